//! Hybrid (Gated DeltaNet) models on a tiny synthetic qwen35 file: the
//! recurrent state makes a row's result depend on every row before it in
//! its sequence, so chunking, batching and per-row outputs must give what
//! one chunk gives; a chunk that does not continue its sequence's state
//! (a prefix found in the KV cache alone) is refused, not run on a wrong
//! state; and the candle backend refuses the architecture by name.
//! Correctness against llama.cpp is `scripts/llamacpp-reference.sh`'s
//! (docs/models.md).

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use zinfer_fetch::test_model_path;
use zinfer_model::synthetic::{SynthShape, SynthSpec, generate, hybrid_tiny_presets};
use zinfer_model::{
    AttentionDtype, ChunkOutput, LoadOptions, ModelError, SeqChunk, load, load_candle,
};

mod support;
use support::{max_abs_diff, max_row_diff, stepwise, whole_chunk};

/// The same weights under another batch layout: the recurrence runs row
/// by row in one order either way, so only the matmuls' blocking differs.
const SAME_WEIGHTS_TOL: f32 = 1e-5;

/// A prompt past 150 tokens, so the state carries far.
const PROMPT: usize = 160;

fn options() -> LoadOptions {
    LoadOptions {
        kv_capacity: 2048,
        threads: Some(2),
        attention: AttentionDtype::F32,
        ..LoadOptions::default()
    }
}

/// The preset's f32 file, written once into `dir`.
fn write(dir: &Path, preset: &str) -> PathBuf {
    let path = dir.join(format!("{preset}.gguf"));
    let mut f = std::fs::File::open(test_model_path().unwrap()).unwrap();
    let tokenizer: HashMap<String, Value> = Content::read(&mut f).unwrap().metadata;
    let spec = SynthSpec {
        shape: SynthShape::preset(preset).unwrap(),
        quant: "f32".parse().unwrap(),
        seed: 5,
        threads: 2,
    };
    generate(&path, &spec, &tokenizer, |_| {}).unwrap();
    path
}

/// `n` token ids below `vocab`, fixed by `seed`.
fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

fn chunk<'a>(tokens: &'a [u32], slots: &'a [u32], start_pos: usize) -> SeqChunk<'a> {
    SeqChunk {
        tokens,
        slots,
        start_pos,
        output: ChunkOutput::LastLogits,
    }
}

/// One chunk, then chunks of odd sizes and decode steps, then the same
/// batched with another sequence's chunks: the same last logits; and every
/// row of a chunk is what one position per step gives.
#[test]
fn chunks_batches_and_steps_match_one_shot() {
    let dir = tempfile::tempdir().unwrap();
    for preset in hybrid_tiny_presets() {
        let path = write(dir.path(), preset);
        let mut loaded = load(&path, &options()).unwrap();
        let m = loaded.model.as_mut();
        assert!(m.recurrent(), "{preset}");
        // 3 recurrent layers x (3 x 128 taps + 4 heads x 16 x 16) floats =
        // 16,896 bytes, over 512 a slot (the one attention layer's K and V,
        // 64 floats each).
        assert_eq!(m.state_slots(), 33, "{preset}");
        let vocab = m.vocab_size();
        let prompt = ids(PROMPT, vocab, 1);
        let slots: Vec<u32> = (0..PROMPT as u32).map(|i| 1500 - 3 * i).collect();
        let whole = m.forward(&[chunk(&prompt, &slots, 0)]).unwrap().remove(0);

        let mut last = Vec::new();
        let mut start = 0;
        for end in [13, 90].into_iter().chain(91..=PROMPT) {
            let c = chunk(&prompt[start..end], &slots[..end], start);
            last = m.forward(&[c]).unwrap().remove(0);
            start = end;
        }
        let diff = max_abs_diff(&whole, &last);
        assert!(diff < SAME_WEIGHTS_TOL, "{preset} chunked: {diff}");

        // The prompt again in other slots, in two chunks, each batched with
        // a chunk of another sequence (its prefill, then a decode step).
        let other = ids(40, vocab, 2);
        let other_slots: Vec<u32> = (0..40).collect();
        let again: Vec<u32> = (100..100 + PROMPT as u32).collect();
        m.forward(&[
            chunk(&other[..39], &other_slots[..39], 0),
            chunk(&prompt[..70], &again[..70], 0),
        ])
        .unwrap();
        let out = m
            .forward(&[
                chunk(&prompt[70..], &again, 70),
                chunk(&other[39..], &other_slots, 39),
            ])
            .unwrap();
        let diff = max_abs_diff(&whole, &out[0]);
        assert!(diff < SAME_WEIGHTS_TOL, "{preset} batched: {diff}");
        let alone = m
            .forward(&[chunk(&other, &(300..340).collect::<Vec<u32>>(), 0)])
            .unwrap();
        let diff = max_abs_diff(&alone[0], &out[1]);
        assert!(
            diff < SAME_WEIGHTS_TOL,
            "{preset} the other, batched: {diff}"
        );

        // Every row's logits of one chunk against one position per step.
        let n = 48;
        let step_slots: Vec<u32> = (400..400 + n as u32).collect();
        let steps = stepwise(m, &prompt[..n], &step_slots, ChunkOutput::LastLogits);
        let chunk_slots: Vec<u32> = (500..500 + n as u32).collect();
        let all = whole_chunk(m, &prompt[..n], &chunk_slots, ChunkOutput::AllLogits);
        let diff = max_row_diff(&all, &steps, vocab, preset);
        assert!(diff < SAME_WEIGHTS_TOL, "{preset} rows: {diff}");
    }
}

/// A chunk that starts where its sequence's state is not (a prefix from
/// the KV cache alone, a position skipped or repeated) is refused and
/// changes nothing: the sequence then continues where it stopped.
#[test]
fn a_chunk_that_does_not_continue_its_state_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for preset in hybrid_tiny_presets() {
        let path = write(dir.path(), preset);
        let mut loaded = load(&path, &options()).unwrap();
        let m = loaded.model.as_mut();
        let prompt = ids(40, m.vocab_size(), 3);
        let slots: Vec<u32> = (0..40).collect();
        let whole = m.forward(&[chunk(&prompt, &slots, 0)]).unwrap().remove(0);

        // Another sequence lists the first 20 slots as a cached prefix.
        let cached: Vec<u32> = (0..20).chain(500..520).collect();
        let refused = m.forward(&[chunk(&prompt[20..], &cached, 20)]);
        assert!(
            matches!(&refused, Err(ModelError::InvalidBatch(e)) if e.contains("recurrent state")),
            "{preset}: {refused:?}"
        );
        // The first sequence's state is at 40; it cannot redo position 39.
        let redo = m.forward(&[chunk(&prompt[39..], &slots, 39)]);
        assert!(matches!(redo, Err(ModelError::InvalidBatch(_))), "{preset}");

        // Once released, the first sequence cannot continue either.
        m.release_states(&[0]);
        let longer: Vec<u32> = (0..41).collect();
        let gone = m.forward(&[chunk(&prompt[..1], &longer, 40)]);
        assert!(
            matches!(&gone, Err(ModelError::InvalidBatch(e)) if e.contains("missing")),
            "{preset}: {gone:?}"
        );

        // A sequence that does continue its state gives the one-shot logits.
        let fresh: Vec<u32> = (600..640).collect();
        m.forward(&[chunk(&prompt[..20], &fresh[..20], 0)]).unwrap();
        let rest = m.forward(&[chunk(&prompt[20..], &fresh, 20)]).unwrap();
        let diff = max_abs_diff(&whole, &rest[0]);
        assert!(diff < SAME_WEIGHTS_TOL, "{preset} resumed: {diff}");
    }
}

/// The candle backend (GPU workers) refuses a hybrid file, naming the
/// architecture, rather than running it without its recurrent layers.
#[test]
fn the_candle_backend_refuses_hybrid_models_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for preset in hybrid_tiny_presets() {
        let path = write(dir.path(), preset);
        let arch = SynthShape::preset(preset).unwrap().arch.name();
        let err = load_candle(&path, &options(), &candle_core::Device::Cpu)
            .err()
            .unwrap();
        assert!(
            matches!(&err, ModelError::UnsupportedArchitecture(what) if what.contains(arch)),
            "{preset}: {err}"
        );
    }
}

/// A copy of `src` with metadata `key` set to `value`.
fn with_key(src: &Path, key: &str, value: Value, dst: &Path) {
    use candle_core::quantized::{QTensor, gguf_file};
    let mut f = std::fs::File::open(src).unwrap();
    let ct = Content::read(&mut f).unwrap();
    let tensors: Vec<(String, QTensor)> = ct
        .tensor_infos
        .keys()
        .map(|name| {
            let t = ct.tensor(&mut f, name, &candle_core::Device::Cpu).unwrap();
            (name.clone(), t)
        })
        .collect();
    let mut metadata = ct.metadata.clone();
    metadata.insert(key.to_string(), value);
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(dst).unwrap(), &md, &ts).unwrap();
}

/// Recurrent widths a file declares are bounded before anything is sized
/// by them (a state of `heads x state_size^2` floats per layer and
/// sequence), and each refusal names its key; so are RoPE sections that
/// leave a rotated pair to the fourth (non-text) section.
#[test]
fn oversized_recurrent_widths_and_foreign_rope_sections_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "qwen35-tiny");
    let bad = dir.path().join("bad.gguf");
    let cases = [
        ("qwen35.ssm.state_size", Value::U32(1 << 20)),
        ("qwen35.ssm.time_step_rank", Value::U32(1 << 20)),
        ("qwen35.ssm.conv_kernel", Value::U32(100_000)),
        (
            "qwen35.rope.dimension_sections",
            Value::Array([2, 2, 2, 2].map(Value::I32).to_vec()),
        ),
    ];
    for (key, value) in cases {
        with_key(&path, key, value, &bad);
        let err = load(&bad, &options()).err().unwrap();
        assert!(err.to_string().contains(key), "{key}: {err}");
    }
    assert!(load(&path, &options()).is_ok());
}

/// Only the attention layers keep K and V rows: the pool and the header's
/// estimate the supervisor budgets with count one layer in four for these
/// presets (their Gated DeltaNet layers keep a per-sequence state instead).
#[test]
fn only_attention_layers_take_kv_memory() {
    let dir = tempfile::tempdir().unwrap();
    for preset in hybrid_tiny_presets() {
        let path = write(dir.path(), preset);
        let shape = SynthShape::preset(preset).unwrap();
        let hybrid = shape.hybrid.unwrap();
        let attention_layers = (0..shape.n_layers)
            .filter(|&l| !hybrid.is_recurrent(l))
            .count();
        assert!(attention_layers < shape.n_layers, "{preset}");
        let per_layer = 2 * shape.n_kv_heads * shape.head_dim * 4;
        let estimate = zinfer_probe::kv_bytes_per_token(&path, zinfer_model::KvDtype::F32).unwrap();
        assert_eq!(estimate, (attention_layers * per_layer) as u64, "{preset}");
    }
}
