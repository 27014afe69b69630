//! A GGUF file's header: its metadata keys and scalar values, read without
//! touching the tensors (or linking a tensor library), for memory estimates
//! and listings made before any model is loaded.
//!
//! Arrays (the tokenizer's vocabulary, merges, scores) are walked past, not
//! kept. Every declared length is checked against the bytes left in the file
//! before anything is read or allocated, so a corrupt or hostile header is a
//! [`HeaderError`], never a panic or a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

/// The four bytes every GGUF file starts with.
const MAGIC: [u8; 4] = *b"GGUF";

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

/// One scalar metadata value (arrays are recorded by length only).
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
    /// An array, with its element count.
    Array(u64),
}

/// The metadata of a GGUF file.
#[derive(Clone, Debug, Default)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Tensors the file declares.
    pub tensor_count: u64,
    /// Metadata key -> value.
    pub metadata: HashMap<String, MetaValue>,
}

impl GgufHeader {
    /// `general.architecture` (e.g. `llama`, `qwen2`), if the file names one.
    pub fn architecture(&self) -> Option<&str> {
        match self.metadata.get("general.architecture") {
            Some(MetaValue::Str(arch)) => Some(arch),
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

    /// `{architecture}.{key}` as an integer: where GGUF keeps model dimensions.
    pub fn arch_usize(&self, key: &str) -> Option<usize> {
        self.usize(&format!("{}.{key}", self.architecture()?))
    }
}

/// Reads the header of the GGUF file at `path`.
pub fn read_header(path: &Path) -> Result<GgufHeader, HeaderError> {
    let io = |source| HeaderError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut reader = Reader {
        inner: BufReader::new(file),
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
    let mut metadata = HashMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = value(r, kind, &key)?;
        metadata.insert(key, value);
    }
    Ok(GgufHeader {
        version,
        tensor_count,
        metadata,
    })
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
            let elem = r.u32()?;
            let n = r.u64()?;
            match (elem, fixed_size(elem)) {
                (_, Some(size)) => {
                    let bytes = n
                        .checked_mul(size)
                        .ok_or_else(|| bad(format!("array `{key}` of {n} values is too long")))?;
                    r.skip(bytes, "an array")?;
                }
                (8, None) => {
                    for _ in 0..n {
                        let len = r.u64()?;
                        r.skip(len, "a string")?;
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "array `{key}` holds values of type {elem}, which GGUF does not allow in arrays here"
                    )));
                }
            }
            MetaValue::Array(n)
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
            Some(&MetaValue::Array(2))
        );
        assert_eq!(
            h.metadata.get("tokenizer.ggml.scores"),
            Some(&MetaValue::Array(3))
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
        let err = crate::kv_bytes_per_token(dir.path(), crate::KvDtype::F32).unwrap_err();
        assert!(err.to_string().contains("GGUF headers only"), "{err}");
    }
}
