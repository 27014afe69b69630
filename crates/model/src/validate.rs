//! Whether a GGUF model can load and compute, checked in the order that
//! keeps a hostile file cheap: the metadata's numbers before the spec
//! allocates anything per layer ([`metadata`]), the finished spec's numbers
//! ([`spec`]), then the tensor table against every weight the load reads,
//! the vocabulary and special tokens, the memory the weights will take,
//! and a sample of the weights every logit goes through ([`file`]).
//!
//! The loader runs all of these when it opens a file, and [`check_gguf`],
//! which `zinfer model inspect` reports as "loadable" (after opening the
//! tokenizer, as a worker does), opens the file the same way: the verdict
//! and the load are one code path.

use std::path::Path;

use candle_core::quantized::GgmlDType;
use zinfer_probe::{GgmlType, GgufHeader, TensorInfo};

use super::ModelError;
use super::gguf::{self, Tensors, candle_layout, missing_tensor};
use super::meta::Meta;
use super::spec::ModelSpec;
use super::weights::{self, Naming, TensorSource};

/// Most transformer blocks a file may declare (the largest real models have
/// under 200): per-layer tables are built from this count.
pub const MAX_LAYERS: usize = 1024;
/// Widest residual stream or MLP inner width a file may declare.
pub const MAX_WIDTH: usize = 1 << 20;
/// Most attention heads (query or KV) a file may declare.
pub const MAX_HEADS: usize = 1 << 12;
/// Widest attention head a file may declare.
pub const MAX_HEAD_DIM: usize = 1 << 12;
/// Longest context a file may declare (10M-token models exist; the RoPE
/// tables stop at [`crate::MAX_POSITIONS`] whatever it says).
pub const MAX_CONTEXT: usize = 1 << 27;
/// Most experts a mixture-of-experts file may declare (real ones have up
/// to 512): routing keeps a table per expert.
pub(crate) const MAX_EXPERTS: usize = 1 << 12;
/// Rows of the LM head read at load to look for NaN and infinity.
const SAMPLED_ROWS: usize = 16;
/// The environment variable that sets the memory a load may take (bytes),
/// in place of the host's available memory.
pub const MEMORY_LIMIT_ENV: &str = "ZINFER_MODEL_MEMORY_LIMIT";

/// Whether the loader takes the GGUF file at `path`: it is opened as the
/// loader opens it (every check of this module), without reading the bulk
/// of the weights. With `zinfer_text::ModelTokenizer::open`, which a worker
/// runs first, this is what `zinfer model inspect` calls loadable. Returns
/// the model's spec.
pub fn check_gguf(path: &Path) -> Result<ModelSpec, ModelError> {
    let file = gguf::open(path)?;
    memory(&file.tensors, &file.spec)?;
    Ok(file.spec)
}

/// The integer metadata the spec is built from, range-checked before
/// anything is allocated from it (a `block_count` of 2^40 is refused here,
/// not by an allocator).
pub(crate) fn metadata(meta: &Meta<'_>) -> Result<(), ModelError> {
    let range = |key: &str, max: usize| -> Result<Option<usize>, ModelError> {
        match meta.opt_usize(key)? {
            Some(n) if n == 0 || n > max => Err(invalid(
                meta.key(key),
                n.to_string(),
                format!("must be between 1 and {max}"),
            )),
            other => Ok(other),
        }
    };
    let layers = range("block_count", MAX_LAYERS)?;
    let hidden = range("embedding_length", MAX_WIDTH)?;
    // One width, or one per layer (Gemma 4).
    let ffn = meta.opt_per_layer("feed_forward_length", layers.unwrap_or(1))?;
    if let Some(&n) = ffn.iter().flatten().find(|&&n| n == 0 || n > MAX_WIDTH) {
        return Err(invalid(
            meta.key("feed_forward_length"),
            n.to_string(),
            format!("must be between 1 and {MAX_WIDTH}"),
        ));
    }
    let heads = range("attention.head_count", MAX_HEADS)?;
    // One count, or one per layer (Gemma 4).
    let per_layer_kv = meta.opt_per_layer("attention.head_count_kv", layers.unwrap_or(1))?;
    if let Some(&n) = per_layer_kv
        .iter()
        .flatten()
        .find(|&&n| n == 0 || n > MAX_HEADS)
    {
        return Err(invalid(
            meta.key("attention.head_count_kv"),
            n.to_string(),
            format!("must be between 1 and {MAX_HEADS}"),
        ));
    }
    let key_length = range("attention.key_length", MAX_HEAD_DIM)?;
    range("attention.key_length_swa", MAX_HEAD_DIM)?;
    range("attention.value_length_swa", MAX_HEAD_DIM)?;
    if let Some(w) = meta.opt_usize("embedding_length_per_layer_input")?
        && w > MAX_WIDTH
    {
        return Err(invalid(
            meta.key("embedding_length_per_layer_input"),
            w.to_string(),
            format!("must be at most {MAX_WIDTH}"),
        ));
    }
    range("attention.value_length", MAX_HEAD_DIM)?;
    range("context_length", MAX_CONTEXT)?;
    range("expert_feed_forward_length", MAX_WIDTH)?;
    range("expert_shared_feed_forward_length", MAX_WIDTH)?;
    for key in ["expert_count", "expert_used_count"] {
        if let Some(n) = meta.opt_usize(key)?
            && n > MAX_EXPERTS
        {
            return Err(invalid(
                meta.key(key),
                n.to_string(),
                format!("must be at most {MAX_EXPERTS}"),
            ));
        }
    }
    if let Some(heads) = heads
        && let Some(&kv) = per_layer_kv
            .iter()
            .flatten()
            .find(|&&kv| !heads.is_multiple_of(kv))
    {
        return Err(invalid(
            meta.key("attention.head_count_kv"),
            kv.to_string(),
            format!("must divide the {heads} query heads"),
        ));
    }
    if let (Some(hidden), Some(heads), None) = (hidden, heads, key_length)
        && !hidden.is_multiple_of(heads)
    {
        return Err(invalid(
            meta.key("attention.head_count"),
            heads.to_string(),
            format!(
                "must divide the embedding length {hidden} when the file gives no attention.key_length"
            ),
        ));
    }
    for key in [
        "rope.freq_base",
        "rope.freq_base_swa",
        "rope.scaling.factor",
        "rope.scaling.attn_factor",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    ] {
        if let Some(x) = meta.opt_f32(key)? {
            positive(&meta.key(key), x)?;
        }
    }
    if let Some(eps) = meta.opt_f32("attention.layer_norm_rms_epsilon")?
        && !(eps > 0.0 && eps < 1.0)
    {
        return Err(invalid(
            meta.key("attention.layer_norm_rms_epsilon"),
            eps.to_string(),
            "must be a number between 0 and 1".into(),
        ));
    }
    Ok(())
}

/// The finished spec's numbers, whatever key or default they came from:
/// every float a forward pass multiplies by must be finite (and most
/// positive), or every request fails.
pub(crate) fn spec(spec: &ModelSpec) -> Result<(), ModelError> {
    if !(spec.norm_eps > 0.0 && spec.norm_eps < 1.0) {
        return Err(invalid(
            "RMS norm epsilon".into(),
            spec.norm_eps.to_string(),
            "must be a number between 0 and 1".into(),
        ));
    }
    for rope in &spec.ropes {
        positive("RoPE base", rope.theta)?;
        positive("RoPE linear scale", rope.scaling.linear)?;
        positive("RoPE attention factor", rope.scaling.attn_factor)?;
        for &f in &rope.scaling.freq_factors {
            positive("RoPE frequency factor", f)?;
        }
    }
    let optional = [
        ("attention softcap", spec.attn.softcap),
        ("final logit softcap", spec.final_softcap),
        ("embedding scale", spec.embed_scale),
    ];
    for (what, x) in optional {
        if let Some(x) = x {
            positive(what, x)?;
        }
    }
    Ok(())
}

/// The checks that read the tensor table and a little tensor data: every
/// weight the load reads is there, of the spec's shape and a type the
/// backends build; the vocabulary matches the embedding; special tokens
/// are inside it; the LM head and norms hold no NaN or infinity.
pub(crate) fn file(tensors: &mut Tensors, spec: &ModelSpec) -> Result<(), ModelError> {
    let tied = !tensors
        .header()
        .tensors
        .iter()
        .any(|t| t.name == "output.weight");
    match &spec.hybrid {
        Some(hy) => drop(crate::hybrid::read(&mut DryRun(tensors), spec, hy)?),
        None => drop(weights::read(&mut DryRun(tensors), spec, Naming::Gguf)?),
    }
    vocabulary(tensors, spec)?;
    finite_weights(tensors, spec, tied)
}

/// The tokenizer's token count against the embedding's rows, and every
/// special token id against both.
fn vocabulary(tensors: &Tensors, spec: &ModelSpec) -> Result<(), ModelError> {
    let header = tensors.header();
    if let Some(tokens) = header.array_len("tokenizer.ggml.tokens")
        && tokens != spec.vocab as u64
    {
        return Err(ModelError::VocabMismatch {
            tokens,
            rows: spec.vocab,
        });
    }
    let mut ids: Vec<(&String, i128)> = header
        .metadata
        .iter()
        .filter(|(key, _)| key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id"))
        .filter_map(|(key, value)| match value {
            zinfer_probe::MetaValue::Int(id) => Some((key, *id)),
            _ => None,
        })
        .collect();
    ids.sort();
    // -1 is llama.cpp's "no such token".
    match ids
        .into_iter()
        .find(|&(_, id)| id != -1 && !(0..spec.vocab as i128).contains(&id))
    {
        Some((key, id)) => Err(ModelError::SpecialToken {
            key: key.clone(),
            id,
            vocab: spec.vocab,
        }),
        None => Ok(()),
    }
}

/// The host memory a CPU load's weights and RoPE tables will take, against
/// [`MEMORY_LIMIT_ENV`] or else the host's available memory, before any
/// weight is read. (A GPU load keeps its weights in device memory, which
/// candle sizes as it allocates.)
pub(crate) fn memory(tensors: &Tensors, spec: &ModelSpec) -> Result<(), ModelError> {
    let limit = match std::env::var(MEMORY_LIMIT_ENV) {
        Ok(text) => {
            let limit = text.trim().parse::<u64>().ok();
            if limit.is_none() {
                tracing::warn!(value = %text, "{MEMORY_LIMIT_ENV} is not a number of bytes; not checking the model's memory");
            }
            limit
        }
        Err(_) => zinfer_probe::procfs::available_bytes(),
    };
    let rope_tables = (spec.ropes.len() * spec.max_positions * spec.head_dim * 4) as u64;
    within(
        weight_bytes(tensors.header()).saturating_add(rope_tables),
        limit,
    )
}

/// Host bytes a CPU load keeps for the file's tensors: float matrices are
/// widened to f32 for the kernels, quantized ones kept as stored.
fn weight_bytes(header: &GgufHeader) -> u64 {
    header.tensors.iter().fold(0u64, |n, t| {
        let bytes = match t.ggml_type {
            GgmlType::F16 | GgmlType::BF16 => t.elements().saturating_mul(4),
            _ => t.bytes().unwrap_or(0),
        };
        n.saturating_add(bytes)
    })
}

/// Fails when `need` bytes are more than `limit` (no limit: no check).
fn within(need: u64, limit: Option<u64>) -> Result<(), ModelError> {
    match limit {
        Some(available) if need > available => Err(ModelError::Memory { need, available }),
        _ => Ok(()),
    }
}

/// NaN or infinity in the LM head (sampled rows) or any norm weight makes
/// every logit NaN: refused at load instead of failing every request.
fn finite_weights(tensors: &mut Tensors, spec: &ModelSpec, tied: bool) -> Result<(), ModelError> {
    let head = if tied {
        "token_embd.weight"
    } else {
        "output.weight"
    };
    let last = spec.vocab - 1;
    let mut rows: Vec<usize> = (0..SAMPLED_ROWS)
        .map(|i| i * last / (SAMPLED_ROWS - 1))
        .collect();
    rows.dedup();
    let values = tensors.rows(head, &rows)?;
    finite(head, &values)?;
    let norms: Vec<String> = tensors
        .header()
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 1 && t.name.ends_with("norm.weight"))
        .map(|t| t.name.clone())
        .collect();
    for name in norms {
        let rows = tensors.rows(&name, &[0])?;
        finite(&name, &rows)?;
    }
    Ok(())
}

fn finite(tensor: &str, values: &[f32]) -> Result<(), ModelError> {
    match values.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(ModelError::NonFinite {
            tensor: tensor.to_string(),
            index,
            value: values[index],
        }),
        None => Ok(()),
    }
}

fn positive(what: &str, x: f32) -> Result<(), ModelError> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(invalid(
            what.to_string(),
            x.to_string(),
            "must be a finite number above 0".into(),
        ))
    }
}

fn invalid(what: String, value: String, want: String) -> ModelError {
    ModelError::Invalid { what, value, want }
}

/// The loader's reading of the weights, against the tensor table alone:
/// the same names, shapes and types, without reading any data.
struct DryRun<'a>(&'a Tensors);

impl DryRun<'_> {
    /// The entry of `name`, of a type both backends build.
    fn entry(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        let info = self.0.info(name).ok_or_else(|| missing_tensor(name))?;
        // The CPU kernels read MXFP4 and IQ4_* themselves (the probe sized
        // their data); the candle backend refuses them as it loads.
        if gguf::kernel_kind(info.ggml_type).is_some() {
            return Ok(info);
        }
        let (dtype, _) = candle_layout(name, info)?;
        // Q8_K is a type for activations: no kernel multiplies by it.
        if dtype == GgmlDType::Q8K {
            return Err(ModelError::UnsupportedQuant {
                tensor: name.to_string(),
                dtype: info.ggml_type.to_string(),
            });
        }
        Ok(info)
    }

    /// A matrix's `(rows, cols)` as its dims give them (innermost first).
    fn matrix_dims(&self, name: &str) -> Result<(usize, usize), ModelError> {
        let info = self.entry(name)?;
        let cols = info.dims.first().copied().unwrap_or(1);
        let rows = info.dims.iter().skip(1).product::<u64>();
        if info.dims.len() != 2 {
            return Err(ModelError::TensorLayout {
                tensor: name.to_string(),
                reason: "is not a matrix (2 dimensions)",
            });
        }
        Ok((rows as usize, cols as usize))
    }
}

impl TensorSource for DryRun<'_> {
    type Embedding = ();
    type Matrix = ();
    type Vector = ();

    fn has_own_head(&self, name: &str) -> bool {
        self.0.info(name).is_some()
    }

    fn has(&self, name: &str) -> bool {
        self.0.info(name).is_some()
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<(), ModelError> {
        gguf::check_dims(name, self.matrix_dims(name)?, (rows, cols))
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<(), ModelError> {
        let info = self.entry(name)?;
        gguf::check_len(name, info.elements() as usize, len)
    }

    fn experts(
        &mut self,
        name: &str,
        experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<()>, ModelError> {
        let info = self.entry(name)?;
        let want = [cols as u64, rows as u64, experts as u64];
        if info.dims != want {
            return Err(ModelError::TensorLayout {
                tensor: name.to_string(),
                reason: "is not [experts, rows, cols] as the metadata says",
            });
        }
        Ok(vec![(); experts])
    }

    fn concat(&mut self, _parts: Vec<()>) -> Result<(), ModelError> {
        Ok(())
    }

    fn embedding(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        tied: bool,
    ) -> Result<((), Option<()>), ModelError> {
        gguf::check_dims(name, self.matrix_dims(name)?, (rows, cols))?;
        Ok(((), tied.then_some(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_counts_float_matrices_widened_and_refuses_past_the_limit() {
        let tensor = |ggml_type, dims: &[u64]| TensorInfo {
            name: String::new(),
            dims: dims.to_vec(),
            ggml_type,
            offset: 0,
        };
        let header = GgufHeader {
            tensors: vec![
                tensor(GgmlType::F16, &[4, 8]),
                tensor(GgmlType::Q4_1, &[32, 2]),
                tensor(GgmlType(99), &[32]),
            ],
            ..GgufHeader::default()
        };
        assert_eq!(weight_bytes(&header), 4 * 8 * 4 + 2 * 20);
        assert!(within(100, None).is_ok());
        assert!(within(100, Some(100)).is_ok());
        assert!(matches!(
            within(101, Some(100)),
            Err(ModelError::Memory {
                need: 101,
                available: 100
            })
        ));
    }
}
