//! Loading bad or unsupported checkpoints gives errors that name the
//! problem, never a panic.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::PathBuf;

use candle_core::quantized::{QTensor, gguf_file};
use zinfer_fetch::test_model_path;
use zinfer_model::device::DeviceError;
use zinfer_model::{LoadOptions, ModelError, load};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zinfer-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn load_err(path: &std::path::Path, options: &LoadOptions) -> ModelError {
    match load(path, options) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

/// The default model's metadata with `key` set to `value`, and no tensors.
fn metadata_only(name: &str, key: &str, value: gguf_file::Value) -> PathBuf {
    let mut f = std::fs::File::open(test_model_path().unwrap()).unwrap();
    let mut md = gguf_file::Content::read(&mut f).unwrap().metadata;
    md.insert(key.to_string(), value);
    let path = scratch(name);
    let refs: Vec<(&str, &gguf_file::Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let no_tensors: [(&str, &QTensor); 0] = [];
    gguf_file::write(
        &mut std::fs::File::create(&path).unwrap(),
        &refs,
        &no_tensors,
    )
    .unwrap();
    path
}

#[test]
fn bad_checkpoints_are_named_errors() {
    let options = LoadOptions::default();

    let missing = load_err(&scratch("missing.gguf"), &options);
    assert!(matches!(missing, ModelError::Io { .. }), "{missing}");

    let garbage = scratch("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a gguf file").unwrap();
    let err = load_err(&garbage, &options);
    assert!(matches!(err, ModelError::Gguf(_)), "{err}");
    assert!(err.to_string().contains("not a GGUF file"), "{err}");

    let gemma = metadata_only(
        "gemma.gguf",
        "general.architecture",
        gguf_file::Value::String("gemma".into()),
    );
    let err = load_err(&gemma, &options);
    assert!(
        matches!(err, ModelError::UnsupportedArchitecture(ref a) if a == "gemma"),
        "{err}"
    );
    assert!(err.to_string().contains("qwen3"), "lists what loads: {err}");

    let no_weights = metadata_only(
        "empty.gguf",
        "general.name",
        gguf_file::Value::String("empty".into()),
    );
    let err = load_err(&no_weights, &options);
    assert!(err.to_string().contains("token_embd.weight"), "{err}");

    let hf = scratch("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let hf_config = |model_type: &str| {
        let config = r#"{"model_type": "MT", "hidden_size": 8, "intermediate_size": 8,
        "num_attention_heads": 1, "num_hidden_layers": 1, "vocab_size": 8}"#;
        std::fs::write(hf.join("config.json"), config.replace("MT", model_type)).unwrap();
    };
    hf_config("gpt_neox");
    let err = load_err(&hf, &options);
    assert!(
        matches!(err, ModelError::UnsupportedArchitecture(ref a) if a == "gpt_neox"),
        "{err}"
    );
    // Known, but only from GGUF for now.
    hf_config("qwen2");
    let err = load_err(&hf, &options);
    assert!(err.to_string().contains("GGUF"), "{err}");

    let tpu = LoadOptions {
        device: "tpu:0".to_string(),
        ..LoadOptions::default()
    };
    let err = load_err(&test_model_path().unwrap(), &tpu);
    assert!(
        matches!(err, ModelError::Device(DeviceError::Unknown(_))),
        "{err}"
    );
    // A GPU that is not there: not built (CPU build) or no such ordinal (CUDA build).
    let cuda = LoadOptions {
        device: "cuda:99".to_string(),
        ..LoadOptions::default()
    };
    let err = load_err(&test_model_path().unwrap(), &cuda);
    assert!(
        matches!(
            err,
            ModelError::Device(DeviceError::NotBuilt { .. } | DeviceError::Unavailable { .. })
        ),
        "{err}"
    );

    let _ = std::fs::remove_dir_all(garbage.parent().unwrap());
}
