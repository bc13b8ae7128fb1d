//! `vkllm serve`: the OpenAI-compatible HTTP server (see `vkllm::server`).

use super::{BackendArgs, ModelArg};
use clap::Args;
use std::num::NonZeroUsize;
use vkllm::model::LoadOptions;
use vkllm::open::CpuOptions;
use vkllm::server::worker::{self, ModelSpec};
use vkllm::{Error, Result};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Model name in /v1/models and responses [default: the file name]
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
}

pub fn run(a: ServeArgs) -> Result<()> {
    let path = super::model_path(&a.model)?;
    let name = a.name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    let spec = ModelSpec {
        path,
        backend: a.backend.backend.clone(),
        devices: a.backend.split.devices.clone(),
        shares: a.backend.split.shares().map(<[f64]>::to_vec),
        cpu: CpuOptions {
            threads: a.backend.threads.map(NonZeroUsize::get),
            activations: a.backend.activations.into(),
        },
        load: LoadOptions {
            context: a.backend.ctx.map(NonZeroUsize::get),
            weights: vkllm::model::weights::WeightOptions {
                quantize: a.backend.quantize.map(super::QuantizeKind::dtype),
            },
            kv_cache: a.backend.kv_cache.map(super::KvCacheKind::dtype),
            ..LoadOptions::default()
        },
    };
    let (jobs, ready) = worker::start(spec)?;
    eprintln!("backend: {}", ready.backend);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Invalid(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::Invalid(format!("cannot listen on {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Invalid(format!("cannot listen on {addr}: {e}")))?;
        eprintln!(
            "serving {name} (context {}) on http://{local}/v1",
            ready.capacity
        );
        vkllm::server::serve(listener, jobs, ready, name).await
    })
}
