//! Loading Hugging Face llama and Mistral checkpoints: a directory with
//! `config.json`, `tokenizer.json` and one or more `*.safetensors` files.
//! (Other architectures load from GGUF.)
//!
//! Weights (f32, f16 or bf16 on disk) are kept as dense f32 matrices, which
//! is exact and simple but takes four bytes per parameter; GGUF is the
//! compact, fast format.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use zinfer_probe::read_safetensors_header;

use zinfer_kernels::ScoreRule;

use super::arch;
use super::cpu::{CpuModel, CpuWeights};
use super::gguf::{check_dims, check_len};
use super::linear::{Embedding, Linear};
use super::spec::{MAX_POSITIONS, ModelSpec, RopeScaling, RopeSpec, RopeStyle};
use super::weights::{self, Naming, TensorSource};
use super::{LoadOptions, ModelError};

/// The fields of `config.json` the llama forward pass uses.
#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    rope_scaling: Option<HfRopeScaling>,
    #[serde(default)]
    sliding_window: Option<usize>,
}

/// `rope_scaling` of a llama `config.json`; only the `llama3` type loads.
#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    #[serde(alias = "type")]
    rope_type: String,
    #[serde(default)]
    factor: f64,
    #[serde(default)]
    low_freq_factor: f64,
    #[serde(default)]
    high_freq_factor: f64,
    #[serde(default)]
    original_max_position_embeddings: usize,
}

impl HfRopeScaling {
    /// Per-frequency divisors ([`RopeScaling::llama3_freq_factors`]).
    fn freq_factors(&self, theta: f32, head_dim: usize) -> Result<Vec<f32>, ModelError> {
        if self.rope_type != "llama3" {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "llama with `{}` rope_scaling (zinfer runs `llama3`)",
                self.rope_type
            )));
        }
        let ok = self.factor > 0.0
            && self.low_freq_factor > 0.0
            && self.high_freq_factor > self.low_freq_factor
            && self.original_max_position_embeddings > 0;
        if !ok {
            return Err(ModelError::HfRopeScaling(format!("{self:?}")));
        }
        Ok(RopeScaling::llama3_freq_factors(
            theta,
            head_dim,
            self.factor,
            self.low_freq_factor,
            self.high_freq_factor,
            self.original_max_position_embeddings,
        ))
    }
}

fn default_eps() -> f32 {
    1e-5
}
fn default_theta() -> f32 {
    10_000.0
}
fn default_positions() -> usize {
    4096
}

/// Reads the model from a checkpoint directory.
pub(crate) fn load(dir: &Path, options: &LoadOptions) -> Result<CpuModel, ModelError> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
        path: config_path.clone(),
        source,
    })?;
    let hf: HfConfig = serde_json::from_str(&text).map_err(|source| ModelError::HfConfig {
        path: config_path.clone(),
        source,
    })?;
    let arch = arch::by_hf_model_type(&hf.model_type)?;
    if arch.architecture != arch::Architecture::Llama {
        return Err(ModelError::GgufOnly {
            dir: dir.to_path_buf(),
            model_type: hf.model_type,
            arch: arch.name(),
        });
    }
    let head_dim = hf
        .head_dim
        .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
    let mut scaling = RopeScaling::default();
    if let Some(s) = &hf.rope_scaling {
        scaling.freq_factors = s.freq_factors(hf.rope_theta, head_dim)?;
    }
    let n_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
    let spec = ModelSpec {
        arch: arch.name(),
        n_layers: hf.num_hidden_layers,
        n_heads: hf.num_attention_heads,
        n_kv_heads,
        hidden: hf.hidden_size,
        head_dim,
        ffn: hf.intermediate_size,
        vocab: hf.vocab_size,
        norm_eps: hf.rms_norm_eps,
        max_positions: hf.max_position_embeddings.min(MAX_POSITIONS),
        // Hugging Face checkpoints keep Q/K rows unpermuted: NeoX pairs.
        ropes: vec![RopeSpec {
            style: RopeStyle::Neox,
            theta: hf.rope_theta,
            scaling,
        }],
        layers: ModelSpec::uniform_layers(
            hf.num_hidden_layers,
            hf.sliding_window,
            n_kv_heads,
            head_dim,
            hf.intermediate_size,
        ),
        attn: ScoreRule::standard(head_dim),
        activation: arch.activation,
        embed_scale: None,
        final_softcap: None,
        layout: arch.layout,
        moe: None,
        hybrid: None,
        per_layer_input: None,
        v_norm: false,
        dense_beside_moe: false,
    };
    spec.validate()?;
    let mut tensors = SafetensorsSource {
        tensors: read_tensors(dir)?,
        tied: hf.tie_word_embeddings,
    };
    let weights: CpuWeights = weights::read(&mut tensors, &spec, Naming::HuggingFace)?;
    CpuModel::new(spec, weights, options)
}

/// Every tensor of the directory's `*.safetensors` files, headers read by
/// the probe's hardened reader and the data made tensors by candle.
fn read_tensors(dir: &Path) -> Result<HashMap<String, Stored>, ModelError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::NoSafetensors(dir.to_path_buf()));
    }
    let mut all = HashMap::new();
    for file in files {
        let header = read_safetensors_header(&file)?;
        let data = std::fs::read(&file).map_err(io(&file))?;
        for t in header.tensors {
            let Some(dtype) = float_dtype(&t.dtype) else {
                all.insert(t.name, Stored::Other(t.dtype));
                continue;
            };
            // The header was checked against the file's size.
            let start = (header.data_offset + t.data.start) as usize;
            let end = (header.data_offset + t.data.end) as usize;
            let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
            let bytes = data.get(start..end).ok_or_else(|| ModelError::Io {
                path: file.clone(),
                source: std::io::ErrorKind::UnexpectedEof.into(),
            })?;
            let tensor =
                Tensor::from_raw_buffer(bytes, dtype, &shape, &Device::Cpu).map_err(|source| {
                    ModelError::TensorData {
                        tensor: t.name.clone(),
                        source,
                    }
                })?;
            all.insert(t.name, Stored::Float(tensor));
        }
    }
    Ok(all)
}

/// The candle type of the float dtypes the loader takes.
fn float_dtype(dtype: &str) -> Option<DType> {
    Some(match dtype {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        _ => return None,
    })
}

/// One tensor of a checkpoint: read, or of a dtype the loader does not take
/// (refused only if the model uses it).
enum Stored {
    /// f32, f16 or bf16.
    Float(Tensor),
    /// Any other dtype, as the file spells it.
    Other(String),
}

/// The tensors of a checkpoint directory, taken out as they are read.
struct SafetensorsSource {
    tensors: HashMap<String, Stored>,
    /// `tie_word_embeddings`: the embedding doubles as the LM head (even
    /// when a checkpoint also stores `lm_head.weight`); otherwise
    /// `lm_head.weight` must be there.
    tied: bool,
}

impl SafetensorsSource {
    /// The tensor `name` as f32 (from f32, f16 or bf16).
    fn take(&mut self, name: &str) -> Result<Tensor, ModelError> {
        match self.tensors.remove(name) {
            Some(Stored::Float(w)) => Ok(w.to_dtype(DType::F32)?),
            Some(Stored::Other(dtype)) => Err(ModelError::UnsupportedQuant {
                tensor: name.to_string(),
                dtype,
            }),
            None => Err(ModelError::MissingTensor {
                container: "checkpoint",
                tensor: name.to_string(),
            }),
        }
    }
}

impl TensorSource for SafetensorsSource {
    type Embedding = Embedding;
    type Matrix = Linear;
    type Vector = Vec<f32>;

    fn has_own_head(&self, _: &str) -> bool {
        !self.tied
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        let lin = Linear::dense(&self.take(name)?)?;
        check_dims(name, (lin.rows(), lin.cols()), (rows, cols))?;
        Ok(lin)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let v = self.take(name)?.flatten_all()?.to_vec1::<f32>()?;
        check_len(name, v.len(), len)?;
        Ok(v)
    }

    fn concat(&mut self, parts: Vec<Vec<f32>>) -> Result<Vec<f32>, ModelError> {
        Ok(parts.concat())
    }

    fn experts(
        &mut self,
        name: &str,
        _: usize,
        _: usize,
        _: usize,
    ) -> Result<Vec<Linear>, ModelError> {
        // Directories load for llama only (dense).
        Err(ModelError::TensorLayout {
            tensor: name.to_string(),
            reason: "holds experts, which load from GGUF files only",
        })
    }

    fn embedding(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        tied: bool,
    ) -> Result<(Embedding, Option<Linear>), ModelError> {
        let head = self.matrix(name, rows, cols)?;
        let Linear::Dense { w, cols, .. } = &head else {
            return Err(ModelError::TensorLayout {
                tensor: name.to_string(),
                reason: "is not dense",
            });
        };
        let table = Embedding::Dense {
            w: w.clone(),
            cols: *cols,
        };
        Ok((table, tied.then_some(head)))
    }
}
