//! Synthetic checkpoints of every architecture: names, shapes and keys as
//! llama.cpp's converter writes them, real vocabularies from llama.cpp's
//! test files, and candle-transformers' quantized models run them.
#![cfg(feature = "synthetic")]
#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};
use candle_transformers::models::{
    quantized_gemma3, quantized_llama, quantized_phi3, quantized_qwen2, quantized_qwen3,
};
use zinfer_fetch::test_model_path;
use zinfer_model::synthetic::{
    Architecture, Llama3RopeScaling, LongRope, PRESETS, Quant, Summary, SynthShape, SynthSpec,
    generate, tiny_presets, use_more_bits,
};

/// The tokenizer metadata a shape is written with: its llama.cpp vocabulary,
/// else the default model's. Read once per file for all tests.
fn tokenizer_source(shape: &SynthShape) -> Arc<HashMap<String, Value>> {
    static CACHE: Mutex<BTreeMap<PathBuf, Arc<HashMap<String, Value>>>> =
        Mutex::new(BTreeMap::new());
    let path = match &shape.vocab_file {
        Some(name) => zinfer_fetch::vocab_file(name).unwrap(),
        None => test_model_path().unwrap(),
    };
    let mut cache = CACHE.lock().unwrap();
    cache
        .entry(path.clone())
        .or_insert_with(|| {
            let mut f = std::fs::File::open(&path).unwrap();
            Arc::new(Content::read(&mut f).unwrap().metadata)
        })
        .clone()
}

fn write(dir: &Path, shape: &SynthShape, quant: &str) -> (PathBuf, Summary) {
    let path = dir.join(format!("{}-{quant}.gguf", shape.name));
    let spec = SynthSpec {
        shape: shape.clone(),
        quant: quant.parse().unwrap(),
        seed: 11,
        threads: 2,
    };
    let summary = generate(&path, &spec, &tokenizer_source(shape), |_| {})
        .unwrap_or_else(|e| panic!("{} {quant}: {e}", shape.name));
    (path, summary)
}

/// [`write`], then the file's header as candle's GGUF reader sees it.
fn write_and_read(dir: &Path, shape: &SynthShape, quant: &str) -> (PathBuf, Summary, Content) {
    let (path, summary) = write(dir, shape, quant);
    let ct = Content::read(&mut std::fs::File::open(&path).unwrap()).unwrap();
    (path, summary, ct)
}

/// candle-transformers' quantized model for the architecture (gemma2 has none).
enum CandleModel {
    Llama(quantized_llama::ModelWeights),
    Qwen2(quantized_qwen2::ModelWeights),
    Qwen3(quantized_qwen3::ModelWeights),
    Phi3(quantized_phi3::ModelWeights),
    Gemma3(quantized_gemma3::ModelWeights),
}

impl CandleModel {
    fn load(arch: Architecture, path: &Path) -> Self {
        let mut f = std::fs::File::open(path).unwrap();
        let ct = Content::read(&mut f).unwrap();
        let cpu = &Device::Cpu;
        let m = match arch {
            Architecture::Llama => {
                quantized_llama::ModelWeights::from_gguf(ct, &mut f, cpu).map(Self::Llama)
            }
            Architecture::Qwen2 => {
                quantized_qwen2::ModelWeights::from_gguf(ct, &mut f, cpu).map(Self::Qwen2)
            }
            Architecture::Qwen3 => {
                quantized_qwen3::ModelWeights::from_gguf(ct, &mut f, cpu).map(Self::Qwen3)
            }
            Architecture::Phi3 => {
                quantized_phi3::ModelWeights::from_gguf(false, ct, &mut f, cpu).map(Self::Phi3)
            }
            Architecture::Gemma3 => {
                quantized_gemma3::ModelWeights::from_gguf(ct, &mut f, cpu).map(Self::Gemma3)
            }
            Architecture::Gemma2 => panic!("candle-transformers has no quantized gemma2"),
            Architecture::Qwen35 | Architecture::Qwen35Moe => {
                panic!("candle-transformers has no quantized qwen35")
            }
            Architecture::Gemma4 => panic!("candle-transformers has no quantized gemma4"),
            Architecture::Qwen3Moe | Architecture::Qwen2Moe | Architecture::GptOss => {
                panic!("candle-transformers has no CPU quantized MoE")
            }
        };
        m.unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Last-position logits of `ids` placed from `pos` on.
    fn forward(&mut self, ids: &[u32], pos: usize) -> Vec<f32> {
        let x = Tensor::new(ids, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = match self {
            Self::Llama(m) => m.forward(&x, pos),
            Self::Qwen2(m) => m.forward(&x, pos),
            Self::Qwen3(m) => m.forward(&x, pos),
            Self::Phi3(m) => m.forward(&x, pos),
            Self::Gemma3(m) => m.forward(&x, pos),
        };
        logits.unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}

fn assert_sane(logits: &[f32], vocab: usize, what: &str) {
    assert_eq!(logits.len(), vocab, "{what}");
    assert!(logits.iter().all(|x| x.is_finite()), "{what}");
    let max = logits.iter().fold(f32::MIN, |a, &x| a.max(x));
    let min = logits.iter().fold(f32::MAX, |a, &x| a.min(x));
    assert!(
        max - min > 1e-3 && max.abs() < 100.0,
        "{what}: logits in [{min}, {max}]"
    );
}

/// Each tiny preset in F32 and Q8_0: candle's model for its architecture
/// loads it and runs a 20-token prompt (past the 16-token windows) and one
/// decode step (not gemma2, which it lacks, nor the MoE presets, whose
/// experts it runs on CUDA only).
#[test]
fn tiny_presets_run_in_candle_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| 300 + 37 * i).collect();
    // candle-transformers has no CPU quantized MoE.
    let dense = |n: &&str| SynthShape::preset(n).unwrap().moe.is_none();
    let candle_has = |n: &&str| !matches!(*n, "gemma2-tiny" | "gemma4-tiny" | "gemma4-moe-tiny");
    for name in tiny_presets().filter(|n| candle_has(n) && dense(n)) {
        let shape = SynthShape::preset(name).unwrap();
        for quant in ["f32", "q8_0"] {
            let what = format!("{name} {quant}");
            let (path, summary) = write(dir.path(), &shape, quant);
            let mut m = CandleModel::load(shape.arch, &path);
            let logits = m.forward(&prompt, 0);
            assert_sane(&logits, summary.vocab, &what);
            let next = logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i as u32)
                .unwrap();
            assert_sane(&m.forward(&[next], prompt.len()), summary.vocab, &what);
            std::fs::remove_file(&path).unwrap();
        }
    }
}

/// The tensors llama.cpp's loader asks for, candle-order dims (`[rows, cols]`).
fn expected_tensors(s: &SynthShape) -> BTreeMap<String, Vec<usize>> {
    let (h, hd, f, v) = (s.hidden, s.head_dim, s.ffn, s.vocab);
    let (q, kv) = (s.n_heads * hd, s.n_kv_heads * hd);
    let mut t = BTreeMap::new();
    t.insert("token_embd.weight".to_string(), vec![v, h]);
    t.insert("output_norm.weight".to_string(), vec![h]);
    if !s.tied_embeddings {
        t.insert("output.weight".to_string(), vec![v, h]);
    }
    for i in 0..s.n_layers {
        let mut put = |name: &str, dims: &[usize]| {
            t.insert(format!("blk.{i}.{name}"), dims.to_vec());
        };
        put("attn_norm.weight", &[h]);
        put("attn_output.weight", &[h, q]);
        if s.arch == Architecture::GptOss {
            // gpt-oss names its MLP norm `post_attention_norm`.
            put("post_attention_norm.weight", &[h]);
            put("attn_sinks.weight", &[s.n_heads]);
            put("attn_output.bias", &[h]);
        } else {
            put("ffn_norm.weight", &[h]);
        }
        if s.arch == Architecture::Phi3 {
            put("attn_qkv.weight", &[q + 2 * kv, h]);
            put("ffn_up.weight", &[2 * f, h]);
        } else {
            put("attn_q.weight", &[q, h]);
            put("attn_k.weight", &[kv, h]);
            put("attn_v.weight", &[kv, h]);
        }
        if let Some(m) = s.moe {
            let (e, ef) = (m.experts, m.expert_ffn);
            put("ffn_gate_inp.weight", &[e, h]);
            put("ffn_gate_exps.weight", &[e, ef, h]);
            put("ffn_up_exps.weight", &[e, ef, h]);
            put("ffn_down_exps.weight", &[e, h, ef]);
            if s.arch == Architecture::GptOss {
                put("ffn_gate_inp.bias", &[e]);
                put("ffn_gate_exps.bias", &[e, ef]);
                put("ffn_up_exps.bias", &[e, ef]);
                put("ffn_down_exps.bias", &[e, h]);
            }
            if let Some(sf) = m.shared_ffn {
                put("ffn_gate_inp_shexp.weight", &[h]);
                put("ffn_gate_shexp.weight", &[sf, h]);
                put("ffn_up_shexp.weight", &[sf, h]);
                put("ffn_down_shexp.weight", &[h, sf]);
            }
        } else {
            put("ffn_down.weight", &[h, f]);
            if s.arch != Architecture::Phi3 {
                put("ffn_gate.weight", &[f, h]);
                put("ffn_up.weight", &[f, h]);
            }
        }
        if matches!(
            s.arch,
            Architecture::Qwen2 | Architecture::Qwen2Moe | Architecture::GptOss
        ) {
            put("attn_q.bias", &[q]);
            put("attn_k.bias", &[kv]);
            put("attn_v.bias", &[kv]);
        }
        if matches!(
            s.arch,
            Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
        ) {
            put("attn_q_norm.weight", &[hd]);
            put("attn_k_norm.weight", &[hd]);
        }
        if matches!(s.arch, Architecture::Gemma2 | Architecture::Gemma3) {
            put("post_attention_norm.weight", &[h]);
            put("post_ffw_norm.weight", &[h]);
        }
    }
    t
}

/// What candle's GGUF reader sees in each tiny preset's file: exactly the
/// tensors llama.cpp loads for the architecture, with their shapes, and the
/// keys its converter writes.
#[test]
fn tiny_presets_have_llama_cpp_names_shapes_and_keys() {
    let dir = tempfile::tempdir().unwrap();
    // gemma4-tiny's per-layer widths are checked by gemma4_tiny_has_llama_cpp_names.
    for name in tiny_presets().filter(|n| !n.starts_with("gemma4")) {
        let shape = SynthShape::preset(name).unwrap();
        let (path, summary, ct) = write_and_read(dir.path(), &shape, "q8_0");
        let shape = SynthShape {
            vocab: summary.vocab,
            ..shape
        };
        let got: BTreeMap<String, Vec<usize>> = ct
            .tensor_infos
            .iter()
            .map(|(k, info)| (k.clone(), info.shape.dims().to_vec()))
            .collect();
        assert_eq!(got, expected_tensors(&shape), "{name}");
        for (t, info) in &ct.tensor_infos {
            // llama.cpp's quantizer leaves MoE routers in f32.
            // Biases stay f32 too, stacked expert ones included.
            let want = if info.shape.rank() == 1
                || t.ends_with("ffn_gate_inp.weight")
                || t.ends_with(".bias")
            {
                GgmlDType::F32
            } else {
                GgmlDType::Q8_0
            };
            assert_eq!(info.ggml_dtype, want, "{name} {t}");
        }

        let arch = shape.arch.name();
        let md = &ct.metadata;
        assert_eq!(md["general.architecture"].to_string().unwrap(), arch);
        for key in md.keys() {
            assert!(
                key.starts_with("general.")
                    || key.starts_with("tokenizer.")
                    || key.starts_with(&format!("{arch}.")),
                "{name}: stray key {key}"
            );
        }
        let u = |k: &str| {
            md.get(&format!("{arch}.{k}"))
                .map(|v| v.to_u32().unwrap() as usize)
        };
        let f = |k: &str| md.get(&format!("{arch}.{k}")).map(|v| v.to_f32().unwrap());
        assert_eq!(u("block_count"), Some(shape.n_layers), "{name}");
        assert_eq!(u("context_length"), Some(shape.context), "{name}");
        assert_eq!(u("embedding_length"), Some(shape.hidden), "{name}");
        assert_eq!(u("feed_forward_length"), Some(shape.ffn), "{name}");
        assert_eq!(u("attention.head_count"), Some(shape.n_heads), "{name}");
        assert_eq!(
            u("attention.head_count_kv"),
            Some(shape.n_kv_heads),
            "{name}"
        );
        assert_eq!(f("attention.layer_norm_rms_epsilon"), Some(shape.rms_eps));
        assert_eq!(f("rope.freq_base"), Some(shape.rope_theta), "{name}");
        assert_eq!(
            u("attention.sliding_window"),
            shape.sliding_window,
            "{name}"
        );
        assert_eq!(f("attn_logit_softcapping"), shape.attn_softcap, "{name}");
        assert_eq!(f("final_logit_softcapping"), shape.final_softcap, "{name}");
        let head_keys = match shape.arch {
            Architecture::Qwen2 | Architecture::Qwen2Moe | Architecture::Phi3 => None,
            _ => Some(shape.head_dim),
        };
        assert_eq!(u("attention.key_length"), head_keys, "{name}");
        assert_eq!(u("attention.value_length"), head_keys, "{name}");
        let rope_dims = matches!(shape.arch, Architecture::Llama | Architecture::Phi3)
            .then_some(shape.head_dim);
        assert_eq!(u("rope.dimension_count"), rope_dims, "{name}");
        assert_eq!(f("rope.scaling.factor"), shape.yarn_factor, "{name}");
        assert_eq!(
            md.get(&format!("{arch}.rope.scaling.type"))
                .map(|v| v.to_string().unwrap().clone()),
            shape.yarn_factor.map(|_| "yarn".to_string()),
            "{name}"
        );
        assert_eq!(u("expert_count"), shape.moe.map(|m| m.experts), "{name}");
        assert_eq!(u("expert_used_count"), shape.moe.map(|m| m.used), "{name}");
        assert_eq!(
            u("expert_feed_forward_length"),
            shape.moe.map(|m| m.expert_ffn),
            "{name}"
        );
        assert_eq!(
            u("expert_shared_feed_forward_length"),
            shape.moe.and_then(|m| m.shared_ffn),
            "{name}"
        );
        assert_eq!(
            u("rope.scaling.original_context_length"),
            shape.rope_original_context,
            "{name}"
        );
        let tokens = md["tokenizer.ggml.tokens"].to_vec().unwrap().len();
        assert_eq!(tokens, summary.vocab, "{name}");
        if shape.arch == Architecture::Qwen2 {
            // Qwen's own tokenizer, chat template included.
            assert_eq!(md["tokenizer.ggml.pre"].to_string().unwrap(), "qwen2");
            assert_eq!(md["tokenizer.ggml.eos_token_id"].to_u32().unwrap(), 151_643);
            assert!(md.contains_key("tokenizer.chat_template"));
        }
        std::fs::remove_file(&path).unwrap();
    }
}

/// The windows, soft-caps and layer patterns of the tiny presets are the
/// ones tests rely on: small windows, a global layer in gemma3-tiny.
#[test]
fn tiny_presets_slide_as_their_architectures_do() {
    let p = |n| SynthShape::preset(n).unwrap();
    let sliding = |s: &SynthShape| (0..s.n_layers).map(|i| s.is_sliding(i)).collect::<Vec<_>>();
    assert_eq!(
        sliding(&p("gemma3-tiny")),
        [true, true, true, true, true, false]
    );
    assert_eq!(sliding(&p("gemma2-tiny")), [true, false, true, false]);
    assert_eq!(sliding(&p("llama-swa-tiny")), [true, true]);
    assert_eq!(sliding(&p("qwen2-tiny")), [false, false]);
    assert_eq!(sliding(&p("phi3-tiny")), [false, false]);
    assert_eq!(sliding(&p("gpt-oss-tiny")), [true, false]);
    assert_eq!(
        sliding(&p("gemma-3-1b")).iter().filter(|&&s| !s).count(),
        4,
        "26 layers: global 5, 11, 17, 23"
    );
    for name in tiny_presets() {
        let s = p(name);
        assert!((2..=9).contains(&s.n_layers), "{name}");
        assert!(s.vocab_from_tokenizer, "{name}");
        assert!(s.sliding_window.is_none_or(|w| w <= 32), "{name}");
        assert!(s.n_kv_heads < s.n_heads, "{name}: GQA");
    }
    assert_eq!(p("gemma2-tiny").attn_softcap, Some(50.0));
    assert_eq!(p("gemma3-tiny").attn_softcap, None);
    let q3 = p("qwen3-tiny");
    assert_ne!(q3.head_dim * q3.n_heads, q3.hidden);
}

/// The real presets carry their Hugging Face config.json numbers.
#[test]
fn real_presets_have_the_public_configs_numbers() {
    let p = |n| SynthShape::preset(n).unwrap();
    let dims = |s: &SynthShape| {
        (
            s.n_layers,
            s.hidden,
            s.n_heads,
            s.n_kv_heads,
            s.head_dim,
            s.ffn,
            s.vocab,
        )
    };
    let s = p("qwen2.5-1.5b");
    assert_eq!(s.arch, Architecture::Qwen2);
    assert_eq!(dims(&s), (28, 1536, 12, 2, 128, 8960, 151_936));
    assert_eq!((s.rope_theta, s.rms_eps, s.context), (1e6, 1e-6, 32_768));
    assert!(s.tied_embeddings);
    let s = p("qwen3-1.7b");
    assert_eq!(s.arch, Architecture::Qwen3);
    assert_eq!(dims(&s), (28, 2048, 16, 8, 128, 6144, 151_936));
    assert_eq!((s.rope_theta, s.rms_eps, s.context), (1e6, 1e-6, 40_960));
    assert!(s.tied_embeddings);
    let s = p("qwen3-30b-a3b");
    assert_eq!(s.arch, Architecture::Qwen3Moe);
    assert_eq!(dims(&s), (48, 2048, 32, 4, 128, 6144, 151_936));
    assert_eq!((s.rope_theta, s.rms_eps, s.context), (1e6, 1e-6, 40_960));
    let moe = s.moe.unwrap();
    assert_eq!((moe.experts, moe.used, moe.expert_ffn), (128, 8, 768));
    assert!(!s.tied_embeddings);
    let s = p("gpt-oss-20b");
    assert_eq!(s.arch, Architecture::GptOss);
    assert_eq!(dims(&s), (24, 2880, 64, 8, 64, 2880, 201_088));
    assert_eq!(
        (s.rope_theta, s.rms_eps, s.context),
        (150_000.0, 1e-5, 131_072)
    );
    let moe = s.moe.unwrap();
    assert_eq!((moe.experts, moe.used, moe.expert_ffn), (32, 4, 2880));
    assert_eq!((s.sliding_window, s.yarn_factor), (Some(128), Some(32.0)));
    assert_eq!(s.rope_original_context, Some(4096));
    assert!(!s.tied_embeddings && s.is_sliding(0) && !s.is_sliding(1));
    let s = p("phi-3-mini");
    assert_eq!(s.arch, Architecture::Phi3);
    assert_eq!(dims(&s), (32, 3072, 32, 32, 96, 8192, 32_064));
    assert_eq!((s.rope_theta, s.rms_eps, s.context), (10_000.0, 1e-5, 4096));
    assert_eq!(s.rope_original_context, Some(4096));
    assert!(!s.tied_embeddings && s.long_rope.is_none());
    let s = p("phi-3-mini-128k");
    assert_eq!(dims(&s), (32, 3072, 32, 32, 96, 8192, 32_064));
    assert_eq!((s.context, s.rope_original_context), (131_072, Some(4096)));
    let l = s.long_rope.as_ref().unwrap();
    assert_eq!((l.long_factors.len(), l.short_factors.len()), (48, 48));
    // sqrt(1 + ln 32 / ln 4096) = sqrt(17 / 12)
    let want = (17.0f32 / 12.0).sqrt();
    assert!((s.long_rope_attn_factor().unwrap() - want).abs() < 1e-6);
    let s = p("gemma-2-2b");
    assert_eq!(s.arch, Architecture::Gemma2);
    assert_eq!(dims(&s), (26, 2304, 8, 4, 256, 9216, 256_000));
    assert_eq!((s.rope_theta, s.rms_eps, s.context), (10_000.0, 1e-6, 8192));
    assert_eq!(s.sliding_window, Some(4096));
    assert_eq!((s.attn_softcap, s.final_softcap), (Some(50.0), Some(30.0)));
    assert!(s.tied_embeddings);
    let s = p("gemma-3-1b");
    assert_eq!(s.arch, Architecture::Gemma3);
    assert_eq!(dims(&s), (26, 1152, 4, 1, 256, 6912, 262_144));
    assert_eq!((s.rope_theta, s.rms_eps, s.context), (1e6, 1e-6, 32_768));
    assert_eq!(s.sliding_window, Some(512));
    assert_eq!(
        (s.attn_softcap, s.final_softcap, s.rope_theta_swa),
        (None, None, None)
    );
    assert!(s.tied_embeddings);

    for name in PRESETS {
        let s = p(name);
        s.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(s.vocab_from_tokenizer, name.ends_with("-tiny"), "{name}");
    }
    let vocab = |n| p(n).vocab_file;
    assert_eq!(vocab("qwen2.5-1.5b").as_deref(), Some("qwen2"));
    assert_eq!(vocab("qwen3-1.7b").as_deref(), Some("qwen2"));
    assert_eq!(vocab("phi-3-mini").as_deref(), Some("phi-3"));
    assert_eq!(vocab("llama-3.2-1b").as_deref(), Some("llama-bpe"));
    assert_eq!(vocab("gemma-3-1b").as_deref(), Some("llama-spm"));
    assert_eq!(vocab("smollm2-135m"), None);
}

/// Shapes that llama.cpp would read wrongly are refused before writing.
#[test]
fn shapes_an_architecture_cannot_read_are_refused() {
    let p = |n| SynthShape::preset(n).unwrap();
    let bad = [
        // llama.cpp builds qwen2's Q hidden wide
        SynthShape {
            head_dim: 64,
            ..p("qwen2-tiny")
        },
        // and reads no output.weight for gemma2
        SynthShape {
            tied_embeddings: false,
            ..p("gemma2-tiny")
        },
        SynthShape {
            rope_scaling: Some(Llama3RopeScaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_context: 256,
            }),
            ..p("qwen3-tiny")
        },
        SynthShape {
            attn_softcap: Some(50.0),
            ..p("gemma3-tiny")
        },
        SynthShape {
            long_rope: Some(LongRope::stand_in(64, 4.0)),
            ..p("phi3-tiny")
        },
        SynthShape {
            head_dim: 33,
            ..p("qwen3-tiny")
        },
        SynthShape {
            yarn_factor: Some(4.0),
            ..p("phi3-tiny")
        },
        SynthShape {
            tied_embeddings: true,
            ..p("qwen2moe-tiny")
        },
        SynthShape {
            moe: p("qwen3moe-tiny").moe,
            ..p("qwen2moe-tiny")
        },
        SynthShape {
            rope_original_context: None,
            ..p("qwen3-yarn-tiny")
        },
        // llama.cpp needs gpt-oss's output.weight and its window.
        SynthShape {
            sliding_window: None,
            ..p("gpt-oss-tiny")
        },
    ];
    for s in bad {
        assert!(s.validate().is_err(), "{s:?}");
    }
    // MXFP4 and IQ4 experts need experts.
    let dir = tempfile::tempdir().unwrap();
    for quant in ["mxfp4_experts", "iq4_xs_experts", "iq4_nl_experts"] {
        let spec = SynthSpec {
            shape: p("qwen3-tiny"),
            quant: quant.parse().unwrap(),
            seed: 1,
            threads: 1,
        };
        let out = dir.path().join("x.gguf");
        let err = generate(&out, &spec, &tokenizer_source(&spec.shape), |_| {}).unwrap_err();
        assert!(err.to_string().contains(quant), "{err}");
    }
    assert!("gemma9".parse::<Architecture>().is_err());
    assert_eq!(
        "qwen3".parse::<Architecture>().unwrap(),
        Architecture::Qwen3
    );
}

/// A tiny shape takes its vocabulary file's token count; a shape with real
/// rows keeps them, the tokens padded with unused `[PADn]` ones as
/// llama.cpp's converter pads Qwen's.
#[test]
fn the_vocabulary_file_sets_or_is_padded_to_the_rows() {
    let p = |n| SynthShape::preset(n).unwrap();
    let fitted = |s: SynthShape| s.fitted_to(&tokenizer_source(&s)).unwrap().vocab;
    assert_eq!(fitted(p("qwen2-tiny")), 151_936);
    assert_eq!(fitted(p("phi3-tiny")), 32_064);
    assert_eq!(fitted(p("gemma3-tiny")), 32_000);
    assert_eq!(fitted(p("llama-swa-tiny")), 49_152);
    assert_eq!(fitted(p("gemma-3-1b")), 262_144);

    let dir = tempfile::tempdir().unwrap();
    let shape = SynthShape {
        name: "padded".into(),
        n_layers: 1,
        vocab: 33_000,
        vocab_from_tokenizer: false,
        ..p("gemma3-tiny")
    };
    let (_, summary, ct) = write_and_read(dir.path(), &shape, "q8_0");
    assert_eq!(summary.vocab, 33_000);
    assert_eq!(
        ct.tensor_infos["token_embd.weight"].shape.dims(),
        [33_000, 128]
    );
    let tokens = ct.metadata["tokenizer.ggml.tokens"].to_vec().unwrap();
    let types = ct.metadata["tokenizer.ggml.token_type"].to_vec().unwrap();
    assert_eq!(tokens.len(), 33_000);
    assert_eq!(types.len(), 33_000);
    assert_eq!(tokens[1].to_string().unwrap(), "<s>");
    assert_eq!(tokens[32_999].to_string().unwrap(), "[PAD32999]");
    assert_eq!(types[32_999].to_i32().unwrap(), 5);
    assert_eq!(
        ct.metadata["tokenizer.ggml.model"].to_string().unwrap(),
        "llama"
    );
}

/// Phi-3's long-context factors are written as llama.cpp reads them: two
/// global `head_dim / 2` tensors and the attention scale; candle's phi3
/// (which ignores them) still runs the file.
#[test]
fn phi3_long_context_factors_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let shape = SynthShape {
        name: "phi3-long".into(),
        context: 2048,
        long_rope: Some(LongRope::stand_in(32, 4.0)),
        ..SynthShape::preset("phi3-tiny").unwrap()
    };
    let (path, summary, ct) = write_and_read(dir.path(), &shape, "f32");
    let mut f = std::fs::File::open(&path).unwrap();
    let read = |f: &mut std::fs::File, name: &str| {
        ct.tensor(f, name, &Device::Cpu)
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    let long = read(&mut f, "rope_factors_long.weight");
    let short = read(&mut f, "rope_factors_short.weight");
    let l = shape.long_rope.as_ref().unwrap();
    assert_eq!(long, l.long_factors);
    assert_eq!(short, l.short_factors);
    assert_eq!((long[0], long[15]), (1.0, 4.0));
    let factor = ct.metadata["phi3.rope.scaling.attn_factor"]
        .to_f32()
        .unwrap();
    let want = (1.0 + 4f64.ln() / 512f64.ln()).sqrt() as f32;
    assert!((factor - want).abs() < 1e-6, "{factor} vs {want}");
    assert_eq!(
        ct.metadata["phi3.rope.scaling.original_context_length"]
            .to_u32()
            .unwrap(),
        512
    );
    let mut m = CandleModel::load(Architecture::Phi3, &path);
    assert_sane(&m.forward(&[1, 2, 3], 0), summary.vocab, "phi3-long");
}

/// llama.cpp's Q4_K_M and Q5_K_M count Phi-3's fused QKV as an `attn_v`:
/// Q6_K in the layers `use_more_bits` picks.
#[test]
fn q4_k_m_treats_phi3_fused_qkv_as_attn_v() {
    let dir = tempfile::tempdir().unwrap();
    let shape = SynthShape {
        name: "phi3-kquant".into(),
        n_layers: 8,
        hidden: 256,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        vocab: 1024,
        vocab_from_tokenizer: false,
        ..SynthShape::preset("phi3-tiny").unwrap()
    };
    // Q5_K_M gives the same layers Q6_K, the rest Q5_K.
    for (quant, base) in [("q4_k_m", GgmlDType::Q4K), ("q5_k_m", GgmlDType::Q5K)] {
        let (_, _, ct) = write_and_read(dir.path(), &shape, quant);
        let dtype = |name: &str| ct.tensor_infos[name].ggml_dtype;
        for i in 0..8 {
            let want = if use_more_bits(i, 8) {
                GgmlDType::Q6K
            } else {
                base
            };
            let qkv = format!("blk.{i}.attn_qkv.weight");
            assert_eq!(dtype(&qkv), want, "{quant} layer {i}");
            assert_eq!(dtype(&format!("blk.{i}.ffn_up.weight")), base, "{quant}");
        }
        assert_eq!(dtype("output.weight"), GgmlDType::Q6K, "{quant}");
    }
    assert!(matches!("q4_k_m".parse().unwrap(), Quant::Q4KM));
    assert!(matches!("q5_k_m".parse().unwrap(), Quant::Q5KM));
}

/// gemma4-tiny's tensors as llama.cpp's gemma4 loader asks for them:
/// sliding layers' attention 32 wide with 2 KV heads, global ones 64 wide
/// with 1, no K/V (nor K norm) in layers 6-8 (they share layers 4 and 5's
/// KV), no `attn_v` in layer 1, the per-layer embeddings and output scales,
/// and the keys its converter writes.
#[test]
fn gemma4_tiny_has_llama_cpp_names() {
    let dir = tempfile::tempdir().unwrap();
    let shape = SynthShape::preset("gemma4-tiny").unwrap();
    let (path, summary, ct) = write_and_read(dir.path(), &shape, "f32");
    let got: BTreeMap<String, Vec<usize>> = ct
        .tensor_infos
        .iter()
        .map(|(k, info)| (k.clone(), info.shape.dims().to_vec()))
        .collect();
    let (h, f, v, w) = (128, 128, summary.vocab, 16);
    let mut want = BTreeMap::new();
    let mut put = |name: String, dims: &[usize]| {
        want.insert(name, dims.to_vec());
    };
    put("token_embd.weight".into(), &[v, h]);
    put("output_norm.weight".into(), &[h]);
    put("rope_freqs.weight".into(), &[32]);
    put("per_layer_token_embd.weight".into(), &[v, 9 * w]);
    put("per_layer_model_proj.weight".into(), &[9 * w, h]);
    put("per_layer_proj_norm.weight".into(), &[w]);
    for i in 0..9 {
        let (d, kvh) = if i % 3 < 2 { (32, 2) } else { (64, 1) };
        let mut put = |name: &str, dims: &[usize]| put(format!("blk.{i}.{name}"), dims);
        put("attn_norm.weight", &[h]);
        put("attn_q.weight", &[4 * d, h]);
        put("attn_q_norm.weight", &[d]);
        if i < 6 {
            put("attn_k.weight", &[kvh * d, h]);
            put("attn_k_norm.weight", &[d]);
            if i != 1 {
                put("attn_v.weight", &[kvh * d, h]);
            }
        }
        put("attn_output.weight", &[h, 4 * d]);
        put("post_attention_norm.weight", &[h]);
        put("ffn_norm.weight", &[h]);
        // The shared-KV layers' MLPs are twice as wide.
        let f = if i < 6 { f } else { 2 * f };
        put("ffn_gate.weight", &[f, h]);
        put("ffn_up.weight", &[f, h]);
        put("ffn_down.weight", &[h, f]);
        put("post_ffw_norm.weight", &[h]);
        put("inp_gate.weight", &[w, h]);
        put("proj.weight", &[h, w]);
        put("post_norm.weight", &[h]);
        put("layer_output_scale.weight", &[1]);
    }
    assert_eq!(got, want);
    let md = &ct.metadata;
    let u = |k: &str| md[&format!("gemma4.{k}")].to_u32().unwrap();
    assert_eq!(u("attention.key_length"), 64);
    assert_eq!(u("attention.key_length_swa"), 32);
    assert_eq!(u("attention.shared_kv_layers"), 3);
    assert_eq!(u("embedding_length_per_layer_input"), 16);
    let per_layer = |k: &str| -> Vec<u32> {
        let values = md[&format!("gemma4.{k}")].to_vec().unwrap();
        values.iter().map(|x| x.to_u32().unwrap()).collect()
    };
    assert_eq!(
        per_layer("attention.head_count_kv"),
        [2, 2, 1, 2, 2, 1, 2, 2, 1]
    );
    assert_eq!(
        per_layer("feed_forward_length"),
        [128, 128, 128, 128, 128, 128, 256, 256, 256]
    );
    let sliding: Vec<bool> = md["gemma4.attention.sliding_window_pattern"]
        .to_vec()
        .unwrap()
        .iter()
        .map(|x| x.to_bool().unwrap())
        .collect();
    assert_eq!(sliding, (0..9).map(|i| i % 3 < 2).collect::<Vec<_>>());
    std::fs::remove_file(&path).unwrap();
}

/// gemma4-moe-tiny's MoE tensors as llama.cpp's gemma4 loader asks for
/// them, beside each layer's dense MLP, and the expert keys.
#[test]
fn gemma4_moe_tiny_has_llama_cpp_names() {
    let dir = tempfile::tempdir().unwrap();
    let shape = SynthShape::preset("gemma4-moe-tiny").unwrap();
    let (path, _, ct) = write_and_read(dir.path(), &shape, "f32");
    let dims = |name: &str| ct.tensor_infos[name].shape.dims().to_vec();
    let (h, e, f) = (128, 8, 64);
    for i in 0..4 {
        let t = |s: &str| format!("blk.{i}.{s}");
        assert_eq!(dims(&t("ffn_gate_inp.weight")), [e, h]);
        assert_eq!(dims(&t("ffn_gate_inp.scale")), [h]);
        assert_eq!(dims(&t("ffn_gate_up_exps.weight")), [e, 2 * f, h]);
        assert_eq!(dims(&t("ffn_down_exps.weight")), [e, h, f]);
        assert_eq!(dims(&t("ffn_down_exps.scale")), [e]);
        for norm in ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] {
            assert_eq!(dims(&t(&format!("{norm}.weight"))), [h]);
        }
        assert_eq!(dims(&t("ffn_down.weight")), [h, 128]);
        assert_eq!(ct.tensor_infos.contains_key(&t("attn_v.weight")), i != 2);
    }
    assert!(!ct.tensor_infos.contains_key("per_layer_token_embd.weight"));
    let u = |k: &str| ct.metadata[&format!("gemma4.{k}")].to_u32().unwrap();
    assert_eq!(
        (
            u("expert_count"),
            u("expert_used_count"),
            u("expert_feed_forward_length")
        ),
        (8, 2, 64)
    );
    std::fs::remove_file(&path).unwrap();
}
