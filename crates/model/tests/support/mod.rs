//! Helpers shared by the model tests.
#![allow(dead_code, unreachable_pub)] // each test file uses its own subset

use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use zinfer_model::{ChunkOutput, ForwardModel, LoadedModel, SeqChunk};
use zinfer_text::ModelTokenizer;

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

/// The default model's tokenizer.
pub fn tokenizer() -> ModelTokenizer {
    ModelTokenizer::open(&zinfer_fetch::test_model_path().unwrap()).unwrap()
}

/// The test prompt, ChatML without a system message, in the default
/// model's tokens.
pub fn prompt_ids() -> Vec<u32> {
    tokenizer()
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
            output: ChunkOutput::LastLogits,
        }])
        .unwrap();
    assert_eq!(out.len(), 1);
    out.remove(0)
}

/// Eight greedy tokens for "What is the capital of France?" (ChatML, no
/// system message), one forward per token over slots 0..128, as text
/// (`m` is the default model, or has its vocabulary).
pub fn greedy_capital_of_france(m: &mut LoadedModel) -> String {
    let tokenizer = tokenizer();
    let mut ids = tokenizer
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
                output: ChunkOutput::LastLogits,
            }])
            .unwrap();
        let next = argmax(&logits[0]) as u32;
        start = end;
        ids.push(next);
        out.push(next);
    }
    tokenizer.decode(&out).unwrap()
}

/// Each position of `ids` run as its own one-token step on top of the
/// ones before it (the engine's decode steps), in `slots`, each asking for
/// `output`: one vector per position.
pub fn stepwise(
    m: &mut dyn ForwardModel,
    ids: &[u32],
    slots: &[u32],
    output: ChunkOutput,
) -> Vec<Vec<f32>> {
    (0..ids.len())
        .map(|pos| {
            m.forward(&[SeqChunk {
                tokens: &ids[pos..=pos],
                slots: &slots[..=pos],
                start_pos: pos,
                output,
            }])
            .unwrap()
            .remove(0)
        })
        .collect()
}

/// `ids` run as one chunk from position 0 in `slots`, asking for `output`.
pub fn whole_chunk(
    m: &mut dyn ForwardModel,
    ids: &[u32],
    slots: &[u32],
    output: ChunkOutput,
) -> Vec<f32> {
    let mut out = m
        .forward(&[SeqChunk {
            tokens: ids,
            slots,
            start_pos: 0,
            output,
        }])
        .unwrap();
    assert_eq!(out.len(), 1);
    out.remove(0)
}

/// The largest difference between the rows of `all` (row-major, `width`
/// wide) and `steps`, one row per step.
pub fn max_row_diff(all: &[f32], steps: &[Vec<f32>], width: usize, what: &str) -> f32 {
    assert_eq!(all.len(), steps.len() * width, "{what}: rows x width");
    all.chunks_exact(width)
        .zip(steps)
        .map(|(row, step)| max_abs_diff(row, step))
        .fold(0.0, f32::max)
}

/// The largest differences (logits, hidden states) seen by
/// [`check_all_rows_match_stepwise`].
#[derive(Debug, Default)]
pub struct RowDiffs {
    pub logits: f32,
    pub hidden: f32,
}

/// [`ChunkOutput::AllLogits`] and [`ChunkOutput::AllHidden`] of `ids` as one
/// prefill chunk against the same prompt run one position per step (each
/// step's `LastLogits`, or `AllHidden` of its one row), row by row, within
/// `tol`; then the same chunks batched together with a `LastLogits` chunk
/// of the prompt give each its own output, of the documented length.
/// Uses `6 * ids.len()` slots from `first_slot` (scattered, reversed).
pub fn check_all_rows_match_stepwise(
    m: &mut dyn ForwardModel,
    ids: &[u32],
    first_slot: u32,
    tol: f32,
    what: &str,
) -> RowDiffs {
    let n = ids.len();
    let (vocab, hidden) = (m.vocab_size(), m.hidden_size());
    // Six disjoint slot sets, the later ones in reverse order.
    let sets: Vec<Vec<u32>> = (0..6u32)
        .map(|s| {
            let base = first_slot + s * n as u32;
            let mut v: Vec<u32> = (base..base + n as u32).collect();
            if s >= 2 {
                v.reverse();
            }
            v
        })
        .collect();
    let step_logits = stepwise(m, ids, &sets[0], ChunkOutput::LastLogits);
    let step_hidden = stepwise(m, ids, &sets[1], ChunkOutput::AllHidden);
    assert!(step_logits.iter().all(|r| r.len() == vocab), "{what}");
    assert!(step_hidden.iter().all(|r| r.len() == hidden), "{what}");

    let all_logits = whole_chunk(m, ids, &sets[2], ChunkOutput::AllLogits);
    let all_hidden = whole_chunk(m, ids, &sets[3], ChunkOutput::AllHidden);
    let diffs = RowDiffs {
        logits: max_row_diff(&all_logits, &step_logits, vocab, what),
        hidden: max_row_diff(&all_hidden, &step_hidden, hidden, what),
    };
    eprintln!(
        "{what}: {n} rows, max |AllLogits - stepwise| = {}, max |AllHidden - stepwise| = {}",
        diffs.logits, diffs.hidden
    );
    assert!(
        diffs.logits < tol,
        "{what}: AllLogits vs stepwise {}",
        diffs.logits
    );
    assert!(
        diffs.hidden < tol,
        "{what}: AllHidden vs stepwise {}",
        diffs.hidden
    );
    assert!(
        all_hidden.iter().all(|v| v.is_finite()) && all_hidden.iter().any(|&v| v != 0.0),
        "{what}: hidden states"
    );

    // The three kinds in one step, in other slots.
    let batch = [
        SeqChunk {
            tokens: ids,
            slots: &sets[4],
            start_pos: 0,
            output: ChunkOutput::AllHidden,
        },
        SeqChunk {
            tokens: ids,
            slots: &sets[5],
            start_pos: 0,
            output: ChunkOutput::LastLogits,
        },
        SeqChunk {
            tokens: &ids[n - 1..],
            slots: &sets[2],
            start_pos: n - 1,
            output: ChunkOutput::AllLogits,
        },
    ];
    let out = m.forward(&batch).unwrap();
    assert_eq!(out.len(), 3, "{what}");
    let hidden_diff = max_row_diff(&out[0], &step_hidden, hidden, what);
    assert!(hidden_diff < tol, "{what}: batched AllHidden {hidden_diff}");
    let last = &step_logits[n - 1];
    let last_diff = max_abs_diff(&out[1], last);
    assert!(last_diff < tol, "{what}: batched LastLogits {last_diff}");
    // The last token again over the chunk's own K/V: a one-row AllLogits.
    let again = max_abs_diff(&out[2], last);
    assert!(again < tol, "{what}: one-row AllLogits {again}");
    diffs
}
