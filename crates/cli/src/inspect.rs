//! `zinfer model inspect`: what a model file or directory holds and whether
//! this build can load it, read from headers only (no weights are loaded,
//! so it is quick on any size of model).

mod hf;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;
use zinfer_probe::{Architecture, GgmlType, GgufHeader, KvDtype, KvShape, SUPPORTED_ARCHITECTURES};

/// Flags of `zinfer model inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct InspectArgs {
    /// A GGUF file, or a Hugging Face directory (config.json, *.safetensors,
    /// tokenizer.json).
    path: PathBuf,
    /// Print one JSON object instead of aligned lines.
    #[arg(long, env = "ZINFER_JSON")]
    json: bool,
}

/// Everything `inspect` reports; `None` where the file does not say.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Report {
    path: String,
    /// `gguf` or `safetensors`.
    format: &'static str,
    gguf_version: Option<u32>,
    architecture: Option<String>,
    name: Option<String>,
    parameters: u64,
    tensors: u64,
    /// Per storage type (ggml type or safetensors dtype), most parameters first.
    quant_mix: Vec<TypeShare>,
    file_type: Option<FileType>,
    context_length: Option<u64>,
    layers: Option<u64>,
    hidden: Option<u64>,
    heads: Option<u64>,
    kv_heads: Option<u64>,
    head_dim: Option<u64>,
    sliding_window: Option<u64>,
    rope_base: Option<f64>,
    expert_count: Option<u64>,
    /// Experts each token runs (`{arch}.expert_used_count`).
    experts_used: Option<u64>,
    /// Parameters one token reads: all but the experts it does not run
    /// (`parameters` for a dense model).
    active_parameters: Option<u64>,
    tokenizer: Option<String>,
    tokenizer_pre: Option<String>,
    tokens: Option<u64>,
    chat_template: bool,
    /// Bytes of tensor data; `None` when some type's size is unknown.
    weight_bytes: Option<u64>,
    kv_bytes_per_token: Option<KvBytes>,
    /// Whether this build's loader takes the architecture.
    loadable: bool,
    /// Why not, when `loadable` is false.
    unsupported_reason: Option<String>,
}

/// Tensors stored in one type.
#[derive(Debug, Serialize)]
struct TypeShare {
    #[serde(rename = "type")]
    kind: String,
    tensors: u64,
    parameters: u64,
    /// `None` for a ggml type whose block size this build does not know.
    bytes: Option<u64>,
}

/// GGUF `general.file_type`: the quantization the file was made with.
#[derive(Debug, Serialize)]
struct FileType {
    id: u64,
    name: Option<&'static str>,
}

/// KV cache bytes per cached token in each pool dtype.
#[derive(Debug, Serialize)]
struct KvBytes {
    f32: u64,
    f16: u64,
}

/// Runs `zinfer model inspect`.
pub(crate) fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let report = inspect(&args.path)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", human(&report));
    }
    Ok(())
}

/// Reads the report for a GGUF file or a Hugging Face directory.
pub(crate) fn inspect(path: &Path) -> anyhow::Result<Report> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mut load_refusal = None;
    let mut report = if meta.is_dir() {
        hf::inspect_dir(path)?
    } else if path.extension().is_some_and(|e| e == "safetensors") {
        bail!(
            "{} is one safetensors file: pass the model directory (config.json, *.safetensors, tokenizer.json)",
            path.display()
        );
    } else {
        let header = zinfer_probe::read_header(path)?;
        load_refusal = gguf_load_refusal(path);
        from_gguf(&header)
    };
    report.path = path.display().to_string();
    let reason =
        unsupported_reason(report.architecture.as_deref(), report.expert_count).or(load_refusal);
    report.loadable = reason.is_none();
    report.unsupported_reason = reason;
    Ok(report)
}

/// Why a worker would refuse the GGUF file, if it would: the tokenizer and
/// chat template, then the model, checked by the code the load runs.
fn gguf_load_refusal(path: &Path) -> Option<String> {
    if let Err(e) = zinfer_text::ModelTokenizer::open(path) {
        return Some(e.to_string());
    }
    zinfer_model::check_gguf(path).err().map(|e| e.to_string())
}

/// Why this build cannot load a model of `architecture`, if it cannot.
fn unsupported_reason(architecture: Option<&str>, experts: Option<u64>) -> Option<String> {
    let supported = SUPPORTED_ARCHITECTURES.join(", ");
    match architecture {
        None => Some(format!("no architecture declared (supported: {supported})")),
        Some(arch) if !SUPPORTED_ARCHITECTURES.contains(&arch) => Some(format!(
            "architecture `{arch}` is not supported by this build (supported: {supported})"
        )),
        Some(arch) => {
            let parsed = arch.parse::<Architecture>();
            let moe = parsed.as_ref().is_ok_and(|a| a.has_experts());
            let optional = parsed.is_ok_and(Architecture::experts_optional);
            match experts.filter(|&n| n > 0) {
                Some(n) if !moe && !optional => Some(format!(
                    "mixture-of-experts ({n} experts) is not supported by this build for `{arch}`"
                )),
                None if moe => Some(format!("`{arch}` declares no `{arch}.expert_count`")),
                _ => None,
            }
        }
    }
}

/// Parameters one token reads: the stacked expert tensors (`*_exps.*`)
/// count `used / experts` of theirs. `None` without a complete expert count.
fn active_parameters(h: &GgufHeader, experts: Option<u64>, used: Option<u64>) -> Option<u64> {
    let total = h.parameter_count();
    let (experts, used) = match (experts, used) {
        (Some(e), Some(u)) if e > 0 => (e, u.min(e)),
        (None | Some(0), _) => return Some(total),
        _ => return None,
    };
    let stacked = h
        .tensors
        .iter()
        .filter(|t| t.name.contains("_exps."))
        .fold(0u64, |n, t| n.saturating_add(t.elements()));
    let unused = u128::from(stacked) * u128::from(experts - used) / u128::from(experts);
    Some(total.saturating_sub(u64::try_from(unused).unwrap_or(u64::MAX)))
}

fn from_gguf(h: &GgufHeader) -> Report {
    let arch_u64 = |key: &str| h.arch_usize(key).map(|n| n as u64);
    let heads = arch_u64("attention.head_count");
    let hidden = arch_u64("embedding_length");
    let head_dim = arch_u64("attention.key_length").or(match (hidden, heads) {
        (Some(hidden), Some(heads)) if heads > 0 => Some(hidden / heads),
        _ => None,
    });
    let (expert_count, experts_used) = (arch_u64("expert_count"), arch_u64("expert_used_count"));
    let mut mix: BTreeMap<GgmlType, TypeShare> = BTreeMap::new();
    for t in &h.tensors {
        let share = mix.entry(t.ggml_type).or_insert_with(|| TypeShare {
            kind: t.ggml_type.to_string(),
            tensors: 0,
            parameters: 0,
            bytes: Some(0),
        });
        share.tensors += 1;
        share.parameters = share.parameters.saturating_add(t.elements());
        share.bytes = share.bytes.zip(t.bytes()).map(|(a, b)| a.saturating_add(b));
    }
    Report {
        format: "gguf",
        gguf_version: Some(h.version),
        architecture: h.architecture().map(str::to_string),
        name: h.str("general.name").map(str::to_string),
        parameters: h.parameter_count(),
        tensors: h.tensor_count,
        quant_mix: by_parameters(mix.into_values().collect()),
        file_type: h.usize("general.file_type").map(|id| FileType {
            id: id as u64,
            name: file_type_name(id),
        }),
        context_length: arch_u64("context_length"),
        layers: arch_u64("block_count"),
        hidden,
        heads,
        kv_heads: arch_u64("attention.head_count_kv")
            .or_else(|| widest_per_layer(h, "attention.head_count_kv"))
            .or(heads),
        head_dim,
        sliding_window: arch_u64("attention.sliding_window"),
        rope_base: h.arch_float("rope.freq_base"),
        expert_count,
        experts_used,
        active_parameters: active_parameters(h, expert_count, experts_used),
        tokenizer: h.str("tokenizer.ggml.model").map(str::to_string),
        tokenizer_pre: h.str("tokenizer.ggml.pre").map(str::to_string),
        tokens: h.array_len("tokenizer.ggml.tokens"),
        chat_template: h.str("tokenizer.chat_template").is_some(),
        weight_bytes: h.tensor_data_bytes(),
        kv_bytes_per_token: KvShape::from_header(h).ok().and_then(|s| kv_bytes(&s)),
        ..Report::default()
    }
}

/// The largest of `{arch}.{key}` given per layer (Gemma 4's KV heads).
fn widest_per_layer(h: &GgufHeader, key: &str) -> Option<u64> {
    let per_layer = h.ints(&format!("{}.{key}", h.architecture()?)).ok()??;
    per_layer
        .into_iter()
        .filter_map(|n| u64::try_from(n).ok())
        .max()
}

/// Types holding the most parameters first.
fn by_parameters(mut mix: Vec<TypeShare>) -> Vec<TypeShare> {
    mix.sort_by(|a, b| b.parameters.cmp(&a.parameters).then(a.kind.cmp(&b.kind)));
    mix
}

fn kv_bytes(shape: &KvShape) -> Option<KvBytes> {
    Some(KvBytes {
        f32: shape.bytes_per_token(KvDtype::F32).ok()?,
        f16: shape.bytes_per_token(KvDtype::F16).ok()?,
    })
}

/// llama.cpp's `llama_ftype` names (4 to 6 and 33 to 35 are retired formats).
fn file_type_name(id: usize) -> Option<&'static str> {
    const NAMES: [&str; 39] = [
        "ALL_F32",
        "MOSTLY_F16",
        "MOSTLY_Q4_0",
        "MOSTLY_Q4_1",
        "MOSTLY_Q4_1_SOME_F16",
        "",
        "",
        "MOSTLY_Q8_0",
        "MOSTLY_Q5_0",
        "MOSTLY_Q5_1",
        "MOSTLY_Q2_K",
        "MOSTLY_Q3_K_S",
        "MOSTLY_Q3_K_M",
        "MOSTLY_Q3_K_L",
        "MOSTLY_Q4_K_S",
        "MOSTLY_Q4_K_M",
        "MOSTLY_Q5_K_S",
        "MOSTLY_Q5_K_M",
        "MOSTLY_Q6_K",
        "MOSTLY_IQ2_XXS",
        "MOSTLY_IQ2_XS",
        "MOSTLY_Q2_K_S",
        "MOSTLY_IQ3_XS",
        "MOSTLY_IQ3_XXS",
        "MOSTLY_IQ1_S",
        "MOSTLY_IQ4_NL",
        "MOSTLY_IQ3_S",
        "MOSTLY_IQ3_M",
        "MOSTLY_IQ2_S",
        "MOSTLY_IQ2_M",
        "MOSTLY_IQ4_XS",
        "MOSTLY_IQ1_M",
        "MOSTLY_BF16",
        "",
        "",
        "",
        "MOSTLY_TQ1_0",
        "MOSTLY_TQ2_0",
        "MOSTLY_MXFP4_MOE",
    ];
    NAMES.get(id).copied().filter(|name| !name.is_empty())
}

/// The report as aligned `key: value` lines.
fn human(r: &Report) -> String {
    let mut lines: Vec<(&str, String)> = Vec::new();
    let opt = |v: Option<u64>| v.map_or_else(|| "not declared".to_string(), |n| n.to_string());
    let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "not declared".to_string());
    lines.push(("path", r.path.clone()));
    lines.push((
        "format",
        match r.gguf_version {
            Some(v) => format!("GGUF v{v}"),
            None => "safetensors".to_string(),
        },
    ));
    lines.push(("architecture", text(&r.architecture)));
    lines.push(("name", text(&r.name)));
    lines.push((
        "parameters",
        format!(
            "{} ({} in {} tensors)",
            count(r.parameters),
            r.parameters,
            r.tensors
        ),
    ));
    for (i, share) in r.quant_mix.iter().enumerate() {
        let bytes = share.bytes.map_or_else(|| "size unknown".to_string(), size);
        let value = format!(
            "{:<16} {:>5} tensor{} {:>8} params {:>12}",
            share.kind,
            share.tensors,
            if share.tensors == 1 { " " } else { "s" },
            count(share.parameters),
            bytes
        );
        lines.push((if i == 0 { "quant mix" } else { "" }, value));
    }
    if let Some(ft) = &r.file_type {
        let value = match ft.name {
            Some(name) => format!("{name} ({})", ft.id),
            None => format!("unknown file type {}", ft.id),
        };
        lines.push(("file type", value));
    }
    lines.push(("context length", opt(r.context_length)));
    lines.push(("layers", opt(r.layers)));
    lines.push(("hidden", opt(r.hidden)));
    lines.push(("heads", opt(r.heads)));
    lines.push(("KV heads", opt(r.kv_heads)));
    lines.push(("head dim", opt(r.head_dim)));
    if let Some(window) = r.sliding_window {
        lines.push(("sliding window", window.to_string()));
    }
    lines.push((
        "rope base",
        r.rope_base
            .map_or_else(|| "not declared".to_string(), |b| b.to_string()),
    ));
    if let Some(experts) = r.expert_count.filter(|&n| n > 0) {
        let used = r
            .experts_used
            .map_or_else(|| "not declared".to_string(), |n| n.to_string());
        lines.push(("experts", format!("{experts} ({used} per token)")));
        if let Some(active) = r.active_parameters {
            lines.push((
                "active params",
                format!("{} ({active}) per token", count(active)),
            ));
        }
    }
    let mut tokenizer = text(&r.tokenizer);
    if let Some(pre) = &r.tokenizer_pre {
        let _ = write!(tokenizer, " (pre: {pre})");
    }
    lines.push(("tokenizer", tokenizer));
    lines.push(("tokens", opt(r.tokens)));
    lines.push((
        "chat template",
        if r.chat_template { "yes" } else { "no" }.to_string(),
    ));
    lines.push((
        "weights",
        r.weight_bytes.map_or_else(
            || "unknown (a tensor type of unknown size)".to_string(),
            size,
        ),
    ));
    lines.push((
        "KV per token",
        r.kv_bytes_per_token.as_ref().map_or_else(
            || "unknown (attention shape not declared)".to_string(),
            |kv| format!("{} (f32), {} (f16)", size(kv.f32), size(kv.f16)),
        ),
    ));
    lines.push((
        "loadable",
        match &r.unsupported_reason {
            None => "yes".to_string(),
            Some(reason) => format!("no: {reason}"),
        },
    ));
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (key, value) in lines {
        let key = if key.is_empty() {
            String::new()
        } else {
            format!("{key}:")
        };
        let _ = writeln!(out, "{key:<width$} {value}");
    }
    out
}

/// A count in K/M/B (`134.5M`).
fn count(n: u64) -> String {
    let x = n as f64;
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}K", x / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}M", x / 1e6),
        _ => format!("{:.2}B", x / 1e9),
    }
}

/// Bytes in B/KiB/MiB/GiB.
fn size(n: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    let x = n as f64;
    match n {
        0..KIB => format!("{n} B"),
        KIB..MIB => format!("{:.1} KiB", x / KIB as f64),
        MIB..GIB => format!("{:.1} MiB", x / MIB as f64),
        _ => format!("{:.2} GiB", x / GIB as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_counts_pick_their_unit() {
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(46080), "45.0 KiB");
        assert_eq!(size(96_576_768), "92.1 MiB");
        assert_eq!(size(3 << 30), "3.00 GiB");
        assert_eq!(count(999), "999");
        assert_eq!(count(134_515_008), "134.5M");
        assert_eq!(count(7_241_732_096), "7.24B");
    }

    /// llama.cpp's `llama_ftype` numbers, gpt-oss's MXFP4 files included.
    #[test]
    fn file_types_have_llama_cpps_names() {
        assert_eq!(file_type_name(15), Some("MOSTLY_Q4_K_M"));
        assert_eq!(file_type_name(32), Some("MOSTLY_BF16"));
        assert_eq!(file_type_name(34), None, "retired");
        assert_eq!(file_type_name(38), Some("MOSTLY_MXFP4_MOE"));
        assert_eq!(file_type_name(39), None);
    }

    #[test]
    fn support_names_the_reason() {
        assert_eq!(unsupported_reason(Some("qwen3"), Some(0)), None);
        assert_eq!(unsupported_reason(Some("llama"), None), None);
        let moe = unsupported_reason(Some("qwen3"), Some(128)).unwrap_or_default();
        assert!(moe.contains("mixture-of-experts (128 experts)"), "{moe}");
        assert_eq!(unsupported_reason(Some("qwen3moe"), Some(128)), None);
        assert_eq!(unsupported_reason(Some("qwen2moe"), Some(60)), None);
        assert_eq!(unsupported_reason(Some("gpt-oss"), Some(32)), None);
        // Gemma 4 with experts (26B-A4B) and without (E2B, E4B, 31B).
        assert_eq!(unsupported_reason(Some("gemma4"), Some(128)), None);
        assert_eq!(unsupported_reason(Some("gemma4"), None), None);
        let none = unsupported_reason(Some("qwen3moe"), None).unwrap_or_default();
        assert!(none.contains("no `qwen3moe.expert_count`"), "{none}");
        let other = unsupported_reason(Some("mamba"), None).unwrap_or_default();
        assert!(other.contains("not supported by this build"), "{other}");
        assert!(unsupported_reason(None, None).is_some());
    }
}
