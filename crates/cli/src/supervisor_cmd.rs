//! `zinfer supervisor`: starts and stops workers on this host when the
//! router's control plane asks (`ctl scale`, `ctl migrate`, autoscaling,
//! models loaded on demand). What it shares with `serve` is in
//! [`crate::supervise`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use zinfer_probe::Device;

use crate::supervise::{self, SupervisorArgs};
use crate::worker_cmd::EngineArgs;

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
    supervisor: SupervisorArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Runs the supervisor until Ctrl-C or SIGTERM, then stops its workers.
pub(crate) fn run(args: &SupervisorCmdArgs) -> anyhow::Result<()> {
    let devices = supervise::check_devices(&args.devices)?;
    let threads = args
        .engine
        .threads
        .unwrap_or_else(|| supervise::default_threads(devices.len()));
    let id = args.id.clone().unwrap_or_else(|| {
        format!(
            "supervisor-{}-{}",
            zinfer_supervisor::host_name(),
            std::process::id()
        )
    });
    let mut config = supervise::config(
        id.clone(),
        args.control.clone(),
        args.router.clone(),
        &args.engine,
        &args.supervisor,
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
        config.worker.curve = supervise::worker_curve_files(server_key, worker_key)?;
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
        supervise::model_names(&config.models),
        config.devices,
        zinfer_supervisor::gib(config.budget.total),
        config.control
    );
    zinfer_supervisor::run(config, stop_rx)?;
    eprintln!("zinfer supervisor {id}: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn model_flags_repeat_and_combine() {
        use clap::Parser;
        let cli = crate::Cli::try_parse_from([
            "zinfer",
            "supervisor",
            "--model",
            "/m/a.gguf",
            "--model",
            "/m/b.gguf",
            "--models-dir",
            "/m",
            "--models-config",
            "/m/models.toml",
        ])
        .unwrap();
        let crate::Command::Supervisor(args) = cli.command else {
            panic!("not supervisor");
        };
        let models = args.supervisor.models;
        assert_eq!(
            models.model,
            [Path::new("/m/a.gguf"), Path::new("/m/b.gguf")]
        );
        assert_eq!(models.models_dir.as_deref(), Some(Path::new("/m")));
        assert_eq!(
            models.models_config.as_deref(),
            Some(Path::new("/m/models.toml"))
        );
    }
}
