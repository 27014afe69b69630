//! A GGUF file's metadata as the model spec reads it: `{arch}.` keys with
//! their types checked, apart from the loader so that the architecture
//! table and the loader both read it without importing each other.

use zinfer_probe::{GgufHeader, MetaValue};

use super::ModelError;

/// GGUF metadata of one architecture: `usize("block_count")` reads
/// `{arch}.block_count`.
pub(crate) struct Meta<'a> {
    header: &'a GgufHeader,
    arch: &'a str,
}

impl<'a> Meta<'a> {
    /// The keys of architecture `arch` in `header`.
    pub(crate) fn new(header: &'a GgufHeader, arch: &'a str) -> Self {
        Meta { header, arch }
    }

    /// The full key of `{arch}.{key}`.
    pub(crate) fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    /// Whether the file has `{arch}.{key}`.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.header.metadata.contains_key(&self.key(key))
    }

    /// `{arch}.{key}` as an integer; an error when it is missing.
    pub(crate) fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.opt_usize(key)?
            .ok_or_else(|| ModelError::MissingKey(self.key(key)))
    }

    /// `{arch}.{key}` as an integer, if present.
    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        let full = self.key(key);
        self.header
            .metadata
            .get(&full)
            .map(|v| value_usize(v, &full))
            .transpose()
    }

    /// `{arch}.{key}` per layer: one integer for every layer, or an array
    /// of one per layer (Gemma 4's `attention.head_count_kv`), if present.
    pub(crate) fn opt_per_layer(
        &self,
        key: &str,
        n_layers: usize,
    ) -> Result<Option<Vec<usize>>, ModelError> {
        let full = self.key(key);
        match self.header.metadata.get(&full) {
            None => Ok(None),
            Some(MetaValue::Array { .. }) => {
                let values = self.header.ints(&full)?.unwrap_or_default();
                if values.len() != n_layers {
                    return Err(ModelError::PerLayerLength {
                        key: full,
                        got: values.len(),
                        layers: n_layers,
                    });
                }
                values
                    .into_iter()
                    .map(|v| value_usize(&MetaValue::Int(i128::from(v)), &full))
                    .collect::<Result<_, _>>()
                    .map(Some)
            }
            Some(v) => Ok(Some(vec![value_usize(v, &full)?; n_layers])),
        }
    }

    /// `{arch}.{key}` as a float, if present.
    pub(crate) fn opt_f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        let full = self.key(key);
        match self.header.metadata.get(&full) {
            None => Ok(None),
            Some(MetaValue::Float(v)) => Ok(Some(*v as f32)),
            Some(other) => Err(wrong_type(full, "a float", other)),
        }
    }

    /// `{arch}.{key}` as a string, if present.
    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&str>, ModelError> {
        let full = self.key(key);
        match self.header.metadata.get(&full) {
            None => Ok(None),
            Some(MetaValue::Str(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(full, "a string", other)),
        }
    }

    /// `{arch}.{key}` as one flag per array entry, if present.
    pub(crate) fn opt_bools(&self, key: &str) -> Result<Option<Vec<bool>>, ModelError> {
        Ok(self.header.bools(&self.key(key))?)
    }

    /// `{arch}.{key}` as an integer array, if present.
    pub(crate) fn opt_ints(&self, key: &str) -> Result<Option<Vec<i64>>, ModelError> {
        Ok(self.header.ints(&self.key(key))?)
    }

    /// Which layers have a sliding window: `attention.sliding_window_pattern`
    /// as one flag per layer, or a period `n` (every layer but the last of
    /// each `n`); `period` when the key is missing.
    pub(crate) fn swa_pattern(
        &self,
        n_layers: usize,
        period: usize,
    ) -> Result<Vec<bool>, ModelError> {
        let full = self.key("attention.sliding_window_pattern");
        let period = match self.header.metadata.get(&full) {
            Some(MetaValue::Array { .. }) => {
                let flags = self.header.bools(&full)?.unwrap_or_default();
                if flags.len() != n_layers {
                    return Err(ModelError::PerLayerLength {
                        key: full,
                        got: flags.len(),
                        layers: n_layers,
                    });
                }
                return Ok(flags);
            }
            Some(v) => value_usize(v, &full)?,
            None => period,
        };
        Ok((0..n_layers)
            .map(|i| period == 0 || i % period < period - 1)
            .collect())
    }
}

/// Any GGUF integer as a usize (metadata writers disagree on widths).
pub(crate) fn value_usize(v: &MetaValue, key: &str) -> Result<usize, ModelError> {
    match v {
        MetaValue::Int(n) => usize::try_from(*n).map_err(|_| ModelError::MetadataRange {
            key: key.to_string(),
            value: *n,
        }),
        other => Err(wrong_type(key.to_string(), "an integer", other)),
    }
}

fn wrong_type(key: String, want: &'static str, found: &MetaValue) -> ModelError {
    ModelError::MetadataType {
        key,
        want,
        found: format!("{found:?}"),
    }
}
