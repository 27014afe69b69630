//! [`WorkerConfig`]: everything one `zinfer worker` process needs, as one
//! value.
//!
//! It lives in this crate because both of its users can link it here
//! without the engine: the supervisor, which fills one in for every worker
//! it starts and reads its KV settings for the memory estimate, must not
//! link `zinfer-worker` or `zinfer-model`; the CLI, which builds it from
//! `zinfer worker`'s flags or from `serve`'s and `zinfer supervisor`'s,
//! already depends on this crate. Its field types come from
//! `zinfer-probe`, which both link too.
//!
//! A supervisor hands it to the worker it starts as JSON on the worker's
//! stdin ([`WorkerConfig::to_json`], [`WorkerConfig::read`]): nothing of it
//! shows in `ps`, no file is left behind, and the worker reads it whole
//! instead of parsing flags again.

use std::fmt::Display;
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zinfer_probe::{AttentionDtype, Device, KvDtype};

/// Everything one worker needs: where its router is, which model on which
/// device, its engine settings, and how it shuts down and hands over.
/// The fields follow `zinfer worker`'s flags one for one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// The router's worker endpoint.
    pub router: String,
    /// Worker id; `None`: HOSTNAME-PID-XXXX, made by the worker.
    pub id: Option<String>,
    /// The device it loads the model on.
    #[serde(with = "as_text")]
    pub device: Device,
    /// Address of its Prometheus /metrics endpoint; `None`: none.
    pub metrics: Option<SocketAddr>,
    /// Seconds to finish in-flight requests after SIGTERM.
    pub grace_secs: u64,
    /// Start as a migration target, taking a cache on a socket bound at
    /// `import_host`.
    pub import_cache: bool,
    /// Host or address the cache-import socket binds and advertises.
    pub import_host: String,
    /// The public key (Z85) of the worker being replaced, the only client
    /// the import socket admits under CURVE.
    pub import_from_key: Option<String>,
    /// Model file or directory; `None`: the default model, fetched when
    /// missing.
    pub model: Option<PathBuf>,
    /// CURVE key files for the connection to the router.
    pub curve: CurveFiles,
    /// How the engine runs.
    pub engine: EngineSettings,
}

/// CURVE key files, as `--curve-server-key` and `--curve-key` name them
/// (the keys themselves stay in their files).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurveFiles {
    /// The router's public key file; `None`: plain TCP.
    pub server_key: Option<PathBuf>,
    /// This worker's key pair file.
    pub key: Option<PathBuf>,
}

/// How a worker's engine runs: threads, KV pool, batching, speculation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// CPU threads for the forward pass; `None`: every core.
    pub threads: Option<usize>,
    /// KV pool size in tokens (the draft model's pool too).
    pub kv_tokens: usize,
    /// Element type of cached K/V.
    #[serde(with = "as_text")]
    pub kv_dtype: KvDtype,
    /// Number format of the CPU attention's products.
    #[serde(with = "as_text")]
    pub attention_dtype: AttentionDtype,
    /// Most sequences decoded together in one step.
    pub max_batch: usize,
    /// Most prompt tokens prefilled per step.
    pub prefill_chunk: usize,
    /// Tokens drafted per step for requests that do not ask; 0: off.
    pub speculative_draft: u32,
    /// Longest suffix the prompt-lookup drafter looks up.
    pub speculative_ngram: u32,
    /// Speculate only while at most this many sequences decode together.
    pub speculative_max_batch: usize,
    /// A smaller model that drafts instead of prompt lookup.
    pub draft_model: Option<PathBuf>,
}

/// Why a worker configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The stream could not be read.
    #[error("reading the worker configuration: {0}")]
    Read(#[from] std::io::Error),
    /// It was not a worker configuration.
    #[error("the worker configuration is not valid: {0}")]
    Parse(#[from] serde_json::Error),
    /// It was longer than any configuration is.
    #[error("the worker configuration is longer than {MAX_CONFIG_BYTES} bytes")]
    TooLong,
}

/// Far more than any configuration takes (about 1 KiB), so a stray
/// stream cannot make a worker buffer without end.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl WorkerConfig {
    /// The configuration as one line of JSON, for a worker's stdin.
    pub fn to_json(&self) -> Result<String, ConfigError> {
        Ok(serde_json::to_string(self)?)
    }

    /// Reads a configuration written by [`WorkerConfig::to_json`] from
    /// `input` to its end.
    pub fn read(input: impl Read) -> Result<Self, ConfigError> {
        let mut text = String::new();
        input.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLong);
        }
        Ok(serde_json::from_str(&text)?)
    }
}

/// The flag spelling of a value (`cuda:0`, `f16`, `bf16`) in JSON, so the
/// probe's types need no serde of their own.
mod as_text {
    use super::*;

    pub(super) fn serialize<T: Display, S: Serializer>(
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub(super) fn deserialize<'de, T, D>(deserializer: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A configuration with every field set, for tests here and in `process`.
    pub(crate) fn config() -> WorkerConfig {
        WorkerConfig {
            router: "tcp://127.0.0.1:5556".into(),
            id: Some("w1".into()),
            device: Device::CpuSet(1),
            metrics: Some(SocketAddr::from(([127, 0, 0, 1], 9101))),
            grace_secs: 10,
            import_cache: true,
            import_host: "127.0.0.1".into(),
            import_from_key: Some("KEY".into()),
            model: Some("/m/a.gguf".into()),
            curve: CurveFiles {
                server_key: Some("/k/router.pub".into()),
                key: Some("/k/worker.key".into()),
            },
            engine: EngineSettings {
                threads: Some(3),
                kv_tokens: 4096,
                kv_dtype: KvDtype::F16,
                attention_dtype: AttentionDtype::Bf16,
                max_batch: 8,
                prefill_chunk: 256,
                speculative_draft: 6,
                speculative_ngram: 4,
                speculative_max_batch: 2,
                draft_model: Some("/m/draft.gguf".into()),
            },
        }
    }

    #[test]
    fn a_configuration_reaches_a_worker_whole() {
        let sent = config();
        let json = sent.to_json().unwrap();
        assert!(!json.contains('\n'), "{json}");
        // Typed values travel in their flag spelling.
        assert!(json.contains(r#""device":"cpu:1""#), "{json}");
        assert!(json.contains(r#""kv_dtype":"f16""#), "{json}");
        assert!(json.contains(r#""attention_dtype":"bf16""#), "{json}");
        assert_eq!(WorkerConfig::read(json.as_bytes()).unwrap(), sent);
    }

    #[test]
    fn a_bad_configuration_says_what_is_wrong() {
        let json = config().to_json().unwrap();
        let err = WorkerConfig::read(json.replace("cpu:1", "tpu").as_bytes()).unwrap_err();
        assert!(err.to_string().contains("unknown device `tpu`"), "{err}");
        let err =
            WorkerConfig::read(json.replace("\"grace_secs\"", "\"grace\"").as_bytes()).unwrap_err();
        assert!(err.to_string().contains("unknown field `grace`"), "{err}");
        let err = WorkerConfig::read(&b""[..]).unwrap_err();
        assert!(matches!(err, ConfigError::Parse(_)), "{err}");
        let long = vec![b' '; MAX_CONFIG_BYTES as usize + 1];
        let err = WorkerConfig::read(&long[..]).unwrap_err();
        assert!(matches!(err, ConfigError::TooLong), "{err}");
    }
}
