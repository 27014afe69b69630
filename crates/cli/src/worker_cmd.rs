//! `zinfer worker`: one model on one device, connected to a router.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, FromArgMatches};
use zinfer_curve::ClientCurve;
use zinfer_model::{self as model, LoadOptions};
use zinfer_probe::Device;
use zinfer_supervisor::{CurveFiles, EngineSettings, WorkerConfig};
use zinfer_text::ModelTokenizer;
use zinfer_worker::engine::{Engine, EngineConfig};
use zinfer_worker::metrics::WorkerMetrics;
use zinfer_worker::scheduler::SchedulerConfig;
use zinfer_worker::server::{self, ServerConfig};

/// Engine flags, shared by `zinfer worker`, `zinfer supervisor` and `zinfer
/// serve` (which take their models from flags of their own).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EngineArgs {
    /// CPU threads for the forward pass. Default: all cores (split evenly
    /// between workers under `serve`).
    #[arg(long, env = "ZINFER_THREADS")]
    pub(crate) threads: Option<usize>,
    /// KV pool size in tokens, shared by running sequences and the prefix cache.
    #[arg(long, default_value_t = model::DEFAULT_KV_CAPACITY, env = "ZINFER_KV_TOKENS")]
    pub(crate) kv_tokens: usize,
    /// Most sequences decoded together in one step.
    #[arg(long, default_value_t = 32, env = "ZINFER_MAX_BATCH")]
    pub(crate) max_batch: usize,
    /// Most prompt tokens prefilled per step, so running decodes keep going
    /// while a long prompt is processed.
    #[arg(long, default_value_t = 512, env = "ZINFER_PREFILL_CHUNK")]
    pub(crate) prefill_chunk: usize,
    /// Element type of cached K/V on the CPU: `f32`, or `f16` for half the
    /// memory per cached token, with K/V rounded to half precision.
    #[arg(long, default_value_t = model::KvDtype::F32, env = "ZINFER_KV_DTYPE")]
    pub(crate) kv_dtype: model::KvDtype,
    /// Number format of the CPU attention's products: `auto` (bf16 where
    /// the CPU has AVX512_BF16, else f32), `f32`, or `bf16` (twice the
    /// products per instruction; queries, keys, values and softmax weights
    /// rounded to 8 significant bits, sums in f32).
    #[arg(long, default_value_t = model::AttentionDtype::Auto, env = "ZINFER_ATTENTION_DTYPE")]
    pub(crate) attention_dtype: model::AttentionDtype,
    /// Prompt-lookup speculative decoding for requests that do not set
    /// `speculative`: each decode step drafts up to this many tokens by
    /// finding the sequence's last tokens earlier in its prompt or output,
    /// and the model checks them in the same pass. Output is unchanged;
    /// answers that quote their input come faster. 0 (default) is off.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=i64::from(zinfer_protocol::MAX_SPECULATIVE_DRAFT)), env = "ZINFER_SPECULATIVE_DRAFT")]
    pub(crate) speculative_draft: u32,
    /// Longest suffix the drafter looks up (2 to 8).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=i64::from(zinfer_protocol::MAX_SPECULATIVE_NGRAM)), env = "ZINFER_SPECULATIVE_NGRAM")]
    pub(crate) speculative_ngram: u32,
    /// Speculate only while at most this many sequences decode together:
    /// bigger batches already read each weight for many rows, and checking
    /// drafts there costs more than it saves. 0 turns speculation off for
    /// every request.
    #[arg(long, default_value_t = 4, env = "ZINFER_SPECULATIVE_MAX_BATCH")]
    pub(crate) speculative_max_batch: usize,
    /// A smaller model with the same tokenizer (a `.gguf` file or a
    /// safetensors directory) that drafts the tokens speculative decoding
    /// checks, instead of prompt lookup; it keeps its own KV pool of
    /// `--kv-tokens`. Needs `--speculative-draft` (or requests that ask).
    #[arg(long, env = "ZINFER_DRAFT_MODEL")]
    pub(crate) draft_model: Option<PathBuf>,
}

impl EngineArgs {
    /// The engine settings these flags give.
    pub(crate) fn settings(&self) -> EngineSettings {
        EngineSettings {
            threads: self.threads,
            kv_tokens: self.kv_tokens,
            kv_dtype: self.kv_dtype,
            attention_dtype: self.attention_dtype,
            max_batch: self.max_batch,
            prefill_chunk: self.prefill_chunk,
            speculative_draft: self.speculative_draft,
            speculative_ngram: self.speculative_ngram,
            speculative_max_batch: self.speculative_max_batch,
            draft_model: self.draft_model.clone(),
        }
    }
}

/// Flags of `zinfer worker`.
#[derive(Debug, clap::Args)]
pub(crate) struct WorkerArgs {
    /// The router's worker endpoint.
    #[arg(
        long,
        default_value = "tcp://127.0.0.1:5556",
        env = "ZINFER_WORKER_ROUTER"
    )]
    router: String,
    /// Worker id, unique among the router's live workers: the router
    /// refuses a second live worker with the same id. Default:
    /// HOSTNAME-PID-XXXX (XXXX random hex), unique even where every
    /// container's worker is PID 1.
    #[arg(long, env = "ZINFER_WORKER_ID")]
    id: Option<String>,
    /// Device: `cpu`, `cpu:N` (the N-th group of --threads cores, pinned),
    /// `cuda:N` (binaries built with `--features cuda`), or `auto` for the
    /// best one present (the first GPU, else the CPU).
    #[arg(long, default_value = "auto", env = "ZINFER_DEVICE")]
    device: Device,
    #[command(flatten)]
    host: WorkerHostArgs,
    /// The model: a local `.gguf` file or a safetensors directory
    /// (config.json, tokenizer.json, *.safetensors). One per worker (`serve`
    /// and `supervisor` take several). Default: SmolLM2-135M-Instruct Q4_1,
    /// fetched into $ZINFER_HOME/models on first use.
    #[arg(long, value_name = "PATH", env = "ZINFER_MODEL")]
    model: Option<PathBuf>,
    #[command(flatten)]
    curve: crate::zmq_util::CurveArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Flags of `zinfer worker` that a supervisor's workers take from the
/// environment they share with it ([`WorkerHostArgs::from_env`]) where
/// the supervisor sets nothing: it sets the metrics port and the cache
/// import per worker, and `serve` the grace from its own `--grace`.
#[derive(Debug, clap::Args)]
pub(crate) struct WorkerHostArgs {
    /// Address of this worker's Prometheus /metrics endpoint.
    #[arg(long, env = "ZINFER_METRICS")]
    metrics: Option<SocketAddr>,
    /// Seconds to finish in-flight requests after SIGTERM or Ctrl-C.
    #[arg(long, default_value_t = 10, env = "ZINFER_GRACE")]
    grace: u64,
    /// Start as a migration target: take the prefix cache of the worker it
    /// replaces on a socket bound at --import-host (supervisors set this).
    #[arg(long, env = "ZINFER_IMPORT_CACHE")]
    import_cache: bool,
    /// Host or address the cache-import socket binds and advertises; other
    /// workers must reach it.
    #[arg(long, default_value = "127.0.0.1", env = "ZINFER_IMPORT_HOST")]
    import_host: String,
    /// With --import-cache and CURVE: the public key (Z85) of the worker
    /// being replaced, the only client the import socket admits
    /// (supervisors pass what the router names).
    #[arg(long, value_name = "KEY", env = "ZINFER_IMPORT_FROM_KEY")]
    import_from_key: Option<String>,
}

impl WorkerHostArgs {
    /// These flags as the environment alone sets them (a worker's
    /// defaults where it sets none).
    pub(crate) fn from_env() -> anyhow::Result<Self> {
        let command = Self::augment_args(clap::Command::new("worker"));
        let matches = command
            .try_get_matches_from(["worker"])
            .context("reading the workers' settings from the environment")?;
        Ok(Self::from_arg_matches(&matches)?)
    }
}

/// The one place a worker's configuration is put together, for `zinfer
/// worker` from its flags and for a supervisor's workers from `serve`'s or
/// `zinfer supervisor`'s.
pub(crate) fn worker_config(
    router: String,
    id: Option<String>,
    device: Device,
    model: Option<PathBuf>,
    host: &WorkerHostArgs,
    curve: CurveFiles,
    engine: EngineSettings,
) -> WorkerConfig {
    WorkerConfig {
        router,
        id,
        device,
        metrics: host.metrics,
        grace_secs: host.grace,
        import_cache: host.import_cache,
        import_host: host.import_host.clone(),
        import_from_key: host.import_from_key.clone(),
        model,
        curve,
        engine,
    }
}

impl WorkerArgs {
    /// The configuration these flags give.
    fn config(&self) -> WorkerConfig {
        worker_config(
            self.router.clone(),
            self.id.clone(),
            self.device,
            self.model.clone(),
            &self.host,
            CurveFiles {
                server_key: self.curve.curve_server_key.clone(),
                key: self.curve.curve_key.clone(),
            },
            self.engine.settings(),
        )
    }
}

/// The model to serve: the given path, or the default model, fetched when missing.
pub(crate) fn resolve_model(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    match model {
        Some(path) => {
            if !path.exists() {
                anyhow::bail!(
                    "model {} does not exist; pass a .gguf file or a safetensors directory, or leave out --model for the default",
                    path.display()
                );
            }
            Ok(path.to_path_buf())
        }
        None => zinfer_fetch::default_model_path()
            .context("fetching the default model (or pass --model PATH)"),
    }
}

/// `zinfer worker`: serves with the configuration its flags give.
///
/// Must run before this process starts any thread (see [`run_config`]).
pub(crate) fn run(args: &WorkerArgs) -> anyhow::Result<()> {
    run_config(&args.config())
}

/// A worker a supervisor started: serves with the configuration the
/// supervisor wrote to its stdin.
///
/// Must run before this process starts any thread (see [`run_config`]).
pub(crate) fn run_spawned() -> anyhow::Result<()> {
    use std::io::IsTerminal;
    anyhow::ensure!(
        !std::io::stdin().is_terminal(),
        "`zinfer spawned-worker` reads its configuration from a supervisor on stdin; \
         to start a worker by hand, run `zinfer worker`"
    );
    let config = WorkerConfig::read(std::io::stdin().lock())?;
    run_config(&config)
}

/// Loads the model, connects to the router and serves until stopped.
///
/// Must run before this process starts any thread: it sets the thread-count
/// environment variables candle reads when its pool starts.
fn run_config(config: &WorkerConfig) -> anyhow::Result<()> {
    zinfer_supervisor::exit_with_parent()?;
    // Key files are checked before the (slow) model load.
    let curve = ClientCurve::from_flags(
        config.curve.server_key.as_deref(),
        config.curve.key.as_deref(),
    )?;
    let settings = &config.engine;
    // The flags' ranges, checked again for a configuration read from JSON.
    let speculative = zinfer_protocol::Speculative {
        ngram: settings.speculative_ngram,
        max_draft: settings.speculative_draft,
    };
    speculative
        .validate()
        .context("the worker's speculative settings")?;
    let threads = settings
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    set_thread_count(threads)?;
    let device = model::check_device(config.device)?;
    device.pin(threads)?;
    let device = device.to_string();
    let model_path = resolve_model(config.model.as_deref())?;
    let id = config.id.clone().unwrap_or_else(default_worker_id);
    eprintln!(
        "zinfer worker {id}: loading {} on {device} with {threads} thread(s)",
        model_path.display()
    );
    let tokenizer = ModelTokenizer::open(&model_path)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let load_options = LoadOptions {
        kv_capacity: settings.kv_tokens,
        threads: Some(threads),
        device: device.clone(),
        kv_dtype: settings.kv_dtype,
        attention: settings.attention_dtype,
    };
    let mut loaded = model::load(&model_path, &load_options)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let classifier = loaded.classifier.take().map(Arc::new);
    let engine_config = EngineConfig {
        scheduler: SchedulerConfig {
            max_batch: settings.max_batch,
            step_token_budget: settings.prefill_chunk,
            // Beside decodes, prefill gets half the chunk (256 by default).
            decode_prefill_budget: settings.prefill_chunk / 2,
            speculate_max_decodes: settings.speculative_max_batch,
            ..SchedulerConfig::default()
        },
        speculative,
        classifier,
        ..EngineConfig::default()
    };
    let engine = match &settings.draft_model {
        None => Engine::start(loaded, tokenizer, engine_config),
        Some(path) => {
            eprintln!(
                "zinfer worker {id}: loading the draft model {}",
                path.display()
            );
            let draft_tokenizer = ModelTokenizer::open(path)
                .with_context(|| format!("loading the draft model {}", path.display()))?;
            let draft = model::load(path, &load_options)
                .with_context(|| format!("loading the draft model {}", path.display()))?;
            Engine::start_with_draft(loaded, tokenizer, draft, &draft_tokenizer, engine_config)?
        }
    };

    let metrics = WorkerMetrics::new()?;
    metrics.kv_capacity.set(engine.kv_capacity() as i64);
    metrics.set_info(engine.model_name(), &device);
    // Answers scrapes and probes until `run` returns.
    let _metrics_server = match config.metrics {
        Some(addr) => {
            let exported = metrics.clone();
            Some(zinfer_worker::metrics::serve(
                addr,
                Arc::new(move || exported.render()),
            )?)
        }
        None => None,
    };

    let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .context("installing the Ctrl-C handler")?;

    let server_config = ServerConfig {
        device,
        models: vec![engine.model_name().to_string()],
        kv_capacity: engine.kv_capacity() as u64,
        max_batch: engine.max_batch() as u32,
        context_length: u32::try_from(engine.context_length()).ok(),
        vocab_size: u32::try_from(engine.vocab_size()).ok(),
        grace: Duration::from_secs(config.grace_secs),
        import_host: config.import_cache.then(|| config.import_host.clone()),
        import_from: config
            .import_from_key
            .as_deref()
            .map(zinfer_curve::PublicKey::from_z85)
            .transpose()
            .context("--import-from-key")?,
        curve,
        ..ServerConfig::new(config.router.clone(), id.clone())
    };
    eprintln!(
        "zinfer worker {id}: serving {} ({} KV tokens), connecting to {}{}",
        engine.model_name(),
        engine.kv_capacity(),
        config.router,
        match &server_config.curve {
            // The key to put on the router's --worker-keys list.
            Some(curve) => format!(" with CURVE as key {}", curve.own.public()),
            None => String::new(),
        }
    );
    server::run(server_config, engine, metrics, stop_rx)?;
    eprintln!("zinfer worker {id}: stopped");
    Ok(())
}

/// `HOSTNAME-PID-XXXX`: the host and process for people reading
/// `zinfer ctl workers`, and 16 random bits because in containers every
/// host's worker can be PID 1 on a host named alike.
fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "worker".into());
    // The protocol allows 256 bytes; keep the host part well under it.
    let host: String = host.chars().take(64).collect();
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// candle sizes its thread pool from these variables when it first starts
/// it. Changing the environment while another thread may read it is
/// undefined behaviour, so this refuses once a second thread exists (on
/// Linux, where the process's threads can be counted).
#[allow(unsafe_code)]
fn set_thread_count(threads: usize) -> anyhow::Result<()> {
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        let running = tasks.count();
        anyhow::ensure!(
            running == 1,
            "internal error: the worker's thread count must be set before any thread \
             starts, and {running} threads are running"
        );
    }
    for name in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
        // SAFETY: this process has one thread (checked above on Linux; on
        // other systems `main` calls this before it starts any), so nothing
        // reads the environment concurrently.
        unsafe { std::env::set_var(name, threads.to_string()) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use std::path::Path;

    use super::{EngineArgs, WorkerHostArgs, default_worker_id};

    #[derive(Parser)]
    struct Engine {
        #[command(flatten)]
        engine: EngineArgs,
    }

    /// A worker by hand and a supervisor's worker get their engine
    /// settings from the same flags: every flag (speculation and the draft
    /// model included) comes through as given, and whole through JSON.
    #[test]
    fn engine_flags_reach_a_worker_unchanged() {
        let given = Engine::try_parse_from([
            "worker",
            "--threads",
            "3",
            "--kv-tokens",
            "4096",
            "--max-batch",
            "8",
            "--prefill-chunk",
            "256",
            "--kv-dtype",
            "f16",
            "--attention-dtype",
            "bf16",
            "--speculative-draft",
            "6",
            "--speculative-ngram",
            "4",
            "--speculative-max-batch",
            "2",
            "--draft-model",
            "/models/draft.gguf",
        ])
        .unwrap()
        .engine;
        let settings = given.settings();
        assert_eq!(
            format!("{settings:?}"),
            "EngineSettings { threads: Some(3), kv_tokens: 4096, kv_dtype: F16, \
             attention_dtype: Bf16, max_batch: 8, prefill_chunk: 256, speculative_draft: 6, \
             speculative_ngram: 4, speculative_max_batch: 2, draft_model: \
             Some(\"/models/draft.gguf\") }"
        );
    }

    #[test]
    fn a_hand_started_worker_gets_its_flags_as_its_configuration() {
        use clap::Parser;
        let cli = crate::Cli::try_parse_from([
            "zinfer",
            "worker",
            "--router",
            "tcp://10.0.0.1:5556",
            "--id",
            "w7",
            "--device",
            "cpu:1",
            "--metrics",
            "127.0.0.1:9200",
            "--grace",
            "3",
            "--import-cache",
            "--import-host",
            "10.0.0.2",
            "--import-from-key",
            "KEY",
            "--model",
            "/m/a.gguf",
            "--curve-server-key",
            "/k/router.pub",
            "--curve-key",
            "/k/w.key",
            "--kv-tokens",
            "64",
        ])
        .unwrap();
        let crate::Command::Worker(args) = cli.command else {
            panic!("not worker");
        };
        let config = args.config();
        assert_eq!(config.router, "tcp://10.0.0.1:5556");
        assert_eq!(config.id.as_deref(), Some("w7"));
        assert_eq!(config.device, zinfer_probe::Device::CpuSet(1));
        assert_eq!(config.metrics, "127.0.0.1:9200".parse().ok());
        assert_eq!(config.grace_secs, 3);
        assert!(config.import_cache);
        assert_eq!(config.import_host, "10.0.0.2");
        assert_eq!(config.import_from_key.as_deref(), Some("KEY"));
        assert_eq!(config.model.as_deref(), Some(Path::new("/m/a.gguf")));
        assert_eq!(
            config.curve.server_key.as_deref(),
            Some(Path::new("/k/router.pub"))
        );
        assert_eq!(config.curve.key.as_deref(), Some(Path::new("/k/w.key")));
        assert_eq!(config.engine.kv_tokens, 64);
        assert_eq!(config.engine.threads, None);
    }

    #[test]
    fn host_flags_default_without_an_environment() {
        // The test environment sets none of these variables.
        let host = WorkerHostArgs::from_env().unwrap();
        assert_eq!(host.metrics, None);
        assert_eq!(host.grace, 10);
        assert!(!host.import_cache);
        assert_eq!(host.import_host, "127.0.0.1");
        assert_eq!(host.import_from_key, None);
    }

    #[test]
    fn a_worker_takes_one_model() {
        use clap::Parser;
        let cli = crate::Cli::try_parse_from(["zinfer", "worker", "--model", "/m/a.gguf"]).unwrap();
        let crate::Command::Worker(args) = cli.command else {
            panic!("not worker");
        };
        assert_eq!(
            args.model.as_deref(),
            Some(std::path::Path::new("/m/a.gguf"))
        );
        let err = crate::Cli::try_parse_from([
            "zinfer",
            "worker",
            "--model",
            "/m/a.gguf",
            "--model",
            "/m/b.gguf",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot be used multiple times"), "{err}");
    }

    #[test]
    fn default_worker_ids_name_host_and_pid_and_differ() {
        let id = default_worker_id();
        let pid = format!("-{}-", std::process::id());
        assert!(id.contains(&pid), "{id}");
        let suffix = id.rsplit('-').next().unwrap_or_default();
        assert_eq!(suffix.len(), 4, "{id}");
        assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        // 16 random bits: 20 ids from one process are not all alike.
        let ids: std::collections::HashSet<String> = (0..20).map(|_| default_worker_id()).collect();
        assert!(ids.len() > 1);
    }
}
