//! GGUF writer (versions 2 and 3), the inverse of [`crate::model::gguf`].
//!
//! Metadata and tensors are collected in memory, checked, then streamed out
//! in one pass: header, metadata, tensor infos, then each tensor's data at
//! its aligned offset. `general.alignment` in the metadata sets the alignment.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::gguf::{tensor_bytes, GgufValue, DEFAULT_ALIGNMENT, GGUF_MAGIC, TYPE_U8};

const ALIGNMENT_KEY: &str = "general.alignment";

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    dtype: DType,
    data: Vec<u8>,
}

/// Builds a GGUF file from metadata and tensors.
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<PendingTensor>,
    tensor_names: HashSet<String>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
            tensor_names: HashSet::new(),
        }
    }

    /// GGUF version to write: 2 or 3 (checked when writing).
    pub fn version(&mut self, v: u32) -> &mut Self {
        self.version = v;
        self
    }

    /// Tensor data alignment, stored as `general.alignment` (u32). Must be a
    /// nonzero power of two (checked when writing).
    pub fn alignment(&mut self, a: usize) -> &mut Self {
        let value = match u32::try_from(a) {
            Ok(a) => GgufValue::U32(a),
            Err(_) => GgufValue::U64(a as u64),
        };
        match self.metadata.iter_mut().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((ALIGNMENT_KEY.to_owned(), value)),
        }
        self
    }

    /// Append a metadata entry (keys must be unique; checked when writing).
    pub fn add(&mut self, key: &str, value: GgufValue) -> &mut Self {
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Append a tensor with ggml dims (`dims[0]` innermost); `data` must hold
    /// exactly the bytes of that shape in `dtype`.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        dtype: DType,
        data: Vec<u8>,
    ) -> Result<()> {
        let err = |msg: String| Error::Tensor {
            name: name.to_owned(),
            msg,
        };
        let want = tensor_bytes(dims, dtype).map_err(|m| err(format!("shape {m}")))?;
        if data.len() != want {
            return Err(err(format!(
                "{dtype} dims {dims:?} need {want} bytes, got {}",
                data.len()
            )));
        }
        if !self.tensor_names.insert(name.to_owned()) {
            return Err(err("was already added to this GGUF file".into()));
        }
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dims: dims.to_vec(),
            dtype,
            data,
        });
        Ok(())
    }

    /// The whole file in memory.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let layout = self.layout()?;
        let mut out = Vec::with_capacity(layout.total);
        self.write_to(&mut out, &layout)
            .map_err(|e| Error::io_write("<memory>", e))?;
        Ok(out)
    }

    /// Stream the file to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let layout = self.layout()?;
        let file = std::fs::File::create(path).map_err(|e| Error::io_write(path, e))?;
        let mut w = std::io::BufWriter::new(file);
        self.write_to(&mut w, &layout)
            .and_then(|()| w.flush())
            .map_err(|e| Error::io_write(path, e))
    }

    /// Check everything that can be wrong before a byte is written, and
    /// place each tensor.
    fn layout(&self) -> Result<Layout> {
        let invalid = |msg: String| Error::Invalid(format!("GGUF writer: {msg}"));
        if self.version != 2 && self.version != 3 {
            return Err(invalid(format!(
                "cannot write version {}, only 2 or 3",
                self.version
            )));
        }
        let mut keys = HashSet::new();
        for (key, value) in &self.metadata {
            if !keys.insert(key.as_str()) {
                return Err(invalid(format!("duplicate metadata key '{key}'")));
            }
            check_homogeneous(value).map_err(|m| invalid(format!("metadata key '{key}': {m}")))?;
        }
        let alignment = match self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v {
                GgufValue::U32(a) if *a != 0 && a.is_power_of_two() => *a as usize,
                _ => {
                    return Err(invalid(format!(
                        "{ALIGNMENT_KEY} must be a u32 nonzero power of two, got {v:?}"
                    )))
                }
            },
        };
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut end = 0usize;
        for t in &self.tensors {
            let start = end.next_multiple_of(alignment);
            offsets.push(start as u64);
            end = start + t.data.len();
        }
        let header = 4 + 4 + 8 + 8;
        let kv: usize = self
            .metadata
            .iter()
            .map(|(k, v)| 8 + k.len() + 4 + encoded_len(v))
            .sum();
        let infos: usize = self
            .tensors
            .iter()
            .map(|t| 8 + t.name.len() + 4 + 8 * t.dims.len() + 4 + 8)
            .sum();
        let data_start = (header + kv + infos).next_multiple_of(alignment);
        Ok(Layout {
            offsets,
            data_start,
            total: data_start + end.next_multiple_of(alignment),
        })
    }

    fn write_to<W: Write>(&self, w: &mut W, layout: &Layout) -> std::io::Result<()> {
        let mut out = Counted { inner: w, pos: 0 };
        out.put(&GGUF_MAGIC)?;
        out.put(&self.version.to_le_bytes())?;
        out.put(&(self.tensors.len() as u64).to_le_bytes())?;
        out.put(&(self.metadata.len() as u64).to_le_bytes())?;
        let mut buf = Vec::new();
        for (key, value) in &self.metadata {
            buf.clear();
            encode_str(&mut buf, key);
            buf.extend_from_slice(&value.type_id().to_le_bytes());
            encode_value(&mut buf, value);
            out.put(&buf)?;
        }
        for (t, offset) in self.tensors.iter().zip(&layout.offsets) {
            buf.clear();
            encode_str(&mut buf, &t.name);
            buf.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                buf.extend_from_slice(&d.to_le_bytes());
            }
            buf.extend_from_slice(&t.dtype.ggml_type_id().to_le_bytes());
            buf.extend_from_slice(&offset.to_le_bytes());
            out.put(&buf)?;
        }
        for (t, offset) in self.tensors.iter().zip(&layout.offsets) {
            out.pad_to(layout.data_start + *offset as usize)?;
            out.put(&t.data)?;
        }
        // ggml pads after every tensor, the last one included.
        out.pad_to(layout.total)
    }
}

/// A writer that knows how many bytes it has written, for padding.
struct Counted<'a, W: Write> {
    inner: &'a mut W,
    pos: usize,
}

impl<W: Write> Counted<'_, W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.pos += bytes.len();
        self.inner.write_all(bytes)
    }

    fn pad_to(&mut self, target: usize) -> std::io::Result<()> {
        const ZEROS: [u8; 256] = [0; 256];
        while self.pos < target {
            let n = (target - self.pos).min(ZEROS.len());
            self.put(&ZEROS[..n])?;
        }
        Ok(())
    }
}

struct Layout {
    /// Tensor offsets relative to the data section.
    offsets: Vec<u64>,
    data_start: usize,
    total: usize,
}

/// GGUF arrays carry one element type, so every element must share it.
fn check_homogeneous(v: &GgufValue) -> std::result::Result<(), String> {
    if let GgufValue::Array(items) = v {
        if let Some(first) = items.first() {
            if let Some(other) = items.iter().find(|x| x.type_id() != first.type_id()) {
                return Err(format!(
                    "array mixes {} and {} elements",
                    first.type_name(),
                    other.type_name()
                ));
            }
        }
        for item in items {
            check_homogeneous(item)?;
        }
    }
    Ok(())
}

fn encoded_len(v: &GgufValue) -> usize {
    match v {
        GgufValue::U8(_) | GgufValue::I8(_) | GgufValue::Bool(_) => 1,
        GgufValue::U16(_) | GgufValue::I16(_) => 2,
        GgufValue::U32(_) | GgufValue::I32(_) | GgufValue::F32(_) => 4,
        GgufValue::U64(_) | GgufValue::I64(_) | GgufValue::F64(_) => 8,
        GgufValue::String(s) => 8 + s.len(),
        GgufValue::Array(items) => 12 + items.iter().map(encoded_len).sum::<usize>(),
    }
}

/// A GGUF string: u64 length, then the bytes.
pub(crate) fn encode_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A metadata value's payload (its type id is written by the caller).
pub(crate) fn encode_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => encode_str(out, s),
        GgufValue::Array(items) => {
            // An empty array has no element to take a type from; u8 reads back as empty all the same.
            let ty = items.first().map_or(TYPE_U8, GgufValue::type_id);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                encode_value(out, item);
            }
        }
    }
}
