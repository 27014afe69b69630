//! Malformed GGUF files derived from a small valid one, each refused with
//! a typed error or loaded and run, never a panic, and with the verdict
//! `zinfer model inspect` reports (the tokenizer opened, then
//! `check_gguf`) the same as the load's (the tokenizer opened, then
//! `load`), as a worker loads.

#![cfg(feature = "synthetic")]
#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::{self, Content, Value};
use zinfer_fetch::test_model_path;
use zinfer_model::synthetic::{SynthShape, SynthSpec, generate};
use zinfer_model::{ChunkOutput, LoadOptions, SeqChunk, check_gguf, load};
use zinfer_text::{ModelTokenizer, limits};

#[global_allocator]
static ALLOC: limits::TemplateAlloc = limits::TemplateAlloc;

/// The most one case may take, load and forward pass included.
const CASE_TIME: Duration = Duration::from_secs(2);
/// The most the whole process's resident memory may reach.
const PEAK_RSS: u64 = 1 << 30;

/// One metadata entry as written: key, type code, value bytes.
#[derive(Clone)]
struct Kv {
    key: String,
    ty: u32,
    bytes: Vec<u8>,
}

/// One tensor table entry, dims innermost first.
#[derive(Clone)]
struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    offset: u64,
}

/// A GGUF file taken apart, to put back together changed.
#[derive(Clone)]
struct Gguf {
    kvs: Vec<Kv>,
    tensors: Vec<Tensor>,
    data: Vec<u8>,
    alignment: usize,
}

fn string_bytes(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend(s);
    out
}

/// A metadata entry as candle's GGUF writer writes it: the entry is
/// written before a known last one, and cut out of the bytes.
fn entry(key: &str, v: &Value) -> Kv {
    const END: u8 = 0x5A;
    // Key "~" (8 + 1 bytes), type (4), a u8 END (1).
    const END_ENTRY: usize = 14;
    let mut out = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut out, &[(key, v), ("~", &Value::U8(END))], &[]).unwrap();
    let bytes = out.into_inner();
    let last = bytes.iter().rposition(|&b| b == END).unwrap();
    let written = &bytes[24..last + 1 - END_ENTRY];
    let at = 8 + key.len();
    Kv {
        key: key.to_string(),
        ty: u32::from_le_bytes(written[at..at + 4].try_into().unwrap()),
        bytes: written[at + 4..].to_vec(),
    }
}

impl Gguf {
    fn parse(path: &Path) -> Self {
        let bytes = std::fs::read(path).unwrap();
        let content = Content::read(&mut std::io::Cursor::new(&bytes)).unwrap();
        let mut kvs: Vec<Kv> = content
            .metadata
            .iter()
            .map(|(key, v)| entry(key, v))
            .collect();
        kvs.sort_by(|a, b| a.key.cmp(&b.key));
        let mut tensors: Vec<Tensor> = content
            .tensor_infos
            .iter()
            .map(|(name, info)| Tensor {
                name: name.clone(),
                dims: info.shape.dims().iter().rev().map(|&d| d as u64).collect(),
                ty: match info.ggml_dtype {
                    candle_core::quantized::GgmlDType::F32 => 0,
                    other => panic!("the base file is F32, not {other:?}"),
                },
                offset: info.offset,
            })
            .collect();
        tensors.sort_by_key(|t| t.offset);
        Self {
            kvs,
            tensors,
            data: bytes[content.tensor_data_offset as usize..].to_vec(),
            alignment: 32,
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for kv in &self.kvs {
            out.extend(string_bytes(kv.key.as_bytes()));
            out.extend(kv.ty.to_le_bytes());
            out.extend(&kv.bytes);
        }
        for t in &self.tensors {
            out.extend(string_bytes(t.name.as_bytes()));
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(t.offset.to_le_bytes());
        }
        let align = self.alignment.max(1);
        out.resize(out.len().div_ceil(align) * align, 0);
        out.extend(&self.data);
        out
    }

    fn set(&mut self, key: &str, v: &Value) -> &mut Self {
        let Kv { ty, bytes, .. } = entry(key, v);
        self.set_raw(key, ty, bytes)
    }

    fn set_raw(&mut self, key: &str, ty: u32, bytes: Vec<u8>) -> &mut Self {
        match self.kvs.iter_mut().find(|kv| kv.key == key) {
            Some(kv) => {
                kv.ty = ty;
                kv.bytes = bytes;
            }
            None => self.kvs.push(Kv {
                key: key.to_string(),
                ty,
                bytes,
            }),
        }
        self
    }

    fn remove(&mut self, key: &str) {
        self.kvs.retain(|kv| kv.key != key);
    }

    fn tensor(&mut self, name: &str) -> &mut Tensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap()
    }

    /// Writes `value` as the f32 at `index` of tensor `name`.
    fn poke(&mut self, name: &str, index: usize, value: f32) {
        let at = self.tensor(name).offset as usize + 4 * index;
        self.data[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }

    fn strings(&self, key: &str) -> Vec<String> {
        let kv = self.kvs.iter().find(|kv| kv.key == key).unwrap();
        let b = &kv.bytes;
        let n = u64::from_le_bytes(b[4..12].try_into().unwrap()) as usize;
        let mut at = 12;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let len = u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
            out.push(String::from_utf8_lossy(&b[at + 8..at + 8 + len]).into_owned());
            at += 8 + len;
        }
        out
    }
}

fn string_array(items: &[String]) -> Value {
    Value::Array(items.iter().map(|s| Value::String(s.clone())).collect())
}

/// The small valid file: llama, 2 layers of width 64, 512 tokens, F32,
/// tied embeddings, the default model's tokenizer and template.
fn base(dir: &Path) -> Gguf {
    let mut f = std::fs::File::open(test_model_path().unwrap()).unwrap();
    let source = Content::read(&mut f).unwrap().metadata;
    let mut shape = SynthShape::preset("llama-swa-tiny").unwrap();
    shape.name = "hostile".into();
    (shape.hidden, shape.head_dim, shape.ffn) = (64, 16, 128);
    (shape.vocab, shape.vocab_from_tokenizer) = (512, false);
    (shape.context, shape.sliding_window) = (256, None);
    shape.tied_embeddings = true;
    let path = dir.join("base.gguf");
    let spec = SynthSpec {
        shape,
        quant: "f32".parse().unwrap(),
        seed: 3,
        threads: 1,
    };
    generate(&path, &spec, &source, |_| {}).unwrap();
    Gguf::parse(&path)
}

/// What the verdict or the load said: `Ok` or the refusal's message.
type Outcome = Result<(), String>;

/// `inspect`'s verdict: the tokenizer, then the shared check.
fn verdict(path: &Path) -> Outcome {
    ModelTokenizer::open(path).map_err(|e| e.to_string())?;
    check_gguf(path).map(drop).map_err(|e| e.to_string())
}

/// A worker's load: the tokenizer, the model, then one forward step whose
/// logits must be finite.
fn load_and_run(path: &Path) -> Outcome {
    let tokenizer = ModelTokenizer::open(path).map_err(|e| e.to_string())?;
    let options = LoadOptions {
        kv_capacity: 64,
        threads: Some(1),
        ..LoadOptions::default()
    };
    let mut loaded = load(path, &options).map_err(|e| e.to_string())?;
    let tokens = tokenizer.encode("hi").unwrap_or_default();
    let mut tokens: Vec<u32> = [1u32].into_iter().chain(tokens).collect();
    tokens.truncate(loaded.model.max_positions().max(1));
    let slots: Vec<u32> = (0..tokens.len() as u32).collect();
    let chunk = SeqChunk {
        tokens: &tokens,
        slots: &slots,
        start_pos: 0,
        output: ChunkOutput::LastLogits,
    };
    let logits = loaded.model.forward(&[chunk]).map_err(|e| e.to_string())?;
    let vocab = loaded.model.vocab_size();
    assert_eq!(logits[0].len(), vocab);
    assert!(
        logits[0].iter().all(|x| x.is_finite()),
        "{}: a file taken by the load gives non-finite logits",
        path.display()
    );
    Ok(())
}

/// Peak resident memory of this process (VmHWM).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Cases by family: (family, name, bytes).
struct Cases(Vec<(&'static str, String, Vec<u8>)>);

impl Cases {
    fn push(&mut self, family: &'static str, name: impl Into<String>, file: &Gguf) {
        self.0.push((family, name.into(), file.to_bytes()));
    }

    fn edit(
        &mut self,
        family: &'static str,
        name: impl Into<String>,
        base: &Gguf,
        f: impl FnOnce(&mut Gguf),
    ) {
        let mut g = base.clone();
        f(&mut g);
        self.push(family, name, &g);
    }
}

fn cases(base: &Gguf) -> Cases {
    let mut c = Cases(Vec::new());
    let bytes = base.to_bytes();
    let data_start = bytes.len() - base.data.len();
    // Truncations: through the header densely, through the data sparsely.
    let mut cut = 0;
    while cut < bytes.len() {
        c.0.push(("truncation", format!("cut at {cut}"), bytes[..cut].to_vec()));
        cut += if cut < data_start {
            1 + data_start / 60
        } else {
            1 + base.data.len() / 10
        };
    }
    // Counts in the fixed header.
    for (field, at) in [("tensor count", 8), ("metadata count", 16)] {
        let n = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        for value in [0, n - 1, n + 1, 1 << 20, 1 << 40, u64::MAX] {
            let mut b = bytes.clone();
            b[at..at + 8].copy_from_slice(&value.to_le_bytes());
            c.0.push(("counts", format!("{field} = {value}"), b));
        }
    }
    // Lengths: each string or array length field in the metadata, set huge.
    let mut at = 24;
    for kv in base.kvs.iter().take(12) {
        for value in [u64::MAX, 1 << 33] {
            let mut b = bytes.clone();
            b[at..at + 8].copy_from_slice(&value.to_le_bytes());
            c.0.push((
                "lengths",
                format!("key length of `{}` = {value}", kv.key),
                b,
            ));
            if kv.ty == 8 || kv.ty == 9 {
                let len_at = at + 8 + kv.key.len() + 4 + if kv.ty == 9 { 4 } else { 0 };
                let mut b = bytes.clone();
                b[len_at..len_at + 8].copy_from_slice(&value.to_le_bytes());
                c.0.push((
                    "lengths",
                    format!("value length of `{}` = {value}", kv.key),
                    b,
                ));
            }
        }
        at += 8 + kv.key.len() + 4 + kv.bytes.len();
    }
    // Value types: each entry's type code changed.
    for kv in base.kvs.iter().take(16) {
        for ty in [4, 6, 8, 9, 13] {
            if ty != kv.ty {
                c.edit("types", format!("`{}` as type {ty}", kv.key), base, |g| {
                    g.set_raw(&kv.key, ty, kv.bytes.clone());
                });
            }
        }
    }
    // Alignment.
    for a in [0u32, 1, 3, 48, 64, 1 << 31] {
        c.edit("alignment", format!("alignment {a}"), base, |g| {
            g.set("general.alignment", &Value::U32(a));
            if a.is_power_of_two() && a <= 4096 {
                g.alignment = a as usize;
            }
        });
    }
    c.edit("alignment", "alignment as a string", base, |g| {
        g.set("general.alignment", &Value::String("32".into()));
    });
    // Model metadata values.
    let ints = [
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "context_length",
        "rope.dimension_count",
        "vocab_size",
    ];
    for key in ints {
        let full = format!("llama.{key}");
        for v in [0u64, 1, 3, 7, 1 << 20, 1 << 40, u64::MAX] {
            c.edit("metadata", format!("{full} = {v}"), base, |g| {
                g.set(&full, &Value::U64(v));
            });
        }
        c.edit("metadata", format!("{full} = -1"), base, |g| {
            g.set(&full, &Value::I32(-1));
        });
        c.edit("metadata", format!("{full} missing"), base, |g| {
            g.remove(&full)
        });
    }
    for key in ["rope.freq_base", "attention.layer_norm_rms_epsilon"] {
        let full = format!("llama.{key}");
        for v in [f32::NAN, f32::INFINITY, -1.0, 0.0, 1e-30, 2.0] {
            c.edit("metadata", format!("{full} = {v}"), base, |g| {
                g.set(&full, &Value::F32(v));
            });
        }
    }
    for arch in ["", "nope", "llama\0", "qwen2"] {
        c.edit("metadata", format!("architecture {arch:?}"), base, |g| {
            g.set("general.architecture", &Value::String(arch.into()));
        });
    }
    // Big metadata: past the reader's limits, or within them.
    c.edit("metadata", "2 MiB string", base, |g| {
        g.set("general.description", &Value::String("x".repeat(2 << 20)));
    });
    c.edit("metadata", "64 KiB string", base, |g| {
        g.set("general.description", &Value::String("x".repeat(64 << 10)));
    });
    c.edit("metadata", "array of 2^20 + 1 bytes", base, |g| {
        let mut b = 0u32.to_le_bytes().to_vec();
        b.extend(((1u64 << 20) + 1).to_le_bytes());
        b.resize(b.len() + (1 << 20) + 1, 0);
        g.set_raw("general.blob", 9, b);
    });
    // Tensor dims, types and offsets.
    let names: Vec<String> = base.tensors.iter().map(|t| t.name.clone()).collect();
    for (i, name) in names.iter().enumerate() {
        let dims = base.tensors[i].dims.clone();
        let mut variants: Vec<(String, Vec<u64>)> = vec![
            ("first dim doubled".into(), {
                let mut d = dims.clone();
                d[0] *= 2;
                d
            }),
            ("a zero dim".into(), {
                let mut d = dims.clone();
                d[0] = 0;
                d
            }),
            ("overflowing dims".into(), vec![1 << 32, 1 << 32, 1 << 32]),
            ("an extra dim".into(), [dims.clone(), vec![1]].concat()),
            ("reversed dims".into(), dims.iter().rev().copied().collect()),
        ];
        if dims.len() == 2 {
            variants.push(("one row more".into(), vec![dims[0], dims[1] + 1]));
        }
        for (what, d) in variants {
            c.edit("dims", format!("{name}: {what}"), base, |g| {
                g.tensor(name).dims = d
            });
        }
        for ty in [1u32, 2, 8, 15, 30, 99] {
            c.edit("tensor types", format!("{name} as type {ty}"), base, |g| {
                g.tensor(name).ty = ty
            });
        }
        let offset = base.tensors[i].offset;
        let previous = if i > 0 {
            base.tensors[i - 1].offset
        } else {
            64
        };
        for (what, o) in [
            ("misaligned", offset + 4),
            ("onto the previous", previous),
            ("past the end", base.data.len() as u64),
            ("huge", u64::MAX - 31),
        ] {
            c.edit("offsets", format!("{name}: {what}"), base, |g| {
                g.tensor(name).offset = o
            });
        }
    }
    c.edit("offsets", "a duplicate tensor name", base, |g| {
        let t = g.tensors[1].clone();
        g.tensors[2].name = t.name;
    });
    // Tokenizer tables.
    let tokens = base.strings("tokenizer.ggml.tokens");
    c.edit(
        "tokenizer",
        "one token more than embedding rows",
        base,
        |g| {
            let mut t = tokens.clone();
            t.push("extra".into());
            g.set("tokenizer.ggml.tokens", &string_array(&t));
        },
    );
    c.edit("tokenizer", "one token fewer", base, |g| {
        g.set(
            "tokenizer.ggml.tokens",
            &string_array(&tokens[..tokens.len() - 1]),
        );
    });
    c.edit("tokenizer", "2^20 + 1 empty tokens", base, |g| {
        g.set(
            "tokenizer.ggml.tokens",
            &string_array(&vec![String::new(); (1 << 20) + 1]),
        );
    });
    // At the limit: taken by the reader, then refused for not matching
    // the embedding, within the memory bound.
    c.edit("tokenizer", "2^20 empty tokens", base, |g| {
        g.set(
            "tokenizer.ggml.tokens",
            &string_array(&vec![String::new(); 1 << 20]),
        );
    });
    c.edit("tokenizer", "no tokens", base, |g| {
        g.remove("tokenizer.ggml.tokens")
    });
    c.edit("tokenizer", "tokens as integers", base, |g| {
        g.set(
            "tokenizer.ggml.tokens",
            &Value::Array(vec![Value::U32(1); tokens.len()]),
        );
    });
    c.edit("tokenizer", "duplicate tokens", base, |g| {
        g.set(
            "tokenizer.ggml.tokens",
            &string_array(&vec!["a".to_string(); tokens.len()]),
        );
    });
    c.edit("tokenizer", "garbage merges", base, |g| {
        g.set(
            "tokenizer.ggml.merges",
            &string_array(&["x".into(), "a b c".into(), " ".into()]),
        );
    });
    c.edit("tokenizer", "unknown model", base, |g| {
        g.set("tokenizer.ggml.model", &Value::String("nope".into()));
    });
    c.edit("tokenizer", "short token types", base, |g| {
        g.set(
            "tokenizer.ggml.token_type",
            &Value::Array(vec![Value::I32(1); 3]),
        );
    });
    for key in ["bos", "eos", "padding", "unknown", "eot"] {
        for id in [512i64, 1 << 31, -5] {
            c.edit("tokenizer", format!("{key} id {id}"), base, |g| {
                g.set(&format!("tokenizer.ggml.{key}_token_id"), &Value::I64(id));
            });
        }
    }
    // Weights that cannot compute.
    for (name, index) in [
        ("output_norm.weight", 3),
        ("blk.0.attn_norm.weight", 0),
        ("blk.1.ffn_norm.weight", 63),
        ("token_embd.weight", 0),
        ("token_embd.weight", 511 * 64 + 5),
    ] {
        for v in [f32::NAN, f32::INFINITY] {
            c.edit("weights", format!("{name}[{index}] = {v}"), base, |g| {
                g.poke(name, index, v)
            });
        }
    }
    // Templates, last: a render past its memory budget leaves a thread
    // asleep for good, and the renderer refuses all renders after a few.
    let templates = [
        ("nested loops", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}".to_string()),
        ("deep recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".into()),
        ("output flood", "{% for i in range(2000) %}{{ 'x' * 50000 }}{% endfor %}".into()),
        ("huge", "x".repeat(600 << 10)),
        ("does not compile", "{% for %}".into()),
        ("refuses system turns", "{{ raise_exception('no') }}".into()),
        ("empty", String::new()),
        ("string doubling", "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}".into()),
    ];
    for (name, source) in templates {
        c.edit("templates", name, base, |g| {
            g.set("tokenizer.chat_template", &Value::String(source));
        });
    }
    c
}

#[test]
fn malformed_files_are_refused_alike_by_inspect_and_load_or_run() {
    let dir = tempfile::tempdir().unwrap();
    let base = base(dir.path());
    let base_path = dir.path().join("rewritten.gguf");
    std::fs::write(&base_path, base.to_bytes()).unwrap();
    assert_eq!(verdict(&base_path), Ok(()));
    assert_eq!(load_and_run(&base_path), Ok(()));

    let cases = cases(&base);
    let mut by_family: BTreeMap<&str, [usize; 2]> = BTreeMap::new();
    let mut failures = Vec::new();
    let path = dir.path().join("case.gguf");
    for (family, name, bytes) in &cases.0 {
        std::fs::write(&path, bytes).unwrap();
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(|| (verdict(&path), load_and_run(&path)));
        let took = start.elapsed();
        let slot = by_family.entry(family).or_default();
        match outcome {
            Err(_) => failures.push(format!("{family}/{name}: panicked")),
            Ok((v, l)) => {
                slot[usize::from(l.is_ok())] += 1;
                if v.is_ok() != l.is_ok() {
                    failures.push(format!("{family}/{name}: inspect {v:?}, load {l:?}"));
                } else if let (Err(v), Err(l)) = (&v, &l)
                    && v != l
                {
                    failures.push(format!("{family}/{name}: inspect says {v:?}, load {l:?}"));
                }
            }
        }
        if took > CASE_TIME {
            failures.push(format!("{family}/{name}: took {took:?}"));
        }
    }
    let counts: Vec<String> = by_family
        .iter()
        .map(|(f, [refused, loaded])| format!("{f}: {refused} refused, {loaded} loaded"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}\n(by family: {})",
        failures.len(),
        cases.0.len(),
        failures.join("\n"),
        counts.join("; ")
    );
    let total: usize = by_family.values().map(|[r, l]| r + l).sum();
    assert!(total >= 300, "only {total} cases: {}", counts.join("; "));
    let refused: usize = by_family.values().map(|[r, _]| r).sum();
    assert!(
        refused * 2 > total,
        "most mutations must be refused: {}",
        counts.join("; ")
    );
    let peak = peak_rss();
    assert!(
        peak < PEAK_RSS,
        "peak RSS {peak} bytes; {}",
        counts.join("; ")
    );
}

/// The loads of a file and of its copy with other metadata agree: a
/// mutation the load takes must not change what the model computes.
#[test]
fn the_rewritten_base_file_is_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let base = base(dir.path());
    let rewritten = dir.path().join("rewritten.gguf");
    std::fs::write(&rewritten, base.to_bytes()).unwrap();
    let logits = |path: &Path| {
        let mut m = load(
            path,
            &LoadOptions {
                kv_capacity: 8,
                threads: Some(1),
                ..LoadOptions::default()
            },
        )
        .unwrap();
        let chunk = SeqChunk {
            tokens: &[1, 2, 3],
            slots: &[0, 1, 2],
            start_pos: 0,
            output: ChunkOutput::LastLogits,
        };
        m.model.forward(&[chunk]).unwrap().remove(0)
    };
    assert_eq!(logits(&dir.path().join("base.gguf")), logits(&rewritten));
}
