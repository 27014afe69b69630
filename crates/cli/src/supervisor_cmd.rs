//! `zinfer supervisor`: starts and stops workers on this host when the
//! router's control plane asks (`ctl scale`, `ctl migrate`, autoscaling).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use zinfer_probe::Device;
use zinfer_supervisor::{MemoryBudget, ModelSpec, SupervisorConfig};

use crate::worker_cmd::{self, EngineArgs};

/// Flags of `zinfer supervisor` (and of the supervisor inside `serve`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SupervisorArgs {
    /// Memory all workers of this supervisor may hold together, e.g. `8GiB`
    /// or `512MiB`. A spawn that would exceed it is refused with how much
    /// is needed and free. Default: 90% of the memory available at start.
    #[arg(long, value_parser = zinfer_supervisor::parse_bytes, env = "ZINFER_MEMORY_BUDGET")]
    pub(crate) memory_budget: Option<u64>,
}

/// Flags of `zinfer supervisor` alone.
#[derive(Debug, clap::Args)]
pub(crate) struct SupervisorCmdArgs {
    /// The router's control endpoint.
    #[arg(long, default_value = "tcp://127.0.0.1:5557", env = "ZINFER_CONTROL")]
    control: String,
    /// The router's worker endpoint, for the workers it starts.
    #[arg(
        long,
        default_value = "tcp://127.0.0.1:5556",
        env = "ZINFER_WORKER_ROUTER"
    )]
    router: String,
    /// Supervisor id, unique among the router's supervisors. Default:
    /// supervisor-HOSTNAME-PID.
    #[arg(long, env = "ZINFER_SUPERVISOR_ID")]
    id: Option<String>,
    /// Devices to start workers on, least used first; repeat for several
    /// (`cpu:0`, `cpu:1`, `cuda:0`, ...).
    #[arg(
        long = "device",
        default_value = "cpu",
        env = "ZINFER_DEVICE",
        value_delimiter = ','
    )]
    devices: Vec<Device>,
    /// First port of the workers' /metrics endpoints (one port per worker).
    #[arg(long, env = "ZINFER_WORKER_METRICS_PORT")]
    worker_metrics_port: Option<u16>,
    /// Seconds a worker gets to exit after SIGTERM before it is killed.
    #[arg(long, default_value_t = 15, env = "ZINFER_STOP_GRACE")]
    stop_grace: u64,
    /// CURVE: the router's public key, and this supervisor's key pair (on
    /// the router's --admin-keys list).
    #[command(flatten)]
    curve: crate::zmq_util::CurveArgs,
    /// The key pair file the workers it starts use (on the router's
    /// --worker-keys list). Default: --curve-key, which must then be on
    /// both lists.
    #[arg(long, value_name = "FILE", env = "ZINFER_WORKER_CURVE_KEY")]
    worker_curve_key: Option<PathBuf>,
    #[command(flatten)]
    budget: SupervisorArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// The supervisor configuration for one model.
pub(crate) fn config(
    id: String,
    control: String,
    router: String,
    engine: &EngineArgs,
    budget: &SupervisorArgs,
    devices: Vec<String>,
    threads: usize,
) -> anyhow::Result<SupervisorConfig> {
    let model = worker_cmd::resolve_model(engine.model.as_deref())?;
    let total = match budget.memory_budget {
        Some(bytes) => bytes,
        None => zinfer_probe::procfs::available_bytes()
            .map(|bytes| bytes / 10 * 9)
            .context("reading /proc/meminfo; give --memory-budget")?,
    };
    Ok(SupervisorConfig {
        id,
        control,
        router,
        models: vec![ModelSpec::from_path(&model)],
        devices,
        budget: MemoryBudget { total },
        kv_tokens: engine.kv_tokens,
        kv_dtype: engine.kv_dtype,
        check_device: zinfer_model::check_device,
        exe: std::env::current_exe().context("finding the zinfer binary")?,
        worker_args: engine.to_args(threads),
        worker_env: vec![(
            "ZINFER_LOG_FORMAT".to_string(),
            crate::serve::log_format().to_string(),
        )],
        metrics_base: None,
        stop_grace: Duration::from_secs(15),
        curve: None,
    })
}

/// The CURVE flags for the workers a supervisor starts: the router's
/// public key and the workers' key pair, as absolute paths (the files are
/// read now, so a bad one stops the supervisor, not every spawn).
pub(crate) fn worker_curve_args(
    server_key: &Path,
    worker_key: &Path,
) -> anyhow::Result<Vec<String>> {
    zinfer_curve::read_public_key(server_key)?;
    zinfer_curve::KeyPair::read(worker_key)?;
    let absolute = |path: &Path| -> anyhow::Result<String> {
        Ok(std::path::absolute(path)
            .with_context(|| format!("resolving {}", path.display()))?
            .display()
            .to_string())
    };
    Ok(vec![
        "--curve-server-key".into(),
        absolute(server_key)?,
        "--curve-key".into(),
        absolute(worker_key)?,
    ])
}

/// Checks this build can use every device and resolves `auto`, as the
/// names the supervisor hands its workers.
pub(crate) fn check_devices(devices: &[Device]) -> anyhow::Result<Vec<String>> {
    devices
        .iter()
        .map(|device| Ok(zinfer_model::check_device(*device)?.to_string()))
        .collect()
}

/// Runs the supervisor until Ctrl-C or SIGTERM, then stops its workers.
pub(crate) fn run(args: &SupervisorCmdArgs) -> anyhow::Result<()> {
    let devices = check_devices(&args.devices)?;
    let threads = args
        .engine
        .threads
        .unwrap_or_else(|| crate::serve::default_threads(devices.len()));
    let id = args.id.clone().unwrap_or_else(|| {
        format!(
            "supervisor-{}-{}",
            zinfer_supervisor::host_name(),
            std::process::id()
        )
    });
    let mut config = config(
        id.clone(),
        args.control.clone(),
        args.router.clone(),
        &args.engine,
        &args.budget,
        devices,
        threads,
    )?;
    config.metrics_base = args.worker_metrics_port;
    config.stop_grace = Duration::from_secs(args.stop_grace);
    config.curve = args.curve.load()?;
    if let Some(server_key) = &args.curve.curve_server_key {
        let Some(worker_key) = args
            .worker_curve_key
            .as_ref()
            .or(args.curve.curve_key.as_ref())
        else {
            bail!(
                "with --curve-server-key the workers this supervisor starts need a key pair on \
                 the router's --worker-keys list: pass --worker-curve-key FILE (or --curve-key)"
            );
        };
        config
            .worker_args
            .extend(worker_curve_args(server_key, worker_key)?);
    } else if let Some(worker_key) = &args.worker_curve_key {
        bail!(
            "--worker-curve-key {} needs --curve-server-key (the router's public key)",
            worker_key.display()
        );
    }
    let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .context("installing the Ctrl-C handler")?;
    eprintln!(
        "zinfer supervisor {id}: offering {} on {:?} (budget {}), router control at {}",
        config.models[0].name,
        config.devices,
        zinfer_supervisor::gib(config.budget.total),
        config.control
    );
    zinfer_supervisor::run(config, stop_rx)?;
    eprintln!("zinfer supervisor {id}: stopped");
    Ok(())
}
