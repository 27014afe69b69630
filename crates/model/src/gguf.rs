//! Loading GGUF files: the metadata into a [`ModelSpec`] (keys read with
//! the architecture's prefix, then the architecture's own rules), and the
//! tensors for the CPU kernels (the candle backend reads them in its module).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{Content, Value};
use zinfer_kernels::ScoreRule;

use super::arch::{self, RopeTensors};
use super::cpu::{CpuModel, CpuWeights};
use super::linear::{Embedding, Linear};
use super::spec::{MAX_POSITIONS, ModelSpec, RopeSpec};
use super::weights::{self, Naming, TensorSource};
use super::{LoadOptions, ModelError};

/// Reads the model from one GGUF file.
pub(crate) fn load(path: &Path, options: &LoadOptions) -> Result<CpuModel, ModelError> {
    let mut file = open(path)?;
    let spec = file.spec.clone();
    let weights: CpuWeights = weights::read(&mut CpuSource(&mut file), &spec, Naming::Gguf)?;
    CpuModel::new(spec, weights, options)
}

/// A GGUF file with its metadata read: what both backends start from.
pub(crate) struct GgufFile {
    pub(crate) content: Content,
    pub(crate) reader: BufReader<File>,
    pub(crate) spec: ModelSpec,
}

impl GgufFile {
    /// Whether the file has a tensor of this name.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads the tensor `name` onto `device`.
    pub(crate) fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor, ModelError> {
        if !self.has(name) {
            return Err(ModelError::Format(format!(
                "GGUF file has no tensor `{name}`"
            )));
        }
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|e| ModelError::Format(format!("reading tensor `{name}`: {e}")))
    }

    /// The tensor `name` as f32 values on the host, if the file has it.
    pub(crate) fn opt_vector(&mut self, name: &str) -> Result<Option<Vec<f32>>, ModelError> {
        opt_vector(&self.content, &mut self.reader, name)
    }
}

/// Reads a GGUF file's header and model spec (not the weights).
pub(crate) fn open(path: &Path) -> Result<GgufFile, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(File::open(path).map_err(io)?);
    let content = Content::read(&mut reader).map_err(|e| {
        ModelError::Format(format!(
            "{} is not a readable GGUF file: {e}",
            path.display()
        ))
    })?;
    let spec = spec(&content, &mut reader)?;
    Ok(GgufFile {
        content,
        reader,
        spec,
    })
}

/// The tensor `name` as f32 values on the host, if the file has it.
fn opt_vector<R: Read + Seek>(
    content: &Content,
    reader: &mut R,
    name: &str,
) -> Result<Option<Vec<f32>>, ModelError> {
    if !content.tensor_infos.contains_key(name) {
        return Ok(None);
    }
    let t = content
        .tensor(reader, name, &Device::Cpu)
        .map_err(|e| ModelError::Format(format!("reading tensor `{name}`: {e}")))?;
    let v = t
        .dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(Some(v))
}

/// GGUF metadata of one architecture: `usize("block_count")` reads
/// `{arch}.block_count`.
pub(crate) struct Meta<'a> {
    md: &'a HashMap<String, Value>,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    /// `{arch}.{key}` as an integer; an error when it is missing.
    pub(crate) fn usize(&self, key: &str) -> Result<usize, ModelError> {
        let full = self.key(key);
        self.opt_usize(key)?
            .ok_or_else(|| ModelError::Format(format!("GGUF metadata has no `{full}`")))
    }

    /// `{arch}.{key}` as an integer, if present.
    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        let full = self.key(key);
        self.md
            .get(&full)
            .map(|v| value_usize(v, &full))
            .transpose()
    }

    /// `{arch}.{key}` as a float, if present.
    pub(crate) fn opt_f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        let full = self.key(key);
        match self.md.get(&full) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(*v)),
            Some(Value::F64(v)) => Ok(Some(*v as f32)),
            Some(other) => Err(ModelError::Format(format!(
                "`{full}` is not a float: {other:?}"
            ))),
        }
    }

    /// `{arch}.{key}` as a string, if present.
    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&str>, ModelError> {
        let full = self.key(key);
        match self.md.get(&full) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(ModelError::Format(format!(
                "`{full}` is not a string: {other:?}"
            ))),
        }
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
        let period = match self.md.get(&full) {
            Some(Value::Array(flags)) => {
                if flags.len() != n_layers {
                    return Err(ModelError::Format(format!(
                        "`{full}` has {} flags for {n_layers} layers",
                        flags.len()
                    )));
                }
                return flags
                    .iter()
                    .map(|f| match f {
                        Value::Bool(b) => Ok(*b),
                        other => Err(ModelError::Format(format!(
                            "`{full}` holds {other:?}, not flags"
                        ))),
                    })
                    .collect();
            }
            Some(v) => value_usize(v, &full)?,
            None => period,
        };
        Ok((0..n_layers)
            .map(|i| period == 0 || i % period < period - 1)
            .collect())
    }
}

/// The spec of an opened file: the keys every architecture shares, then
/// the architecture's own.
fn spec<R: Read + Seek>(content: &Content, reader: &mut R) -> Result<ModelSpec, ModelError> {
    let md = &content.metadata;
    let name = match md.get("general.architecture") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(ModelError::Format(
                "GGUF metadata has no general.architecture".to_string(),
            ));
        }
    };
    let arch = arch::by_gguf_name(&name)?;
    let meta = Meta { md, arch: &name };
    if meta.opt_usize("expert_count")?.unwrap_or(0) > 0 {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{name} with mixture-of-experts"
        )));
    }
    let n_heads = meta.usize("attention.head_count")?;
    let hidden = meta.usize("embedding_length")?;
    let head_dim = match meta.opt_usize("attention.key_length")? {
        Some(d) => d,
        None => hidden / n_heads.max(1),
    };
    if let Some(v) = meta.opt_usize("attention.value_length")?
        && v != head_dim
    {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{name} with value heads of {v} and key heads of {head_dim}"
        )));
    }
    if let Some(rope_dim) = meta.opt_usize("rope.dimension_count")?
        && rope_dim != head_dim
    {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{name} with partial RoPE ({rope_dim} of {head_dim} dims)"
        )));
    }
    let vocab = content
        .tensor_infos
        .get("token_embd.weight")
        .and_then(|t| t.shape.dims().first().copied())
        .ok_or_else(|| {
            ModelError::Format("GGUF file has no usable tensor `token_embd.weight`".to_string())
        })?;
    let n_layers = meta.usize("block_count")?;
    let mut rope = RopeSpec::plain(
        arch.rope_style,
        meta.opt_f32("rope.freq_base")?.unwrap_or(10_000.0),
    );
    match meta.opt_str("rope.scaling.type")? {
        None | Some("none") => {}
        Some("linear") => {
            if let Some(f) = meta.opt_f32("rope.scaling.factor")?.filter(|&f| f > 0.0) {
                rope.scaling.linear = f;
            }
        }
        // YaRN needs attention scaling zinfer does not do; refuse rather than drift.
        Some(other) if other != "longrope" => {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "{name} with `{other}` RoPE scaling"
            )));
        }
        Some(_) => {}
    }
    let mut spec = ModelSpec {
        arch: arch.name,
        n_layers,
        n_heads,
        n_kv_heads: meta
            .opt_usize("attention.head_count_kv")?
            .unwrap_or(n_heads),
        hidden,
        head_dim,
        ffn: meta.usize("feed_forward_length")?,
        vocab,
        norm_eps: meta
            .opt_f32("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5),
        max_positions: meta
            .opt_usize("context_length")?
            .unwrap_or(4096)
            .min(MAX_POSITIONS),
        ropes: vec![rope],
        layers: ModelSpec::uniform_layers(n_layers, None),
        attn: ScoreRule::standard(head_dim),
        activation: arch.activation,
        embed_scale: None,
        final_softcap: None,
        layout: arch.layout,
    };
    if let Some(f) = opt_vector(content, reader, "rope_freqs.weight")? {
        spec.ropes[0].scaling.freq_factors = f;
    }
    let file_rope = RopeTensors {
        long: opt_vector(content, reader, "rope_factors_long.weight")?,
        short: opt_vector(content, reader, "rope_factors_short.weight")?,
    };
    (arch.finish)(&mut spec, &meta, &file_rope)?;
    spec.validate()?;
    Ok(spec)
}

/// The CPU kernels' view of a GGUF file.
struct CpuSource<'a>(&'a mut GgufFile);

impl TensorSource for CpuSource<'_> {
    type Embedding = Embedding;
    type Matrix = Linear;
    type Vector = Vec<f32>;

    fn has_own_head(&self, name: &str) -> bool {
        self.0.has(name)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        let lin = Linear::from_qtensor(name, self.0.qtensor(name, &Device::Cpu)?)?;
        check_dims(name, (lin.rows(), lin.cols()), (rows, cols))?;
        Ok(lin)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let v = self
            .0
            .opt_vector(name)?
            .ok_or_else(|| ModelError::Format(format!("GGUF file has no tensor `{name}`")))?;
        check_len(name, v.len(), len)?;
        Ok(v)
    }

    fn concat(&mut self, parts: Vec<Vec<f32>>) -> Result<Vec<f32>, ModelError> {
        Ok(parts.concat())
    }

    fn embedding(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        tied: bool,
    ) -> Result<(Embedding, Option<Linear>), ModelError> {
        let qt = self.0.qtensor(name, &Device::Cpu)?;
        check_dims(name, qt.shape().dims2()?, (rows, cols))?;
        if tied {
            let (table, head) = Embedding::with_tied_head(name, qt)?;
            Ok((table, Some(head)))
        } else {
            Ok((Embedding::from_qtensor(name, qt)?, None))
        }
    }
}

/// Fails unless a matrix is `want` (rows, cols).
pub(crate) fn check_dims(
    name: &str,
    got: (usize, usize),
    want: (usize, usize),
) -> Result<(), ModelError> {
    if got != want {
        return Err(ModelError::Format(format!(
            "`{name}` is {}x{}, the model config needs {}x{}",
            got.0, got.1, want.0, want.1
        )));
    }
    Ok(())
}

/// Fails unless a vector has `want` values.
pub(crate) fn check_len(name: &str, got: usize, want: usize) -> Result<(), ModelError> {
    if got != want {
        return Err(ModelError::Format(format!(
            "`{name}` has {got} values, the model config needs {want}"
        )));
    }
    Ok(())
}

/// Any GGUF integer as a usize (metadata writers disagree on widths).
pub(crate) fn value_usize(v: &Value, key: &str) -> Result<usize, ModelError> {
    let n: i128 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        other => {
            return Err(ModelError::Format(format!(
                "`{key}` is not an integer: {other:?}"
            )));
        }
    };
    usize::try_from(n).map_err(|_| ModelError::Format(format!("`{key}` = {n} is out of range")))
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::GgmlDType;
    use candle_core::quantized::gguf_file::{TensorInfo, VersionedMagic};

    use super::*;

    /// A header with `keys` (`{arch}.` added) over a 4-layer model with
    /// 8 heads of 32 (2 KV heads) and no tensor data but the embedding's info.
    fn header(arch: &str, keys: &[(&str, Value)]) -> Content {
        let mut metadata: HashMap<String, Value> = [
            ("block_count", Value::U32(4)),
            ("embedding_length", Value::U32(256)),
            ("feed_forward_length", Value::U32(512)),
            ("attention.head_count", Value::U32(8)),
            ("attention.head_count_kv", Value::U32(2)),
            ("context_length", Value::U32(8192)),
        ]
        .into_iter()
        .chain(keys.iter().cloned())
        .map(|(k, v)| (format!("{arch}.{k}"), v))
        .collect();
        metadata.insert("general.architecture".into(), Value::String(arch.into()));
        let embd = TensorInfo {
            ggml_dtype: GgmlDType::F32,
            shape: (100, 256).into(),
            offset: 0,
        };
        Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: [("token_embd.weight".to_string(), embd)].into(),
            tensor_data_offset: 0,
        }
    }

    fn read(arch: &str, keys: &[(&str, Value)]) -> Result<ModelSpec, ModelError> {
        spec(&header(arch, keys), &mut std::io::Cursor::new(Vec::new()))
    }

    #[test]
    fn gemma_layers_slide_by_their_pattern_with_a_local_rope() {
        let g3 = read(
            "gemma3",
            &[
                ("attention.sliding_window", Value::U32(512)),
                ("rope.freq_base", Value::F32(1e6)),
            ],
        )
        .unwrap();
        // Four layers of a 5-local : 1-global pattern: all local.
        assert!(
            g3.layers
                .iter()
                .all(|l| l.window == Some(512) && l.rope == 1)
        );
        assert_eq!(g3.ropes[1].theta, 10_000.0);
        assert_eq!(g3.embed_scale, Some(16.0));
        let g2 = read("gemma2", &[]).unwrap();
        let windows: Vec<_> = g2.layers.iter().map(|l| l.window).collect();
        assert_eq!(windows, [Some(4096), None, Some(4096), None]);
        assert_eq!(
            (g2.attn.softcap, g2.final_softcap),
            (Some(50.0), Some(30.0))
        );
        let flags = Value::Array(vec![Value::Bool(false); 4]);
        let none = read(
            "gemma3",
            &[
                ("attention.sliding_window", Value::U32(512)),
                ("attention.sliding_window_pattern", flags),
            ],
        )
        .unwrap();
        assert!(none.layers.iter().all(|l| l.window.is_none()));
    }

    #[test]
    fn rope_scaling_is_read_or_refused() {
        let linear = [
            ("rope.scaling.type", Value::String("linear".into())),
            ("rope.scaling.factor", Value::F32(8.0)),
        ];
        assert_eq!(
            read("gemma3", &linear).unwrap().ropes[0].scaling.linear,
            8.0
        );
        let yarn = [("rope.scaling.type", Value::String("yarn".into()))];
        assert!(matches!(
            read("qwen2", &yarn),
            Err(ModelError::UnsupportedArchitecture(m)) if m.contains("yarn")
        ));
        let key_length = [("attention.key_length", Value::U32(64))];
        assert_eq!(read("qwen3", &key_length).unwrap().head_dim, 64);
        let moe = [("expert_count", Value::U32(8))];
        assert!(read("qwen3", &moe).is_err());
    }

    #[test]
    fn phi3_picks_long_factors_past_the_original_context() {
        let rope = RopeTensors {
            long: Some(vec![4.0; 16]),
            short: Some(vec![1.5; 16]),
        };
        for (original, want) in [(4096, 4.0), (8192, 1.5)] {
            let keys = [
                ("rope.scaling.original_context_length", Value::U32(original)),
                ("rope.scaling.attn_factor", Value::F32(1.19)),
            ];
            let content = header("phi3", &keys);
            let mut spec = read("phi3", &keys).unwrap();
            let meta = Meta {
                md: &content.metadata,
                arch: "phi3",
            };
            (arch::by_gguf_name("phi3").unwrap().finish)(&mut spec, &meta, &rope).unwrap();
            assert_eq!(
                spec.ropes[0].scaling.freq_factors,
                vec![want; 16],
                "{original}"
            );
            assert_eq!(spec.ropes[0].scaling.attn_factor, 1.19);
        }
    }
}
