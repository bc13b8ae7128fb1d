//! GGUF reader (versions 2 and 3, little-endian).
//!
//! The whole file is memory-mapped; metadata is parsed into owned values and
//! tensor data is handed out as slices of the mapping. Files are untrusted:
//! every count, length, shape and offset is checked against the bytes that
//! remain before anything is allocated, so a corrupt file is an
//! [`Error::Gguf`] naming what is wrong and where, never a panic or a huge
//! allocation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::dtype::DType;
use crate::error::{Error, Result};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Deepest array-in-array nesting accepted. Real files nest at most twice;
/// the cap keeps a hostile file from recursing the parser off its stack.
const MAX_ARRAY_DEPTH: usize = 16;

// Metadata value type ids of the GGUF format.
pub(crate) const TYPE_U8: u32 = 0;
pub(crate) const TYPE_I8: u32 = 1;
pub(crate) const TYPE_U16: u32 = 2;
pub(crate) const TYPE_I16: u32 = 3;
pub(crate) const TYPE_U32: u32 = 4;
pub(crate) const TYPE_I32: u32 = 5;
pub(crate) const TYPE_F32: u32 = 6;
pub(crate) const TYPE_BOOL: u32 = 7;
pub(crate) const TYPE_STRING: u32 = 8;
pub(crate) const TYPE_ARRAY: u32 = 9;
pub(crate) const TYPE_U64: u32 = 10;
pub(crate) const TYPE_I64: u32 = 11;
pub(crate) const TYPE_F64: u32 = 12;

/// Smallest encodings, used to bound counts by the bytes that remain.
/// A metadata entry: key length (8) + value type (4) + a one-byte value.
const MIN_KV_BYTES: usize = 13;
/// A tensor info: name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: usize = 32;
/// Most items reserved up front for a counted list. Counts are already bounded
/// by the bytes left, but a parsed item can be larger in memory than in the
/// file, so a lying count must not reserve more than this; real lists grow.
const MAX_PREALLOC: usize = 1 << 16;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// Any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type whose value fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any numeric type (64-bit integers may round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F32(_) => "f32",
            GgufValue::F64(_) => "f64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
        }
    }

    /// The GGUF value type id this value is written with.
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => TYPE_U8,
            GgufValue::I8(_) => TYPE_I8,
            GgufValue::U16(_) => TYPE_U16,
            GgufValue::I16(_) => TYPE_I16,
            GgufValue::U32(_) => TYPE_U32,
            GgufValue::I32(_) => TYPE_I32,
            GgufValue::U64(_) => TYPE_U64,
            GgufValue::I64(_) => TYPE_I64,
            GgufValue::F32(_) => TYPE_F32,
            GgufValue::F64(_) => TYPE_F64,
            GgufValue::Bool(_) => TYPE_BOOL,
            GgufValue::String(_) => TYPE_STRING,
            GgufValue::Array(_) => TYPE_ARRAY,
        }
    }
}

/// Bytes of the smallest encoding of a value of type `ty`; `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<usize> {
    match ty {
        TYPE_U8 | TYPE_I8 | TYPE_BOOL => Some(1),
        TYPE_U16 | TYPE_I16 => Some(2),
        TYPE_U32 | TYPE_I32 | TYPE_F32 => Some(4),
        TYPE_U64 | TYPE_I64 | TYPE_F64 | TYPE_STRING => Some(8),
        TYPE_ARRAY => Some(12),
        _ => None,
    }
}

/// Name of a ggml type id, for error messages about types vkllm cannot load.
fn ggml_type_name(id: u32) -> Option<&'static str> {
    const NAMES: [&str; 40] = [
        "f32",
        "f16",
        "q4_0",
        "q4_1",
        "q4_2",
        "q4_3",
        "q5_0",
        "q5_1",
        "q8_0",
        "q8_1",
        "q2_k",
        "q3_k",
        "q4_k",
        "q5_k",
        "q6_k",
        "q8_k",
        "iq2_xxs",
        "iq2_xs",
        "iq3_xxs",
        "iq1_s",
        "iq4_nl",
        "iq3_s",
        "iq2_s",
        "iq4_xs",
        "i8",
        "i16",
        "i32",
        "i64",
        "f64",
        "iq1_m",
        "bf16",
        "q4_0_4_4",
        "q4_0_4_8",
        "q4_0_8_8",
        "tq1_0",
        "tq2_0",
        "iq4_nl_4_4",
        "iq4_nl_4_8",
        "iq4_nl_8_8",
        "mxfp4",
    ];
    NAMES.get(usize::try_from(id).ok()?).copied()
}

/// Byte size of a tensor of `dtype` with ggml dims `dims`, checking the shape:
/// 1 to 4 nonzero dims, an element count that fits `i64` (as in ggml) and a
/// row length that is a whole number of blocks. Errors are plain sentences
/// for the caller to prefix with the tensor name.
pub(crate) fn tensor_bytes(dims: &[u64], dtype: DType) -> std::result::Result<usize, String> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(format!(
            "has {} dimensions; GGUF allows 1 to {MAX_DIMS}",
            dims.len()
        ));
    }
    if dims.contains(&0) {
        return Err(format!("has a zero dimension in {dims:?}"));
    }
    let overflow = || format!("element count of dims {dims:?} overflows");
    let mut n: i64 = 1;
    for &d in dims {
        let d = i64::try_from(d).map_err(|_| overflow())?;
        n = n.checked_mul(d).ok_or_else(overflow)?;
    }
    let n = usize::try_from(n).map_err(|_| overflow())?;
    let cols = usize::try_from(dims[0]).map_err(|_| overflow())?;
    let rows = n / cols;
    let block = dtype.block_elems();
    if cols % block != 0 {
        return Err(format!(
            "row length {cols} is not a multiple of the {dtype} block size {block}"
        ));
    }
    (cols / block)
        .checked_mul(dtype.block_bytes())
        .and_then(|row| row.checked_mul(rows))
        .ok_or_else(|| format!("byte size of {dtype} dims {dims:?} overflows"))
}

/// A tensor's shape, type and place in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (row length).
    pub dims: Vec<u64>,
    pub dtype: DType,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Bytes.
    pub size: usize,
}

impl TensorInfo {
    /// Row length (`dims[0]`).
    pub fn cols(&self) -> usize {
        self.dims.first().map_or(0, |&d| d as usize)
    }

    /// Product of the outer dims; 1 for a 1-D tensor.
    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).map(|&d| d as usize).product()
    }

    pub fn n_elements(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open GGUF file: parsed metadata and tensor infos over the file bytes.
pub struct GgufFile {
    path: PathBuf,
    storage: Storage,
    version: u32,
    alignment: usize,
    data_offset: u64,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if meta.is_dir() {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "is a directory");
            return Err(Error::io(path, e));
        }
        // SAFETY: the mapping is read-only and vkllm never writes a model file
        // while it is open; as with every mmap loader, truncating the file
        // from outside while it is mapped is not supported.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::parse(Storage::Mapped(map), path.to_path_buf())
    }

    /// Parse a GGUF image held in memory; `name` stands in for the path in errors.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<GgufFile> {
        Self::parse(Storage::Owned(bytes), PathBuf::from(name))
    }

    fn parse(storage: Storage, path: PathBuf) -> Result<GgufFile> {
        let parsed = match Parsed::from_bytes(storage.bytes()) {
            Ok(p) => p,
            Err(msg) => return Err(Error::Gguf { path, msg }),
        };
        Ok(GgufFile {
            path,
            storage,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            key_index: parsed.key_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn wrong_type(&self, key: &str, v: &GgufValue, expected: &str) -> Error {
        let found = match v {
            GgufValue::String(_) | GgufValue::Array(_) => v.type_name().to_string(),
            _ => format!("{} (value {v:?})", v.type_name()),
        };
        Error::Gguf {
            path: self.path.clone(),
            msg: format!("metadata key '{key}' has type {found}, expected {expected}"),
        }
    }

    /// A key holding any non-negative integer.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, v, "a non-negative integer")),
        }
    }

    /// A key holding any number.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.wrong_type(key, v, "a number")),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, v, "a bool")),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, v, "a string")),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&[GgufValue]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, v, "an array")),
        }
    }

    /// `general.architecture`, required by every model file.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")?
            .ok_or_else(|| Error::Gguf {
                path: self.path.clone(),
                msg: "metadata key 'general.architecture' is missing".into(),
            })
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of `t`. Ranges of this file's tensors were validated at open;
    /// a `TensorInfo` whose range lies outside the file yields an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = usize::try_from(t.offset).unwrap_or(usize::MAX);
        start
            .checked_add(t.size)
            .and_then(|end| self.storage.bytes().get(start..end))
            .unwrap_or_default()
    }
}

/// Everything parsed out of the file bytes.
struct Parsed {
    version: u32,
    alignment: usize,
    data_offset: u64,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

type ParseResult<T> = std::result::Result<T, String>;

impl Parsed {
    fn from_bytes(buf: &[u8]) -> ParseResult<Parsed> {
        let mut c = Cursor { buf, pos: 0 };
        let magic: [u8; 4] = c.array().map_err(|e| format!("magic: {e}"))?;
        if magic != GGUF_MAGIC {
            return Err(format!(
                "bad magic \"{}\", expected \"GGUF\"",
                magic.escape_ascii()
            ));
        }
        let version = c.u32().map_err(|e| format!("version: {e}"))?;
        if version != 2 && version != 3 {
            let hint = if matches!(version.swap_bytes(), 2 | 3) {
                " (big-endian; only little-endian GGUF is supported)"
            } else {
                ""
            };
            return Err(format!("unsupported GGUF version {version}{hint}"));
        }
        let n_tensors_at = c.pos;
        let n_tensors = c.u64().map_err(|e| format!("tensor count: {e}"))?;
        let n_kv_at = c.pos;
        let n_kv = c.u64().map_err(|e| format!("metadata count: {e}"))?;

        let n_kv = c.bounded_count(
            n_kv,
            n_kv_at,
            MIN_KV_BYTES,
            "metadata count",
            "metadata entries",
        )?;
        let mut metadata = Vec::with_capacity(n_kv.min(MAX_PREALLOC));
        let mut key_index = HashMap::with_capacity(n_kv.min(MAX_PREALLOC));
        for i in 0..n_kv {
            let key = c
                .string()
                .map_err(|e| format!("key of metadata entry #{i}: {e}"))?;
            let value = c
                .u32()
                .and_then(|ty| c.value(ty, 0))
                .map_err(|e| format!("metadata key '{key}': {e}"))?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(format!("duplicate metadata key '{key}'"));
            }
            metadata.push((key, value));
        }
        let alignment = match key_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => parse_alignment(&metadata[i].1)?,
        };

        let n_tensors = c.bounded_count(
            n_tensors,
            n_tensors_at,
            MIN_TENSOR_INFO_BYTES,
            "tensor count",
            "tensor infos",
        )?;
        let mut tensors = Vec::with_capacity(n_tensors.min(MAX_PREALLOC));
        let mut tensor_index = HashMap::with_capacity(n_tensors.min(MAX_PREALLOC));
        for i in 0..n_tensors {
            let name = c
                .string()
                .map_err(|e| format!("name of tensor info #{i}: {e}"))?;
            let info = c
                .tensor_info(&name, alignment)
                .map_err(|e| format!("tensor '{name}': {e}"))?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(format!("duplicate tensor name '{name}'"));
            }
            tensors.push(info);
        }

        let data_offset = (c.pos as u64)
            .checked_next_multiple_of(alignment as u64)
            .ok_or_else(|| {
                format!(
                    "data section offset overflows aligning {} to {alignment}",
                    c.pos
                )
            })?;
        let file_len = buf.len() as u64;
        for t in &mut tensors {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.size as u64));
            match (start, end) {
                (Some(start), Some(end)) if end <= file_len => t.offset = start,
                (Some(start), Some(end)) => {
                    return Err(format!(
                        "tensor '{}': data [{start}..{end}) runs past the end of the file ({file_len} bytes)",
                        t.name
                    ))
                }
                _ => {
                    return Err(format!(
                        "tensor '{}': data offset {} + {} bytes overflows",
                        t.name, t.offset, t.size
                    ))
                }
            }
        }
        check_overlaps(&tensors)?;

        Ok(Parsed {
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }
}

fn parse_alignment(v: &GgufValue) -> ParseResult<usize> {
    let a = v
        .as_u64()
        .ok_or_else(|| format!("general.alignment has type {}, expected u32", v.type_name()))?;
    if a == 0 || !a.is_power_of_two() {
        return Err(format!(
            "general.alignment {a} is not a nonzero power of two"
        ));
    }
    usize::try_from(a).map_err(|_| format!("general.alignment {a} does not fit in memory"))
}

/// Tensors must not share bytes (a corrupt file could alias one tensor's data as another's).
fn check_overlaps(tensors: &[TensorInfo]) -> ParseResult<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let a_end = a.offset + a.size as u64;
        if b.offset < a_end {
            return Err(format!(
                "tensors '{}' [{}..{a_end}) and '{}' [{}..{}) overlap",
                a.name,
                a.offset,
                b.name,
                b.offset,
                b.offset + b.size as u64
            ));
        }
    }
    Ok(())
}

/// Little-endian reads over the file bytes; every read is bounds-checked.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> ParseResult<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end.and_then(|e| self.buf.get(self.pos..e).map(|s| (e, s))) {
            Some((e, s)) => {
                self.pos = e;
                Ok(s)
            }
            None => Err(format!(
                "unexpected end of file at byte {}: need {n} bytes, {} left",
                self.pos,
                self.remaining()
            )),
        }
    }

    fn array<const N: usize>(&mut self) -> ParseResult<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> ParseResult<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> ParseResult<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> ParseResult<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// `count` (read at byte `at`) items of at least `min_bytes` each must
    /// fit in what remains.
    fn bounded_count(
        &self,
        count: u64,
        at: usize,
        min_bytes: usize,
        what: &str,
        items: &str,
    ) -> ParseResult<usize> {
        let max = self.remaining() / min_bytes;
        match usize::try_from(count) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(format!(
                "{what} {count} at byte {at} is impossible: the {} remaining bytes hold at most {max} {items}",
                self.remaining()
            )),
        }
    }

    fn string(&mut self) -> ParseResult<String> {
        let at = self.pos;
        let len = self.u64()?;
        if len > self.remaining() as u64 {
            return Err(format!(
                "string length {len} at byte {at} runs past the end of the file ({} bytes)",
                self.buf.len()
            ));
        }
        let bytes = self.take(len as usize)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|e| format!("string at byte {at} is not valid UTF-8 ({e})"))
    }

    fn value(&mut self, ty: u32, depth: usize) -> ParseResult<GgufValue> {
        let at = self.pos;
        Ok(match ty {
            TYPE_U8 => GgufValue::U8(self.u8()?),
            TYPE_I8 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            TYPE_U16 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            TYPE_I16 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            TYPE_U32 => GgufValue::U32(self.u32()?),
            TYPE_I32 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            TYPE_U64 => GgufValue::U64(self.u64()?),
            TYPE_I64 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            TYPE_F32 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            TYPE_F64 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            TYPE_BOOL => match self.u8()? {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("bool at byte {at} has value {b}, expected 0 or 1")),
            },
            TYPE_STRING => GgufValue::String(self.string()?),
            TYPE_ARRAY => GgufValue::Array(self.array_value(depth + 1)?),
            _ => return Err(format!("unknown value type {ty} before byte {at}")),
        })
    }

    fn array_value(&mut self, depth: usize) -> ParseResult<Vec<GgufValue>> {
        let at = self.pos;
        if depth > MAX_ARRAY_DEPTH {
            return Err(format!(
                "arrays nested deeper than {MAX_ARRAY_DEPTH} at byte {at}"
            ));
        }
        let ty = self.u32()?;
        let min = min_value_bytes(ty)
            .ok_or_else(|| format!("array at byte {at} has unknown value type {ty}"))?;
        let count_at = self.pos;
        let count = self.u64()?;
        let n = self.bounded_count(count, count_at, min, "array length", "elements")?;
        let mut items = Vec::with_capacity(n.min(MAX_PREALLOC));
        for _ in 0..n {
            items.push(self.value(ty, depth)?);
        }
        Ok(items)
    }

    /// The rest of a tensor info after its name; `offset` is still relative
    /// to the data section.
    fn tensor_info(&mut self, name: &str, alignment: usize) -> ParseResult<TensorInfo> {
        let n_dims = self.u32()?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(format!(
                "has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64()?);
        }
        let type_id = self.u32()?;
        let dtype =
            DType::from_ggml_type_id(type_id).ok_or_else(|| match ggml_type_name(type_id) {
                Some(n) => format!("ggml type {type_id} ({n}) is not supported by vkllm"),
                None => format!("unknown ggml type id {type_id}"),
            })?;
        let size = tensor_bytes(&dims, dtype)?;
        let offset = self.u64()?;
        if offset % alignment as u64 != 0 {
            return Err(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        Ok(TensorInfo {
            name: name.to_owned(),
            dims,
            dtype,
            offset,
            size,
        })
    }
}
