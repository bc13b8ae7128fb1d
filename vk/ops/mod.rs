//! Op encoders, one file per op (named as its CPU kernel in cpu/ and its
//! shader in glsl/): shape checks, then dispatches (or copies) recorded
//! through [`Encoder::dispatch`], which declares reads and writes to the
//! recorder so it can place barriers.

mod add;
mod append_token;
mod argmax;
mod attention;
mod copy;
mod embedding;
mod encoder;
mod glu;
mod kv_pages;
mod layer_norm;
pub(super) mod matmul;
mod matmul_experts;
mod rms_norm;
mod rope;
mod rope_store;
mod rope_store_attention;
mod round_i8;
mod route_experts;
mod scale;
mod store_rows;
mod sum_experts;

use super::pipeline::Spec;
use crate::backend::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};

pub(super) use encoder::{Encoder, OpState};

/// Most storage buffers any kernel binds (attention_decode: 14).
const MAX_BINDINGS: usize = 14;

/// One storage-buffer binding of a dispatch.
pub(super) struct Bind<'a> {
    buf: &'a Buffer,
    write: bool,
    /// Left out of barrier tracking: only updated with atomics whose order
    /// does not matter (the status word).
    tracked: bool,
    /// A read that may be the op's output buffer too (elementwise in place).
    may_alias: bool,
}

pub(super) fn read(buf: &Buffer) -> Bind<'_> {
    Bind {
        buf,
        write: false,
        tracked: true,
        may_alias: false,
    }
}

/// A read of an elementwise op whose output may be this same buffer.
pub(super) fn read_in_place(buf: &Buffer) -> Bind<'_> {
    Bind {
        may_alias: true,
        ..read(buf)
    }
}

pub(super) fn write(buf: &Buffer) -> Bind<'_> {
    Bind {
        buf,
        write: true,
        tracked: true,
        may_alias: false,
    }
}

/// A buffer the command writes when `written`, else only reads.
pub(super) fn read_or_write(buf: &Buffer, written: bool) -> Bind<'_> {
    if written {
        write(buf)
    } else {
        read(buf)
    }
}

pub(super) fn atomic(buf: &Buffer) -> Bind<'_> {
    Bind {
        buf,
        write: true,
        tracked: false,
        may_alias: false,
    }
}

/// Which pipeline a dispatch runs.
pub(super) struct KernelRef {
    name: &'static str,
    /// The weight dtype variant, for shaders compiled per dtype.
    dtype: Option<DType>,
    /// Specialization constants 0.. (0: the workgroup size), all 0 when the
    /// shader has none.
    spec: Spec,
}

pub(super) fn plain(name: &'static str) -> KernelRef {
    KernelRef {
        name,
        dtype: None,
        spec: [0; 3],
    }
}

pub(super) fn typed(name: &'static str, dtype: DType) -> KernelRef {
    KernelRef {
        name,
        dtype: Some(dtype),
        spec: [0; 3],
    }
}

impl KernelRef {
    /// Specialization constant 0.
    pub(super) fn spec(self, c0: u32) -> KernelRef {
        self.specs([c0, 0, 0])
    }

    pub(super) fn specs(self, spec: Spec) -> KernelRef {
        KernelRef { spec, ..self }
    }
}

/// `v` as a u32 shader parameter, or an error naming the op.
pub(super) fn u32_of(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::op(
            op,
            format!("{what} = {v} exceeds the u32 range of the shaders"),
        )
    })
}

/// `len` bytes at `offset` must lie inside `buf`.
pub(super) fn check_range(op: &'static str, buf: &Buffer, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= buf.bytes => Ok(()),
        _ => Err(Error::op(
            op,
            format!(
                "{len} bytes at offset {offset} do not fit a buffer of {} bytes",
                buf.bytes
            ),
        )),
    }
}
