//! Synthetic GGUF checkpoints load with the worker's loader and run.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::collections::HashMap;
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, Value};
use zinfer_fetch::test_model_path;
use zinfer_model::{ChunkOutput, Classifier, KvShape, LoadOptions, SeqChunk, load};
use zinfer_text::ModelTokenizer;
mod support;
use support::{max_abs_diff, one_shot, reference_logits, top_k};
use zinfer_model::synthetic::{
    Architecture, Llama3RopeScaling, Quant, Rerank, SynthShape, SynthSpec, fallback, generate,
    generate_reranker, tokenizer_metadata, use_more_bits,
};

fn source_metadata() -> HashMap<String, Value> {
    let mut f = std::fs::File::open(test_model_path().unwrap()).unwrap();
    Content::read(&mut f).unwrap().metadata
}

/// 2 layers, hidden 256 (K-quant rows fit), GQA 4/2, the real vocabulary,
/// and Llama 3 RoPE factors so their round trip is checked too.
fn tiny() -> SynthShape {
    SynthShape {
        name: "tiny".into(),
        arch: Architecture::Llama,
        n_layers: 2,
        hidden: 256,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        ffn: 512,
        vocab: 49_152,
        vocab_from_tokenizer: false,
        vocab_file: None,
        context: 4096,
        rope_theta: 500_000.0,
        rope_theta_swa: None,
        rms_eps: 1e-5,
        tied_embeddings: false,
        rope_scaling: Some(Llama3RopeScaling {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 1024,
        }),
        rope_original_context: None,
        long_rope: None,
        sliding_window: None,
        attn_softcap: None,
        final_softcap: None,
        moe: None,
        yarn_factor: None,
        hybrid: None,
        gemma4: None,
    }
}

fn write(dir: &Path, shape: SynthShape, quant: &str, md: &HashMap<String, Value>) -> Content {
    let path = dir.join(format!("{quant}.gguf"));
    let spec = SynthSpec {
        shape,
        quant: quant.parse().unwrap(),
        seed: 7,
        threads: 2,
    };
    let mut last = None;
    let summary = generate(&path, &spec, md, |p| last = Some(p.bytes_done)).unwrap();
    assert_eq!(summary.file_bytes, std::fs::metadata(&path).unwrap().len());
    assert!(last.unwrap() < summary.file_bytes);
    Content::read(&mut std::fs::File::open(&path).unwrap()).unwrap()
}

fn dtype_of(ct: &Content, name: &str) -> GgmlDType {
    ct.tensor_infos[name].ggml_dtype
}

#[test]
fn every_quant_type_loads_and_gives_finite_logits() {
    let md = source_metadata();
    let dir = tempfile::tempdir().unwrap();
    let ids = [1u32, 9690, 198, 19556, 28, 905, 17];
    let slots: Vec<u32> = (0..ids.len() as u32).collect();
    for quant in [
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k",
        "q4_k_m",
    ] {
        let start = std::time::Instant::now();
        // Tied: one vocabulary-sized matrix to quantize instead of two.
        let shape = SynthShape {
            tied_embeddings: true,
            ..tiny()
        };
        let ct = write(dir.path(), shape, quant, &md);
        assert!(!ct.tensor_infos.contains_key("output.weight"));
        if let Quant::Pure(t) = quant.parse().unwrap() {
            assert_eq!(dtype_of(&ct, "blk.1.ffn_up.weight"), t, "{quant}");
            assert_eq!(dtype_of(&ct, "token_embd.weight"), t, "{quant}");
        } else {
            assert_eq!(dtype_of(&ct, "token_embd.weight"), GgmlDType::Q6K);
        }
        assert_eq!(dtype_of(&ct, "blk.0.attn_norm.weight"), GgmlDType::F32);
        let mut m = load(
            &dir.path().join(format!("{quant}.gguf")),
            &LoadOptions {
                kv_capacity: 64,
                threads: Some(1),
                ..LoadOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{quant}: {e}"));
        let logits = m
            .model
            .forward(&[SeqChunk {
                tokens: &ids,
                slots: &slots,
                start_pos: 0,
                output: ChunkOutput::LastLogits,
            }])
            .unwrap();
        assert_eq!(logits[0].len(), 49_152, "{quant}");
        assert!(logits[0].iter().all(|x| x.is_finite()), "{quant}");
        let spread = logits[0].iter().fold(0.0f32, |a, x| a.max(x.abs()));
        assert!(
            spread > 0.0 && spread < 100.0,
            "{quant}: max |logit| {spread}"
        );
        eprintln!(
            "{quant}: {:.2} s, max |logit| {spread:.3}",
            start.elapsed().as_secs_f64()
        );
        std::fs::remove_file(dir.path().join(format!("{quant}.gguf"))).unwrap();
    }
}

#[test]
fn the_loader_reads_the_shape_that_was_written() {
    let md = source_metadata();
    let dir = tempfile::tempdir().unwrap();
    let shape = tiny();
    let ct = write(dir.path(), shape.clone(), "q8_0", &md);
    let u = |k: &str| ct.metadata[k].to_u32().unwrap() as usize;
    assert_eq!(
        ct.metadata["general.architecture"].to_string().unwrap(),
        "llama"
    );
    assert_eq!(u("llama.block_count"), 2);
    assert_eq!(u("llama.attention.head_count"), 4);
    assert_eq!(u("llama.attention.head_count_kv"), 2);
    assert_eq!(u("llama.embedding_length"), 256);
    assert_eq!(u("llama.feed_forward_length"), 512);
    assert_eq!(u("llama.rope.dimension_count"), 64);
    assert_eq!(
        ct.metadata["llama.rope.freq_base"].to_f32().unwrap(),
        500_000.0
    );
    let rope = ct
        .tensor(
            &mut std::fs::File::open(dir.path().join("q8_0.gguf")).unwrap(),
            "rope_freqs.weight",
            &Device::Cpu,
        )
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(rope, shape.rope_freq_factors().unwrap());
    assert_eq!(rope[0], 1.0);
    assert_eq!(rope[31], 32.0);

    let m = load(
        &dir.path().join("q8_0.gguf"),
        &LoadOptions {
            kv_capacity: 16,
            threads: Some(1),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        m.model.kv_shape(),
        KvShape {
            layers: 2,
            kv_heads: 2,
            key_dim: 64,
            value_dim: 64,
        }
    );
    assert_eq!(m.model.vocab_size(), 49_152);
    assert_eq!(m.model.max_positions(), 4096);
    // The copied tokenizer still encodes text as the real model does.
    let tokenizer = ModelTokenizer::open(&dir.path().join("q8_0.gguf")).unwrap();
    assert_eq!(
        tokenizer
            .encode("Hello, world! The quick brown fox.")
            .unwrap(),
        [19556, 28, 905, 17, 378, 2365, 6354, 16438, 30]
    );
}

/// Llama 3.2 1B: head_dim 64, theta 500000, factor 32, low 1, high 4,
/// original context 8192. Expected values worked out by hand from the
/// Hugging Face `rope_type: llama3` formula: wavelength 2*pi*theta^(2i/64);
/// below 2048 kept (factor 1), above 8192 divided by 32, between blended
/// with smooth = (8192 / wavelength - 1) / 3, factor 1 / ((1 - smooth) / 32 + smooth).
#[test]
fn llama_3_2_rope_factors_follow_the_llama3_formula() {
    let shape = SynthShape::preset("llama-3.2-1b").unwrap();
    let f = shape.rope_freq_factors().unwrap();
    assert_eq!(f.len(), 32);
    for (i, want) in [
        (0, 1.0),
        (14, 1.0), // wavelength 1956.5
        (15, 1.651_329_2),
        (16, 3.292_262),
        (17, 9.666_729),
        (18, 32.0), // wavelength 10089
        (31, 32.0),
    ] {
        assert!(
            (f[i] - want).abs() < 1e-4 * want,
            "factor {i}: {} vs {want}",
            f[i]
        );
    }
    assert!(
        SynthShape::preset("smollm2-360m")
            .unwrap()
            .rope_freq_factors()
            .is_none()
    );
}

#[test]
fn presets_have_the_public_configs_numbers() {
    let p = |n| SynthShape::preset(n).unwrap();
    let s = p("smollm2-135m");
    assert_eq!(
        (s.n_layers, s.hidden, s.n_heads, s.n_kv_heads, s.ffn),
        (30, 576, 9, 3, 1536)
    );
    let s = p("smollm2-360m");
    assert_eq!(
        (s.n_layers, s.hidden, s.n_heads, s.n_kv_heads, s.ffn),
        (32, 960, 15, 5, 2560)
    );
    let s = p("tinyllama-1.1b");
    assert_eq!(
        (
            s.n_layers,
            s.hidden,
            s.n_heads,
            s.n_kv_heads,
            s.ffn,
            s.vocab
        ),
        (22, 2048, 32, 4, 5632, 32_000)
    );
    assert!(!s.tied_embeddings);
    let s = p("llama-3.2-1b");
    assert_eq!(
        (
            s.n_layers,
            s.hidden,
            s.n_heads,
            s.n_kv_heads,
            s.ffn,
            s.vocab
        ),
        (16, 2048, 32, 8, 8192, 128_256)
    );
    assert!(s.tied_embeddings);
    assert!(SynthShape::preset("gpt-5").is_err());
    assert!("q3_k".parse::<Quant>().is_err());
}

/// llama.cpp's Q4_K_M rule on a 16-layer model with rows that fit K-quants.
#[test]
fn q4_k_m_gives_q6_k_to_the_head_and_to_use_more_bits_layers() {
    let picked: Vec<usize> = (0..22).filter(|&i| use_more_bits(i, 22)).collect();
    // n/8 = 2 and 7n/8 = 19: the first two, every third from 4, the last three.
    assert_eq!(picked, [0, 1, 4, 7, 10, 13, 16, 19, 20, 21]);
    assert_eq!(fallback(GgmlDType::Q4K, 576), GgmlDType::Q5_0);
    assert_eq!(fallback(GgmlDType::Q5K, 960), GgmlDType::Q5_1);
    assert_eq!(fallback(GgmlDType::Q6K, 960), GgmlDType::Q8_0);
    assert_eq!(fallback(GgmlDType::Q4_0, 48), GgmlDType::F16);

    let md = source_metadata();
    let dir = tempfile::tempdir().unwrap();
    let shape = SynthShape {
        n_layers: 16,
        hidden: 256,
        ffn: 512,
        vocab: 1024,
        ..tiny()
    };
    let ct = write(dir.path(), shape, "q4_k_m", &md);
    assert_eq!(dtype_of(&ct, "output.weight"), GgmlDType::Q6K);
    assert_eq!(dtype_of(&ct, "token_embd.weight"), GgmlDType::Q4K);
    for i in 0..16 {
        let want = if use_more_bits(i, 16) {
            GgmlDType::Q6K
        } else {
            GgmlDType::Q4K
        };
        assert_eq!(
            dtype_of(&ct, &format!("blk.{i}.attn_v.weight")),
            want,
            "layer {i}"
        );
        assert_eq!(
            dtype_of(&ct, &format!("blk.{i}.ffn_down.weight")),
            want,
            "layer {i}"
        );
        assert_eq!(
            dtype_of(&ct, &format!("blk.{i}.attn_q.weight")),
            GgmlDType::Q4K
        );
    }
    assert_eq!(ct.metadata["general.file_type"].to_u32().unwrap(), 15);
}

/// Vocabularies other than the source's: tokens padded with unused ones, or
/// cut with the merges that would reach past the end.
#[test]
fn the_tokenizer_is_fitted_to_the_vocabulary() {
    let md = source_metadata();
    let len = |v: &[(String, Value)], k: &str| {
        v.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.to_vec().unwrap().len())
    };
    let big = tokenizer_metadata(&md, 128_256).unwrap();
    assert_eq!(len(&big, "tokenizer.ggml.tokens"), Some(128_256));
    assert_eq!(len(&big, "tokenizer.ggml.token_type"), Some(128_256));
    assert_eq!(len(&big, "tokenizer.ggml.merges"), Some(48_900));
    let (_, types) = big
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.token_type")
        .unwrap();
    assert_eq!(types.to_vec().unwrap()[100_000].to_i32().unwrap(), 5);
    let (_, tokens) = big
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .unwrap();
    assert_eq!(
        tokens.to_vec().unwrap()[100_000].to_string().unwrap(),
        "[PAD100000]"
    );

    let small = tokenizer_metadata(&md, 32_000).unwrap();
    assert_eq!(len(&small, "tokenizer.ggml.tokens"), Some(32_000));
    let merges = len(&small, "tokenizer.ggml.merges").unwrap();
    assert!(merges > 30_000 && merges < 32_000, "{merges} merges kept");
}

/// A cut vocabulary still loads (its merges are consistent) and runs.
#[test]
fn a_smaller_vocabulary_loads() {
    let md = source_metadata();
    let dir = tempfile::tempdir().unwrap();
    let shape = SynthShape {
        vocab: 32_000,
        tied_embeddings: true,
        rope_scaling: None,
        ..tiny()
    };
    write(dir.path(), shape, "q4_0", &md);
    let mut m = load(
        &dir.path().join("q4_0.gguf"),
        &LoadOptions {
            kv_capacity: 16,
            threads: Some(1),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let ids = ModelTokenizer::open(&dir.path().join("q4_0.gguf"))
        .unwrap()
        .encode("Hello, world! The quick brown fox.")
        .unwrap();
    assert!(ids.iter().all(|&t| t < 32_000));
    let slots: Vec<u32> = (0..ids.len() as u32).collect();
    let logits = m
        .model
        .forward(&[SeqChunk {
            tokens: &ids,
            slots: &slots,
            start_pos: 0,
            output: ChunkOutput::LastLogits,
        }])
        .unwrap();
    assert_eq!(logits[0].len(), 32_000);
    assert!(logits[0].iter().all(|x| x.is_finite()));
}

/// The same seed gives the same bytes whatever the thread count (each chunk
/// of rows has its own random stream); another seed gives other weights.
#[test]
fn files_depend_on_the_seed_not_on_the_thread_count() {
    let md = source_metadata();
    let dir = tempfile::tempdir().unwrap();
    let bytes = |seed: u64, threads: usize| {
        let path = dir.path().join(format!("{seed}-{threads}.gguf"));
        let spec = SynthSpec {
            shape: SynthShape {
                n_layers: 1,
                ..tiny()
            },
            quant: Quant::Pure(GgmlDType::Q8_0),
            seed,
            threads,
        };
        generate(&path, &spec, &md, |_| {}).unwrap();
        std::fs::read(&path).unwrap()
    };
    let one = bytes(1, 1);
    assert_eq!(one, bytes(1, 3));
    assert_ne!(one, bytes(2, 3));
    assert!(!dir.path().join("1-1.gguf.partial").exists());
}

/// Our Q4_K, Q5_K, Q6_K and Q5_0 / Q5_1 kernels against candle-transformers'
/// `quantized_llama` (candle's own kernels) on the same file, for a 7- and a
/// 40-token prompt (int8 dot products; where this CPU has no tile kernel,
/// the 40-token one takes the dequantize + f32 GEMM path). The two sides
/// round activations to 8 bits differently (ours per 32 values, candle's
/// per 256 for K-quants), so the check is a bound on the logit gap relative
/// to the logits' range, and the top tokens.
#[test]
fn quantized_logits_agree_with_candle_quantized_llama() {
    let md = source_metadata();
    let dir = tempfile::tempdir().unwrap();
    // candle's quantized_llama reads no RoPE factors: leave them out.
    let shape = SynthShape {
        tied_embeddings: true,
        rope_scaling: None,
        ..tiny()
    };
    let short = [1u32, 9690, 198, 19556, 28, 905, 17];
    let long: Vec<u32> = (0..40).map(|i| 1_000 + 37 * i).collect();
    for quant in ["q4_k", "q5_k", "q6_k", "q5_0", "q5_1"] {
        write(dir.path(), shape.clone(), quant, &md);
        let path = dir.path().join(format!("{quant}.gguf"));
        let mut m = load(
            &path,
            &LoadOptions {
                kv_capacity: 64,
                threads: Some(1),
                ..LoadOptions::default()
            },
        )
        .unwrap();
        for ids in [&short[..], &long[..]] {
            let ours = one_shot(&mut m, ids);
            let reference = reference_logits(&path, ids);
            let range = reference.iter().fold(0f32, |a, x| a.max(x.abs()));
            let diff = max_abs_diff(&ours, &reference);
            let (a, b) = (top_k(&ours, 5), top_k(&reference, 5));
            let shared = a.iter().filter(|i| b.contains(i)).count();
            eprintln!(
                "{quant}, {} tokens: max |ours - candle| {diff:.4}, max |logit| {range:.3}, top-5 shared {shared}",
                ids.len()
            );
            assert!(diff < 0.05 * range, "{quant}: {diff} of {range}");
            assert!(shared >= 3, "{quant}: top-5 {a:?} vs {b:?}");
        }
    }
}

/// A synthetic reranker carries llama.cpp's rank metadata and a two-row
/// head; [`Classifier`] reads it (none for the same model without it) and
/// scores a last hidden state as the softmax of the "yes" and "no" rows,
/// those rows read back here through candle's own GGUF reader.
#[test]
fn a_synthetic_reranker_has_a_yes_no_head() {
    let dir = tempfile::tempdir().unwrap();
    let md = source_metadata();
    let mut shape = SynthShape::preset("qwen3-tiny").unwrap();
    shape.n_layers = 1;
    let spec = SynthSpec {
        shape,
        quant: "f32".parse().unwrap(),
        seed: 3,
        threads: 1,
    };
    let plain = dir.path().join("plain.gguf");
    generate(&plain, &spec, &md, |_| {}).unwrap();
    assert!(Classifier::load(&plain).unwrap().is_none());
    let path = dir.path().join("rerank.gguf");
    let rerank = Rerank {
        template: Some("<q>{query}</q><d>{document}</d>".into()),
    };
    generate_reranker(&path, &spec, &md, &rerank, |_| {}).unwrap();
    let head = Classifier::load(&path).unwrap().unwrap();
    assert_eq!(head.hidden_size(), 64);
    // The load reads the head with the weights (and none for the plain model).
    let options = LoadOptions::default();
    assert!(load(&plain, &options).unwrap().classifier.is_none());
    let loaded = load(&path, &options).unwrap().classifier.unwrap();
    assert_eq!(
        loaded.scores(&[0.5; 64]).unwrap(),
        head.scores(&[0.5; 64]).unwrap()
    );

    let mut f = std::fs::File::open(&path).unwrap();
    let ct = Content::read(&mut f).unwrap();
    assert_eq!(ct.metadata["qwen3.pooling_type"].to_u32().unwrap(), 4);
    assert_eq!(
        ct.metadata["tokenizer.chat_template.rerank"]
            .to_string()
            .unwrap(),
        "<q>{query}</q><d>{document}</d>"
    );
    let rows = ct
        .tensor(&mut f, "cls.output.weight", &Device::Cpu)
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!((rows.len(), rows[0].len()), (2, 64));

    let mut m = load(&path, &LoadOptions::default()).unwrap();
    let mut scores = Vec::new();
    for (i, ids) in [[5u32, 9, 200, 31], [7, 7, 1, 2]].iter().enumerate() {
        let slots: Vec<u32> = (0..4).map(|s| s + 4 * i as u32).collect();
        let out = m
            .model
            .forward(&[SeqChunk {
                tokens: ids,
                slots: &slots,
                start_pos: 0,
                output: ChunkOutput::AllHidden,
            }])
            .unwrap();
        let last = &out[0][3 * 64..];
        let dot = |r: &[f32]| r.iter().zip(last).map(|(a, b)| a * b).sum::<f32>();
        let p_yes = 1.0 / (1.0 + (dot(&rows[1]) - dot(&rows[0])).exp());
        let s = head.scores(last).unwrap();
        assert_eq!(s.len(), 2);
        assert!((s[0] - p_yes).abs() < 1e-5, "{s:?} vs {p_yes}");
        assert!((s[0] + s[1] - 1.0).abs() < 1e-5);
        scores.push(head.score(last).unwrap());
    }
    assert!((scores[0] - scores[1]).abs() > 1e-4, "{scores:?}");
}
