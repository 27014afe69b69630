//! zinfer's models: loading, devices, and the forward pass over the KV
//! pool, on zinfer's CPU kernels or on candle. The tokenizer and chat
//! template of a checkpoint are `zinfer_text`'s.
//!
//! [`load`] reads a GGUF file or a Hugging Face safetensors directory into a
//! [`LoadedModel`]: a [`ForwardModel`] that owns its KV pool. The engine drives the model one step at a time with a
//! [`StepBatch`]: the step's [`SeqChunk`]s laid out flat; the KV slots come
//! from the engine's token pool.

mod arch;
mod attention;
mod batch;
mod candle_model;
mod classifier;
mod cpu;
mod deltanet;
pub mod device;
mod flash;
mod gguf;
mod hybrid;
mod kv;
mod linear;
mod meta;
mod moe;
mod ple;
mod safetensors;
mod spec;
#[cfg(feature = "synthetic")]
pub mod synthetic;
mod validate;
mod weights;

use std::path::{Path, PathBuf};

pub use device::{Device, DeviceError, candle_device, check_device};
pub use zinfer_probe::{AttentionDtype, KvDtype, KvShape, model_name};

pub use arch::supported as supported_architectures;
pub use batch::StepBatch;
pub use candle_model::CandleModel;
pub use classifier::{Classifier, POOLING_RANK};
pub use cpu::CpuModel;
pub use deltanet::HybridSpec;
pub use hybrid::HybridModel;
pub use spec::{
    Activation, BlockLayout, Gating, LayerSpec, MAX_POSITIONS, ModelSpec, MoeSpec, RopeScaling,
    RopeSpec, RopeStyle, SpecError, Yarn,
};
pub use validate::{
    MAX_CONTEXT, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, MAX_WIDTH, MEMORY_LIMIT_ENV, check_gguf,
};
pub use zinfer_kernels::ScoreRule;

/// What a forward step returns for one [`SeqChunk`].
///
/// Everything but [`ChunkOutput::LastLogits`] is paid for by the chunk that
/// asks: the LM head runs on the rows that need logits and no others, and
/// a batch of `LastLogits` chunks runs exactly as if this did not exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChunkOutput {
    /// The logits after the chunk's last token: `vocab_size()` values (what
    /// sampling needs).
    #[default]
    LastLogits,
    /// The logits after every token of the chunk (prompt logprobs, `echo`):
    /// `tokens.len() * vocab_size()` values, row-major, row `i` the logits
    /// after `tokens[i]`, i.e. the distribution of the token at position
    /// `start_pos + i + 1`. The step holds them all at once (4 bytes per
    /// token and vocabulary entry), so such chunks are best kept short.
    AllLogits,
    /// The final hidden state of every token of the chunk (embeddings):
    /// after the output norm, before the LM head (llama.cpp's `result_norm`,
    /// what it returns as embeddings), `tokens.len() * hidden_size()`
    /// values, row-major, unpooled and not normalised. No logits are
    /// computed for the chunk.
    AllHidden,
}

/// One sequence's part of a forward step.
#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    /// Tokens to run now: an uncached prompt chunk, or the single newest token in decode.
    pub tokens: &'a [u32],
    /// KV slots of every position 0..start_pos+tokens.len() of this sequence, in order.
    /// The first start_pos already hold K/V (cached prefix or earlier steps);
    /// the last tokens.len() are written by this step.
    pub slots: &'a [u32],
    /// Number of positions already in the KV pool (= slots.len() - tokens.len()).
    pub start_pos: usize,
    /// What the step returns for this chunk (see [`ChunkOutput`]).
    pub output: ChunkOutput,
}

/// A loaded model with its KV pool. Owned by one engine thread.
pub trait ForwardModel {
    /// Runs one step for a batch of sequences (any mix of prefill chunks and
    /// decode tokens) and returns one vector per chunk, in batch order, as
    /// the chunk's [`SeqChunk::output`] asks: the logits of its last token
    /// (`vocab_size()` values, the default), the logits of every token
    /// (`tokens.len() * vocab_size()`), or the final hidden state of every
    /// token (`tokens.len() * hidden_size()`), rows in token order.
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError>;
    /// Runs one step given flat, as the engine hands it over: the same
    /// contract and results as [`Self::forward`] on [`StepBatch::chunks`].
    /// A backend that uploads its inputs (a GPU) overrides this to send the
    /// batch's arrays as they are; the default views them as chunks, without
    /// copying tokens or slots, and calls [`Self::forward`].
    fn forward_batch(&mut self, batch: &StepBatch) -> Result<Vec<Vec<f32>>, ModelError> {
        let chunks: Vec<SeqChunk<'_>> = batch.chunks().collect();
        self.forward(&chunks)
    }
    /// Number of logits per token; token ids must be below it.
    fn vocab_size(&self) -> usize;
    /// Width of one final hidden state (the model's embedding width): the
    /// row length of [`ChunkOutput::AllHidden`].
    fn hidden_size(&self) -> usize;
    /// Number of token slots in the KV pool (the TokenPool capacity).
    fn kv_capacity(&self) -> usize;
    /// Longest sequence (prompt + output) the model can run: its context
    /// length. The engine ends a sequence there instead of failing the batch.
    fn max_positions(&self) -> usize {
        usize::MAX
    }
    /// Whether the model keeps a recurrent state per sequence besides its
    /// K/V (hybrid models): such a sequence resumes only where its state
    /// stopped, so a prefix found in the KV cache, a rolled-back draft or
    /// a moved sequence cannot continue it, and the engine must not try.
    fn recurrent(&self) -> bool {
        false
    }
    /// The memory of one sequence's recurrent state in KV pool slots
    /// (rounded up): what the engine holds from the pool for each running
    /// sequence. 0 for a model without recurrent state (the default).
    fn state_slots(&self) -> usize {
        0
    }
    /// Drops the recurrent states of the sequences whose first KV slot is
    /// one of `first_slots`: the engine calls it when it frees such a
    /// sequence's slots (finished, failed or preempted), before any step
    /// could give a slot to another sequence. Does nothing for a model
    /// without recurrent state (the default).
    fn release_states(&mut self, first_slots: &[u32]) {
        let _ = first_slots;
    }
    /// The shape of one slot's K/V, for carrying cached prefixes to another
    /// worker. Two models can exchange K/V only if their shapes are equal
    /// (and they are the same model: the shape cannot tell checkpoints
    /// apart). The default, all zeros, means the model cannot transfer.
    fn kv_shape(&self) -> KvShape {
        KvShape::default()
    }
    /// The K/V of `slots`, laid out layer-major as [`KvShape`] describes,
    /// so a cached prefix can be sent to another worker. Fails, without
    /// panicking, on a slot outside the pool, or when the model cannot
    /// transfer (the default).
    fn read_kv(&self, slots: &[u32]) -> Result<Vec<f32>, ModelError> {
        let _ = slots;
        Err(ModelError::KvTransfer(
            "this model does not support cache transfer".into(),
        ))
    }
    /// Writes K/V read by [`Self::read_kv`] (on this or an identical model)
    /// into `slots`. Fails, changing nothing, when `data` does not hold
    /// exactly one row per slot, layer and K/V, or a slot is outside the
    /// pool, or the model cannot transfer (the default).
    fn write_kv(&mut self, slots: &[u32], data: &[f32]) -> Result<(), ModelError> {
        let _ = (slots, data);
        Err(ModelError::KvTransfer(
            "this model does not support cache transfer".into(),
        ))
    }
}

/// Checks a transfer of `slots` of K/V of `shape` against a pool of
/// `capacity` slots and, for a write, the length of its data. Done before
/// any copy so a bad request changes nothing.
pub(crate) fn check_transfer(
    shape: &KvShape,
    slots: &[u32],
    capacity: usize,
    data_len: Option<usize>,
) -> Result<(), ModelError> {
    if let Some(&slot) = slots.iter().find(|&&s| s as usize >= capacity) {
        return Err(ModelError::KvTransfer(format!(
            "slot {slot} is outside the KV pool of {capacity}"
        )));
    }
    if let Some(len) = data_len {
        let want = shape.floats_for(slots.len());
        if want != Some(len) {
            return Err(ModelError::KvTransfer(format!(
                "{len} values for {} slots; this model needs {} per slot ({} layers x K,V x {})",
                slots.len(),
                shape.floats_per_slot(),
                shape.layers,
                shape.kv_dim()
            )));
        }
    }
    Ok(())
}

/// KV pool slots when none are asked for: 32,768 tokens (1.4 GiB of f32 K/V,
/// 0.7 GiB of f16, for the default model, committed only as slots are first written on the
/// CPU; allocated up front on a GPU).
pub const DEFAULT_KV_CAPACITY: usize = 32_768;

/// How to load a model; the KV pool is sized here because it lives with the model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Token slots in the KV pool (memory grows as slots are first written).
    pub kv_capacity: usize,
    /// Compute threads. `Some(1)` runs every kernel on the engine thread.
    /// `Some(n > 1)` or `None` use the kernels' pool, which is sized once per
    /// process: by the first model loaded with `Some(n > 1)`, else from
    /// `CANDLE_NUM_THREADS` (or `RAYON_NUM_THREADS`, else one per core).
    pub threads: Option<usize>,
    /// Device name as [`Device`] parses it: `cpu`, `cuda:N` (CUDA builds),
    /// or `auto`.
    pub device: String,
    /// Element type of the K/V rows in the pool (CPU backend).
    pub kv_dtype: KvDtype,
    /// Number format of the attention's dot products (CPU backend).
    pub attention: AttentionDtype,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            kv_capacity: DEFAULT_KV_CAPACITY,
            threads: None,
            device: "cpu".to_string(),
            kv_dtype: KvDtype::F32,
            attention: AttentionDtype::Auto,
        }
    }
}

/// A model ready to run: the forward pass, named.
pub struct LoadedModel {
    /// Name reported to the router (the file or directory stem).
    pub name: String,
    /// The forward pass with its KV pool.
    pub model: Box<dyn ForwardModel + Send>,
    /// A reranker's head (`rank` pooling), read with the weights.
    pub classifier: Option<Classifier>,
}

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("reading {path}: {source}; check the path given with --model")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A GGUF file's header could not be read (not GGUF, truncated, or an
    /// array of another element type than the loader reads). Boxed, as
    /// the next one: they are larger than the other variants.
    #[error(transparent)]
    Gguf(Box<zinfer_probe::HeaderError>),
    /// A safetensors file's header could not be read.
    #[error(transparent)]
    Safetensors(Box<zinfer_probe::SafetensorsError>),
    /// A metadata key the loader needs is not in the GGUF file.
    #[error("GGUF metadata has no `{0}`")]
    MissingKey(String),
    /// A metadata value is of another type than the key takes.
    #[error("`{key}` is not {want}: {found}")]
    MetadataType {
        /// The full key (`qwen3.rope.freq_base`).
        key: String,
        /// What the loader reads there (`a float`, `an integer`).
        want: &'static str,
        /// The value found.
        found: String,
    },
    /// An integer metadata value out of the range the loader takes.
    #[error("`{key}` = {value} is out of range")]
    MetadataRange {
        /// The full key.
        key: String,
        /// The value found.
        value: i128,
    },
    /// A per-layer metadata array of another length than the model has
    /// layers.
    #[error("`{key}` has {got} flags for {layers} layers")]
    PerLayerLength {
        /// The full key.
        key: String,
        /// Entries in the array.
        got: usize,
        /// Layers of the model.
        layers: usize,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("{container} has no tensor `{tensor}`")]
    MissingTensor {
        /// `GGUF file` or `checkpoint`.
        container: &'static str,
        /// Checkpoint name of the tensor.
        tensor: String,
    },
    /// A matrix of another shape than the model's dimensions say.
    #[error(
        "`{tensor}` is {}x{}, the model config needs {}x{}",
        got.0,
        got.1,
        want.0,
        want.1
    )]
    MatrixShape {
        /// Checkpoint name of the tensor.
        tensor: String,
        /// Its (rows, cols).
        got: (usize, usize),
        /// The (rows, cols) the config needs.
        want: (usize, usize),
    },
    /// A vector of another length than the model's dimensions say.
    #[error("`{tensor}` has {got} values, the model config needs {want}")]
    VectorLength {
        /// Checkpoint name of the tensor.
        tensor: String,
        /// Its values.
        got: usize,
        /// The values the config needs.
        want: usize,
    },
    /// A tensor's bytes could not be made into a tensor.
    #[error("reading tensor `{tensor}`: {source}")]
    TensorData {
        /// Checkpoint name of the tensor.
        tensor: String,
        /// What candle said.
        source: candle_core::Error,
    },
    /// A tensor whose storage cannot serve the role it is loaded for.
    #[error("`{tensor}` {reason}")]
    TensorLayout {
        /// Checkpoint name of the tensor.
        tensor: String,
        /// Why (`is not dense`).
        reason: &'static str,
    },
    /// A quantized matrix the kernels refused.
    #[error("`{tensor}`: {source}")]
    QuantLayout {
        /// Checkpoint name of the tensor.
        tensor: String,
        /// What the kernels said.
        source: zinfer_kernels::LayoutError,
    },
    /// The checkpoint has another number of blocks than its config says.
    #[error("config says {config} layers, checkpoint has {checkpoint}")]
    BlockCount {
        /// Layers in the config.
        config: usize,
        /// Blocks of weights in the checkpoint.
        checkpoint: usize,
    },
    /// The model's dimensions contradict each other.
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    /// `config.json` could not be parsed.
    #[error("{path}: {source}")]
    HfConfig {
        /// The file.
        path: PathBuf,
        /// What serde said.
        source: serde_json::Error,
    },
    /// A `rope_scaling` in `config.json` with unusable values.
    #[error("config.json has an invalid llama3 rope_scaling: {0}")]
    HfRopeScaling(String),
    /// A Hugging Face directory of an architecture loaded from GGUF only.
    #[error(
        "{dir} is a `{model_type}` checkpoint: zinfer loads {arch} from GGUF files only (convert it with llama.cpp's convert_hf_to_gguf.py)"
    )]
    GgufOnly {
        /// The directory.
        dir: PathBuf,
        /// Its `model_type`.
        model_type: String,
        /// The architecture that loads from GGUF.
        arch: &'static str,
    },
    /// A directory without weights.
    #[error("{} has no *.safetensors files", .0.display())]
    NoSafetensors(PathBuf),
    /// A safetensors directory given to a GPU worker.
    #[error(
        "{} is a safetensors directory; GPU workers load GGUF files (convert it, or serve it with --device cpu)",
        .0.display()
    )]
    SafetensorsOnGpu(PathBuf),
    /// The model's architecture (or a feature of it) is not one zinfer runs.
    #[error(
        "unsupported architecture `{0}`: zinfer runs {list} (see README, Supported models)",
        list = arch::supported()
    )]
    UnsupportedArchitecture(String),
    /// A tensor is stored in a type the CPU kernels cannot use.
    #[error(
        "tensor `{tensor}` has unsupported type {dtype}: use a Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, K-quant, F16, BF16 or F32 file (or MXFP4, IQ4_NL, IQ4_XS on the CPU)"
    )]
    UnsupportedQuant {
        /// Checkpoint name of the tensor.
        tensor: String,
        /// Its stored type.
        dtype: String,
    },
    /// The requested device is unknown, not in this build, or not usable.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A forward batch broke the [`SeqChunk`] contract.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// `--attention-dtype bf16` on a CPU without AVX512_BF16.
    #[error(
        "bf16 attention needs a CPU with AVX512_BF16 (and AVX-512 VNNI), which this one lacks or ZINFER_CPU_LEVEL hides: use --attention-dtype auto or f32"
    )]
    NoBf16Attention,
    /// Reading or writing K/V for a cache transfer failed: bad slots, data
    /// of another shape, or a model that cannot transfer.
    #[error("cache transfer: {0}")]
    KvTransfer(String),
    /// A tensor operation failed.
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
    /// A metadata value or spec number out of the range a model can run
    /// with (a zero or absurd dimension, a NaN epsilon, heads that do not
    /// divide).
    #[error("`{what}` is {value}: it {want}")]
    Invalid {
        /// The full metadata key, or the spec number's name.
        what: String,
        /// The value found.
        value: String,
        /// What it must be.
        want: String,
    },
    /// The tokenizer's vocabulary and the embedding's rows disagree.
    #[error(
        "the tokenizer has {tokens} tokens but `token_embd.weight` has {rows} rows: ids past the shorter one would be garbage"
    )]
    VocabMismatch {
        /// Entries of `tokenizer.ggml.tokens`.
        tokens: u64,
        /// Rows of the embedding.
        rows: usize,
    },
    /// A special token id outside the vocabulary.
    #[error("`{key}` = {id} is outside the vocabulary of {vocab} tokens")]
    SpecialToken {
        /// The full key.
        key: String,
        /// The id found.
        id: i128,
        /// Tokens in the vocabulary.
        vocab: usize,
    },
    /// The weights would take more memory than the load may use.
    #[error(
        "loading needs about {need} bytes, more than the {available} available (set {env} to allow more)",
        env = validate::MEMORY_LIMIT_ENV
    )]
    Memory {
        /// Estimated bytes of weights and tables.
        need: u64,
        /// Bytes the load may use.
        available: u64,
    },
    /// A weight every logit goes through holds NaN or infinity.
    #[error("`{tensor}` holds {value} at sampled value {index}: the model cannot compute with it")]
    NonFinite {
        /// Checkpoint name of the tensor.
        tensor: String,
        /// Index among the values read.
        index: usize,
        /// The value.
        value: f32,
    },
}

impl From<zinfer_probe::HeaderError> for ModelError {
    fn from(e: zinfer_probe::HeaderError) -> Self {
        Self::Gguf(Box::new(e))
    }
}

impl From<zinfer_probe::SafetensorsError> for ModelError {
    fn from(e: zinfer_probe::SafetensorsError) -> Self {
        Self::Safetensors(Box::new(e))
    }
}

/// Loads a GGUF file or a safetensors directory (config.json, *.safetensors)
/// and allocates its KV pool; the checkpoint's tokenizer is
/// `zinfer_text::ModelTokenizer::open`'s.
///
/// `cpu` runs zinfer's own kernels ([`CpuModel`]); a GPU device runs [`CandleModel`] on it.
pub fn load(path: &Path, options: &LoadOptions) -> Result<LoadedModel, ModelError> {
    let device: Device = options.device.parse()?;
    match check_device(device)? {
        Device::Cpu | Device::CpuSet(_) | Device::Auto => {
            apply_threads(options.threads);
            let (model, classifier): (Box<dyn ForwardModel + Send>, _) = if path.is_dir() {
                (Box::new(safetensors::load(path, options)?), None)
            } else {
                gguf::load(path, options)?
            };
            Ok(LoadedModel {
                name: model_name(path),
                model,
                classifier,
            })
        }
        gpu => load_candle(path, options, &candle_device(gpu)?),
    }
}

/// Loads a GGUF file into [`CandleModel`] on any candle device: the GPU
/// backend, which also runs on candle's CPU device (how it is tested without
/// a GPU).
pub fn load_candle(
    path: &Path,
    options: &LoadOptions,
    device: &candle_core::Device,
) -> Result<LoadedModel, ModelError> {
    if path.is_dir() {
        return Err(ModelError::SafetensorsOnGpu(path.to_path_buf()));
    }
    let (model, classifier) = candle_model::load(path, options, device)?;
    Ok(LoadedModel {
        name: model_name(path),
        model: Box::new(model),
        classifier,
    })
}

/// Sizes the kernels' thread pool, or reports that an earlier model in
/// this process sized it otherwise.
fn apply_threads(threads: Option<usize>) {
    let Some(wanted) = threads.filter(|&n| n > 1) else {
        return;
    };
    let actual = zinfer_kernels::pool_threads(Some(wanted));
    if actual != wanted {
        tracing::warn!(
            wanted,
            actual,
            "the kernel thread pool was sized earlier in this process; --threads applies to the first model loaded"
        );
    }
}

/// Threads the CPU kernels split their work over (the kernels' pool, sized
/// as [`LoadOptions::threads`] says).
pub fn kernel_threads() -> usize {
    zinfer_kernels::pool_threads(None)
}
