//! Benchmarking, the library half of `vkllm bench` and `vkllm synth`:
//!
//! - [`protocol`]: llama-bench's tests (pp = one batch of prompt tokens,
//!   tg = single-token greedy steps, both at a cache depth), repetitions,
//!   statistics, the markdown table and the JSON records;
//! - [`batched`]: llama-batched-bench's test (many sequences' prompts,
//!   then decode steps over all of them at once), its table and records;
//! - [`bandwidth`]: a device's measured copy bandwidth, the yardstick of the
//!   roofline column;
//! - [`synth`]: llama-family GGUF files of real models' shapes with random,
//!   well-scaled weights and llama.cpp's quantization recipes.

pub mod bandwidth;
pub mod batched;
pub mod protocol;
pub mod synth;

pub use protocol::{run_test, Protocol, Record, TestKind, TestResult, TestSpec};
