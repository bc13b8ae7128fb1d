//! `copy`: bytes between (or within) buffers of the store.

use super::buffers::Store;
use crate::backend::Buffer;
use crate::error::{Error, Result};

/// Byte copy between (or within) buffers; offsets and size multiples of 4.
pub(crate) fn copy(
    store: &mut Store,
    src: &Buffer,
    so: usize,
    dst: &Buffer,
    d_o: usize,
    bytes: usize,
) -> Result<()> {
    if !so.is_multiple_of(4) || !d_o.is_multiple_of(4) || !bytes.is_multiple_of(4) {
        return Err(Error::op(
            "copy",
            format!("offsets {so}, {d_o} and size {bytes} must be multiples of 4"),
        ));
    }
    let range = |off: usize, len: usize, what: &str| {
        off.checked_add(bytes)
            .filter(|end| *end <= len)
            .map(|end| off..end)
            .ok_or_else(|| {
                Error::op(
                    "copy",
                    format!("{bytes} bytes at {off} overrun the {len}-byte {what}"),
                )
            })
    };
    if src.id() == dst.id() {
        let buf = store.bytes_mut("copy", "dst", dst)?;
        let s = range(so, buf.len(), "src")?;
        range(d_o, buf.len(), "dst")?;
        buf.copy_within(s, d_o);
        return Ok(());
    }
    let s = range(so, store.bytes("copy", "src", src)?.len(), "src")?;
    let data = store.bytes("copy", "src", src)?[s].to_vec();
    let out = store.bytes_mut("copy", "dst", dst)?;
    let d = range(d_o, out.len(), "dst")?;
    out[d].copy_from_slice(&data);
    Ok(())
}
