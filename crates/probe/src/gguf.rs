//! A GGUF file's header: its metadata keys and scalar values and its tensor
//! table (names, shapes, types, offsets), read without touching the tensor
//! data (or linking a tensor library), for memory estimates and listings
//! made before any model is loaded.
//!
//! Arrays (the tokenizer's vocabulary, merges, scores) are walked past, and
//! only their element type and length kept. Every declared count and length
//! is checked against the bytes left in the file before anything is read or
//! allocated, and every tensor of a known type must lie inside the file, so
//! a truncated, corrupt or hostile file is a [`HeaderError`], never a panic
//! or a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

/// The four bytes every GGUF file starts with.
const MAGIC: [u8; 4] = *b"GGUF";

/// Tensor data starts on this boundary unless `general.alignment` says
/// otherwise.
const DEFAULT_ALIGNMENT: u64 = 32;

/// The largest `general.alignment` taken: far above any real file's, low
/// enough that rounding an offset up to it cannot overflow.
const MAX_ALIGNMENT: i128 = 1 << 30;

/// ggml tensors have at most this many dimensions.
const MAX_DIMS: u32 = 4;

/// The fewest bytes one metadata entry takes (key length, type, a 1-byte
/// value): bounds a declared entry count by the file's size.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// The fewest bytes one tensor info takes (name length, dimension count,
/// type, offset).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Why a header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// The file could not be opened or read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The bytes are not a GGUF header this reader understands.
    #[error("{path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, at which key.
        reason: String,
    },
}

/// One scalar metadata value, or the shape of an array.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// Any integer type, widened.
    Int(i128),
    /// f32 or f64, widened.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string (invalid UTF-8 is replaced).
    Str(String),
    /// An array: its values are walked past, so only what they are and how
    /// many is kept (a vocabulary's size without holding the vocabulary).
    Array {
        /// GGUF value type of the elements (e.g. 8 = string, 6 = f32).
        elem_type: u32,
        /// Element count.
        len: u64,
    },
}

/// A ggml tensor type code from the tensor table (`0` = F32, `3` = Q4_1...).
///
/// Only the types listed in [`GgmlType::block`] have a known size; others
/// are kept by number, so a newer quantization is reported, not guessed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// 32-bit float.
    pub const F32: Self = Self(0);
    /// 16-bit float.
    pub const F16: Self = Self(1);
    /// 4-bit blocks of 32 with a scale and a minimum, the default model's type.
    pub const Q4_1: Self = Self(3);
    /// 8-bit blocks of 32 with a scale.
    pub const Q8_0: Self = Self(8);
    /// bfloat16.
    pub const BF16: Self = Self(30);

    /// `(values, bytes)` of one block of this type, or `None` for types this
    /// reader does not size.
    pub fn block(self) -> Option<(u64, u64)> {
        Some(match self.0 {
            0 => (1, 4),
            1 | 30 => (1, 2),
            2 => (32, 18),
            3 => (32, 20),
            6 => (32, 22),
            7 => (32, 24),
            8 => (32, 34),
            10 => (256, 84),
            11 => (256, 110),
            12 => (256, 144),
            13 => (256, 176),
            14 => (256, 210),
            15 => (256, 292),
            _ => return None,
        })
    }

    /// The ggml name (`Q4_K`) of a type this reader sizes.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            30 => "BF16",
            _ => return None,
        })
    }

    /// Bytes that `values` values of this type take; `None` for an unknown
    /// type or a count that is not whole blocks.
    pub fn bytes_for(self, values: u64) -> Option<u64> {
        let (per_block, block_bytes) = self.block()?;
        if !values.is_multiple_of(per_block) {
            return None;
        }
        (values / per_block).checked_mul(block_bytes)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown type {}", self.0),
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost first (ggml order).
    pub dims: Vec<u64>,
    /// How the values are stored.
    pub ggml_type: GgmlType,
    /// Where the data starts, from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Value count: the product of the dimensions (checked not to overflow
    /// when the table was read).
    pub fn elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }

    /// Bytes of the tensor's data; `None` when its type is not one this
    /// reader sizes.
    pub fn bytes(&self) -> Option<u64> {
        self.ggml_type.bytes_for(self.elements())
    }
}

/// The metadata and tensor table of a GGUF file.
#[derive(Clone, Debug, Default)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Tensors the file declares (the length of `tensors`).
    pub tensor_count: u64,
    /// Metadata key -> value.
    pub metadata: HashMap<String, MetaValue>,
    /// The tensor table, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the data section that tensor offsets count
    /// from.
    pub data_offset: u64,
}

impl GgufHeader {
    /// `general.architecture` (e.g. `llama`, `qwen2`), if the file names one.
    pub fn architecture(&self) -> Option<&str> {
        self.str("general.architecture")
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key) {
            Some(MetaValue::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// A non-negative integer value.
    pub fn usize(&self, key: &str) -> Option<usize> {
        match self.metadata.get(key) {
            Some(MetaValue::Int(n)) => usize::try_from(*n).ok(),
            _ => None,
        }
    }

    /// A float value (an integer is widened: writers disagree on types).
    pub fn float(&self, key: &str) -> Option<f64> {
        match self.metadata.get(key) {
            Some(MetaValue::Float(x)) => Some(*x),
            Some(MetaValue::Int(n)) => Some(*n as f64),
            _ => None,
        }
    }

    /// The element count of an array value.
    pub fn array_len(&self, key: &str) -> Option<u64> {
        match self.metadata.get(key) {
            Some(MetaValue::Array { len, .. }) => Some(*len),
            _ => None,
        }
    }

    /// `{architecture}.{key}` as an integer: where GGUF keeps model dimensions.
    pub fn arch_usize(&self, key: &str) -> Option<usize> {
        self.usize(&format!("{}.{key}", self.architecture()?))
    }

    /// `{architecture}.{key}` as a float (e.g. `rope.freq_base`).
    pub fn arch_float(&self, key: &str) -> Option<f64> {
        self.float(&format!("{}.{key}", self.architecture()?))
    }

    /// Parameters: the values of all tensors.
    pub fn parameter_count(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |n, t| n.saturating_add(t.elements()))
    }

    /// Bytes of all tensor data, or `None` when some tensor's type is one
    /// this reader does not size.
    pub fn tensor_data_bytes(&self) -> Option<u64> {
        self.tensors
            .iter()
            .try_fold(0u64, |n, t| n.checked_add(t.bytes()?))
    }
}

/// Reads the header and tensor table of the GGUF file at `path`.
pub fn read_header(path: &Path) -> Result<GgufHeader, HeaderError> {
    let io = |source| HeaderError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut reader = Reader {
        inner: BufReader::new(file),
        len,
        left: len,
    };
    parse(&mut reader).map_err(|e| match e {
        ParseError::Io(source) => io(source),
        ParseError::Format(reason) => HeaderError::Format {
            path: path.to_path_buf(),
            reason,
        },
    })
}

enum ParseError {
    Io(std::io::Error),
    Format(String),
}

impl From<std::io::Error> for ParseError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

fn bad(reason: impl Into<String>) -> ParseError {
    ParseError::Format(reason.into())
}

/// A reader that knows how many bytes the file has left.
struct Reader<R> {
    inner: R,
    len: u64,
    left: u64,
}

impl<R: Read + Seek> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], ParseError> {
        self.reserve(N as u64, "a value")?;
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf)?;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// Fails unless `n` more bytes are in the file, and counts them as read.
    fn reserve(&mut self, n: u64, what: &str) -> Result<(), ParseError> {
        if n > self.left {
            return Err(bad(format!(
                "{what} of {n} bytes runs past the end of the file ({} left): truncated or not GGUF",
                self.left
            )));
        }
        self.left -= n;
        Ok(())
    }

    /// Fails unless `count` items of at least `min_bytes` each fit in the
    /// bytes left: a hostile count is refused before any loop or allocation.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<(), ParseError> {
        if count > self.left / min_bytes {
            return Err(bad(format!(
                "the header declares {count} {what}, more than the {} bytes left could hold: truncated or not GGUF",
                self.left
            )));
        }
        Ok(())
    }

    fn string(&mut self) -> Result<String, ParseError> {
        let n = self.u64()?;
        self.reserve(n, "a string")?;
        let mut buf = vec![0u8; n as usize];
        self.inner.read_exact(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<(), ParseError> {
        self.reserve(n, what)?;
        let n = i64::try_from(n).map_err(|_| bad(format!("{what} is too long")))?;
        self.inner.seek_relative(n)?;
        Ok(())
    }
}

fn parse<R: Read + Seek>(r: &mut Reader<R>) -> Result<GgufHeader, ParseError> {
    if r.bytes::<4>()? != MAGIC {
        return Err(bad("not a GGUF file (no `GGUF` magic)"));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!(
            "GGUF version {version} is not supported (2 and 3 are)"
        )));
    }
    let tensor_count = r.u64()?;
    let kv_count = r.u64()?;
    r.check_count(kv_count, MIN_KV_BYTES, "metadata entries")?;
    let mut metadata = HashMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = value(r, kind, &key)?;
        metadata.insert(key, value);
    }
    r.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, "tensors")?;
    // Grown as entries are read, not reserved from the count: an entry in
    // memory is larger than its bytes in the file.
    let mut tensors = Vec::new();
    for _ in 0..tensor_count {
        tensors.push(tensor_info(r)?);
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::Int(a)) if (1..=MAX_ALIGNMENT).contains(a) && a.count_ones() == 1 => {
            *a as u64
        }
        Some(other) => {
            return Err(bad(format!(
                "`general.alignment` is {other:?}, not a power of two up to {MAX_ALIGNMENT}"
            )));
        }
    };
    let data_offset = (r.len - r.left).div_ceil(alignment) * alignment;
    for t in &tensors {
        check_extent(t, data_offset, alignment, r.len)?;
    }
    Ok(GgufHeader {
        version,
        tensor_count,
        metadata,
        tensors,
        data_offset,
    })
}

fn tensor_info<R: Read + Seek>(r: &mut Reader<R>) -> Result<TensorInfo, ParseError> {
    let name = r.string()?;
    let n_dims = r.u32()?;
    if n_dims > MAX_DIMS {
        return Err(bad(format!(
            "tensor `{name}` has {n_dims} dimensions; ggml allows at most {MAX_DIMS}"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    let mut elements = 1u64;
    for _ in 0..n_dims {
        let d = r.u64()?;
        elements = elements
            .checked_mul(d)
            .filter(|&n| i64::try_from(n).is_ok())
            .ok_or_else(|| bad(format!("tensor `{name}` has too many values")))?;
        dims.push(d);
    }
    let ggml_type = GgmlType(r.u32()?);
    let offset = r.u64()?;
    if let (Some((per_block, _)), Some(&first)) = (ggml_type.block(), dims.first())
        && !first.is_multiple_of(per_block)
    {
        return Err(bad(format!(
            "tensor `{name}`: its first dimension {first} is not a whole number of {ggml_type} blocks ({per_block} values)"
        )));
    }
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
    })
}

/// A tensor of a known type must start aligned and end inside the file.
fn check_extent(
    t: &TensorInfo,
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), ParseError> {
    if !t.offset.is_multiple_of(alignment) {
        return Err(bad(format!(
            "tensor `{}` starts at data offset {}, not a multiple of the alignment {alignment}",
            t.name, t.offset
        )));
    }
    let Some(bytes) = t.bytes() else {
        return Ok(());
    };
    let end = data_offset
        .checked_add(t.offset)
        .and_then(|start| start.checked_add(bytes));
    match end {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(bad(format!(
            "tensor `{}` ({bytes} bytes at data offset {}) runs past the end of the file ({file_len} bytes): truncated",
            t.name, t.offset
        ))),
    }
}

/// Bytes of one value of a fixed-size GGUF type; `None` for strings and arrays.
fn fixed_size(kind: u32) -> Option<u64> {
    match kind {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn value<R: Read + Seek>(r: &mut Reader<R>, kind: u32, key: &str) -> Result<MetaValue, ParseError> {
    Ok(match kind {
        0 => MetaValue::Int(r.bytes::<1>()?[0].into()),
        1 => MetaValue::Int(i8::from_le_bytes(r.bytes()?).into()),
        2 => MetaValue::Int(u16::from_le_bytes(r.bytes()?).into()),
        3 => MetaValue::Int(i16::from_le_bytes(r.bytes()?).into()),
        4 => MetaValue::Int(r.u32()?.into()),
        5 => MetaValue::Int(i32::from_le_bytes(r.bytes()?).into()),
        6 => MetaValue::Float(f32::from_le_bytes(r.bytes()?).into()),
        7 => MetaValue::Bool(r.bytes::<1>()?[0] != 0),
        8 => MetaValue::Str(r.string()?),
        9 => {
            let elem_type = r.u32()?;
            let len = r.u64()?;
            match (elem_type, fixed_size(elem_type)) {
                (_, Some(size)) => {
                    let bytes = len
                        .checked_mul(size)
                        .ok_or_else(|| bad(format!("array `{key}` of {len} values is too long")))?;
                    r.skip(bytes, "an array")?;
                }
                (8, None) => {
                    r.check_count(len, 8, &format!("strings in array `{key}`"))?;
                    for _ in 0..len {
                        let n = r.u64()?;
                        r.skip(n, "a string")?;
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "array `{key}` holds values of type {elem_type}, which GGUF does not allow in arrays here"
                    )));
                }
            }
            MetaValue::Array { elem_type, len }
        }
        10 => MetaValue::Int(r.u64()?.into()),
        11 => MetaValue::Int(i64::from_le_bytes(r.bytes()?).into()),
        12 => MetaValue::Float(f64::from_le_bytes(r.bytes()?)),
        other => return Err(bad(format!("`{key}` has unknown value type {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF header with the given metadata, as bytes.
    fn header(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((kvs.len() as u64).to_le_bytes());
        for (key, kind, value) in kvs {
            out.extend((key.len() as u64).to_le_bytes());
            out.extend(key.as_bytes());
            out.extend(kind.to_le_bytes());
            out.extend(value);
        }
        out
    }

    fn string(s: &str) -> Vec<u8> {
        let mut out = (s.len() as u64).to_le_bytes().to_vec();
        out.extend(s.as_bytes());
        out
    }

    fn read(bytes: &[u8]) -> Result<GgufHeader, String> {
        let mut r = Reader {
            inner: std::io::Cursor::new(bytes),
            len: bytes.len() as u64,
            left: bytes.len() as u64,
        };
        parse(&mut r).map_err(|e| match e {
            ParseError::Io(e) => e.to_string(),
            ParseError::Format(reason) => reason,
        })
    }

    #[test]
    fn reads_scalars_and_walks_past_arrays() {
        let mut tokens = 8u32.to_le_bytes().to_vec();
        tokens.extend(2u64.to_le_bytes());
        tokens.extend(string("<s>"));
        tokens.extend(string("hello"));
        let mut scores = 6u32.to_le_bytes().to_vec();
        scores.extend(3u64.to_le_bytes());
        scores.extend([0u8; 12]);
        let h = read(&header(&[
            ("general.architecture", 8, string("qwen3")),
            ("tokenizer.ggml.tokens", 9, tokens),
            ("qwen3.block_count", 4, 28u32.to_le_bytes().to_vec()),
            ("tokenizer.ggml.scores", 9, scores),
            ("qwen3.rope.freq_base", 6, 1e6f32.to_le_bytes().to_vec()),
            ("qwen3.context_length", 10, 40960u64.to_le_bytes().to_vec()),
        ]))
        .unwrap();
        assert_eq!(h.architecture(), Some("qwen3"));
        assert_eq!(h.arch_usize("block_count"), Some(28));
        assert_eq!(h.arch_usize("context_length"), Some(40960));
        assert_eq!(
            h.metadata.get("qwen3.rope.freq_base"),
            Some(&MetaValue::Float(1e6))
        );
        assert_eq!(
            h.metadata.get("tokenizer.ggml.tokens"),
            Some(&MetaValue::Array {
                elem_type: 8,
                len: 2
            })
        );
        assert_eq!(
            h.metadata.get("tokenizer.ggml.scores"),
            Some(&MetaValue::Array {
                elem_type: 6,
                len: 3
            })
        );
    }

    #[test]
    fn refuses_what_is_not_gguf_or_is_cut_short() {
        assert!(read(b"GGML\x03\0\0\0").unwrap_err().contains("magic"));
        let mut v1 = header(&[]);
        v1[4] = 1;
        assert!(read(&v1).unwrap_err().contains("version 1"));
        let full = header(&[("general.architecture", 8, string("llama"))]);
        for cut in 0..full.len() {
            assert!(read(&full[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn huge_declared_lengths_are_refused_before_allocating() {
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend(b"x");
        let err = read(&header(&[("general.name", 8, huge)])).unwrap_err();
        assert!(err.contains("past the end"), "{err}");
        let mut array = 6u32.to_le_bytes().to_vec();
        array.extend(u64::MAX.to_le_bytes());
        let err = read(&header(&[("a", 9, array)])).unwrap_err();
        assert!(err.contains("too long"), "{err}");
        let err = read(&header(&[("a", 13, vec![0; 8])])).unwrap_err();
        assert!(err.contains("unknown value type 13"), "{err}");
    }

    /// One tensor info entry: name, dims, ggml type, data offset.
    fn tensor(name: &str, dims: &[u64], ggml_type: u32, offset: u64) -> Vec<u8> {
        let mut out = string(name);
        out.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(ggml_type.to_le_bytes());
        out.extend(offset.to_le_bytes());
        out
    }

    /// A whole file: `header` with its tensor count set, the tensor table,
    /// padding to 32 bytes and `data` zero bytes of tensor data.
    fn file(header: Vec<u8>, tensors: &[Vec<u8>], data: usize) -> Vec<u8> {
        let mut out = header;
        out[8..16].copy_from_slice(&(tensors.len() as u64).to_le_bytes());
        for t in tensors {
            out.extend(t);
        }
        out.resize(out.len().div_ceil(32) * 32 + data, 0);
        out
    }

    #[test]
    fn reads_the_tensor_table() {
        let bytes = file(
            header(&[("general.architecture", 8, string("llama"))]),
            &[
                tensor("token_embd.weight", &[8, 4], 0, 0),
                tensor("blk.0.attn_q.weight", &[64, 2], 3, 128),
                tensor("blk.0.ffn_up.weight", &[256], 14, 224),
            ],
            224 + 210,
        );
        let h = read(&bytes).unwrap();
        assert_eq!(h.tensor_count, 3);
        assert_eq!(h.data_offset % 32, 0);
        assert_eq!(h.data_offset as usize, bytes.len() - 434);
        let t = &h.tensors[1];
        assert_eq!(t.name, "blk.0.attn_q.weight");
        assert_eq!(t.dims, [64, 2]);
        assert_eq!(t.ggml_type, GgmlType::Q4_1);
        assert_eq!(t.offset, 128);
        assert_eq!(t.bytes(), Some(4 * 20));
        assert_eq!(h.tensors[2].ggml_type.to_string(), "Q6_K");
        assert_eq!(h.parameter_count(), 32 + 128 + 256);
        assert_eq!(h.tensor_data_bytes(), Some(128 + 80 + 210));
    }

    #[test]
    fn an_unknown_tensor_type_is_kept_by_number_not_sized() {
        let bytes = file(
            header(&[]),
            &[tensor("a", &[32], 8, 0), tensor("b", &[32, 3], 20, 64)],
            64 + 100,
        );
        let h = read(&bytes).unwrap();
        assert_eq!(h.tensors[1].ggml_type, GgmlType(20));
        assert_eq!(h.tensors[1].ggml_type.to_string(), "unknown type 20");
        assert_eq!(h.tensors[1].bytes(), None);
        assert_eq!(h.tensors[0].bytes(), Some(34));
        assert_eq!(h.parameter_count(), 32 + 96);
        assert_eq!(h.tensor_data_bytes(), None);
    }

    #[test]
    fn a_file_cut_anywhere_is_an_error() {
        let full = file(
            header(&[("general.architecture", 8, string("llama"))]),
            &[
                tensor("token_embd.weight", &[8, 4], 0, 0),
                tensor("output.weight", &[32, 4], 8, 128),
            ],
            128 + 4 * 34,
        );
        assert!(read(&full).is_ok());
        for cut in 0..full.len() {
            assert!(read(&full[..cut]).is_err(), "cut at {cut}");
        }
        let err = read(&full[..full.len() - 1]).unwrap_err();
        assert!(
            err.contains("`output.weight`") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn absurd_counts_and_shapes_are_refused_before_allocating() {
        let mut many_tensors = header(&[]);
        many_tensors[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let err = read(&many_tensors).unwrap_err();
        assert!(err.contains("declares") && err.contains("tensors"), "{err}");

        let mut many_kvs = header(&[]);
        many_kvs[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let err = read(&many_kvs).unwrap_err();
        assert!(err.contains("metadata entries"), "{err}");

        let mut strings = 8u32.to_le_bytes().to_vec();
        strings.extend(u64::MAX.to_le_bytes());
        let err = read(&header(&[("tokenizer.ggml.tokens", 9, strings)])).unwrap_err();
        assert!(
            err.contains("strings in array `tokenizer.ggml.tokens`"),
            "{err}"
        );

        let cases: [(Vec<u8>, &str); 6] = [
            (tensor("x", &[1, 1, 1, 1, 1], 0, 0), "5 dimensions"),
            (tensor("x", &[u64::MAX, 2], 0, 0), "too many values"),
            (tensor("x", &[1 << 32, 1 << 31], 0, 0), "too many values"),
            (
                tensor("x", &[33], 3, 0),
                "not a whole number of Q4_1 blocks",
            ),
            (tensor("x", &[4], 0, 8), "not a multiple of the alignment"),
            (tensor("x", &[4], 0, u64::MAX - 31), "runs past the end"),
        ];
        for (entry, want) in cases {
            let err = read(&file(header(&[]), &[entry], 64)).unwrap_err();
            assert!(err.contains(want), "want {want:?}: {err}");
        }
        let mut long_name = u64::MAX.to_le_bytes().to_vec();
        long_name.extend([0; 24]);
        let err = read(&file(header(&[]), &[long_name], 0)).unwrap_err();
        assert!(err.contains("past the end"), "{err}");
    }

    #[test]
    fn alignment_comes_from_the_metadata() {
        let int = |n: u32| n.to_le_bytes().to_vec();
        let mut bytes = header(&[("general.alignment", 4, int(64))]);
        bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
        bytes.extend(tensor("x", &[4], 0, 0));
        let data_offset = bytes.len().div_ceil(64) * 64;
        bytes.resize(data_offset + 16, 0);
        let h = read(&bytes).unwrap();
        assert_eq!(h.data_offset as usize, data_offset);
        let err = read(&header(&[("general.alignment", 4, int(48))])).unwrap_err();
        assert!(err.contains("power of two"), "{err}");
    }

    #[test]
    fn kv_bytes_per_token_reads_head_widths_from_the_file() {
        let int = |n: u32| n.to_le_bytes().to_vec();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        // Llama shape: head width is embedding_length / head_count.
        std::fs::write(
            &path,
            header(&[
                ("general.architecture", 8, string("llama")),
                ("llama.block_count", 4, int(30)),
                ("llama.embedding_length", 4, int(576)),
                ("llama.attention.head_count", 4, int(9)),
                ("llama.attention.head_count_kv", 4, int(3)),
            ]),
        )
        .unwrap();
        let f32_bytes = crate::kv_bytes_per_token(&path, crate::KvDtype::F32).unwrap();
        assert_eq!(f32_bytes, 30 * 2 * 3 * 64 * 4);
        let f16_bytes = crate::kv_bytes_per_token(&path, crate::KvDtype::F16).unwrap();
        assert_eq!(f16_bytes * 2, f32_bytes);
        // Qwen3 shape: key_length is not embedding_length / head_count.
        std::fs::write(
            &path,
            header(&[
                ("general.architecture", 8, string("qwen3")),
                ("qwen3.block_count", 4, int(28)),
                ("qwen3.embedding_length", 4, int(1024)),
                ("qwen3.attention.head_count", 4, int(16)),
                ("qwen3.attention.head_count_kv", 4, int(8)),
                ("qwen3.attention.key_length", 4, int(128)),
                ("qwen3.attention.value_length", 4, int(128)),
            ]),
        )
        .unwrap();
        let bytes = crate::kv_bytes_per_token(&path, crate::KvDtype::F32).unwrap();
        assert_eq!(bytes, 28 * 8 * (128 + 128) * 4);
        // Hostile dimensions are an error, not an overflow.
        let huge = u64::MAX.to_le_bytes().to_vec();
        std::fs::write(
            &path,
            header(&[
                ("general.architecture", 8, string("llama")),
                ("llama.block_count", 10, huge.clone()),
                ("llama.attention.head_count", 10, huge.clone()),
                ("llama.attention.key_length", 10, huge),
            ]),
        )
        .unwrap();
        let err = crate::kv_bytes_per_token(&path, crate::KvDtype::F32).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
        let err = crate::kv_bytes_per_token(dir.path(), crate::KvDtype::F32).unwrap_err();
        assert!(err.to_string().contains("GGUF headers only"), "{err}");
    }
}
