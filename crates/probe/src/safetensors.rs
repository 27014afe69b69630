//! A safetensors file's header (an 8-byte little-endian length, then a JSON
//! object of tensors), read without the tensor data: for `zinfer model
//! inspect` and for the loader, which then reads each tensor's bytes where
//! the header says. Every length and data offset is checked against the
//! file's size, so a truncated or hostile file is a [`SafetensorsError`],
//! never a panic or a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The safetensors format's own cap on its JSON header.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Why a safetensors header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// The file could not be opened or read.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Fewer than the 8 bytes of the header length.
    #[error("{}: shorter than a safetensors header length", path.display())]
    NoLength {
        /// The file.
        path: PathBuf,
    },
    /// A header length past the end of the file.
    #[error(
        "{}: a header of {header_len} bytes runs past the end of the file ({file_len} bytes): truncated or not safetensors",
        path.display()
    )]
    HeaderPastEnd {
        /// The file.
        path: PathBuf,
        /// The declared header length.
        header_len: u64,
        /// The file's size.
        file_len: u64,
    },
    /// A header longer than the format allows.
    #[error("{}: a header of {header_len} bytes is larger than safetensors allows", path.display())]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The declared header length.
        header_len: u64,
    },
    /// The header is not a JSON object.
    #[error("{}: the header is not a safetensors JSON object: {source}", path.display())]
    NotJson {
        /// The file.
        path: PathBuf,
        /// What the JSON parser said.
        source: serde_json::Error,
    },
    /// An entry without a dtype, shape and data offsets.
    #[error("{}: tensor `{tensor}` is not a safetensors entry: {source}", path.display())]
    NotEntry {
        /// The file.
        path: PathBuf,
        /// The entry's name.
        tensor: String,
        /// What the JSON parser said.
        source: serde_json::Error,
    },
    /// A shape whose value count overflows.
    #[error("{}: tensor `{tensor}` has too many values", path.display())]
    TooManyValues {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// Data offsets outside the data section.
    #[error(
        "{}: tensor `{tensor}` spans bytes {begin}..{end} of a {data_len}-byte data section: truncated or corrupt",
        path.display()
    )]
    OutsideData {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its first byte in the data section.
        begin: u64,
        /// One past its last byte.
        end: u64,
        /// The data section's size.
        data_len: u64,
    },
    /// Data offsets that do not span what the dtype and shape need.
    #[error(
        "{}: tensor `{tensor}` of {elements} {dtype} values spans {bytes} bytes",
        path.display()
    )]
    ByteCount {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its value count.
        elements: u64,
        /// Its dtype.
        dtype: String,
        /// The bytes its offsets span.
        bytes: u64,
    },
}

/// One entry of a safetensors header.
#[derive(Debug, Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// One tensor, as its header declares it (checked against the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafetensorsTensor {
    /// Its name (`model.layers.0.mlp.up_proj.weight`).
    pub name: String,
    /// Its dtype as the file spells it (`BF16`, `F32`).
    pub dtype: String,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
    /// Value count: the product of the dimensions.
    pub elements: u64,
    /// Where its bytes are, from the start of the data section.
    pub data: Range<u64>,
}

impl SafetensorsTensor {
    /// Bytes of its data.
    pub fn bytes(&self) -> u64 {
        self.data.end - self.data.start
    }
}

/// The tensor table of a safetensors file.
#[derive(Clone, Debug)]
pub struct SafetensorsHeader {
    /// The tensors, sorted by name (`__metadata__` left out).
    pub tensors: Vec<SafetensorsTensor>,
    /// Absolute file offset of the data section that offsets count from.
    pub data_offset: u64,
}

/// Reads the header of the safetensors file at `path`.
pub fn read_safetensors_header(path: &Path) -> Result<SafetensorsHeader, SafetensorsError> {
    let path_buf = || path.to_path_buf();
    let io = |source| SafetensorsError::Io {
        path: path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix)
        .map_err(|_| SafetensorsError::NoLength { path: path_buf() })?;
    let header_len = u64::from_le_bytes(prefix);
    let data_len = len
        .saturating_sub(8)
        .checked_sub(header_len)
        .ok_or_else(|| SafetensorsError::HeaderPastEnd {
            path: path_buf(),
            header_len,
            file_len: len,
        })?;
    if header_len > MAX_HEADER_BYTES {
        return Err(SafetensorsError::HeaderTooLarge {
            path: path_buf(),
            header_len,
        });
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let entries: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|source| SafetensorsError::NotJson {
            path: path_buf(),
            source,
        })?;
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if name == "__metadata__" {
            continue;
        }
        let entry: Entry =
            serde_json::from_value(value).map_err(|source| SafetensorsError::NotEntry {
                path: path_buf(),
                tensor: name.clone(),
                source,
            })?;
        let Some(elements) = entry.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d)) else {
            return Err(SafetensorsError::TooManyValues {
                path: path_buf(),
                tensor: name,
            });
        };
        let [begin, end] = entry.data_offsets;
        if begin > end || end > data_len {
            return Err(SafetensorsError::OutsideData {
                path: path_buf(),
                tensor: name,
                begin,
                end,
                data_len,
            });
        }
        let bytes = end - begin;
        if let Some(width) = dtype_bytes(&entry.dtype)
            && elements.checked_mul(width) != Some(bytes)
        {
            return Err(SafetensorsError::ByteCount {
                path: path_buf(),
                tensor: name,
                elements,
                dtype: entry.dtype,
                bytes,
            });
        }
        tensors.push(SafetensorsTensor {
            name,
            dtype: entry.dtype,
            shape: entry.shape,
            elements,
            data: begin..end,
        });
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(SafetensorsHeader {
        tensors,
        data_offset: 8 + header_len,
    })
}

/// Bytes per value of a safetensors dtype, where known.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file: the header's JSON, then `data` zero bytes.
    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.resize(out.len() + data, 0);
        out
    }

    fn read(bytes: &[u8]) -> Result<SafetensorsHeader, SafetensorsError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        std::fs::write(&path, bytes).unwrap();
        read_safetensors_header(&path)
    }

    #[test]
    fn reads_the_tensor_table() {
        let header = r#"{"__metadata__": {"format": "pt"},
            "b": {"dtype": "F32", "shape": [2, 3], "data_offsets": [16, 40]},
            "a": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]}}"#;
        let h = read(&file(header, 40)).unwrap();
        assert_eq!(h.data_offset, 8 + header.len() as u64);
        let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(h.tensors[1].shape, [2, 3]);
        assert_eq!(h.tensors[1].elements, 6);
        assert_eq!(h.tensors[1].data, 16..40);
        assert_eq!(h.tensors[0].bytes(), 16);
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        assert!(matches!(
            read(&[1, 2, 3]),
            Err(SafetensorsError::NoLength { .. })
        ));
        assert!(matches!(
            read(&u64::MAX.to_le_bytes()),
            Err(SafetensorsError::HeaderPastEnd { .. })
        ));
        assert!(matches!(
            read(&file("[1]", 0)),
            Err(SafetensorsError::NotJson { .. })
        ));
        assert!(matches!(
            read(&file(r#"{"w": {"dtype": "F32"}}"#, 0)),
            Err(SafetensorsError::NotEntry { .. })
        ));
        let err = read(&file(
            r#"{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}"#,
            8,
        ))
        .unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        let err = read(&file(
            r#"{"w": {"dtype": "F32", "shape": [64], "data_offsets": [0, 128]}}"#,
            128,
        ))
        .unwrap_err();
        assert!(err.to_string().contains("spans 128 bytes"), "{err}");
        let huge = format!(
            r#"{{"w": {{"dtype": "F32", "shape": [{0}, {0}], "data_offsets": [0, 0]}}}}"#,
            u64::MAX
        );
        assert!(matches!(
            read(&file(&huge, 0)),
            Err(SafetensorsError::TooManyValues { .. })
        ));
    }
}
