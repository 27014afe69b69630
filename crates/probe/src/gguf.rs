//! A GGUF file's header: its metadata keys and scalar values and its tensor
//! table (names, shapes, types, offsets), read without touching the tensor
//! data (or linking a tensor library), for memory estimates and listings
//! made before any model is loaded.
//!
//! Arrays (the tokenizer's vocabulary, merges, scores; per-layer settings)
//! are walked past while the header is read, and only their element type,
//! length and file offset kept, so [`read_header`] stays cheap; the typed
//! getters ([`GgufHeader::strings`], [`GgufHeader::ints`], ...) read one
//! array's values on demand. Every declared count and length is checked
//! against the bytes left in the file before anything is read or allocated,
//! and every tensor of a known type must lie inside the file, so a
//! truncated, corrupt or hostile file is a [`HeaderError`], never a panic or
//! a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
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

/// The environment variable that raises [`Limits::metadata_bytes`] (a
/// number of MiB), for a file with a larger header than any this reader
/// has met; the other limits scale with it.
pub const METADATA_LIMIT_ENV: &str = "ZINFER_GGUF_METADATA_MIB";

/// How much of a GGUF header the reader takes: past these a file is
/// refused before its header is held in memory, so a file of millions of
/// empty strings or a key of gigabytes cannot push a process past its
/// memory. The defaults are several times the largest real files' (Gemma
/// 3's 262,144-token vocabulary, Llama 3's 280,147 merges, templates of
/// tens of KiB, MoE tables of a few thousand tensors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes from the file's start to the end of the tensor table.
    pub metadata_bytes: u64,
    /// Metadata entries.
    pub entries: u64,
    /// Tensors in the table.
    pub tensors: u64,
    /// Elements of one array.
    pub array_len: u64,
    /// Bytes of one string (key, value or array element).
    pub string_bytes: u64,
}

impl Limits {
    /// Default [`Limits::metadata_bytes`]: 64 MiB.
    pub const METADATA_BYTES: u64 = 64 << 20;
    /// Default [`Limits::entries`].
    pub const ENTRIES: u64 = 1 << 16;
    /// Default [`Limits::tensors`].
    pub const TENSORS: u64 = 1 << 16;
    /// Default [`Limits::array_len`].
    pub const ARRAY_LEN: u64 = 1 << 20;
    /// Default [`Limits::string_bytes`]: 1 MiB.
    pub const STRING_BYTES: u64 = 1 << 20;

    /// The defaults, scaled up by `factor` (at least 1).
    pub fn scaled(factor: u64) -> Self {
        let f = factor.max(1);
        Self {
            metadata_bytes: Self::METADATA_BYTES.saturating_mul(f),
            entries: Self::ENTRIES.saturating_mul(f),
            tensors: Self::TENSORS.saturating_mul(f),
            array_len: Self::ARRAY_LEN.saturating_mul(f),
            string_bytes: Self::STRING_BYTES.saturating_mul(f),
        }
    }

    /// The defaults, or, when [`METADATA_LIMIT_ENV`] names more MiB than
    /// the default 64, all limits raised in that proportion. A value that
    /// is not a number is ignored with a warning.
    pub fn from_env() -> Self {
        let Ok(text) = std::env::var(METADATA_LIMIT_ENV) else {
            return Self::default();
        };
        match text.trim().parse::<u64>() {
            Ok(mib) => Self::scaled(mib.div_ceil(Self::METADATA_BYTES >> 20)),
            Err(_) => {
                tracing::warn!(
                    value = %text,
                    "{METADATA_LIMIT_ENV} is not a number of MiB; using the default GGUF limits"
                );
                Self::default()
            }
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::scaled(1)
    }
}

/// Why a header (or one of its arrays) could not be read.
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
        /// What is wrong, at which key or tensor.
        reason: FormatError,
    },
    /// A directory was given where only a GGUF file's header says enough.
    #[error("{path}: KV size is read from GGUF headers only")]
    NotGguf {
        /// The directory.
        path: PathBuf,
    },
    /// The header does not give a usable KV shape.
    #[error("{path}: {reason}")]
    Shape {
        /// The file.
        path: PathBuf,
        /// Which dimension is missing or too large.
        reason: crate::ShapeError,
    },
}

/// What is wrong with a GGUF file's bytes.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file (no `GGUF` magic)")]
    NoMagic,
    /// A GGUF version this reader does not know.
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    Version(u32),
    /// A value, string or array ends past the end of the file.
    #[error(
        "{what} of {bytes} bytes runs past the end of the file ({left} left): truncated or not GGUF"
    )]
    PastEnd {
        /// What was being read (`a string`, `an array`).
        what: &'static str,
        /// Its declared size.
        bytes: u64,
        /// Bytes the file had left.
        left: u64,
    },
    /// A declared count could not fit in the bytes left.
    #[error(
        "the header declares {count} {what}, more than the {left} bytes left could hold: truncated or not GGUF"
    )]
    TooMany {
        /// The declared count.
        count: u64,
        /// What was counted.
        what: Counted,
        /// Bytes the file had left.
        left: u64,
    },
    /// A length past what a seek can address.
    #[error("{0} is too long")]
    TooLong(&'static str),
    /// An array whose byte size overflows 64 bits.
    #[error("array `{key}` of {len} values is too long")]
    ArrayTooLong {
        /// Its metadata key.
        key: String,
        /// Its declared length.
        len: u64,
    },
    /// An array of a type GGUF does not allow as an element.
    #[error(
        "array `{key}` holds values of type {elem_type}, which GGUF does not allow in arrays here"
    )]
    ArrayElement {
        /// Its metadata key.
        key: String,
        /// The element type code.
        elem_type: u32,
    },
    /// A metadata value of an unknown type.
    #[error("`{key}` has unknown value type {kind}")]
    UnknownType {
        /// Its metadata key.
        key: String,
        /// The type code.
        kind: u32,
    },
    /// `general.alignment` is not a usable boundary.
    #[error("`general.alignment` is {0:?}, not a power of two up to {MAX_ALIGNMENT}")]
    Alignment(MetaValue),
    /// A tensor with more dimensions than ggml allows.
    #[error("tensor `{tensor}` has {dims} dimensions; ggml allows at most {MAX_DIMS}")]
    TooManyDims {
        /// The tensor's name.
        tensor: String,
        /// Its declared dimension count.
        dims: u32,
    },
    /// A tensor whose value count overflows.
    #[error("tensor `{0}` has too many values")]
    TooManyValues(String),
    /// A quantized tensor whose rows are not whole blocks.
    #[error(
        "tensor `{tensor}`: its first dimension {first} is not a whole number of {ggml_type} blocks ({per_block} values)"
    )]
    PartialBlock {
        /// The tensor's name.
        tensor: String,
        /// Its first (innermost) dimension.
        first: u64,
        /// Its type.
        ggml_type: GgmlType,
        /// Values per block of that type.
        per_block: u64,
    },
    /// A tensor that does not start on the alignment.
    #[error(
        "tensor `{tensor}` starts at data offset {offset}, not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        /// The tensor's name.
        tensor: String,
        /// Its data offset.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose data ends past the end of the file.
    #[error(
        "tensor `{tensor}` ({bytes} bytes at data offset {offset}) runs past the end of the file ({file_len} bytes): truncated"
    )]
    TensorPastEnd {
        /// The tensor's name.
        tensor: String,
        /// Its data's size.
        bytes: u64,
        /// Its data offset.
        offset: u64,
        /// The file's size.
        file_len: u64,
    },
    /// A count or size past one of the reader's [`Limits`].
    #[error(
        "{what} is {value}, past the limit of {limit} (raise the limits with {METADATA_LIMIT_ENV}=<MiB> if the file is genuine)"
    )]
    Limit {
        /// What was measured, naming the key or tensor.
        what: String,
        /// Its declared value.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// A metadata key that appears twice.
    #[error("metadata key `{0}` appears twice")]
    DuplicateKey(String),
    /// A tensor name that appears twice.
    #[error("tensor `{0}` appears twice in the tensor table")]
    DuplicateTensor(String),
    /// Two tensors whose data overlap.
    #[error(
        "tensor `{tensor}` (data offset {offset}) overlaps `{previous}`, which ends at data offset {previous_end}"
    )]
    Overlap {
        /// The later tensor.
        tensor: String,
        /// Its data offset.
        offset: u64,
        /// The tensor it overlaps.
        previous: String,
        /// Where that one's data ends.
        previous_end: u64,
    },
    /// Unused bytes before a tensor, more than alignment padding.
    #[error(
        "tensor `{tensor}` starts at data offset {offset}, {gap} bytes after the data before it: its type or dimensions do not match the bytes written"
    )]
    Gap {
        /// The tensor after the gap.
        tensor: String,
        /// Its data offset.
        offset: u64,
        /// Unused bytes before it.
        gap: u64,
    },
    /// Unused bytes after the last tensor, more than alignment padding.
    #[error(
        "{bytes} bytes follow the last tensor `{tensor}`: a tensor's type or dimensions do not match the bytes written"
    )]
    Trailing {
        /// The last tensor.
        tensor: String,
        /// Bytes after it.
        bytes: u64,
    },
    /// A typed getter asked for an array, and the key holds a scalar.
    #[error("`{key}` is a single {found}, not an array of {want}")]
    NotArray {
        /// The metadata key.
        key: String,
        /// What the getter reads.
        want: &'static str,
        /// The scalar's kind.
        found: &'static str,
    },
    /// A typed getter asked for elements of another type.
    #[error("array `{key}` holds {found} values, not {want}")]
    ElementType {
        /// The metadata key.
        key: String,
        /// What the getter reads.
        want: &'static str,
        /// The array's element type.
        found: ValueType,
    },
    /// An integer element outside the getter's range.
    #[error("array `{key}`: value {value} at index {index} does not fit {want}")]
    OutOfRange {
        /// The metadata key.
        key: String,
        /// The element's index.
        index: u64,
        /// The element.
        value: i128,
        /// What the getter reads.
        want: &'static str,
    },
}

/// What a declared count counts, for [`FormatError::TooMany`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counted {
    /// Metadata entries.
    MetadataEntries,
    /// Tensor infos.
    Tensors,
    /// Strings in the array at this key.
    Strings(String),
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MetadataEntries => f.write_str("metadata entries"),
            Self::Tensors => f.write_str("tensors"),
            Self::Strings(key) => write!(f, "strings in array `{key}`"),
        }
    }
}

/// A GGUF metadata value type code (`8` = string, `6` = f32, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ValueType(pub u32);

impl ValueType {
    /// 32-bit signed integer.
    pub const I32: Self = Self(5);
    /// 32-bit float.
    pub const F32: Self = Self(6);
    /// Boolean (one byte).
    pub const BOOL: Self = Self(7);
    /// Length-prefixed UTF-8 string.
    pub const STRING: Self = Self(8);
    /// 64-bit float.
    pub const F64: Self = Self(12);

    /// The GGUF name of the type (`u8`, `string`), or `None` for an unknown
    /// code.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "u8",
            1 => "i8",
            2 => "u16",
            3 => "i16",
            4 => "u32",
            5 => "i32",
            6 => "f32",
            7 => "bool",
            8 => "string",
            9 => "array",
            10 => "u64",
            11 => "i64",
            12 => "f64",
            _ => return None,
        })
    }

    /// Bytes of one value of a fixed-size type; `None` for strings, arrays
    /// and unknown codes.
    fn fixed_size(self) -> Option<u64> {
        match self.0 {
            0 | 1 | 7 => Some(1),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        }
    }

    /// Whether this is one of the integer types.
    fn is_integer(self) -> bool {
        matches!(self.0, 0..=5 | 10 | 11)
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        name_or_code(f, self.name(), self.0)
    }
}

/// A type code's name, or `unknown type N` for one this reader does not know.
fn name_or_code(
    f: &mut std::fmt::Formatter<'_>,
    name: Option<&str>,
    code: u32,
) -> std::fmt::Result {
    match name {
        Some(name) => f.write_str(name),
        None => write!(f, "unknown type {code}"),
    }
}

/// One scalar metadata value, or where an array is.
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
    /// An array: its values are walked past when the header is read, so
    /// only what they are, how many and where is kept (a vocabulary's size
    /// without holding the vocabulary); the typed getters read them.
    Array {
        /// Type of the elements.
        elem_type: ValueType,
        /// Element count.
        len: u64,
        /// Absolute file offset of the first element.
        offset: u64,
    },
}

impl MetaValue {
    /// What kind of value this is, for errors.
    fn kind(&self) -> &'static str {
        match self {
            Self::Int(_) => "integer",
            Self::Float(_) => "float",
            Self::Bool(_) => "bool",
            Self::Str(_) => "string",
            Self::Array { .. } => "array",
        }
    }
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
            20 => (32, 18),
            23 => (256, 136),
            39 => (32, 17),
            _ => return None,
        })
    }

    /// The ggml name (`Q4_K`) of a type ggml numbers (sized or not).
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
            20 => "IQ4_NL",
            23 => "IQ4_XS",
            30 => "BF16",
            39 => "MXFP4",
            // Named, not sized: refused by name.
            9 => "Q8_1",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            21 => "IQ3_S",
            22 => "IQ2_S",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            34 => "TQ1_0",
            35 => "TQ2_0",
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
        name_or_code(f, self.name(), self.0)
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
    /// The file the header was read from, where the array getters read.
    pub path: PathBuf,
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

    /// The strings of an array value (`tokenizer.ggml.tokens`,
    /// `tokenizer.ggml.merges`), read from the file now; `None` when the key
    /// is absent.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<String>>, HeaderError> {
        self.read_array(
            key,
            "strings",
            |t| t == ValueType::STRING,
            |r, _| r.string(key),
        )
    }

    /// An array of integers of any GGUF integer type, widened to i64
    /// (per-layer head counts); `None` when the key is absent.
    pub fn ints(&self, key: &str) -> Result<Option<Vec<i64>>, HeaderError> {
        self.integers(key, "integers")
    }

    /// An array of integers that each fit i32 (scores some converters
    /// write as integers); `None` when the key is absent.
    pub fn i32s(&self, key: &str) -> Result<Option<Vec<i32>>, HeaderError> {
        self.integers(key, "i32 integers")
    }

    /// An array of f32 or f64 values, as f32 (`tokenizer.ggml.scores`);
    /// `None` when the key is absent.
    pub fn floats(&self, key: &str) -> Result<Option<Vec<f32>>, HeaderError> {
        self.read_array(
            key,
            "floats",
            |t| t == ValueType::F32 || t == ValueType::F64,
            |r, t| {
                Ok(if t == ValueType::F64 {
                    f64::from_le_bytes(r.bytes()?) as f32
                } else {
                    f32::from_le_bytes(r.bytes()?)
                })
            },
        )
    }

    /// An array of booleans (a per-layer sliding-window pattern); `None`
    /// when the key is absent.
    pub fn bools(&self, key: &str) -> Result<Option<Vec<bool>>, HeaderError> {
        self.read_array(
            key,
            "bools",
            |t| t == ValueType::BOOL,
            |r, _| Ok(r.bytes::<1>()?[0] != 0),
        )
    }

    /// An integer array converted element by element to `T`.
    fn integers<T: TryFrom<i128>>(
        &self,
        key: &str,
        want: &'static str,
    ) -> Result<Option<Vec<T>>, HeaderError> {
        let mut index = 0u64;
        self.read_array(key, want, ValueType::is_integer, |r, t| {
            let value = r.int(t)?;
            let converted = T::try_from(value).map_err(|_| FormatError::OutOfRange {
                key: key.to_string(),
                index,
                value,
                want,
            });
            index += 1;
            Ok(converted?)
        })
    }

    /// Reads the array at `key` from the file, each element with `element`,
    /// after checking that its elements are ones `accepts` takes and that
    /// it fits in what the file now holds.
    fn read_array<T>(
        &self,
        key: &str,
        want: &'static str,
        accepts: fn(ValueType) -> bool,
        mut element: impl FnMut(&mut Reader<BufReader<File>>, ValueType) -> Result<T, ParseError>,
    ) -> Result<Option<Vec<T>>, HeaderError> {
        let (elem_type, len, offset) = match self.metadata.get(key) {
            None => return Ok(None),
            Some(MetaValue::Array {
                elem_type,
                len,
                offset,
            }) => (*elem_type, *len, *offset),
            Some(other) => {
                return Err(header_error(
                    &self.path,
                    FormatError::NotArray {
                        key: key.to_string(),
                        want,
                        found: other.kind(),
                    }
                    .into(),
                ));
            }
        };
        let mut read = || -> Result<Vec<T>, ParseError> {
            if !accepts(elem_type) {
                return Err(FormatError::ElementType {
                    key: key.to_string(),
                    want,
                    found: elem_type,
                }
                .into());
            }
            let mut file = File::open(&self.path)?;
            let file_len = file.metadata()?.len();
            file.seek(SeekFrom::Start(offset))?;
            let mut r = Reader {
                inner: BufReader::new(file),
                len: file_len,
                left: file_len.saturating_sub(offset),
                limits: Limits::scaled(u64::MAX),
            };
            match elem_type.fixed_size() {
                Some(size) => {
                    let bytes = len
                        .checked_mul(size)
                        .ok_or_else(|| FormatError::ArrayTooLong {
                            key: key.to_string(),
                            len,
                        })?;
                    if bytes > r.left {
                        return Err(FormatError::PastEnd {
                            what: "an array",
                            bytes,
                            left: r.left,
                        }
                        .into());
                    }
                }
                None => r.check_count(len, 8, Counted::Strings(key.to_string()))?,
            }
            // Grown as elements are read: a count is only as good as the
            // bytes behind it.
            let mut out = Vec::new();
            for _ in 0..len {
                out.push(element(&mut r, elem_type)?);
            }
            Ok(out)
        };
        read().map(Some).map_err(|e| header_error(&self.path, e))
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

/// Reads the header and tensor table of the GGUF file at `path`, within
/// [`Limits::from_env`].
pub fn read_header(path: &Path) -> Result<GgufHeader, HeaderError> {
    read_header_with(path, Limits::from_env())
}

/// Reads the header and tensor table of the GGUF file at `path`, refusing
/// a file past `limits`.
pub fn read_header_with(path: &Path, limits: Limits) -> Result<GgufHeader, HeaderError> {
    let read = || -> Result<GgufHeader, ParseError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let mut reader = Reader {
            inner: BufReader::new(file),
            len,
            left: len,
            limits,
        };
        parse(&mut reader)
    };
    let mut header = read().map_err(|e| header_error(path, e))?;
    header.path = path.to_path_buf();
    Ok(header)
}

/// Reads a GGUF header from bytes in memory (a fuzzer's input) as
/// [`read_header_with`] reads a file's; the header has no path, so its
/// array getters cannot read.
pub fn parse_header(bytes: &[u8], limits: Limits) -> Result<GgufHeader, HeaderError> {
    let mut reader = Reader {
        inner: std::io::Cursor::new(bytes),
        len: bytes.len() as u64,
        left: bytes.len() as u64,
        limits,
    };
    parse(&mut reader).map_err(|e| header_error(Path::new(""), e))
}

/// A failure while reading, before the file's path is attached.
#[derive(Debug)]
enum ParseError {
    Io(std::io::Error),
    Format(FormatError),
}

impl From<std::io::Error> for ParseError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<FormatError> for ParseError {
    fn from(e: FormatError) -> Self {
        Self::Format(e)
    }
}

fn header_error(path: &Path, e: ParseError) -> HeaderError {
    let path = path.to_path_buf();
    match e {
        ParseError::Io(source) => HeaderError::Io { path, source },
        ParseError::Format(reason) => HeaderError::Format { path, reason },
    }
}

/// A reader that knows how many bytes the file has left, and how much of
/// a header it takes.
struct Reader<R> {
    inner: R,
    len: u64,
    left: u64,
    limits: Limits,
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

    /// One integer of GGUF type `kind`, widened; the caller has checked that
    /// `kind` is an integer type.
    fn int(&mut self, kind: ValueType) -> Result<i128, ParseError> {
        Ok(match kind.0 {
            0 => self.bytes::<1>()?[0].into(),
            1 => i8::from_le_bytes(self.bytes()?).into(),
            2 => u16::from_le_bytes(self.bytes()?).into(),
            3 => i16::from_le_bytes(self.bytes()?).into(),
            4 => self.u32()?.into(),
            5 => i32::from_le_bytes(self.bytes()?).into(),
            10 => self.u64()?.into(),
            _ => i64::from_le_bytes(self.bytes()?).into(),
        })
    }

    /// Fails unless `n` more bytes are in the file, and counts them as read.
    fn reserve(&mut self, n: u64, what: &'static str) -> Result<(), ParseError> {
        if n > self.left {
            return Err(FormatError::PastEnd {
                what,
                bytes: n,
                left: self.left,
            }
            .into());
        }
        self.left -= n;
        Ok(())
    }

    /// Fails unless `count` items of at least `min_bytes` each fit in the
    /// bytes left: a hostile count is refused before any loop or allocation.
    fn check_count(&self, count: u64, min_bytes: u64, what: Counted) -> Result<(), ParseError> {
        if count > self.left / min_bytes {
            return Err(FormatError::TooMany {
                count,
                what,
                left: self.left,
            }
            .into());
        }
        Ok(())
    }

    /// Bytes read so far.
    fn consumed(&self) -> u64 {
        self.len - self.left
    }

    /// Fails when `value` is past `limit`, naming `what`.
    fn limit(value: u64, limit: u64, what: impl FnOnce() -> String) -> Result<(), ParseError> {
        if value > limit {
            return Err(FormatError::Limit {
                what: what(),
                value,
                limit,
            }
            .into());
        }
        Ok(())
    }

    /// Fails once the header read so far is past its limit.
    fn check_consumed(&self) -> Result<(), ParseError> {
        Self::limit(self.consumed(), self.limits.metadata_bytes, || {
            "the GGUF header's size in bytes".to_string()
        })
    }

    /// A string's length, checked against the limit; `what` names it.
    fn string_len(&mut self, what: &str) -> Result<u64, ParseError> {
        let n = self.u64()?;
        Self::limit(n, self.limits.string_bytes, || {
            format!("the length of a string in {what}")
        })?;
        Ok(n)
    }

    /// A string; `what` names where it is (`metadata key`, `` `general.name` ``).
    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        let n = self.string_len(what)?;
        self.reserve(n, "a string")?;
        let mut buf = vec![0u8; n as usize];
        self.inner.read_exact(&mut buf)?;
        // Some writers pad strings with NULs; llama.cpp's and candle's
        // readers drop them, and `llama\0` must still name `llama`.
        while buf.last() == Some(&0) {
            buf.pop();
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    fn skip(&mut self, n: u64, what: &'static str) -> Result<(), ParseError> {
        self.reserve(n, what)?;
        let n = i64::try_from(n).map_err(|_| FormatError::TooLong(what))?;
        self.inner.seek_relative(n)?;
        Ok(())
    }
}

fn parse<R: Read + Seek>(r: &mut Reader<R>) -> Result<GgufHeader, ParseError> {
    if r.bytes::<4>()? != MAGIC {
        return Err(FormatError::NoMagic.into());
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(FormatError::Version(version).into());
    }
    let tensor_count = r.u64()?;
    let kv_count = r.u64()?;
    Reader::<R>::limit(kv_count, r.limits.entries, || {
        "the count of metadata entries".to_string()
    })?;
    Reader::<R>::limit(tensor_count, r.limits.tensors, || {
        "the count of tensors".to_string()
    })?;
    r.check_count(kv_count, MIN_KV_BYTES, Counted::MetadataEntries)?;
    let mut metadata = HashMap::new();
    for _ in 0..kv_count {
        let key = r.string("a metadata key")?;
        let kind = ValueType(r.u32()?);
        let value = value(r, kind, &key)?;
        r.check_consumed()?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(FormatError::DuplicateKey(key).into());
        }
    }
    r.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, Counted::Tensors)?;
    // Grown as entries are read, not reserved from the count: an entry in
    // memory is larger than its bytes in the file.
    let mut tensors = Vec::new();
    let mut names = std::collections::HashSet::new();
    for _ in 0..tensor_count {
        let t = tensor_info(r)?;
        r.check_consumed()?;
        if !names.insert(t.name.clone()) {
            return Err(FormatError::DuplicateTensor(t.name).into());
        }
        tensors.push(t);
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::Int(a)) if (1..=MAX_ALIGNMENT).contains(a) && a.count_ones() == 1 => {
            *a as u64
        }
        Some(other) => return Err(FormatError::Alignment(other.clone()).into()),
    };
    let data_offset = (r.len - r.left).div_ceil(alignment) * alignment;
    for t in &tensors {
        check_extent(t, data_offset, alignment, r.len)?;
    }
    check_layout(&tensors, alignment, r.len.saturating_sub(data_offset))?;
    Ok(GgufHeader {
        version,
        tensor_count,
        metadata,
        tensors,
        data_offset,
        path: PathBuf::new(),
    })
}

fn tensor_info<R: Read + Seek>(r: &mut Reader<R>) -> Result<TensorInfo, ParseError> {
    let name = r.string("a tensor name")?;
    let n_dims = r.u32()?;
    if n_dims > MAX_DIMS {
        return Err(FormatError::TooManyDims {
            tensor: name,
            dims: n_dims,
        }
        .into());
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    let mut elements = 1u64;
    for _ in 0..n_dims {
        let d = r.u64()?;
        elements = match elements
            .checked_mul(d)
            .filter(|&n| i64::try_from(n).is_ok())
        {
            Some(n) => n,
            None => return Err(FormatError::TooManyValues(name).into()),
        };
        dims.push(d);
    }
    let ggml_type = GgmlType(r.u32()?);
    let offset = r.u64()?;
    if let (Some((per_block, _)), Some(&first)) = (ggml_type.block(), dims.first())
        && !first.is_multiple_of(per_block)
    {
        return Err(FormatError::PartialBlock {
            tensor: name,
            first,
            ggml_type,
            per_block,
        }
        .into());
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
        return Err(FormatError::Misaligned {
            tensor: t.name.clone(),
            offset: t.offset,
            alignment,
        }
        .into());
    }
    let Some(bytes) = t.bytes() else {
        return Ok(());
    };
    let end = data_offset
        .checked_add(t.offset)
        .and_then(|start| start.checked_add(bytes));
    match end {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(FormatError::TensorPastEnd {
            tensor: t.name.clone(),
            bytes,
            offset: t.offset,
            file_len,
        }
        .into()),
    }
}

/// No two sized tensors share a byte: a file that points two weights at
/// the same data (or one into another) is not what its writer meant. And
/// when every tensor is sized, they tile the data section as GGUF writers
/// lay them out, each padded to the alignment: a larger gap means a
/// tensor's type or dimensions were changed to need fewer bytes than were
/// written for it.
fn check_layout(tensors: &[TensorInfo], alignment: u64, data_len: u64) -> Result<(), ParseError> {
    let mut extents: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter_map(|t| Some((t.offset, t.offset.checked_add(t.bytes()?)?, t.name.as_str())))
        .collect();
    let all_sized = extents.len() == tensors.len();
    extents.sort_unstable();
    let mut previous: Option<(u64, &str)> = None;
    for &(offset, end, tensor) in &extents {
        let (previous_end, previous_name) = previous.unwrap_or((0, ""));
        if offset < previous_end {
            return Err(FormatError::Overlap {
                tensor: tensor.to_string(),
                offset,
                previous: previous_name.to_string(),
                previous_end,
            }
            .into());
        }
        if all_sized && offset - previous_end >= alignment {
            return Err(FormatError::Gap {
                tensor: tensor.to_string(),
                offset,
                gap: offset - previous_end,
            }
            .into());
        }
        if end > previous_end {
            previous = Some((end, tensor));
        }
    }
    if let Some((end, tensor)) = previous
        && all_sized
        && data_len - end >= alignment
    {
        return Err(FormatError::Trailing {
            tensor: tensor.to_string(),
            bytes: data_len - end,
        }
        .into());
    }
    Ok(())
}

fn value<R: Read + Seek>(
    r: &mut Reader<R>,
    kind: ValueType,
    key: &str,
) -> Result<MetaValue, ParseError> {
    Ok(match kind {
        t if t.is_integer() => MetaValue::Int(r.int(t)?),
        ValueType::F32 => MetaValue::Float(f32::from_le_bytes(r.bytes()?).into()),
        ValueType::F64 => MetaValue::Float(f64::from_le_bytes(r.bytes()?)),
        ValueType::BOOL => MetaValue::Bool(r.bytes::<1>()?[0] != 0),
        ValueType::STRING => MetaValue::Str(r.string(&format!("`{key}`"))?),
        ValueType(9) => {
            let elem_type = ValueType(r.u32()?);
            let len = r.u64()?;
            Reader::<R>::limit(len, r.limits.array_len, || {
                format!("the length of array `{key}`")
            })?;
            let offset = r.len - r.left;
            match elem_type.fixed_size() {
                Some(size) => {
                    let bytes = len
                        .checked_mul(size)
                        .ok_or_else(|| FormatError::ArrayTooLong {
                            key: key.to_string(),
                            len,
                        })?;
                    r.skip(bytes, "an array")?;
                }
                None if elem_type == ValueType::STRING => {
                    r.check_count(len, 8, Counted::Strings(key.to_string()))?;
                    let what = format!("array `{key}`");
                    for _ in 0..len {
                        let n = r.string_len(&what)?;
                        r.skip(n, "a string")?;
                    }
                }
                None => {
                    return Err(FormatError::ArrayElement {
                        key: key.to_string(),
                        elem_type: elem_type.0,
                    }
                    .into());
                }
            }
            MetaValue::Array {
                elem_type,
                len,
                offset,
            }
        }
        other => {
            return Err(FormatError::UnknownType {
                key: key.to_string(),
                kind: other.0,
            }
            .into());
        }
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

    /// Parses `bytes` as a whole file. Every read is checked against the
    /// bytes left first, so a cursor never fails with an I/O error.
    fn read(bytes: &[u8]) -> Result<GgufHeader, FormatError> {
        read_with(bytes, Limits::default())
    }

    fn read_with(bytes: &[u8], limits: Limits) -> Result<GgufHeader, FormatError> {
        parse_header(bytes, limits).map_err(|e| match e {
            HeaderError::Format { reason, .. } => reason,
            other => panic!("a cursor read failed: {other}"),
        })
    }

    /// Why `bytes` are refused, as the message users see.
    fn refusal(bytes: &[u8]) -> String {
        match read(bytes) {
            Ok(_) => panic!("{} bytes were taken", bytes.len()),
            Err(e) => e.to_string(),
        }
    }

    /// Why `bytes` are refused with no limits: the checks against the
    /// file's size, which hold whatever the limits.
    fn unlimited_refusal(bytes: &[u8]) -> String {
        match read_with(bytes, Limits::scaled(u64::MAX)) {
            Ok(_) => panic!("{} bytes were taken", bytes.len()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn trailing_nuls_are_dropped_from_strings() {
        let mut tokens = 8u32.to_le_bytes().to_vec();
        tokens.extend(1u64.to_le_bytes());
        tokens.extend(string("<s>\0\0"));
        let (_dir, h) = on_disk(&header(&[
            ("general.architecture", 8, string("llama\0")),
            ("tokenizer.ggml.tokens", 9, tokens),
        ]));
        assert_eq!(h.architecture(), Some("llama"));
        assert_eq!(
            h.strings("tokenizer.ggml.tokens").unwrap().unwrap(),
            ["<s>"]
        );
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
        let bytes = header(&[
            ("general.architecture", 8, string("qwen3")),
            ("tokenizer.ggml.tokens", 9, tokens),
            ("qwen3.block_count", 4, 28u32.to_le_bytes().to_vec()),
            ("tokenizer.ggml.scores", 9, scores),
            ("qwen3.rope.freq_base", 6, 1e6f32.to_le_bytes().to_vec()),
            ("qwen3.context_length", 10, 40960u64.to_le_bytes().to_vec()),
        ]);
        let tokens_at = array_offset(&bytes, "tokenizer.ggml.tokens");
        let scores_at = array_offset(&bytes, "tokenizer.ggml.scores");
        let h = read(&bytes).unwrap();
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
                elem_type: ValueType::STRING,
                len: 2,
                offset: tokens_at,
            })
        );
        assert_eq!(
            h.metadata.get("tokenizer.ggml.scores"),
            Some(&MetaValue::Array {
                elem_type: ValueType::F32,
                len: 3,
                offset: scores_at,
            })
        );
    }

    /// Where the first element of the array at `key` lies in `bytes`: after
    /// the key, the value type, the element type and the length.
    fn array_offset(bytes: &[u8], key: &str) -> u64 {
        let at = bytes
            .windows(key.len())
            .position(|w| w == key.as_bytes())
            .unwrap();
        (at + key.len() + 4 + 4 + 8) as u64
    }

    /// An array value: element type, length, then the elements' bytes.
    fn array(elem_type: u32, len: u64, elements: &[Vec<u8>]) -> Vec<u8> {
        let mut out = elem_type.to_le_bytes().to_vec();
        out.extend(len.to_le_bytes());
        out.extend(elements.concat());
        out
    }

    /// `bytes` written to a temporary file and its header read back.
    fn on_disk(bytes: &[u8]) -> (tempfile::TempDir, GgufHeader) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).unwrap();
        let h = read_header(&path).unwrap();
        assert_eq!(h.path, path);
        (dir, h)
    }

    /// A file with one array of each kind the tokenizer and loaders read.
    fn arrays_file() -> Vec<u8> {
        let le = |n: i32| n.to_le_bytes().to_vec();
        header(&[
            ("general.architecture", 8, string("gemma3")),
            (
                "tokenizer.ggml.tokens",
                9,
                array(8, 3, &[string("<s>"), string("hé"), string("")]),
            ),
            ("tokenizer.ggml.merges", 9, array(8, 1, &[string("h é")])),
            (
                "tokenizer.ggml.token_type",
                9,
                array(5, 3, &[le(3), le(1), le(-1)]),
            ),
            (
                "tokenizer.ggml.scores",
                9,
                array(
                    6,
                    2,
                    &[
                        0.5f32.to_le_bytes().to_vec(),
                        (-2f32).to_le_bytes().to_vec(),
                    ],
                ),
            ),
            (
                "gemma3.swa_layers",
                9,
                array(7, 3, &[vec![1], vec![0], vec![2]]),
            ),
            (
                "gemma3.attention.head_count_kv",
                9,
                array(
                    4,
                    2,
                    &[8u32.to_le_bytes().to_vec(), 4u32.to_le_bytes().to_vec()],
                ),
            ),
            ("big", 9, array(10, 1, &[u64::MAX.to_le_bytes().to_vec()])),
            ("wide", 9, array(12, 1, &[1.25f64.to_le_bytes().to_vec()])),
            ("bytes", 9, array(1, 2, &[vec![0xff], vec![7]])),
            ("gemma3.block_count", 4, 2u32.to_le_bytes().to_vec()),
        ])
    }

    #[test]
    fn typed_getters_read_arrays_on_demand() {
        let (_dir, h) = on_disk(&arrays_file());
        assert_eq!(h.array_len("tokenizer.ggml.tokens"), Some(3));
        assert_eq!(
            h.strings("tokenizer.ggml.tokens").unwrap().unwrap(),
            ["<s>", "hé", ""]
        );
        assert_eq!(
            h.strings("tokenizer.ggml.merges").unwrap().unwrap(),
            ["h é"]
        );
        assert_eq!(
            h.i32s("tokenizer.ggml.token_type").unwrap().unwrap(),
            [3, 1, -1]
        );
        assert_eq!(
            h.floats("tokenizer.ggml.scores").unwrap().unwrap(),
            [0.5, -2.0]
        );
        assert_eq!(h.floats("wide").unwrap().unwrap(), [1.25]);
        assert_eq!(
            h.bools("gemma3.swa_layers").unwrap().unwrap(),
            [true, false, true]
        );
        assert_eq!(
            h.ints("gemma3.attention.head_count_kv").unwrap().unwrap(),
            [8, 4]
        );
        assert_eq!(
            h.i32s("gemma3.attention.head_count_kv").unwrap().unwrap(),
            [8, 4]
        );
        assert_eq!(h.ints("bytes").unwrap().unwrap(), [-1, 7]);
        assert!(h.strings("tokenizer.ggml.absent").unwrap().is_none());
        assert!(h.ints("absent").unwrap().is_none());
        assert!(h.floats("absent").unwrap().is_none());
        assert!(h.bools("absent").unwrap().is_none());
        assert!(h.i32s("absent").unwrap().is_none());
        // The cheap header still reads the scalars around the arrays.
        assert_eq!(h.arch_usize("block_count"), Some(2));
    }

    #[test]
    fn a_getter_of_the_wrong_type_is_a_typed_error() {
        let (_dir, h) = on_disk(&arrays_file());
        let format = |e: HeaderError| match e {
            HeaderError::Format { reason, .. } => reason,
            other => panic!("not a format error: {other}"),
        };
        let err = format(h.strings("tokenizer.ggml.scores").unwrap_err());
        assert!(
            matches!(&err, FormatError::ElementType { key, want: "strings", found: ValueType::F32 } if key == "tokenizer.ggml.scores"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "array `tokenizer.ggml.scores` holds f32 values, not strings"
        );
        let err = format(h.floats("tokenizer.ggml.tokens").unwrap_err());
        assert!(
            matches!(
                err,
                FormatError::ElementType {
                    found: ValueType::STRING,
                    ..
                }
            ),
            "{err}"
        );
        let err = format(h.ints("tokenizer.ggml.scores").unwrap_err());
        assert!(matches!(err, FormatError::ElementType { .. }), "{err}");
        let err = format(h.bools("gemma3.attention.head_count_kv").unwrap_err());
        assert!(matches!(err, FormatError::ElementType { .. }), "{err}");
        let err = format(h.ints("gemma3.block_count").unwrap_err());
        assert!(
            matches!(
                err,
                FormatError::NotArray {
                    found: "integer",
                    ..
                }
            ),
            "{err}"
        );
        let err = format(h.strings("general.architecture").unwrap_err());
        assert_eq!(
            err.to_string(),
            "`general.architecture` is a single string, not an array of strings"
        );
        let err = format(h.ints("big").unwrap_err());
        assert!(
            matches!(err, FormatError::OutOfRange { index: 0, value, .. } if value == u64::MAX.into()),
            "{err}"
        );
        let err = format(h.i32s("big").unwrap_err());
        assert!(err.to_string().contains("does not fit i32"), "{err}");
    }

    #[test]
    fn a_getter_on_a_file_cut_short_since_is_an_error() {
        let bytes = arrays_file();
        let (dir, h) = on_disk(&bytes);
        let path = dir.path().join("m.gguf");
        let tokens_at = array_offset(&bytes, "tokenizer.ggml.tokens") as usize;
        let scores_at = array_offset(&bytes, "tokenizer.ggml.scores") as usize;
        // Cut inside the last token and inside the second score.
        for (cut, key) in [
            (tokens_at + 8 + 3 + 8 + 2, "tokenizer.ggml.tokens"),
            (scores_at + 6, "tokenizer.ggml.scores"),
        ] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let err = if key == "tokenizer.ggml.tokens" {
                h.strings(key).map(|_| ())
            } else {
                h.floats(key).map(|_| ())
            }
            .unwrap_err();
            assert!(
                matches!(
                    err,
                    HeaderError::Format {
                        reason: FormatError::PastEnd { .. } | FormatError::TooMany { .. },
                        ..
                    }
                ),
                "{key}: {err}"
            );
        }
        std::fs::remove_file(&path).unwrap();
        let err = h.strings("tokenizer.ggml.merges").unwrap_err();
        assert!(matches!(err, HeaderError::Io { .. }), "{err}");
    }

    #[test]
    fn refuses_what_is_not_gguf_or_is_cut_short() {
        assert!(matches!(read(b"GGML\x03\0\0\0"), Err(FormatError::NoMagic)));
        let mut v1 = header(&[]);
        v1[4] = 1;
        assert!(matches!(read(&v1), Err(FormatError::Version(1))));
        assert!(refusal(&v1).contains("version 1"));
        let full = header(&[("general.architecture", 8, string("llama"))]);
        for cut in 0..full.len() {
            assert!(read(&full[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn huge_declared_lengths_are_refused_before_allocating() {
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend(b"x");
        let err = unlimited_refusal(&header(&[("general.name", 8, huge)]));
        assert!(err.contains("past the end"), "{err}");
        let mut array = 6u32.to_le_bytes().to_vec();
        array.extend(u64::MAX.to_le_bytes());
        let err = unlimited_refusal(&header(&[("a", 9, array)]));
        assert!(err.contains("too long"), "{err}");
        let err = unlimited_refusal(&header(&[("a", 13, vec![0; 8])]));
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
            &[tensor("a", &[32], 8, 0), tensor("b", &[32, 3], 99, 64)],
            64 + 100,
        );
        let h = read(&bytes).unwrap();
        assert_eq!(h.tensors[1].ggml_type, GgmlType(99));
        assert_eq!(h.tensors[1].ggml_type.to_string(), "unknown type 99");
        // A type ggml numbers but this reader does not size: named, unsized.
        assert_eq!(GgmlType(16).to_string(), "IQ2_XXS");
        assert_eq!(GgmlType(16).bytes_for(256), None);
        assert_eq!(GgmlType(23).bytes_for(512), Some(2 * 136));
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
        let err = refusal(&full[..full.len() - 1]);
        assert!(
            err.contains("`output.weight`") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn absurd_counts_and_shapes_are_refused_before_allocating() {
        let mut many_tensors = header(&[]);
        many_tensors[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let err = unlimited_refusal(&many_tensors);
        assert!(err.contains("declares") && err.contains("tensors"), "{err}");

        let mut many_kvs = header(&[]);
        many_kvs[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let err = unlimited_refusal(&many_kvs);
        assert!(err.contains("metadata entries"), "{err}");

        let mut strings = 8u32.to_le_bytes().to_vec();
        strings.extend(u64::MAX.to_le_bytes());
        let err = unlimited_refusal(&header(&[("tokenizer.ggml.tokens", 9, strings)]));
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
            let err = unlimited_refusal(&file(header(&[]), &[entry], 64));
            assert!(err.contains(want), "want {want:?}: {err}");
        }
        let mut long_name = u64::MAX.to_le_bytes().to_vec();
        long_name.extend([0; 24]);
        let err = unlimited_refusal(&file(header(&[]), &[long_name], 0));
        assert!(err.contains("past the end"), "{err}");
    }

    #[test]
    fn limits_refuse_large_headers_by_name_and_can_be_raised() {
        let small = Limits {
            metadata_bytes: 4096,
            entries: 4,
            tensors: 2,
            array_len: 3,
            string_bytes: 16,
        };
        let refused = |bytes: &[u8]| match read_with(bytes, small) {
            Ok(_) => panic!("taken"),
            Err(e) => e.to_string(),
        };
        let long = string(&"x".repeat(17));
        let err = refused(&header(&[("general.name", 8, long.clone())]));
        assert!(
            err.contains("string in `general.name`") && err.contains("limit of 16"),
            "{err}"
        );
        let err = refused(&header(&[(
            "k",
            9,
            array(8, 1, std::slice::from_ref(&long)),
        )]));
        assert!(err.contains("array `k`"), "{err}");
        let err = refused(&header(&[("k", 9, array(0, 4, &[vec![0; 4]]))]));
        assert!(err.contains("length of array `k`"), "{err}");
        let kv = |k: &'static str| (k, 0u32, vec![0u8]);
        let err = refused(&header(&[kv("a"), kv("b"), kv("c"), kv("d"), kv("e")]));
        assert!(err.contains("count of metadata entries is 5"), "{err}");
        let err = refused(&file(
            header(&[]),
            &[
                tensor("a", &[1], 0, 0),
                tensor("b", &[1], 0, 32),
                tensor("c", &[1], 0, 64),
            ],
            96,
        ));
        assert!(err.contains("count of tensors is 3"), "{err}");
        let big = array(0, 3, &[vec![0; 3]]);
        let many: Vec<(&str, u32, Vec<u8>)> = ["a", "b", "c", "d"]
            .iter()
            .map(|k| (*k, 9, big.clone()))
            .collect();
        let fat = |n: usize| {
            let s = "y".repeat(n);
            let mut kvs = many.clone();
            kvs[0] = ("n", 8, string(&s));
            header(&kvs)
        };
        assert!(read_with(&fat(16), small).is_ok());
        let tight = Limits {
            metadata_bytes: 100,
            ..small
        };
        let err = match read_with(&fat(16), tight) {
            Ok(_) => panic!("taken"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("header's size"), "{err}");
        // Scaled limits take what the defaults refuse.
        let huge = string(&"z".repeat((Limits::STRING_BYTES + 1) as usize));
        assert!(read(&header(&[("general.name", 8, huge.clone())])).is_err());
        assert!(read_with(&header(&[("general.name", 8, huge)]), Limits::scaled(2)).is_ok());
    }

    #[test]
    fn duplicates_and_overlapping_tensors_are_refused() {
        let kv = ("general.name", 8, string("a"));
        let err = refusal(&header(&[kv.clone(), kv]));
        assert!(err.contains("`general.name` appears twice"), "{err}");
        let err = refusal(&file(
            header(&[]),
            &[tensor("a", &[8], 0, 0), tensor("a", &[8], 0, 32)],
            64,
        ));
        assert!(err.contains("tensor `a` appears twice"), "{err}");
        let err = refusal(&file(
            header(&[]),
            &[tensor("a", &[16], 0, 0), tensor("b", &[8], 0, 32)],
            64,
        ));
        assert!(err.contains("`b` (data offset 32) overlaps `a`"), "{err}");
        let shared = file(
            header(&[]),
            &[tensor("a", &[8], 0, 0), tensor("b", &[8], 0, 0)],
            64,
        );
        assert!(refusal(&shared).contains("overlaps"));
        let apart = file(
            header(&[]),
            &[tensor("a", &[8], 0, 32), tensor("b", &[8], 0, 0)],
            64,
        );
        assert!(read(&apart).is_ok());
        // A tensor whose type now needs fewer bytes than were written.
        let shrunk = file(
            header(&[]),
            &[tensor("a", &[16], 1, 0), tensor("b", &[8], 0, 64)],
            96,
        );
        let err = refusal(&shrunk);
        assert!(
            err.contains("`b` starts at data offset 64, 32 bytes after"),
            "{err}"
        );
        let last_shrunk = file(header(&[]), &[tensor("a", &[16], 1, 0)], 64);
        let err = refusal(&last_shrunk);
        assert!(err.contains("32 bytes follow the last tensor `a`"), "{err}");
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
        let err = refusal(&header(&[("general.alignment", 4, int(48))]));
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
