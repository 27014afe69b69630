//! Helpers shared by the model tests.
#![allow(dead_code, unreachable_pub)] // each test file uses its own subset

use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use zinfer_model::{LoadedModel, SeqChunk};

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .unwrap()
}

/// The test prompt, ChatML without a system message.
pub fn prompt_ids(m: &LoadedModel) -> Vec<u32> {
    m.tokenizer
        .encode("<|im_start|>user\nWrite one sentence about the sea and the 42 boats on it.<|im_end|>\n<|im_start|>assistant\n")
        .unwrap()
}

/// Last-token logits of candle-transformers' `quantized_llama` on the CPU.
pub fn reference_logits(gguf: &Path, ids: &[u32]) -> Vec<f32> {
    let mut f = std::fs::File::open(gguf).unwrap();
    let ct = gguf_file::Content::read(&mut f).unwrap();
    let mut model = ModelWeights::from_gguf(ct, &mut f, &Device::Cpu).unwrap();
    let input = Tensor::new(ids, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    model
        .forward(&input, 0)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// Indices of the k largest values, sorted.
pub fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    let mut top = idx[..k].to_vec();
    top.sort();
    top
}

/// Writes a copy of the GGUF at `src` with every tensor of a type in `from`
/// converted to `to`.
pub fn write_converted(src: &Path, from: &[GgmlDType], to: GgmlDType, tag: &str) -> PathBuf {
    let mut f = std::fs::File::open(src).unwrap();
    let ct = gguf_file::Content::read(&mut f).unwrap();
    let mut names: Vec<&String> = ct.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> = names
        .iter()
        .map(|name| {
            let t = ct.tensor(&mut f, name, &Device::Cpu).unwrap();
            let t = if from.contains(&t.dtype()) {
                QTensor::quantize(&t.dequantize(&Device::Cpu).unwrap(), to).unwrap()
            } else {
                t
            };
            (name.to_string(), t)
        })
        .collect();
    let dst = std::env::temp_dir().join(format!("zinfer-{tag}-{}.gguf", std::process::id()));
    let mut out = std::fs::File::create(&dst).unwrap();
    let md: Vec<(&str, &gguf_file::Value)> =
        ct.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &md, &ts).unwrap();
    dst
}

/// Last-token logits of `ids` run as one chunk from position 0 (slots 0..n).
pub fn one_shot(m: &mut LoadedModel, ids: &[u32]) -> Vec<f32> {
    let slots: Vec<u32> = (0..ids.len() as u32).collect();
    let mut out = m
        .model
        .forward(&[SeqChunk {
            tokens: ids,
            slots: &slots,
            start_pos: 0,
        }])
        .unwrap();
    assert_eq!(out.len(), 1);
    out.remove(0)
}

/// Eight greedy tokens for "What is the capital of France?" (ChatML, no
/// system message), one forward per token over slots 0..128, as text.
pub fn greedy_capital_of_france(m: &mut LoadedModel) -> String {
    let mut ids = m
        .tokenizer
        .encode(
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        )
        .unwrap();
    let slots: Vec<u32> = (0..128).collect();
    let mut start = 0;
    let mut out = Vec::new();
    for _ in 0..8 {
        let end = ids.len();
        let logits = m
            .model
            .forward(&[SeqChunk {
                tokens: &ids[start..],
                slots: &slots[..end],
                start_pos: start,
            }])
            .unwrap();
        let next = argmax(&logits[0]) as u32;
        start = end;
        ids.push(next);
        out.push(next);
    }
    m.tokenizer.decode(&out).unwrap()
}
