//! Every architecture on tiny synthetic checkpoints: against
//! candle-transformers' model for it (an independent implementation), on
//! both backends, and against itself under chunking, batching, cached
//! prefixes and sliding windows.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};
use candle_transformers::models::{
    quantized_llama, quantized_phi3, quantized_qwen2, quantized_qwen3,
};
use zinfer_fetch::test_model_path;
use zinfer_model::synthetic::{SynthShape, SynthSpec, generate, tiny_presets};
use zinfer_model::{
    AttentionDtype, ChunkOutput, ForwardModel, LoadOptions, LoadedModel, SeqChunk, load,
    load_candle,
};

mod support;
use support::{check_all_rows_match_stepwise, max_abs_diff};

/// One backend against itself under another batch layout.
const SAME_WEIGHTS_TOL: f32 = 1e-5;

fn tokenizer_source() -> HashMap<String, Value> {
    let mut f = std::fs::File::open(test_model_path().unwrap()).unwrap();
    Content::read(&mut f).unwrap().metadata
}

/// Writes the f32 file of a preset (once per test process; tests run in
/// parallel, so one writes while the others wait).
fn f32_file(preset: &str) -> PathBuf {
    preset_file(preset, "f32")
}

/// [`f32_file`] in weight type `quant`.
fn preset_file(preset: &str, quant: &str) -> PathBuf {
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = files_dir();
    let path = dir.join(format!("{preset}-{quant}.gguf"));
    if !path.exists() {
        let spec = SynthShape::preset(preset).unwrap();
        let spec = SynthSpec {
            shape: spec,
            quant: quant.parse().unwrap(),
            seed: 11,
            threads: 2,
        };
        generate(&path, &spec, &tokenizer_source(), |_| {}).unwrap();
    }
    path
}

/// This process's directory for preset files, under cargo's temporary
/// directory; those of earlier runs whose process is gone are removed
/// first (the files run to hundreds of MB, and statics are never dropped).
fn files_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("zinfer-arch-")
                && !std::path::Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = root.join(format!("zinfer-arch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
    .clone()
}

/// `n` token ids below `vocab`, fixed by `seed`.
fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn options() -> LoadOptions {
    LoadOptions {
        kv_capacity: 1024,
        threads: Some(2),
        attention: AttentionDtype::F32,
        ..LoadOptions::default()
    }
}

/// zinfer on its CPU kernels and on candle's CPU device (the GPU backend).
fn both_backends(path: &Path) -> [(&'static str, LoadedModel); 2] {
    [
        ("cpu kernels", load(path, &options()).unwrap()),
        (
            "candle backend",
            load_candle(path, &options(), &Device::Cpu).unwrap(),
        ),
    ]
}

/// [`both_backends`] for a file the candle backend runs; the CPU kernels
/// alone for gemma4, which it refuses ([`gemma4_is_refused_by_the_candle_backend`]).
fn backends(path: &Path) -> Vec<(&'static str, LoadedModel)> {
    let mut out = vec![("cpu kernels", load(path, &options()).unwrap())];
    match load_candle(path, &options(), &Device::Cpu) {
        Ok(m) => out.push(("candle backend", m)),
        Err(e) if e.to_string().contains("gemma4 on this device") => {}
        Err(e) => panic!("{}: {e}", path.display()),
    }
    out
}

/// Last-token logits of `ids` run as one chunk from position 0 (slots 0..n).
fn one_shot(m: &mut dyn ForwardModel, ids: &[u32]) -> Vec<f32> {
    let slots: Vec<u32> = (0..ids.len() as u32).collect();
    m.forward(&[SeqChunk {
        tokens: ids,
        slots: &slots,
        start_pos: 0,
        output: ChunkOutput::LastLogits,
    }])
    .unwrap()
    .remove(0)
}

/// Last-token logits of candle-transformers' model for the file's architecture.
fn reference_logits(path: &Path, ids: &[u32]) -> Vec<f32> {
    let dev = Device::Cpu;
    let mut f = std::fs::File::open(path).unwrap();
    let ct = Content::read(&mut f).unwrap();
    let arch = match ct.metadata.get("general.architecture") {
        Some(Value::String(s)) => s.clone(),
        other => panic!("no architecture: {other:?}"),
    };
    let input = Tensor::new(ids, &dev).unwrap().unsqueeze(0).unwrap();
    let out = match arch.as_str() {
        "llama" => quantized_llama::ModelWeights::from_gguf(ct, &mut f, &dev)
            .unwrap()
            .forward(&input, 0),
        "qwen2" => quantized_qwen2::ModelWeights::from_gguf(ct, &mut f, &dev)
            .unwrap()
            .forward(&input, 0),
        "qwen3" => quantized_qwen3::ModelWeights::from_gguf(ct, &mut f, &dev)
            .unwrap()
            .forward(&input, 0),
        "phi3" => quantized_phi3::ModelWeights::from_gguf(false, ct, &mut f, &dev)
            .unwrap()
            .forward(&input, 0),
        other => panic!("no candle-transformers model for {other}"),
    };
    out.unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// llama, qwen2, qwen3 and phi3 against candle-transformers' `quantized_*`
/// models, on both of zinfer's backends, with the largest difference
/// accepted (logits here are within about +-1). Measured on f32 weights:
/// qwen2 and phi3 2e-7 to 4e-7 (summation order); qwen3 1.5e-4 from 6
/// tokens on, on both backends alike, while one token matches to 1e-7:
/// candle-transformers runs Qwen3's CPU attention through its own flash
/// kernel. Gemma has no usable reference here (candle-transformers 0.11.1's
/// `quantized_gemma3` gates its MLP with SiLU where Gemma 3, and llama.cpp,
/// use GELU; it has no Gemma 2): both Gemmas, and every sliding window, are
/// checked against llama.cpp by `scripts/llamacpp-reference.sh`.
#[test]
fn architectures_match_candle_transformers() {
    for (preset, tol) in [
        ("llama-swa-tiny", 1e-6),
        ("qwen2-tiny", 1e-6),
        ("qwen3-tiny", 5e-4),
        ("phi3-tiny", 1e-6),
    ] {
        let path = f32_file(preset);
        for (backend, mut m) in both_backends(&path) {
            let vocab = m.model.vocab_size();
            for n in [1, 6, 13] {
                let prompt = ids(n, vocab, n as u64);
                let want = reference_logits(&path, &prompt);
                let got = one_shot(m.model.as_mut(), &prompt);
                assert_eq!(got.len(), want.len(), "{preset} {backend}");
                let scale = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
                assert!(scale > 0.05, "{preset}: logits are all near zero ({scale})");
                let diff = max_abs_diff(&got, &want);
                assert!(
                    diff < tol,
                    "{preset} {backend}, {n} tokens: {diff} (logits up to {scale})"
                );
            }
        }
    }
}

/// The rows of one prompt longer than three sliding windows, run as one
/// chunk, as chunks that end on both sides of a window edge, then decode
/// steps; batched with another sequence; and from a prefix cached by
/// another sequence: the same last logits every way, on both backends.
#[test]
fn chunks_batches_and_cached_prefixes_match_one_shot_across_windows() {
    for preset in tiny_presets() {
        let path = f32_file(preset);
        for (backend, mut m) in backends(&path) {
            let m = m.model.as_mut();
            let vocab = m.vocab_size();
            let n = 3 * 16 + 9;
            let prompt = ids(n, vocab, 99);
            let whole = one_shot(m, &prompt);

            // Chunks [0, 13), [13, 40), then one token at a time, in slots far from 0..n.
            let slots: Vec<u32> = (0..n as u32).map(|i| 1000 - 7 * i).collect();
            let mut last = Vec::new();
            let mut start = 0;
            for end in [13, 40].into_iter().chain(41..=n) {
                last = m
                    .forward(&[SeqChunk {
                        tokens: &prompt[start..end],
                        slots: &slots[..end],
                        start_pos: start,
                        output: ChunkOutput::LastLogits,
                    }])
                    .unwrap()
                    .remove(0);
                start = end;
            }
            let diff = max_abs_diff(&whole, &last);
            assert!(
                diff < SAME_WEIGHTS_TOL,
                "{preset} {backend} chunked: {diff}"
            );

            // A second sequence reuses the first 30 slots as a cached prefix
            // and runs its rest batched with a decode row of a third one.
            let other = ids(20, vocab, 5);
            let other_slots: Vec<u32> = (500..520).collect();
            one_shot_in(m, &other[..19], &other_slots[..19]);
            let cached: Vec<u32> = slots[..30]
                .iter()
                .copied()
                .chain(600..600 + (n - 30) as u32)
                .collect();
            let out = m
                .forward(&[
                    SeqChunk {
                        tokens: &other[19..],
                        slots: &other_slots,
                        start_pos: 19,
                        output: ChunkOutput::LastLogits,
                    },
                    SeqChunk {
                        tokens: &prompt[30..],
                        slots: &cached,
                        start_pos: 30,
                        output: ChunkOutput::LastLogits,
                    },
                ])
                .unwrap();
            let diff = max_abs_diff(&whole, &out[1]);
            assert!(
                diff < SAME_WEIGHTS_TOL,
                "{preset} {backend} cached + batched: {diff}"
            );
        }
    }
}

/// Every architecture, both backends: each row of a prefill chunk longer
/// than three sliding windows, asked for `AllLogits` or `AllHidden`, is
/// what one position per step gives, alone and batched with the other
/// kinds of output.
#[test]
fn every_row_of_a_chunk_matches_one_position_per_step_across_windows() {
    for preset in tiny_presets() {
        let path = f32_file(preset);
        for (backend, mut m) in backends(&path) {
            let vocab = m.model.vocab_size();
            let prompt = ids(3 * 16 + 9, vocab, 7);
            check_all_rows_match_stepwise(
                m.model.as_mut(),
                &prompt,
                0,
                SAME_WEIGHTS_TOL,
                &format!("{preset} {backend}"),
            );
        }
    }
}

/// A mixture of experts routes and weights rows the same way on both
/// backends (the CPU kernels gather each expert's rows into one matmul, the
/// candle backend selects and adds them back with tensor ops), with and
/// without a shared expert, with gpt-oss's biases, sinks and clamped
/// SwiGLU, and a Q8_0 copy, whose experts are split from quantized stacked
/// tensors, stays near the F32 file.
#[test]
fn experts_agree_across_backends_and_weight_types() {
    for preset in ["qwen3moe-tiny", "qwen2moe-tiny", "gpt-oss-tiny"] {
        let path = f32_file(preset);
        let [(_, mut cpu), (_, mut candle)] = both_backends(&path);
        let mut q8 = load(&preset_file(preset, "q8_0"), &options()).unwrap();
        let vocab = cpu.model.vocab_size();
        for n in [1, 7, 40] {
            let prompt = ids(n, vocab, 21 + n as u64);
            let want = one_shot(cpu.model.as_mut(), &prompt);
            let diff = max_abs_diff(&want, &one_shot(candle.model.as_mut(), &prompt));
            assert!(diff < 1e-5, "{preset}, {n} tokens, candle backend: {diff}");
            let diff = max_abs_diff(&want, &one_shot(q8.model.as_mut(), &prompt));
            assert!(
                diff > 0.0 && diff < 0.02,
                "{preset}, {n} tokens, Q8_0: {diff}"
            );
        }
    }
}

/// gpt-oss-tiny with its experts in MXFP4 (the rest F32, so only the
/// experts differ): the CPU kernels run it near the F32 file, the same
/// every way a prompt is chunked or batched; the candle backend, which has
/// no MXFP4, refuses it with an error naming the type.
#[test]
fn mxfp4_experts_run_on_the_cpu_kernels_and_candle_refuses_them() {
    let f32_path = f32_file("gpt-oss-tiny");
    let path = preset_file("gpt-oss-tiny", "mxfp4_experts");
    let mut dense = load(&f32_path, &options()).unwrap();
    let mut mx = load(&path, &options()).unwrap();
    let vocab = mx.model.vocab_size();
    for n in [1, 7, 40] {
        let prompt = ids(n, vocab, 31 + n as u64);
        let want = one_shot(dense.model.as_mut(), &prompt);
        let diff = max_abs_diff(&want, &one_shot(mx.model.as_mut(), &prompt));
        // 4-bit experts move logits of about +-1 by a few hundredths.
        assert!(diff > 0.0 && diff < 0.1, "{n} tokens, MXFP4: {diff}");
    }
    check_all_rows_match_stepwise(
        mx.model.as_mut(),
        &ids(3 * 16 + 9, vocab, 8),
        0,
        SAME_WEIGHTS_TOL,
        "gpt-oss-tiny mxfp4",
    );
    let err = load_candle(&path, &options(), &Device::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("MXFP4"), "candle backend: {err}");
}

/// IQ4 weights on the CPU kernels: qwen3moe-mini (256-wide rows) with its
/// experts in IQ4_XS (the rest F32) and whole in IQ4_XS (its embedding
/// too), qwen3-tiny whole in IQ4_NL: each near its F32 file and the same
/// every way a prompt is chunked or batched; the candle backend, which has
/// no IQ4 types, refuses each file with an error naming the type.
#[test]
fn iq4_weights_run_on_the_cpu_kernels_and_candle_refuses_them() {
    // Chunked against stepwise: the whole-IQ4 files run every matrix on the
    // int8 kernels, whose rows do not depend on their batch. With F32
    // attention at 256 wide, the f32 GEMM's ~1e-6 differences between a
    // chunk and a step flip int8 roundings of the experts' inputs (as in
    // this shape's Q8_0 file: 6e-3), hence the looser bound there.
    for (preset, quant, name, near_f32, stepwise) in [
        ("qwen3moe-mini", "iq4_xs_experts", "IQ4_XS", 0.1, 0.02),
        ("qwen3moe-mini", "iq4_xs", "IQ4_XS", 0.3, SAME_WEIGHTS_TOL),
        ("qwen3-tiny", "iq4_nl", "IQ4_NL", 0.3, SAME_WEIGHTS_TOL),
    ] {
        let mut dense = load(&f32_file(preset), &options()).unwrap();
        let path = preset_file(preset, quant);
        let mut iq4 = load(&path, &options()).unwrap();
        let vocab = iq4.model.vocab_size();
        for n in [1, 7, 40] {
            let prompt = ids(n, vocab, 41 + n as u64);
            let want = one_shot(dense.model.as_mut(), &prompt);
            let diff = max_abs_diff(&want, &one_shot(iq4.model.as_mut(), &prompt));
            assert!(
                diff > 0.0 && diff < near_f32,
                "{preset} {quant}, {n} tokens: {diff}"
            );
        }
        check_all_rows_match_stepwise(
            iq4.model.as_mut(),
            &ids(3 * 16 + 9, vocab, 8),
            0,
            stepwise,
            &format!("{preset} {quant}"),
        );
        let err = load_candle(&path, &options(), &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains(name),
            "{preset} {quant}, candle backend: {err}"
        );
    }
}

/// A type with no kernel here (IQ2_XXS, ggml 16: qwen3-tiny's IQ4_NL file
/// with one matrix's type code changed) is refused by both backends at
/// load, naming the tensor and the type.
#[test]
fn other_weight_types_are_refused_naming_the_type() {
    let mut bytes = std::fs::read(preset_file("qwen3-tiny", "iq4_nl")).unwrap();
    let name = "blk.1.attn_q.weight";
    let key = [&(name.len() as u64).to_le_bytes()[..], name.as_bytes()].concat();
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let code = at + 4 + 8 * n_dims;
    assert_eq!(bytes[code..code + 4], 20u32.to_le_bytes());
    bytes[code..code + 4].copy_from_slice(&16u32.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("iq2_xxs.gguf");
    std::fs::write(&path, bytes).unwrap();
    let cpu = load(&path, &options()).err().map(|e| e.to_string());
    let candle = load_candle(&path, &options(), &Device::Cpu)
        .err()
        .map(|e| e.to_string());
    for err in [cpu, candle] {
        let err = err.unwrap_or_default();
        assert!(err.contains("IQ2_XXS") && err.contains(name), "{err}");
    }
}

/// Runs `tokens` in `slots` from position 0 and discards the logits.
fn one_shot_in(m: &mut dyn ForwardModel, tokens: &[u32], slots: &[u32]) {
    m.forward(&[SeqChunk {
        tokens,
        slots,
        start_pos: 0,
        output: ChunkOutput::LastLogits,
    }])
    .unwrap();
}

/// With a sliding window on every layer (Mistral-style llama), the last
/// row cannot see tokens more than `layers * (window - 1)` back: changing
/// the first token leaves its logits exactly as they were, while within
/// reach it changes them. Checks the window is applied, not only accepted.
#[test]
fn a_sliding_window_hides_tokens_beyond_its_reach() {
    let path = f32_file("llama-swa-tiny");
    let shape = SynthShape::preset("llama-swa-tiny").unwrap();
    let window = shape.sliding_window.unwrap();
    let reach = shape.n_layers * (window - 1);
    for (backend, mut m) in both_backends(&path) {
        let m = m.model.as_mut();
        let vocab = m.vocab_size();
        for (n, hidden) in [(reach + 2, true), (reach, false)] {
            let prompt = ids(n, vocab, 3);
            let mut changed = prompt.clone();
            changed[0] = (changed[0] + 1) % vocab as u32;
            let (a, b) = (one_shot(m, &prompt), one_shot(m, &changed));
            if hidden {
                assert_eq!(a, b, "{backend}: token 0 seen from {n} tokens on");
            } else {
                assert!(
                    max_abs_diff(&a, &b) > 0.0,
                    "{backend}: token 0 unseen at {n}"
                );
            }
        }
    }
}

/// The supervisor's estimate of KV bytes per token, read from the header
/// alone, is what each architecture's loaded pool takes.
#[test]
fn the_header_estimate_of_kv_bytes_matches_every_architecture() {
    for preset in tiny_presets() {
        let path = f32_file(preset);
        let shape = load(&path, &options()).unwrap().model.kv_shape();
        let estimate = zinfer_probe::kv_bytes_per_token(&path, zinfer_model::KvDtype::F32).unwrap();
        assert_eq!(estimate, (shape.floats_per_slot() * 4) as u64, "{preset}");
    }
}

/// The candle backend refuses gemma4 at load, naming what it lacks,
/// rather than running it wrong.
#[test]
fn gemma4_is_refused_by_the_candle_backend() {
    let path = f32_file("gemma4-tiny");
    let err = load_candle(&path, &options(), &Device::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("gemma4 on this device") && err.contains("another layer's KV"),
        "{err}"
    );
}

/// gemma4-tiny's last three layers read layers 4 and 5's KV and keep none:
/// the pool holds the six other layers' rows (sliding: 2 KV heads of 32,
/// global: 1 of 64, 64 values each), not nine, and a cache transfer
/// carries exactly those, back and forth.
#[test]
fn gemma4_shared_layers_take_no_pool_rows() {
    let path = f32_file("gemma4-tiny");
    let mut m = load(&path, &options()).unwrap();
    let m = m.model.as_mut();
    let shape = m.kv_shape();
    assert_eq!(shape.floats_per_slot(), 2 * 6 * 64);
    let prompt = ids(40, m.vocab_size(), 17);
    let slots: Vec<u32> = (100..140).collect();
    one_shot_in(m, &prompt, &slots);
    let kv = m.read_kv(&slots).unwrap();
    assert_eq!(kv.len(), 40 * 2 * 6 * 64);
    let moved: Vec<u32> = (300..340).collect();
    m.write_kv(&moved, &kv).unwrap();
    assert_eq!(m.read_kv(&moved).unwrap(), kv);
    // A next token from the moved slots is the one from the original ones.
    let next = [prompt[0]];
    let step = |m: &mut dyn ForwardModel, base: &[u32], extra: u32| {
        let all: Vec<u32> = base.iter().copied().chain([extra]).collect();
        m.forward(&[SeqChunk {
            tokens: &next,
            slots: &all,
            start_pos: 40,
            output: ChunkOutput::LastLogits,
        }])
        .unwrap()
        .remove(0)
    };
    let a = step(m, &slots, 500);
    let b = step(m, &moved, 501);
    assert!(max_abs_diff(&a, &b) < SAME_WEIGHTS_TOL);
}
