//! `vkllm serve`: the OpenAI-compatible HTTP server (see `vkllm::server`).
//! Built without the `server` feature, the command stays and says so.

#[cfg(feature = "server")]
pub use with_server::{run, ServeArgs};
#[cfg(not(feature = "server"))]
pub use without_server::{run, ServeArgs};

#[cfg(not(feature = "server"))]
mod without_server {
    use clap::Args;
    use vkllm::{Error, Result};

    /// Whatever was given: the command fails before reading it.
    #[derive(Args)]
    pub struct ServeArgs {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        _ignored: Vec<String>,
    }

    impl ServeArgs {
        pub(crate) fn check(&self) -> std::result::Result<(), String> {
            Ok(())
        }
    }

    pub fn run(_: ServeArgs) -> Result<()> {
        Err(Error::Invalid(
            "this vkllm was built without the server feature (rebuild it with `--features server`)"
                .into(),
        ))
    }
}

#[cfg(feature = "server")]
mod with_server {
    use crate::cli::{BackendArgs, ModelArg};
    use clap::Args;
    use vkllm::server::worker::{self, ModelSpec};
    use vkllm::{Error, Result};

    #[derive(Args)]
    pub struct ServeArgs {
        #[command(flatten)]
        model: ModelArg,
        #[command(flatten)]
        backend: BackendArgs,
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

    impl ServeArgs {
        pub(crate) fn check(&self) -> std::result::Result<(), String> {
            self.backend.check()
        }
    }

    pub fn run(a: ServeArgs) -> Result<()> {
        let path = crate::cli::model_path(&a.model)?;
        let name = a.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
        });
        let spec = ModelSpec {
            path,
            backend: a.backend.backend.clone(),
            devices: a.backend.split.devices.clone(),
            cpu: a.backend.cpu(),
            load: a.backend.load_options(),
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
}
