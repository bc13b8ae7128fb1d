//! Greedy feedback between decode steps (see `ComputeBackend::append_token`).

use super::buffers::Store;
use crate::backend::Buffer;
use crate::error::{Error, Result};

const OP: &str = "append_token";

pub(crate) fn run(
    store: &mut Store,
    ids: &Buffer,
    positions: &Buffer,
    history: &Buffer,
) -> Result<()> {
    let token = store.u32s(OP, "ids", ids, 1)?[0];
    let words = store.words_mut(OP, "history", history)?;
    if words.is_empty() {
        return Err(Error::op(OP, "history holds no count"));
    }
    let count = words[0] as usize;
    let slot = words
        .get_mut(1 + count)
        .ok_or_else(|| Error::op(OP, format!("history holds no room for step {}", count + 1)))?;
    *slot = token;
    words[0] += 1;
    let pos = store.words_mut(OP, "positions", positions)?;
    let first = pos
        .first_mut()
        .ok_or_else(|| Error::op(OP, "positions holds no value"))?;
    *first = first.wrapping_add(1);
    Ok(())
}
