//! Weight element types. [`DType`] is declared with its facts (ggml id and
//! name, block layout, codec, GPU layout, fast paths) in one table, one row
//! per type in quants/types.rs; see [`crate::quants::FORMATS`].

pub use crate::quants::{DType, QK_K};
