//! A streaming GGUF v3 writer: header and tensor infos first (sizes are
//! known from shapes and types), then each tensor's data as it is made.

use std::io::Write;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::shape::{Init, NORM_SPREAD, TensorSpec};
use super::{Progress, SynthError, WEIGHT_STD};

/// GGUF tensor data alignment (the format's default).
pub(super) const ALIGNMENT: u64 = 32;

/// Values generated and quantized at once: bounds memory (4 MiB of f32).
const CHUNK_ELEMS: usize = 1 << 20;

/// Writes a GGUF v3 file: header, metadata, tensor infos, then each tensor's
/// data generated and quantized chunk by chunk.
pub(super) fn write_gguf<W: Write>(
    w: &mut W,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    seed: u64,
    threads: usize,
    progress: &mut impl FnMut(&Progress<'_>),
) -> Result<(), SynthError> {
    let mut header = Vec::new();
    header.extend(0x4655_4747u32.to_le_bytes()); // "GGUF"
    header.extend(3u32.to_le_bytes());
    header.extend((tensors.len() as u64).to_le_bytes());
    header.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut header, key);
        header.extend(value_type(value)?.to_le_bytes());
        put_value(&mut header, value)?;
    }
    let mut offset = 0u64;
    for t in tensors {
        put_string(&mut header, &t.name);
        if t.is_vector() {
            header.extend(1u32.to_le_bytes());
            header.extend((t.cols as u64).to_le_bytes());
        } else if t.experts > 1 {
            header.extend(3u32.to_le_bytes());
            header.extend((t.cols as u64).to_le_bytes());
            header.extend(((t.rows / t.experts) as u64).to_le_bytes());
            header.extend((t.experts as u64).to_le_bytes());
        } else {
            header.extend(2u32.to_le_bytes());
            header.extend((t.cols as u64).to_le_bytes());
            header.extend((t.rows as u64).to_le_bytes());
        }
        let type_id = match t.kernel {
            Some(k) => k.ggml_id(),
            None => ggml_type_id(t.dtype)?,
        };
        header.extend(type_id.to_le_bytes());
        header.extend(offset.to_le_bytes());
        offset += padded(t.bytes());
    }
    let bytes_total = offset;
    header.resize(padded(header.len() as u64) as usize, 0);
    w.write_all(&header)?;

    let mut bytes_done = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let written = write_tensor(w, t, seed, threads)?;
        if written != t.bytes() {
            return Err(SynthError::InvalidShape(format!(
                "`{}`: wrote {written} bytes, expected {}",
                t.name,
                t.bytes()
            )));
        }
        let pad = padded(written) - written;
        w.write_all(&vec![0u8; pad as usize])?;
        bytes_done += written + pad;
        progress(&Progress {
            tensor: &t.name,
            dtype: t.type_name(),
            layer: t.layer,
            end_of_layer: t.layer.is_some()
                && tensors.get(i + 1).is_none_or(|next| next.layer != t.layer),
            bytes_done,
            bytes_total,
        });
    }
    w.flush()?;
    Ok(())
}

/// Generates, quantizes and writes one tensor in chunks of whole rows
/// (quant blocks never span rows, so chunks concatenate exactly), `threads`
/// chunks at a time. Each chunk has its own random stream, so the file does
/// not depend on the thread count.
fn write_tensor<W: Write>(
    w: &mut W,
    t: &TensorSpec,
    seed: u64,
    threads: usize,
) -> Result<u64, SynthError> {
    let threads = threads.max(1);
    let rows_per_chunk = (CHUNK_ELEMS / t.cols).max(1);
    let n_chunks = t.rows.div_ceil(rows_per_chunk);
    let base = tensor_seed(seed, &t.name);
    let chunk = |c: usize| {
        let row = c * rows_per_chunk;
        let rows = rows_per_chunk.min(t.rows - row);
        chunk_bytes(
            t,
            rows,
            base ^ (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        )
    };
    let chunk = &chunk;
    let mut written = 0u64;
    for first in (0..n_chunks).step_by(threads) {
        let last = (first + threads).min(n_chunks);
        let parts: Vec<Result<Vec<u8>, SynthError>> = if last - first == 1 {
            vec![chunk(first)]
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (first..last).map(|c| s.spawn(move || chunk(c))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(Err(SynthError::Panicked)))
                    .collect()
            })
        };
        for part in parts {
            let data = part?;
            w.write_all(&data)?;
            written += data.len() as u64;
        }
    }
    Ok(written)
}

/// One chunk of `rows` rows of `t`, generated and quantized.
fn chunk_bytes(t: &TensorSpec, rows: usize, seed: u64) -> Result<Vec<u8>, SynthError> {
    let n = rows * t.cols;
    let values: Vec<f32> = match &t.init {
        Init::Random => {
            let mut rng = StdRng::seed_from_u64(seed);
            // Uniform on [-a, a] has standard deviation a / sqrt(3).
            let a = WEIGHT_STD * 3f32.sqrt();
            (0..n).map(|_| rng.random_range(-a..a)).collect()
        }
        Init::NearOne => {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..n)
                .map(|_| 1.0 + rng.random_range(-NORM_SPREAD..NORM_SPREAD))
                .collect()
        }
        Init::Values(v) => v.clone(),
    };
    if values.len() != n {
        return Err(SynthError::InvalidShape(format!(
            "`{}` has {} values for {n} elements",
            t.name,
            values.len()
        )));
    }
    if let Some(k) = t.kernel {
        return Ok(k.quantize(&values));
    }
    let chunk = Tensor::from_vec(values, (rows, t.cols), &Device::Cpu)?;
    Ok(QTensor::quantize(&chunk, t.dtype)?.data()?.into_owned())
}

/// A per-tensor seed: FNV-1a of the name mixed with the file's seed.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn padded(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// ggml's type ids (candle keeps its own mapping private).
fn ggml_type_id(t: GgmlDType) -> Result<u32, SynthError> {
    Ok(match t {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    })
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as u64).to_le_bytes());
    buf.extend(s.as_bytes());
}

/// GGUF metadata value type ids.
fn value_type(v: &Value) -> Result<u32, SynthError> {
    Ok(match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    })
}

fn put_value(buf: &mut Vec<u8>, v: &Value) -> Result<(), SynthError> {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend(x.to_le_bytes()),
        Value::U16(x) => buf.extend(x.to_le_bytes()),
        Value::I16(x) => buf.extend(x.to_le_bytes()),
        Value::U32(x) => buf.extend(x.to_le_bytes()),
        Value::I32(x) => buf.extend(x.to_le_bytes()),
        Value::F32(x) => buf.extend(x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_string(buf, s),
        Value::U64(x) => buf.extend(x.to_le_bytes()),
        Value::I64(x) => buf.extend(x.to_le_bytes()),
        Value::F64(x) => buf.extend(x.to_le_bytes()),
        Value::Array(items) => {
            let elem = items.first().map_or(Ok(4), value_type)?;
            if items.iter().any(|x| value_type(x).ok() != Some(elem)) {
                return Err(SynthError::Tokenizer(
                    "a metadata array mixes value types".into(),
                ));
            }
            buf.extend(elem.to_le_bytes());
            buf.extend((items.len() as u64).to_le_bytes());
            for x in items {
                put_value(buf, x)?;
            }
        }
    }
    Ok(())
}
