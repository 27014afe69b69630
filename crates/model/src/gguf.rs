//! Loading GGUF files: the metadata into a [`ModelSpec`] (keys read with
//! the architecture's prefix, then the architecture's own rules), and the
//! tensors for the CPU kernels (the candle backend reads them in its module).
//!
//! The header, metadata and tensor table are read by the probe's hardened
//! reader ([`zinfer_probe::read_header`]); candle only turns each tensor's
//! bytes into a [`QTensor`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::{GgmlDType, QTensor};
use zinfer_kernels::{QKind, QMatrix, ScoreRule};
use zinfer_probe::{GgmlType, GgufHeader, TensorInfo};

use super::arch::{self, RopeTensors};
use super::classifier::Classifier;
use super::cpu::{CpuModel, CpuWeights};
use super::hybrid::{self, HybridModel};
use super::linear::{Embedding, Linear};
use super::meta::Meta;
use super::spec::{MAX_POSITIONS, ModelSpec, RopeSpec, Yarn};
use super::weights::{self, Naming, TensorSource};
use super::{ForwardModel, LoadOptions, ModelError, validate};

/// Reads the model from one GGUF file, with a reranker's head when it has one.
pub(crate) fn load(
    path: &Path,
    options: &LoadOptions,
) -> Result<(Box<dyn ForwardModel + Send>, Option<Classifier>), ModelError> {
    let mut file = open(path)?;
    validate::memory(&file.tensors, &file.spec)?;
    let spec = file.spec.clone();
    if let Some(hy) = &spec.hybrid {
        let weights = hybrid::read(&mut CpuSource(&mut file), &spec, hy)?;
        let classifier = Classifier::read(&mut file)?;
        return Ok((
            Box::new(HybridModel::new(spec, weights, options)?),
            classifier,
        ));
    }
    let weights: CpuWeights = weights::read(&mut CpuSource(&mut file), &spec, Naming::Gguf)?;
    let classifier = Classifier::read(&mut file)?;
    Ok((Box::new(CpuModel::new(spec, weights, options)?), classifier))
}

/// A GGUF file with its metadata read: what both backends start from.
pub(crate) struct GgufFile {
    pub(crate) tensors: Tensors,
    pub(crate) spec: ModelSpec,
}

impl GgufFile {
    /// Whether the file has a tensor of this name.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.tensors.has(name)
    }

    /// Reads the tensor `name` onto `device`.
    pub(crate) fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor, ModelError> {
        self.tensors.qtensor(name, device)
    }

    /// The tensor `name` as f32 values on the host, if the file has it.
    pub(crate) fn opt_vector(&mut self, name: &str) -> Result<Option<Vec<f32>>, ModelError> {
        self.tensors.opt_vector(name)
    }

    /// The stacked expert tensor `name` (ggml `[cols, rows, experts]`), one
    /// `[rows, cols]` tensor per expert on `device`: each expert's blocks
    /// are contiguous in the file, so a split costs one copy at load.
    pub(crate) fn expert_qtensors(
        &mut self,
        name: &str,
        experts: usize,
        (rows, cols): (usize, usize),
        device: &Device,
    ) -> Result<Vec<QTensor>, ModelError> {
        let stacked = self.qtensor(name, &Device::Cpu)?;
        let dims = stacked.shape().dims();
        if dims != [experts, rows, cols] {
            return Err(ModelError::TensorLayout {
                tensor: name.to_string(),
                reason: "is not [experts, rows, cols] as the metadata says",
            });
        }
        let dtype = stacked.dtype();
        let data = stacked.data()?;
        let per = data.len() / experts.max(1);
        data.chunks_exact(per.max(1))
            .map(|bytes| {
                qtensor_from_ggml(dtype, bytes, vec![rows, cols], device).map_err(|source| {
                    ModelError::TensorData {
                        tensor: name.to_string(),
                        source,
                    }
                })
            })
            .collect()
    }
}

/// Reads a GGUF file's header and model spec (not the weights), and checks
/// that the weights it names can load and compute.
pub(crate) fn open(path: &Path) -> Result<GgufFile, ModelError> {
    let mut tensors = Tensors::open(path)?;
    let spec = spec(&mut tensors)?;
    validate::file(&mut tensors, &spec)?;
    Ok(GgufFile { tensors, spec })
}

/// A GGUF file's header and tensor table, with the file open to read
/// tensor data from.
pub(crate) struct Tensors {
    index: Index,
    reader: BufReader<File>,
}

impl Tensors {
    /// Reads the header (not the tensor data).
    fn open(path: &Path) -> Result<Self, ModelError> {
        let reader = BufReader::new(File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?);
        let header = zinfer_probe::read_header(path)?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            index: Index { header, by_name },
            reader,
        })
    }

    fn has(&self, name: &str) -> bool {
        self.index.info(name).is_some()
    }

    /// The header and tensor table.
    pub(crate) fn header(&self) -> &GgufHeader {
        &self.index.header
    }

    /// The table entry of tensor `name`.
    pub(crate) fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.info(name)
    }

    /// Rows `rows` of the matrix `name`, as f32 values, read alone (a
    /// sample of a large head without reading all of it).
    pub(crate) fn rows(&mut self, name: &str, rows: &[usize]) -> Result<Vec<f32>, ModelError> {
        let info = self.index.info(name).ok_or_else(|| missing_tensor(name))?;
        let kind = kernel_kind(info.ggml_type);
        let dtype = match kind {
            Some(_) => GgmlDType::F32,
            None => candle_layout(name, info)?.0,
        };
        let cols = info.dims.first().copied().unwrap_or(0);
        let row_bytes = info
            .ggml_type
            .bytes_for(cols)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| unsupported_quant(name, info))?;
        let start = self.index.header.data_offset + info.offset;
        let io = |source| ModelError::Io {
            path: self.index.header.path.clone(),
            source,
        };
        let mut out = Vec::new();
        let mut raw = vec![0u8; row_bytes];
        for &row in rows {
            self.reader
                .seek(SeekFrom::Start(start + (row * row_bytes) as u64))
                .map_err(io)?;
            self.reader.read_exact(&mut raw).map_err(io)?;
            if let Some(kind) = kind {
                let mut values = vec![0f32; cols as usize];
                QMatrix::new(kind, 1, cols as usize, raw.clone())
                    .map_err(|source| ModelError::QuantLayout {
                        tensor: name.to_string(),
                        source,
                    })?
                    .dequantize_row(0, &mut values);
                out.extend(values);
                continue;
            }
            let values = qtensor_from_ggml(dtype, &raw, vec![cols as usize], &Device::Cpu)
                .and_then(|q| q.dequantize(&Device::Cpu))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|source| ModelError::TensorData {
                    tensor: name.to_string(),
                    source,
                })?;
            out.extend(values);
        }
        Ok(out)
    }

    fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor, ModelError> {
        self.index.qtensor(&mut self.reader, name, device)
    }

    fn opt_vector(&mut self, name: &str) -> Result<Option<Vec<f32>>, ModelError> {
        self.index.opt_vector(&mut self.reader, name)
    }

    fn kernel_only(&mut self, name: &str) -> Result<Option<KernelTensor>, ModelError> {
        self.index.kernel_only(&mut self.reader, name)
    }
}

/// A tensor of a type only zinfer's kernels read: the kernels' name for
/// the type, its dimensions (outermost first) and its stored bytes.
type KernelTensor = (QKind, Vec<usize>, Vec<u8>);

/// The kernels' type for the ggml types that zinfer's CPU kernels read and
/// candle does not: MXFP4 (gpt-oss's experts), IQ4_NL and IQ4_XS.
pub(crate) fn kernel_kind(t: GgmlType) -> Option<QKind> {
    Some(match t.0 {
        20 => QKind::Iq4Nl,
        23 => QKind::Iq4Xs,
        39 => QKind::Mxfp4,
        _ => return None,
    })
}

/// The header and its tensors by name: apart from the open file, so the
/// metadata can be read while tensors are.
struct Index {
    header: GgufHeader,
    /// Tensor name -> index in `header.tensors`.
    by_name: HashMap<String, usize>,
}

impl Index {
    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.header.tensors[i])
    }

    /// Reads the tensor `name` onto `device`: its bytes from the file,
    /// made a [`QTensor`] by candle.
    fn qtensor(
        &self,
        reader: &mut BufReader<File>,
        name: &str,
        device: &Device,
    ) -> Result<QTensor, ModelError> {
        let info = self.info(name).ok_or_else(|| missing_tensor(name))?;
        let (dtype, len) = candle_layout(name, info)?;
        let raw = self.read_bytes(reader, info, len)?;
        // ggml lists dimensions innermost first; candle outermost first.
        let dims = info.dims.iter().rev().map(|&d| d as usize).collect();
        qtensor_from_ggml(dtype, &raw, dims, device).map_err(|source| ModelError::TensorData {
            tensor: name.to_string(),
            source,
        })
    }

    /// The `len` bytes of `info`'s data.
    fn read_bytes(
        &self,
        reader: &mut BufReader<File>,
        info: &TensorInfo,
        len: usize,
    ) -> Result<Vec<u8>, ModelError> {
        let io = |source| ModelError::Io {
            path: self.header.path.clone(),
            source,
        };
        let mut raw = vec![0u8; len];
        reader
            .seek(SeekFrom::Start(self.header.data_offset + info.offset))
            .map_err(io)?;
        reader.read_exact(&mut raw).map_err(io)?;
        Ok(raw)
    }

    /// `name` when it is of a type only the kernels read ([`kernel_kind`]);
    /// `None` for other types.
    fn kernel_only(
        &self,
        reader: &mut BufReader<File>,
        name: &str,
    ) -> Result<Option<KernelTensor>, ModelError> {
        let Some((info, kind)) = self
            .info(name)
            .and_then(|i| Some((i, kernel_kind(i.ggml_type)?)))
        else {
            return Ok(None);
        };
        let len = info.bytes().and_then(|b| usize::try_from(b).ok());
        let len = len.ok_or_else(|| ModelError::UnsupportedQuant {
            tensor: name.to_string(),
            dtype: info.ggml_type.to_string(),
        })?;
        let dims = info.dims.iter().rev().map(|&d| d as usize).collect();
        Ok(Some((kind, dims, self.read_bytes(reader, info, len)?)))
    }

    /// The tensor `name` as f32 values on the host, if the file has it.
    fn opt_vector(
        &self,
        reader: &mut BufReader<File>,
        name: &str,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        if self.info(name).is_none() {
            return Ok(None);
        }
        let v = self
            .qtensor(reader, name, &Device::Cpu)?
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(Some(v))
    }
}

/// A tensor's candle type and byte length, refused where candle cannot
/// build it or would read another length than the table gives.
pub(crate) fn candle_layout(
    name: &str,
    info: &TensorInfo,
) -> Result<(GgmlDType, usize), ModelError> {
    let unsupported = || unsupported_quant(name, info);
    let dtype = ggml_dtype(info.ggml_type).ok_or_else(unsupported)?;
    // The probe checked that a tensor of a sized type lies inside the file.
    let bytes = info.bytes().ok_or_else(unsupported)?;
    let len = usize::try_from(bytes).map_err(|_| unsupported())?;
    // candle reads the buffer by its own block sizes without checking
    // its length: refuse where the probe's table and candle's disagree.
    let blocks = usize::try_from(info.elements() / dtype.block_size() as u64);
    if blocks.ok().and_then(|b| b.checked_mul(dtype.type_size())) != Some(len) {
        return Err(unsupported());
    }
    Ok((dtype, len))
}

fn unsupported_quant(name: &str, info: &TensorInfo) -> ModelError {
    ModelError::UnsupportedQuant {
        tensor: name.to_string(),
        dtype: info.ggml_type.to_string(),
    }
}

/// The candle type of a tensor, for the ggml types candle builds.
fn ggml_dtype(ggml_type: GgmlType) -> Option<GgmlDType> {
    Some(match ggml_type.0 {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

pub(crate) fn missing_tensor(name: &str) -> ModelError {
    ModelError::MissingTensor {
        container: "GGUF file",
        tensor: name.to_string(),
    }
}

/// The spec of an opened file: the keys every architecture shares, then
/// the architecture's own.
fn spec(tensors: &mut Tensors) -> Result<ModelSpec, ModelError> {
    let Tensors { index, reader } = tensors;
    let name = index
        .header
        .str("general.architecture")
        .ok_or_else(|| ModelError::MissingKey("general.architecture".to_string()))?;
    let arch = arch::by_gguf_name(name)?;
    let meta = Meta::new(&index.header, name);
    validate::metadata(&meta)?;
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
    // ggml dimensions are innermost first: the vocabulary is the last.
    let vocab = index
        .info("token_embd.weight")
        .and_then(|t| t.dims.last())
        .map(|&n| n as usize)
        .ok_or_else(|| missing_tensor("token_embd.weight"))?;
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
        Some("yarn") => {
            // As llama.cpp: no factor is 1, the original context defaults to the trained one.
            let factor = meta.opt_f32("rope.scaling.factor")?.filter(|&f| f > 0.0);
            let original = match meta.opt_usize("rope.scaling.original_context_length")? {
                Some(n) => n,
                None => meta.opt_usize("context_length")?.unwrap_or(4096),
            };
            rope.scaling.yarn = Some(Yarn::new(factor.unwrap_or(1.0), original));
            if let Some(a) = meta.opt_f32("rope.scaling.attn_factor")? {
                rope.scaling.attn_factor = a;
            }
        }
        Some(other) if other != "longrope" => {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "{name} with `{other}` RoPE scaling"
            )));
        }
        Some(_) => {}
    }
    // Per layer in some Gemma 4 files; the widest here, each layer's below.
    let layer_ffn = meta
        .opt_per_layer("feed_forward_length", n_layers)?
        .ok_or_else(|| ModelError::MissingKey(meta.key("feed_forward_length")))?;
    let ffn = layer_ffn.iter().copied().max().unwrap_or(0);
    let moe = arch::moe_spec(arch, &meta, ffn)?;
    // Per layer in Gemma 4's files; the widest here, each layer's in its finish.
    let n_kv_heads = meta
        .opt_per_layer("attention.head_count_kv", n_layers)?
        .and_then(|per_layer| per_layer.into_iter().max())
        .unwrap_or(n_heads);
    let mut spec = ModelSpec {
        arch: arch.name(),
        n_layers,
        n_heads,
        n_kv_heads,
        hidden,
        head_dim,
        ffn,
        vocab,
        norm_eps: meta
            .opt_f32("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5),
        max_positions: meta
            .opt_usize("context_length")?
            .unwrap_or(4096)
            .min(MAX_POSITIONS),
        ropes: vec![rope],
        layers: ModelSpec::uniform_layers(n_layers, None, n_kv_heads, head_dim, ffn),
        attn: ScoreRule::standard(head_dim),
        activation: arch.activation,
        embed_scale: None,
        final_softcap: None,
        layout: arch.layout,
        moe,
        hybrid: None,
        per_layer_input: None,
        v_norm: false,
        dense_beside_moe: false,
    };
    for (layer, ffn) in spec.layers.iter_mut().zip(layer_ffn) {
        layer.ffn = ffn;
    }
    if let Some(f) = index.opt_vector(reader, "rope_freqs.weight")? {
        spec.ropes[0].scaling.freq_factors = f;
    }
    let file_rope = RopeTensors {
        long: index.opt_vector(reader, "rope_factors_long.weight")?,
        short: index.opt_vector(reader, "rope_factors_short.weight")?,
    };
    (arch.finish)(&mut spec, &meta, &file_rope)?;
    if let Some(rope_dim) = meta.opt_usize("rope.dimension_count")?
        && rope_dim != spec.rotary_dims()
    {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{name} with partial RoPE ({rope_dim} of {head_dim} dims)"
        )));
    }
    spec.validate()?;
    validate::spec(&spec)?;
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

    fn has(&self, name: &str) -> bool {
        self.0.has(name)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        if let Some((kind, dims, bytes)) = self.0.tensors.kernel_only(name)? {
            check_dims(
                name,
                (dims_at(&dims, 2, 0), dims_at(&dims, 2, 1)),
                (rows, cols),
            )?;
            return Linear::kernel_only(name, kind, rows, cols, bytes);
        }
        let lin = Linear::from_qtensor(name, self.0.qtensor(name, &Device::Cpu)?)?;
        check_dims(name, (lin.rows(), lin.cols()), (rows, cols))?;
        Ok(lin)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let v = self
            .0
            .opt_vector(name)?
            .ok_or_else(|| missing_tensor(name))?;
        check_len(name, v.len(), len)?;
        Ok(v)
    }

    fn concat(&mut self, parts: Vec<Vec<f32>>) -> Result<Vec<f32>, ModelError> {
        Ok(parts.concat())
    }

    fn experts(
        &mut self,
        name: &str,
        experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Linear>, ModelError> {
        if let Some((kind, dims, bytes)) = self.0.tensors.kernel_only(name)? {
            if dims != [experts, rows, cols] {
                return Err(ModelError::TensorLayout {
                    tensor: name.to_string(),
                    reason: "is not [experts, rows, cols] as the metadata says",
                });
            }
            let per = bytes.len() / experts.max(1);
            return bytes
                .chunks_exact(per.max(1))
                .map(|b| Linear::kernel_only(name, kind, rows, cols, b.to_vec()))
                .collect();
        }
        let parts = self
            .0
            .expert_qtensors(name, experts, (rows, cols), &Device::Cpu)?;
        parts
            .into_iter()
            .map(|qt| Linear::from_qtensor(name, qt))
            .collect()
    }

    fn embedding(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        tied: bool,
    ) -> Result<(Embedding, Option<Linear>), ModelError> {
        if self
            .0
            .tensors
            .info(name)
            .is_some_and(|i| kernel_kind(i.ggml_type).is_some())
        {
            let head = self.matrix(name, rows, cols)?;
            return Ok((
                Embedding::of_kernel_matrix(name, &head)?,
                tied.then_some(head),
            ));
        }
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

/// Dimension `i` of a rank-`rank` shape (outermost first), 0 for another rank.
fn dims_at(dims: &[usize], rank: usize, i: usize) -> usize {
    if dims.len() == rank { dims[i] } else { 0 }
}

/// Fails unless a matrix is `want` (rows, cols).
pub(crate) fn check_dims(
    name: &str,
    got: (usize, usize),
    want: (usize, usize),
) -> Result<(), ModelError> {
    if got != want {
        return Err(ModelError::MatrixShape {
            tensor: name.to_string(),
            got,
            want,
        });
    }
    Ok(())
}

/// Fails unless a vector has `want` values.
pub(crate) fn check_len(name: &str, got: usize, want: usize) -> Result<(), ModelError> {
    if got != want {
        return Err(ModelError::VectorLength {
            tensor: name.to_string(),
            got,
            want,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::gguf_file::{self, Value};

    use super::*;

    /// A GGUF file with `keys` (`{arch}.` added) over a 4-layer model with
    /// 8 heads of 32 (2 KV heads) and no tensor but the embedding, opened.
    fn header(arch: &str, keys: &[(&str, Value)]) -> (tempfile::TempDir, Tensors) {
        header_with(arch, keys, &[])
    }

    /// [`header`] with more tensors after the embedding.
    fn header_with(
        arch: &str,
        keys: &[(&str, Value)],
        more: &[(&str, &QTensor)],
    ) -> (tempfile::TempDir, Tensors) {
        let mut metadata: Vec<(String, Value)> = [
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
        metadata.push(("general.architecture".into(), Value::String(arch.into())));
        let refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let embd = candle_core::Tensor::zeros((100, 256), candle_core::DType::F32, &Device::Cpu)
            .and_then(|t| QTensor::quantize(&t, GgmlDType::F32))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut out = File::create(&path).unwrap();
        let tensors: Vec<(&str, &QTensor)> = [("token_embd.weight", &embd)]
            .into_iter()
            .chain(more.iter().copied())
            .collect();
        gguf_file::write(&mut out, &refs, &tensors).unwrap();
        drop(out);
        let tensors = Tensors::open(&path).unwrap();
        (dir, tensors)
    }

    fn read(arch: &str, keys: &[(&str, Value)]) -> Result<ModelSpec, ModelError> {
        spec(&mut header(arch, keys).1)
    }

    /// The probe sizes every type candle builds here as candle does, so
    /// the length check before `qtensor_from_ggml` refuses nothing it takes.
    #[test]
    fn the_probe_and_candle_agree_on_block_sizes() {
        let mut built = 0;
        for code in 0..64 {
            let Some(dtype) = ggml_dtype(GgmlType(code)) else {
                continue;
            };
            built += 1;
            let candle = (dtype.block_size() as u64, dtype.type_size() as u64);
            assert_eq!(GgmlType(code).block(), Some(candle), "type {code}");
        }
        assert_eq!(built, 14);
    }

    /// Gemma 4's keys: per-kind head widths, windows and RoPEs, the shared
    /// layers' KV source, and the layouts it does not cover refused by name.
    #[test]
    fn gemma4_reads_its_layer_kinds_and_refuses_what_it_does_not_cover() {
        let moe = read(
            "gemma4",
            &[
                ("attention.sliding_window", Value::U32(16)),
                (
                    "attention.sliding_window_pattern",
                    Value::Array(vec![Value::Bool(true); 4]),
                ),
                ("expert_count", Value::U32(8)),
                ("expert_used_count", Value::U32(2)),
                ("expert_feed_forward_length", Value::U32(64)),
            ],
        )
        .unwrap();
        assert!(moe.dense_beside_moe);
        assert_eq!(
            moe.moe.map(|m| (m.experts, m.used, m.expert_ffn, m.gating)),
            Some((
                8,
                2,
                64,
                crate::spec::Gating::SoftmaxTopK { renormalize: true }
            ))
        );
        let flags = |f: &[bool]| Value::Array(f.iter().map(|&b| Value::Bool(b)).collect());
        let keys = |pattern: &[bool], extra: &[(&'static str, Value)]| {
            let mut k = vec![
                ("attention.sliding_window", Value::U32(16)),
                ("attention.key_length", Value::U32(64)),
                ("attention.key_length_swa", Value::U32(32)),
                ("attention.shared_kv_layers", Value::U32(1)),
                ("attention.sliding_window_pattern", flags(pattern)),
            ];
            k.extend(extra.iter().cloned());
            k
        };
        let g4 = read("gemma4", &keys(&[true, true, false, true], &[])).unwrap();
        let widths: Vec<_> = g4.layers.iter().map(|l| (l.head_dim, l.window)).collect();
        assert_eq!(
            widths,
            [(32, Some(16)), (32, Some(16)), (64, None), (32, Some(16))]
        );
        let sources: Vec<_> = g4.layers.iter().map(|l| l.kv_from).collect();
        assert_eq!(sources, [None, None, None, Some(1)]);
        assert_eq!(
            (g4.ropes[g4.layers[0].rope].theta, g4.layers[2].rope),
            (10_000.0, 0)
        );
        assert_eq!(
            (g4.attn.scale, g4.v_norm, g4.embed_scale),
            (1.0, true, Some(16.0))
        );
        assert_eq!(g4.kv_layer_dims(), [64, 64, 128]);
        assert_eq!(g4.kv_pool_layer(3), 1);
        assert_eq!(g4.kv_shape().floats_per_slot(), 2 * 256);

        let refused = |keys: Vec<(&str, Value)>, want: &str| {
            let err = read("gemma4", &keys).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        };
        // A shared global layer whose source (layer 2) slides.
        refused(
            keys(&[true, true, true, false], &[]),
            "layer 3 shares the KV of layer 2, of the other attention kind",
        );
        // The 26B-A4B's experts need their count and width.
        refused(
            keys(
                &[true, true, false, true],
                &[("expert_count", Value::U32(8))],
            ),
            "`gemma4.expert_used_count`",
        );
        refused(
            keys(
                &[true, true, false, true],
                &[("rope.dimension_count_swa", Value::U32(16))],
            ),
            "partial RoPE on sliding layers (16 of 32 dims)",
        );
        let mut no_pattern = keys(&[true, true, false, true], &[]);
        no_pattern.pop();
        refused(no_pattern, "`gemma4.attention.sliding_window_pattern`");
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
        // Gemma 3 with a 512-token window and this pattern.
        let with_pattern = |pattern: Value| {
            read(
                "gemma3",
                &[
                    ("attention.sliding_window", Value::U32(512)),
                    ("attention.sliding_window_pattern", pattern),
                ],
            )
        };
        let none = with_pattern(Value::Array(vec![Value::Bool(false); 4])).unwrap();
        assert!(none.layers.iter().all(|l| l.window.is_none()));
        assert_eq!(none.vocab, 100, "the embedding's outer dimension");
        let err = with_pattern(Value::Array(vec![Value::U32(1); 4])).unwrap_err();
        assert!(
            err.to_string()
                .contains("`gemma3.attention.sliding_window_pattern` holds u32 values, not bools"),
            "{err}"
        );
        let err = with_pattern(Value::Array(vec![Value::Bool(true); 3])).unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::PerLayerLength {
                    got: 3,
                    layers: 4,
                    ..
                }
            ),
            "{err}"
        );
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
        let yarn = [
            ("rope.scaling.type", Value::String("yarn".into())),
            ("rope.scaling.factor", Value::F32(4.0)),
            ("rope.scaling.original_context_length", Value::U32(2048)),
        ];
        let scaling = &read("qwen2", &yarn).unwrap().ropes[0].scaling;
        assert_eq!(scaling.yarn, Some(Yarn::new(4.0, 2048)));
        assert_eq!(scaling.linear, 1.0, "YaRN interpolates by its own ramp");
        let yarn = [("rope.scaling.type", Value::String("yarn".into()))];
        let scaling = &read("qwen3", &yarn).unwrap().ropes[0].scaling;
        assert_eq!(
            scaling.yarn,
            Some(Yarn::new(1.0, 8192)),
            "the trained context"
        );
        let dynamic = [("rope.scaling.type", Value::String("dynamic".into()))];
        assert!(matches!(
            read("qwen2", &dynamic),
            Err(ModelError::UnsupportedArchitecture(m)) if m.contains("dynamic")
        ));
        let key_length = [("attention.key_length", Value::U32(64))];
        assert_eq!(read("qwen3", &key_length).unwrap().head_dim, 64);
        let moe = [("expert_count", Value::U32(8))];
        assert!(matches!(
            read("qwen3", &moe),
            Err(ModelError::UnsupportedArchitecture(m)) if m.contains("mixture-of-experts")
        ));
        let experts = [
            ("expert_count", Value::U32(8)),
            ("expert_used_count", Value::U32(2)),
        ];
        let moe = read("qwen3moe", &experts).unwrap().moe.unwrap();
        assert_eq!((moe.experts, moe.used, moe.expert_ffn), (8, 2, 256));
        assert!(matches!(
            read("qwen3moe", &[]),
            Err(ModelError::MissingKey(k)) if k == "qwen3moe.expert_count"
        ));
        for (experts, used) in [(0, 0), (4, 5), (4, 0)] {
            let bad = [
                ("expert_count", Value::U32(experts)),
                ("expert_used_count", Value::U32(used)),
            ];
            let err = read("qwen3moe", &bad).unwrap_err();
            assert!(
                err.to_string().contains("invalid mixture of experts"),
                "{experts}/{used}: {err}"
            );
        }
        // Refused by the metadata check, before any per-expert table exists.
        let huge = [
            ("expert_count", Value::U32(1 << 20)),
            ("expert_used_count", Value::U32(2)),
        ];
        let err = read("qwen3moe", &huge).unwrap_err().to_string();
        assert!(
            err.contains("qwen3moe.expert_count") && err.contains("at most 4096"),
            "{err}"
        );
        let int_base = [("rope.freq_base", Value::U32(10_000))];
        assert!(matches!(
            read("qwen3", &int_base),
            Err(ModelError::MetadataType {
                want: "a float",
                ..
            })
        ));
        let negative = [("attention.key_length", Value::I32(-1))];
        assert!(matches!(
            read("qwen3", &negative),
            Err(ModelError::MetadataRange { value: -1, .. })
        ));
    }

    /// A stacked `[experts, rows, cols]` tensor splits into each expert's
    /// rows, quantized blocks intact; another shape than the metadata's is refused.
    #[test]
    fn stacked_experts_split_per_expert() {
        let values: Vec<f32> = (0..4 * 8 * 32)
            .map(|i| (i % 97) as f32 / 97.0 - 0.5)
            .collect();
        let t = candle_core::Tensor::from_vec(values, (4, 8, 32), &Device::Cpu).unwrap();
        let q8 = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
        let (_dir, tensors) = header_with("qwen3", &[], &[("exps", &q8)]);
        let mut file = GgufFile {
            tensors,
            spec: read("qwen3", &[]).unwrap(),
        };
        let parts = file
            .expert_qtensors("exps", 4, (8, 32), &Device::Cpu)
            .unwrap();
        let whole = q8.dequantize(&Device::Cpu).unwrap();
        assert_eq!(parts.len(), 4);
        for (e, part) in parts.iter().enumerate() {
            assert_eq!(part.dtype(), GgmlDType::Q8_0);
            let got = part
                .dequantize(&Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let want = whole.get(e).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(got, want, "expert {e}");
        }
        assert!(matches!(
            file.expert_qtensors("exps", 8, (4, 32), &Device::Cpu),
            Err(ModelError::TensorLayout { .. })
        ));
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
            let (_dir, file) = header("phi3", &keys);
            let mut spec = read("phi3", &keys).unwrap();
            let meta = Meta::new(&file.index.header, "phi3");
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
