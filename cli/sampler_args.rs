//! The sampling flags `generate` and `chat` share.

use clap::Args;
use vkllm::model::sampling::SamplerConfig;

#[derive(Args)]
pub struct SamplerArgs {
    /// Sampling temperature; 0 is greedy
    #[arg(long, visible_alias = "temp", default_value_t = SamplerConfig::default().temperature, value_parser = super::parse_temperature)]
    temperature: f32,
    /// Keep the K most likely tokens (0: all)
    #[arg(long, default_value_t = SamplerConfig::default().top_k)]
    top_k: usize,
    /// Nucleus sampling threshold (1: off)
    #[arg(long, default_value_t = SamplerConfig::default().top_p, value_parser = super::parse_probability)]
    top_p: f32,
    /// Drop tokens less likely than P times the best one (0: off)
    #[arg(long, default_value_t = SamplerConfig::default().min_p, value_parser = super::parse_probability)]
    min_p: f32,
    /// Penalty for recently seen tokens (1: off)
    #[arg(long, default_value_t = SamplerConfig::default().repeat_penalty, value_parser = super::parse_penalty)]
    repeat_penalty: f32,
    /// How many recent tokens the repeat penalty looks at
    #[arg(long, default_value_t = SamplerConfig::default().repeat_last_n)]
    repeat_last_n: usize,
    /// Sampling seed (the same seed gives the same text)
    #[arg(short = 's', long, default_value_t = SamplerConfig::default().seed)]
    seed: u64,
}

impl SamplerArgs {
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
        }
    }
}
