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
    use std::num::NonZeroUsize;
    use std::path::{Path, PathBuf};
    use vkllm::server::auth::ApiKeys;
    use vkllm::server::limits::Limits;
    use vkllm::server::worker::{self, ModelSpec};
    use vkllm::server::ServerOptions;
    use vkllm::{Error, Result};

    /// The variable read when no `--api-key` is given.
    const API_KEY_VAR: &str = "VKLLM_API_KEY";

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
        /// Key clients must send as `Authorization: Bearer KEY` on every
        /// endpoint but /health (repeatable; default: $VKLLM_API_KEY)
        #[arg(long, value_name = "KEY")]
        api_key: Vec<String>,
        /// File of further keys, one a line (blank lines skipped)
        #[arg(long, value_name = "FILE")]
        api_key_file: Option<PathBuf>,
        /// Largest request body in bytes (413 above it)
        #[arg(long, value_name = "BYTES", default_value_t = Limits::DEFAULT.max_body_bytes)]
        max_body_bytes: usize,
        /// Largest max_tokens a request may ask (400 above it); also the
        /// bound of a request that gives none
        #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_completion_tokens)]
        max_completion_tokens: usize,
        /// Longest prompt in tokens (400 above it) [default: the context]
        #[arg(long, value_name = "N")]
        max_prompt_tokens: Option<usize>,
        /// Connections open at once; one more is answered 503
        #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_connections)]
        max_connections: usize,
        /// Requests generating at once, batched together (llama.cpp's -np);
        /// more wait in arrival order. Each may use a full context of KV
        /// cache [default: 4, fewer where 4 contexts do not fit beside the weights]
        #[arg(long, value_name = "N")]
        parallel: Option<NonZeroUsize>,
    }

    impl ServeArgs {
        pub(crate) fn check(&self) -> std::result::Result<(), String> {
            let counts = [
                ("--max-body-bytes", Some(self.max_body_bytes)),
                ("--max-completion-tokens", Some(self.max_completion_tokens)),
                ("--max-prompt-tokens", self.max_prompt_tokens),
                ("--max-connections", Some(self.max_connections)),
            ];
            if let Some((flag, _)) = counts.iter().find(|(_, n)| *n == Some(0)) {
                return Err(format!("{flag} must be at least 1"));
            }
            if self.api_key.iter().any(|k| k.trim().is_empty()) {
                return Err("--api-key must not be blank".into());
            }
            self.backend.check()
        }

        fn limits(&self) -> Limits {
            Limits {
                max_body_bytes: self.max_body_bytes,
                max_completion_tokens: self.max_completion_tokens,
                max_prompt_tokens: self.max_prompt_tokens,
                max_connections: self.max_connections,
            }
        }

        /// The keys of `--api-key` (else `VKLLM_API_KEY`) and `--api-key-file`.
        fn api_keys(&self) -> Result<ApiKeys> {
            // Trimmed, as a header value is: a key with outer spaces could
            // never match.
            let mut keys: Vec<String> = self.api_key.iter().map(|k| k.trim().into()).collect();
            if keys.is_empty() {
                keys.extend(env_key()?);
            }
            if let Some(path) = &self.api_key_file {
                keys.extend(file_keys(path)?);
            }
            Ok(ApiKeys::new(keys))
        }
    }

    /// `VKLLM_API_KEY`, when set and not blank.
    fn env_key() -> Result<Option<String>> {
        match std::env::var(API_KEY_VAR) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Ok(Some(v.trim().to_string())),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Setting {
                name: API_KEY_VAR,
                value: "(not UTF-8)".into(),
                expected: "text".into(),
            }),
        }
    }

    /// The keys of a key file; one that holds none is an error, as the
    /// server would otherwise start open to all.
    fn file_keys(path: &Path) -> Result<Vec<String>> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let keys: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        if keys.is_empty() {
            return Err(Error::Invalid(format!(
                "{} holds no API key",
                path.display()
            )));
        }
        Ok(keys)
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
            parallel: a.parallel.map(NonZeroUsize::get),
        };
        // Keys and limits first: a bad key file fails before the model loads.
        let opts = ServerOptions {
            model_name: name,
            api_keys: a.api_keys()?,
            limits: a.limits(),
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
            // Only once listening: a failure prints its error line alone.
            eprintln!(
                "parallel: {} requests at once, each up to {} positions",
                ready.slots.total(),
                ready.capacity
            );
            match opts.api_keys.len() {
                0 => eprintln!("no API key: every client is served"),
                n => eprintln!("API keys: {n}; every endpoint but /health needs one"),
            }
            eprintln!(
                "serving {} (context {}) on http://{local}/v1",
                opts.model_name, ready.capacity
            );
            vkllm::server::serve(listener, jobs, ready, opts).await
        })
    }
}
