//! One error type for the crate. Every variant renders as one sentence that
//! names what failed (file, tensor, op, shape) so the CLI can print it as is.
//!
//! Host apps decide what to do from the variant: a lost device means
//! reopening the backend, running out of memory means a smaller context or
//! model, the rest mean the input or the request must change. Matching on
//! [`Error::kind`] groups the variants into those decisions.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading (or, with `write`, writing) a file failed.
    #[error("cannot {} {}: {source}", if *.write { "write" } else { "read" }, .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
        /// The failed operation was a write (creating or filling a file).
        write: bool,
    },
    #[error("{} is not a valid GGUF file: {msg}", .path.display())]
    Gguf { path: PathBuf, msg: String },
    #[error("{} is not a valid safetensors model: {msg}", .path.display())]
    Safetensors { path: PathBuf, msg: String },
    #[error("bad model configuration: {0}")]
    Config(String),
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("shape error: {0}")]
    Shape(String),
    #[error("op {op}: {msg}")]
    Op { op: &'static str, msg: String },
    /// The GPU stopped answering (`VK_ERROR_DEVICE_LOST`): nothing on it is
    /// usable any more; drop the model and open the backend again.
    #[error("the device was lost while {0}; the backend must be reopened")]
    DeviceLost(String),
    /// Device memory cannot hold a request. `needed`/`available` are set
    /// when the request was checked before allocating.
    #[error("out of device memory while {what}{}", need_have(*.needed, *.available))]
    OutOfDeviceMemory {
        what: String,
        needed: Option<u64>,
        available: Option<u64>,
    },
    /// Host memory cannot hold a request (see [`Error::OutOfDeviceMemory`]).
    #[error("out of host memory while {what}{}", need_have(*.needed, *.available))]
    OutOfHostMemory {
        what: String,
        needed: Option<u64>,
        available: Option<u64>,
    },
    /// Any other failure reported by Vulkan or the driver.
    #[error("Vulkan: {0}")]
    Vulkan(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}")]
    Invalid(String),
    /// A setting (an environment variable such as `VKLLM_MATMUL`) holds a
    /// value it does not take; `expected` says what it takes.
    #[error("{name}={value} is not {expected}")]
    Setting {
        name: &'static str,
        value: String,
        expected: String,
    },
}

/// What a caller can do about an [`Error`]: the variants grouped by remedy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The device is gone; reopen the backend (and reload the model).
    DeviceLost,
    /// Not enough device memory; ask for less (context, model, batch).
    OutOfDeviceMemory,
    /// Not enough host memory; ask for less.
    OutOfHostMemory,
    /// A valid request this build, device or backend cannot do.
    Unsupported,
    /// A malformed file, configuration, tokenizer, template or argument.
    InvalidInput,
    /// The operating system refused a read or write.
    Io,
    /// Any other device or driver failure.
    Device,
}

impl Error {
    /// A failed read of `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
            write: false,
        }
    }
    /// A failed write (or create) of `path`.
    pub fn io_write(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
            write: true,
        }
    }
    pub fn op(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Op {
            op,
            msg: msg.into(),
        }
    }
    /// Host memory ran out while doing `what` (an allocation refused).
    pub fn out_of_host_memory(what: impl Into<String>) -> Self {
        Error::OutOfHostMemory {
            what: what.into(),
            needed: None,
            available: None,
        }
    }
    /// Device memory ran out while doing `what`.
    pub fn out_of_device_memory(what: impl Into<String>) -> Self {
        Error::OutOfDeviceMemory {
            what: what.into(),
            needed: None,
            available: None,
        }
    }

    /// The remedy group of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::DeviceLost(_) => ErrorKind::DeviceLost,
            Error::OutOfDeviceMemory { .. } => ErrorKind::OutOfDeviceMemory,
            Error::OutOfHostMemory { .. } => ErrorKind::OutOfHostMemory,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Io { .. } => ErrorKind::Io,
            Error::Vulkan(_) => ErrorKind::Device,
            Error::Gguf { .. }
            | Error::Safetensors { .. }
            | Error::Config(_)
            | Error::Tensor { .. }
            | Error::Shape(_)
            | Error::Op { .. }
            | Error::Tokenizer(_)
            | Error::Template(_)
            | Error::Invalid(_)
            | Error::Setting { .. } => ErrorKind::InvalidInput,
        }
    }
}

/// `": it needs 1.2 GB and 0.5 GB is available"` when both are known.
fn need_have(needed: Option<u64>, available: Option<u64>) -> String {
    match (needed, available) {
        (Some(n), Some(a)) => format!(
            ": it needs {} and {} is available",
            human_bytes(n),
            human_bytes(a)
        ),
        (Some(n), None) => format!(": it needs {}", human_bytes(n)),
        _ => String::new(),
    }
}

/// Bytes in decimal units with 3 significant-ish digits ("76.8 GB", "512 KB").
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["bytes", "KB", "MB", "GB", "TB", "PB"];
    let mut x = n as f64;
    let mut unit = 0;
    while x >= 1000.0 && unit + 1 < UNITS.len() {
        x /= 1000.0;
        unit += 1;
    }
    match unit {
        0 => format!("{n} bytes"),
        _ if x < 10.0 => format!("{x:.2} {}", UNITS[unit]),
        _ if x < 100.0 => format!("{x:.1} {}", UNITS[unit]),
        _ => format!("{x:.0} {}", UNITS[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_errors_say_what_is_needed_and_available() {
        let e = Error::OutOfHostMemory {
            what: "allocating the KV cache".into(),
            needed: Some(76_800_000_000),
            available: Some(5_120_000_000),
        };
        assert_eq!(
            e.to_string(),
            "out of host memory while allocating the KV cache: it needs 76.8 GB and 5.12 GB is available"
        );
        assert_eq!(e.kind(), ErrorKind::OutOfHostMemory);
        let e = Error::out_of_device_memory("allocating a buffer");
        assert_eq!(
            e.to_string(),
            "out of device memory while allocating a buffer"
        );
        assert_eq!(e.kind(), ErrorKind::OutOfDeviceMemory);
    }

    #[test]
    fn io_errors_name_the_operation() {
        let nf = || std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(Error::io("a.gguf", nf())
            .to_string()
            .starts_with("cannot read a.gguf: "));
        let e = Error::io_write("d/b.gguf", nf());
        assert!(e.to_string().starts_with("cannot write d/b.gguf: "), "{e}");
        assert_eq!(e.kind(), ErrorKind::Io);
    }

    #[test]
    fn human_bytes_is_short() {
        assert_eq!(human_bytes(0), "0 bytes");
        assert_eq!(human_bytes(999), "999 bytes");
        assert_eq!(human_bytes(1_500), "1.50 KB");
        assert_eq!(human_bytes(76_800_000_000), "76.8 GB");
        assert_eq!(human_bytes(377_487_360), "377 MB");
    }
}
