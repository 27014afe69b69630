//! The supervisor: starts and stops worker processes on one host for the
//! router's control plane.
//!
//! It connects a DEALER to the router's control socket, says every second
//! what it can start (`supervisor_status`), and acts on `spawn` and `stop`.
//! The router decides (how many workers, where, when to drain); the
//! supervisor only owns processes and this host's memory budget. It runs
//! inside `zinfer serve` and as `zinfer supervisor` on worker-only hosts.
//! Each worker it starts is `zinfer spawned-worker`, which reads its whole
//! [`WorkerConfig`] as JSON from stdin.

mod budget;
mod config;
mod process;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use zinfer_probe::{Device, DeviceError};
use zinfer_protocol::{KeepAlive, Limits, ModelOffer, RouterToSupervisor, SupervisorToRouter};

pub use budget::{BadSize, MemoryBudget, OverBudget, gib, parse_bytes, worker_bytes};
pub use config::{ConfigError, CurveFiles, EngineSettings, WorkerConfig};
use process::WorkerProcess;

/// A model this supervisor can start workers for, with its own settings
/// where they differ from the supervisor's. (The router hears of it as a
/// `zinfer_protocol::ModelOffer`; the model crate's `ModelSpec` is a
/// checkpoint's shape, another thing.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedModel {
    /// The name workers report (the file stem).
    pub name: String,
    /// Model file or directory.
    pub path: PathBuf,
    /// Where its workers go when the router names no device (already
    /// checked and resolved, e.g. `cuda:0`); `None`: the least used of
    /// [`SupervisorConfig::devices`].
    pub device: Option<String>,
    /// CPU threads of each of its workers instead of the supervisor's
    /// `--threads`.
    pub threads: Option<usize>,
    /// KV pool tokens of each of its workers instead of the
    /// [`SupervisorConfig::worker`]'s.
    pub kv_tokens: Option<usize>,
    /// How long the router keeps it loaded after a request when it loaded
    /// it on demand; `None`: the router's default.
    pub keep_alive: Option<KeepAlive>,
}

impl OfferedModel {
    /// A model named after its file, as workers name it, with the
    /// supervisor's settings.
    pub fn from_path(path: &Path) -> Self {
        OfferedModel {
            name: zinfer_probe::model_name(path),
            path: path.to_path_buf(),
            device: None,
            threads: None,
            kv_tokens: None,
            keep_alive: None,
        }
    }

    /// KV pool tokens of each of its workers.
    fn kv_tokens(&self, worker: &WorkerConfig) -> usize {
        self.kv_tokens.unwrap_or(worker.engine.kv_tokens)
    }
}

/// Settings of a supervisor.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Supervisor id, unique among the router's supervisors.
    pub id: String,
    /// The router's control endpoint, e.g. `tcp://10.0.0.1:5557`.
    pub control: String,
    /// Models it offers.
    pub models: Vec<OfferedModel>,
    /// Devices it starts workers on, least used first.
    pub devices: Vec<String>,
    /// Memory its workers may hold together.
    pub budget: MemoryBudget,
    /// Checks a device before a worker is started on it and resolves
    /// `auto`. This crate links no GPU library, so whether a GPU is present
    /// is asked through this (the CLI passes `zinfer_model::check_device`).
    pub check_device: fn(Device) -> Result<Device, DeviceError>,
    /// The `zinfer` binary.
    pub exe: PathBuf,
    /// What every worker it starts begins from: the router's worker
    /// endpoint, the engine settings (whose KV tokens and dtype the memory
    /// estimate reads), grace, CURVE files. Each spawn sets the model,
    /// device, id, metrics address and cache import, and a model's own
    /// `threads` and `kv_tokens` replace the engine's.
    pub worker: WorkerConfig,
    /// Environment for every worker it starts.
    pub worker_env: Vec<(String, String)>,
    /// First port of the workers' /metrics endpoints (one per worker
    /// slot); `None`: workers serve no metrics.
    pub metrics_base: Option<u16>,
    /// How long a stopped worker may take before it is killed.
    pub stop_grace: Duration,
    /// CURVE to the router's control socket; `None`: plain. (Workers get
    /// their own key files through `worker`.)
    pub curve: Option<zinfer_curve::ClientCurve>,
}

/// Why the supervisor could not run.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// CURVE could not be set up on its socket.
    #[error("CURVE to the router's control socket: {0}")]
    Curve(#[from] zinfer_curve::CurveError),
    /// Its socket could not be set up.
    #[error("supervisor socket error while {context}: {source}")]
    Socket {
        /// What was being done.
        context: &'static str,
        /// What libzmq said.
        source: zmq::Error,
    },
}

/// Why a worker started by a supervisor cannot tie its life to it.
#[derive(Debug, thiserror::Error)]
pub enum ParentError {
    /// The kernel refused the parent-death signal.
    #[error("cannot ask to stop with the supervisor: {0}")]
    DeathSignal(nix::Error),
    /// The supervisor died before the request took effect.
    #[error("the supervisor (pid {0}) is gone")]
    Gone(String),
}

/// Why a worker was not started; the router passes the text on to
/// everyone waiting on the spawn.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The router asked for an id one of ours already has.
    #[error("a worker {0:?} already runs here")]
    AlreadyRuns(String),
    /// The model is not one this supervisor offers.
    #[error("this supervisor does not offer model {model:?} (it offers {offered:?})")]
    NotOffered {
        /// The model asked for.
        model: String,
        /// The models offered.
        offered: Vec<String>,
    },
    /// The model's file is gone.
    #[error("model file {} does not exist", .0.display())]
    MissingFile(PathBuf),
    /// The device is unknown or unusable in this build.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The worker does not fit the memory budget.
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    /// The worker's configuration could not be written.
    #[error("cannot write the worker's configuration: {0}")]
    Config(#[from] ConfigError),
    /// The process could not be started.
    #[error("cannot start {}: {source}", .exe.display())]
    Start {
        /// The `zinfer` binary.
        exe: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// The `zinfer` subcommand a supervisor starts each worker with: a worker
/// that reads its [`WorkerConfig`] as JSON from stdin (hidden from
/// `zinfer --help`; `zinfer worker` keeps its flags for people).
pub const SPAWNED_WORKER: &str = "spawned-worker";

/// Set on every worker a supervisor starts, to the supervisor's process
/// id: the worker exits when that process dies (see [`exit_with_parent`]),
/// so a killed supervisor leaves no orphans behind.
pub const EXIT_WITH_PARENT: &str = "ZINFER_EXIT_WITH_PARENT";

/// In a worker started by a supervisor: asks the kernel for SIGTERM when
/// the supervisor dies, and exits at once if it already has. Call it
/// first thing in the worker; a no-op elsewhere.
pub fn exit_with_parent() -> Result<(), ParentError> {
    let Ok(parent) = std::env::var(EXIT_WITH_PARENT) else {
        return Ok(());
    };
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
        .map_err(ParentError::DeathSignal)?;
    // The supervisor may have died before the request took effect.
    if nix::unistd::getppid().as_raw().to_string() != parent {
        return Err(ParentError::Gone(parent));
    }
    Ok(())
}

/// How often the supervisor reports to the router and checks its workers.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until `stop` fires (or its sender is dropped), then stops every
/// worker it started: SIGTERM, and SIGKILL after `stop_grace`.
pub fn run(config: SupervisorConfig, stop: Receiver<()>) -> Result<(), SupervisorError> {
    let context = zmq::Context::new();
    let socket = |context: &'static str| move |source| SupervisorError::Socket { context, source };
    let dealer = context
        .socket(zmq::DEALER)
        .map_err(socket("creating the DEALER"))?;
    dealer
        .set_identity(config.id.as_bytes())
        .map_err(socket("setting the identity"))?;
    dealer
        .set_linger(500)
        .map_err(socket("setting ZMQ_LINGER"))?;
    zinfer_curve::apply_client(&dealer, config.curve.as_ref())?;
    dealer
        .connect(&config.control)
        .map_err(socket("connecting to the router's control socket"))?;
    let mut supervisor = Supervisor::new(config);
    tracing::info!(id = %supervisor.config.id, control = %supervisor.config.control, "supervisor started");
    let mut last_status = Instant::now() - STATUS_INTERVAL;
    loop {
        match stop.try_recv() {
            Ok(()) | Err(crossbeam_channel::TryRecvError::Disconnected) => break,
            Err(crossbeam_channel::TryRecvError::Empty) => {}
        }
        match dealer.poll(zmq::POLLIN, 100) {
            Ok(_) | Err(zmq::Error::EINTR) => {}
            Err(source) => {
                return Err(SupervisorError::Socket {
                    context: "polling",
                    source,
                });
            }
        }
        while let Ok(frame) = dealer.recv_bytes(zmq::DONTWAIT) {
            match zinfer_protocol::decode::<RouterToSupervisor>(&frame, &Limits::default()) {
                Ok(message) => supervisor.handle(message),
                Err(error) => tracing::warn!(%error, "undecodable frame from the router"),
            }
        }
        supervisor.watch(Instant::now());
        if last_status.elapsed() >= STATUS_INTERVAL {
            last_status = Instant::now();
            let status = supervisor.status();
            supervisor.outbox.push(status);
        }
        for message in supervisor.outbox.drain(..) {
            match zinfer_protocol::encode(&message) {
                Ok(frame) => {
                    if let Err(error) = dealer.send(frame, zmq::DONTWAIT) {
                        tracing::debug!(%error, "router unreachable; message dropped");
                    }
                }
                Err(error) => tracing::error!(%error, "cannot encode a supervisor message"),
            }
        }
    }
    supervisor.stop_all();
    Ok(())
}

/// The supervisor's state: its workers and what it has to tell the router.
struct Supervisor {
    config: SupervisorConfig,
    workers: HashMap<String, WorkerProcess>,
    /// Highest resident memory seen per model, for estimates.
    measured: HashMap<String, u64>,
    /// File and KV-pool bytes per model file and KV pool size.
    unmeasured: HashMap<(PathBuf, usize), (u64, u64)>,
    outbox: Vec<SupervisorToRouter>,
    host: String,
}

impl Supervisor {
    fn new(config: SupervisorConfig) -> Self {
        // Read once: the GGUF header holds the whole vocabulary, too much
        // to parse again for every status.
        let unmeasured = config
            .models
            .iter()
            .map(|spec| {
                let kv_tokens = spec.kv_tokens(&config.worker);
                (
                    (spec.path.clone(), kv_tokens),
                    unmeasured_bytes(&spec.path, kv_tokens, config.worker.engine.kv_dtype),
                )
            })
            .collect();
        Supervisor {
            config,
            workers: HashMap::new(),
            measured: HashMap::new(),
            unmeasured,
            outbox: Vec::new(),
            host: host_name(),
        }
    }

    /// Expected bytes of one more worker of `spec`.
    fn estimate(&self, spec: &OfferedModel) -> u64 {
        let kv_tokens = spec.kv_tokens(&self.config.worker);
        let kv_dtype = self.config.worker.engine.kv_dtype;
        let (file, kv) = self
            .unmeasured
            .get(&(spec.path.clone(), kv_tokens))
            .copied()
            .unwrap_or_else(|| unmeasured_bytes(&spec.path, kv_tokens, kv_dtype));
        worker_bytes(file, kv, self.measured.get(&spec.name).copied())
    }

    /// (resident, reserved) of every running worker.
    fn holdings(&mut self) -> Vec<(u64, u64)> {
        self.workers
            .values_mut()
            .map(|w| (w.resident(), w.reserved))
            .collect()
    }

    fn status(&mut self) -> SupervisorToRouter {
        let holdings = self.holdings();
        let models = self
            .config
            .models
            .iter()
            .map(|spec| ModelOffer {
                name: spec.name.clone(),
                path: spec.path.display().to_string(),
                worker_bytes: self.estimate(spec),
                keep_alive: spec.keep_alive,
            })
            .collect();
        SupervisorToRouter::SupervisorStatus {
            supervisor_id: self.config.id.clone(),
            host: self.host.clone(),
            models,
            devices: self.config.devices.clone(),
            memory_budget_bytes: self.config.budget.total,
            memory_used_bytes: self.config.budget.held(&holdings),
            workers: self.workers.keys().cloned().collect(),
        }
    }

    fn handle(&mut self, message: RouterToSupervisor) {
        match message {
            RouterToSupervisor::Spawn {
                worker_id,
                model,
                model_path,
                device,
                import_cache,
                exporter_key,
            } => {
                let import = import_cache.then_some(exporter_key.as_deref());
                if let Err(error) = self.spawn(&worker_id, &model, model_path, device, import) {
                    let reason = error.to_string();
                    tracing::warn!(worker = %worker_id, %reason, "spawn refused");
                    self.outbox
                        .push(SupervisorToRouter::SpawnFailed { worker_id, reason });
                }
            }
            RouterToSupervisor::Stop {
                worker_id,
                grace_ms,
            } => {
                if let Some(worker) = self.workers.get_mut(&worker_id) {
                    worker.terminate();
                    let grace = Duration::from_millis(grace_ms);
                    worker.kill_at.get_or_insert(Instant::now() + grace);
                }
            }
        }
    }

    /// Starts a worker, or says why not (the router reports it to everyone
    /// waiting on the spawn). `import` is `Some` for a migration target,
    /// holding the exporter's key when the router named one.
    fn spawn(
        &mut self,
        worker_id: &str,
        model: &str,
        model_path: Option<String>,
        device: Option<String>,
        import: Option<Option<&str>>,
    ) -> Result<(), SpawnError> {
        if self.workers.contains_key(worker_id) {
            return Err(SpawnError::AlreadyRuns(worker_id.to_string()));
        }
        let Some(spec) = self.config.models.iter().find(|m| m.name == model).cloned() else {
            return Err(SpawnError::NotOffered {
                model: model.to_string(),
                offered: self.config.models.iter().map(|m| m.name.clone()).collect(),
            });
        };
        let path = model_path.map_or(spec.path.clone(), PathBuf::from);
        if !path.exists() {
            return Err(SpawnError::MissingFile(path));
        }
        let device = match device.or_else(|| spec.device.clone()) {
            Some(device) => device,
            None => self.least_used_device(),
        };
        let parsed: Device = device.parse()?;
        (self.config.check_device)(parsed)?;
        let spec = OfferedModel { path, ..spec };
        let need = self.estimate(&spec);
        let holdings = self.holdings();
        self.config.budget.admit(model, need, &holdings)?;
        let slot = self.free_slot();
        let config = self.worker_config(&spec, parsed, worker_id, slot, import);
        let child = WorkerProcess::spawn(
            &self.config.exe,
            &config,
            &self.config.worker_env,
            worker_id,
        )?;
        let worker = WorkerProcess::watch(
            child,
            worker_id.to_string(),
            model.to_string(),
            device,
            need,
            slot,
        );
        self.workers.insert(worker_id.to_string(), worker);
        Ok(())
    }

    /// The configuration of a worker of `spec` (whose path is the one to
    /// load) on `device`: [`SupervisorConfig::worker`] with this worker's
    /// own values; with `import`, a migration target (admitting only the
    /// exporter's key when the router named one).
    fn worker_config(
        &self,
        spec: &OfferedModel,
        device: Device,
        worker_id: &str,
        slot: Option<u16>,
        import: Option<Option<&str>>,
    ) -> WorkerConfig {
        let mut config = self.config.worker.clone();
        config.id = Some(worker_id.to_string());
        config.model = Some(spec.path.clone());
        config.device = device;
        if let (Some(base), Some(slot)) = (self.config.metrics_base, slot) {
            config.metrics = Some(SocketAddr::from((
                [127, 0, 0, 1],
                base.saturating_add(slot),
            )));
        }
        if let Some(exporter) = import {
            config.import_cache = true;
            if let Some(key) = exporter {
                config.import_from_key = Some(key.to_string());
            }
        }
        config.engine.threads = spec.threads.or(config.engine.threads);
        config.engine.kv_tokens = spec.kv_tokens(&self.config.worker);
        config
    }

    /// The configured device with the fewest of our workers (the first on a tie).
    fn least_used_device(&self) -> String {
        let count = |device: &String| {
            self.workers
                .values()
                .filter(|w| &w.device == device)
                .count()
        };
        self.config
            .devices
            .iter()
            .min_by_key(|device| count(device))
            .cloned()
            .unwrap_or_else(|| "cpu".to_string())
    }

    /// The lowest metrics port slot no running worker uses.
    fn free_slot(&self) -> Option<u16> {
        self.config.metrics_base?;
        (0..u16::MAX).find(|slot| !self.workers.values().any(|w| w.slot == Some(*slot)))
    }

    /// Reaps exited workers (telling the router) and kills overdue ones.
    fn watch(&mut self, now: Instant) {
        let mut exited = Vec::new();
        for worker in self.workers.values_mut() {
            if let Some(status) = worker.exited() {
                exited.push((worker.id.clone(), status));
            } else if worker.kill_at.is_some_and(|at| now >= at) {
                worker.kill();
            }
        }
        for (id, status) in exited {
            let Some(worker) = self.workers.remove(&id) else {
                continue;
            };
            let peak = self.measured.entry(worker.model.clone()).or_default();
            *peak = (*peak).max(worker.peak_rss);
            let status = if status.success() {
                status.to_string()
            } else {
                format!("{status}; last log lines: {}", worker.log_tail())
            };
            tracing::info!(worker = %id, %status, "worker process exited");
            self.outbox.push(SupervisorToRouter::WorkerExited {
                worker_id: id,
                status,
            });
        }
        for worker in self.workers.values() {
            let peak = self.measured.entry(worker.model.clone()).or_default();
            *peak = (*peak).max(worker.peak_rss);
        }
    }

    /// SIGTERM to every worker, then SIGKILL after the grace period.
    fn stop_all(&mut self) {
        for worker in self.workers.values() {
            worker.terminate();
        }
        let deadline = Instant::now() + self.config.stop_grace;
        for worker in self.workers.values_mut() {
            while worker.exited().is_none() {
                if Instant::now() >= deadline {
                    worker.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.workers.clear();
    }
}

/// A model's file bytes and its KV pool's bytes (0 when the header does
/// not tell), the estimate before any worker of it ran.
fn unmeasured_bytes(path: &Path, kv_tokens: usize, kv_dtype: zinfer_probe::KvDtype) -> (u64, u64) {
    let kv = zinfer_probe::kv_bytes_per_token(path, kv_dtype)
        .map(|per_token| per_token * kv_tokens as u64)
        .unwrap_or(0);
    (model_bytes(path), kv)
}

/// Bytes of a model file, or of the files of a model directory.
fn model_bytes(path: &Path) -> u64 {
    if path.is_dir() {
        std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    } else {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }
}

/// This host's name, for listings.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_device(device: Device) -> Result<Device, DeviceError> {
        Ok(device)
    }

    /// A GGUF header of a llama model with 2 layers, 2 KV heads and heads
    /// 16 wide: 2 * 2 * (16 + 16) * 4 = 512 bytes per cached f32 token.
    const KV_BYTES_PER_TOKEN: u64 = 512;

    fn write_gguf(path: &Path) {
        let string = |s: &str| {
            let mut out = (s.len() as u64).to_le_bytes().to_vec();
            out.extend(s.as_bytes());
            out
        };
        let entries: [(&str, u32, Vec<u8>); 5] = [
            ("general.architecture", 8, string("llama")),
            ("llama.block_count", 4, 2u32.to_le_bytes().to_vec()),
            ("llama.attention.head_count", 4, 4u32.to_le_bytes().to_vec()),
            (
                "llama.attention.head_count_kv",
                4,
                2u32.to_le_bytes().to_vec(),
            ),
            ("llama.embedding_length", 4, 64u32.to_le_bytes().to_vec()),
        ];
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        bytes.extend((entries.len() as u64).to_le_bytes());
        for (key, kind, value) in entries {
            bytes.extend(string(key));
            bytes.extend(kind.to_le_bytes());
            bytes.extend(value);
        }
        std::fs::write(path, bytes).unwrap();
    }

    fn config(models: Vec<OfferedModel>) -> SupervisorConfig {
        SupervisorConfig {
            id: "test".into(),
            control: "tcp://127.0.0.1:1".into(),
            models,
            devices: vec!["cpu:0".into(), "cpu:1".into()],
            budget: MemoryBudget { total: 1 << 40 },
            check_device: any_device,
            exe: PathBuf::from("true"),
            worker: WorkerConfig {
                router: "tcp://127.0.0.1:2".into(),
                id: None,
                device: Device::Auto,
                metrics: None,
                grace_secs: 10,
                import_cache: false,
                import_host: "127.0.0.1".into(),
                import_from_key: None,
                model: None,
                curve: CurveFiles::default(),
                engine: EngineSettings {
                    threads: Some(8),
                    kv_tokens: 1000,
                    kv_dtype: zinfer_probe::KvDtype::F32,
                    attention_dtype: zinfer_probe::AttentionDtype::Auto,
                    max_batch: 32,
                    prefill_chunk: 512,
                    speculative_draft: 0,
                    speculative_ngram: 3,
                    speculative_max_batch: 4,
                    draft_model: None,
                },
            },
            worker_env: Vec::new(),
            metrics_base: None,
            stop_grace: Duration::from_secs(1),
            curve: None,
        }
    }

    #[test]
    fn a_models_threads_and_kv_tokens_replace_the_supervisors() {
        let plain = OfferedModel::from_path(Path::new("/m/plain.gguf"));
        let tuned = OfferedModel {
            threads: Some(2),
            kv_tokens: Some(4096),
            ..OfferedModel::from_path(Path::new("/m/tuned.gguf"))
        };
        let mut supervisor = Supervisor::new(config(vec![plain.clone(), tuned.clone()]));
        let config = supervisor.worker_config(&tuned, Device::CpuSet(1), "w1", None, None);
        assert_eq!(config.engine.threads, Some(2));
        assert_eq!(config.engine.kv_tokens, 4096);
        assert_eq!(config.engine.max_batch, 32);
        assert_eq!(config.model.as_deref(), Some(Path::new("/m/tuned.gguf")));
        assert_eq!(config.device, Device::CpuSet(1));
        assert_eq!(config.id.as_deref(), Some("w1"));
        assert_eq!(config.router, "tcp://127.0.0.1:2");
        assert_eq!((config.import_cache, config.metrics), (false, None));
        supervisor.config.metrics_base = Some(9100);
        let config =
            supervisor.worker_config(&plain, Device::CpuSet(0), "w2", Some(3), Some(Some("KEY")));
        assert_eq!(config.engine.threads, Some(8));
        assert_eq!(config.engine.kv_tokens, 1000);
        assert_eq!(
            config.metrics,
            Some(SocketAddr::from(([127, 0, 0, 1], 9103)))
        );
        // A migration target admits the exporter the router named.
        assert!(config.import_cache);
        assert_eq!(config.import_from_key.as_deref(), Some("KEY"));
    }

    #[test]
    fn the_estimate_uses_a_models_own_kv_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_gguf(&path);
        let plain = OfferedModel::from_path(&path);
        let big = OfferedModel {
            name: "big".into(),
            kv_tokens: Some(4000),
            ..plain.clone()
        };
        let supervisor = Supervisor::new(config(vec![plain.clone(), big.clone()]));
        let file = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            supervisor.estimate(&plain),
            worker_bytes(file, 1000 * KV_BYTES_PER_TOKEN, None)
        );
        assert_eq!(
            supervisor.estimate(&big),
            worker_bytes(file, 4000 * KV_BYTES_PER_TOKEN, None)
        );
    }

    #[test]
    fn the_offer_carries_each_models_keep_alive_and_estimate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_gguf(&path);
        let ten_minutes = KeepAlive::For(Duration::from_secs(600));
        let kept = OfferedModel {
            keep_alive: Some(ten_minutes),
            kv_tokens: Some(2000),
            ..OfferedModel::from_path(&path)
        };
        let other = OfferedModel {
            name: "other".into(),
            ..OfferedModel::from_path(&path)
        };
        let mut supervisor = Supervisor::new(config(vec![kept, other]));
        let SupervisorToRouter::SupervisorStatus { models, .. } = supervisor.status() else {
            panic!("not a status");
        };
        let file = std::fs::metadata(&path).unwrap().len();
        assert_eq!(models.len(), 2);
        assert_eq!(models[0].name, "tiny");
        assert_eq!(models[0].keep_alive, Some(ten_minutes));
        assert_eq!(
            models[0].worker_bytes,
            worker_bytes(file, 2000 * KV_BYTES_PER_TOKEN, None)
        );
        assert_eq!(models[1].name, "other");
        assert_eq!(models[1].keep_alive, None);
    }

    #[test]
    fn workers_go_to_their_models_device_unless_the_router_names_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_gguf(&path);
        let pinned = OfferedModel {
            device: Some("cpu:1".into()),
            ..OfferedModel::from_path(&path)
        };
        let mut supervisor = Supervisor::new(config(vec![pinned]));
        // `true` stands in for `zinfer worker`: it starts and exits.
        for (id, asked) in [
            ("w1", None),
            ("w2", None),
            ("w3", Some("cpu:0".to_string())),
        ] {
            supervisor.spawn(id, "tiny", None, asked, None).unwrap();
        }
        let device = |id: &str| supervisor.workers[id].device.clone();
        assert_eq!(
            (device("w1"), device("w2")),
            ("cpu:1".into(), "cpu:1".into())
        );
        assert_eq!(device("w3"), "cpu:0");
        let err = supervisor
            .spawn("w4", "nope", None, None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"tiny\""), "{err}");
        supervisor.stop_all();
        assert!(supervisor.workers.is_empty());
    }

    /// The worker gets its configuration whole on stdin: a script in the
    /// place of `zinfer` keeps what it reads.
    #[cfg(unix)]
    #[test]
    fn a_spawned_worker_reads_its_whole_configuration_on_stdin() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_gguf(&path);
        let got = dir.path().join("got.json");
        let exe = dir.path().join("zinfer");
        std::fs::write(
            &exe,
            format!(
                "#!/bin/sh\n[ \"$1\" = {SPAWNED_WORKER} ] && [ $# = 1 ] && cat > '{}'\n",
                got.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let offered = OfferedModel::from_path(&path);
        let mut supervisor = Supervisor::new(SupervisorConfig {
            exe,
            ..config(vec![offered.clone()])
        });
        // Another test's fork can hold the fresh script open for a moment
        // ("text file busy").
        let mut started = supervisor.spawn("w1", "tiny", None, None, None);
        for _ in 0..50 {
            if started.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            started = supervisor.spawn("w1", "tiny", None, None, None);
        }
        started.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !supervisor.workers.is_empty() && Instant::now() < deadline {
            supervisor.watch(Instant::now());
            std::thread::sleep(Duration::from_millis(10));
        }
        let exited = supervisor.outbox.iter().any(|message| {
            matches!(message, SupervisorToRouter::WorkerExited { status, .. } if status.contains("exit status: 0"))
        });
        assert!(exited, "{:?}", supervisor.outbox);
        let read = WorkerConfig::read(std::fs::File::open(&got).unwrap()).unwrap();
        let expected = supervisor.worker_config(&offered, Device::CpuSet(0), "w1", None, None);
        assert_eq!(read, expected);
    }
}
