//! `zinfer serve`: a router, a supervisor and worker processes, all on this
//! host. With one model it starts one worker per device; with several, the
//! router starts a model's workers on its first request (and unloads it
//! when idle), except for the `--preload` ones. The workers are the control
//! plane's: `ctl scale`, `ctl drain`, `ctl migrate` and the autoscaler
//! start and stop them, and a worker that dies is replaced.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use zinfer_curve::{ClientCurve, KeyPair, PublicKey};
use zinfer_probe::Device;
use zinfer_protocol::{AdminReply, AdminRequest, ClientReply, ClientRequest, Limits};
use zinfer_router::RouterConfig;
use zinfer_supervisor::OfferedModel;

use crate::http_cmd::{Front, HttpOptions};
use crate::router_cmd::RouterArgs;
use crate::supervise::{self, SupervisorArgs};
use crate::worker_cmd::EngineArgs;

/// Flags of `zinfer serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    router: RouterArgs,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    supervisor: SupervisorArgs,
    /// Device for a worker; repeat for one worker per device (`cpu`,
    /// `cpu:0`, `cpu:1`, `cuda:0`, ...). `auto` picks the best device
    /// present: the CPU on a machine without a GPU. New workers (`ctl
    /// scale`) go to the least used of these.
    #[arg(
        long = "device",
        default_value = "auto",
        env = "ZINFER_DEVICE",
        value_delimiter = ','
    )]
    devices: Vec<Device>,
    /// First port of the workers' /metrics endpoints (worker slot i uses port + i).
    #[arg(long, default_value_t = 9101, env = "ZINFER_WORKER_METRICS_PORT")]
    worker_metrics_port: u16,
    /// Seconds workers get to finish in-flight requests on shutdown.
    #[arg(long, default_value_t = 10, env = "ZINFER_GRACE")]
    grace: u64,
    /// Seconds to wait for every worker to load and register.
    #[arg(long, default_value_t = 300, env = "ZINFER_STARTUP_TIMEOUT")]
    startup_timeout: u64,
    /// Also serve the OpenAI-compatible HTTP API on this address (as
    /// `zinfer http` would), e.g. 127.0.0.1:8000.
    #[arg(long, env = "ZINFER_HTTP")]
    http: Option<SocketAddr>,
    #[command(flatten)]
    http_options: HttpOptions,
    /// With several models, start this one at start-up (one worker per
    /// device, as a single model is) instead of on its first request;
    /// repeat or comma-separate for several. A single model always starts.
    #[arg(
        long,
        value_name = "NAME",
        env = "ZINFER_PRELOAD",
        value_delimiter = ','
    )]
    preload: Vec<String>,
}

/// Runs router, supervisor and workers until Ctrl-C or SIGTERM.
pub(crate) fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let devices = supervise::check_devices(&args.devices)?;
    let threads = args
        .engine
        .threads
        .unwrap_or_else(|| supervise::default_threads(devices.len()));

    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(4);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .context("installing the Ctrl-C handler")?;

    // With CURVE on, this process's own peers (supervisor, workers, the
    // HTTP front, the start-up `scale`) share one throwaway key pair that
    // joins the router's allow-lists; its files live as long as `serve`.
    let internal = match &args.router.curve_key {
        Some(_) => Some(InternalKeys::create()?),
        None => None,
    };
    let config = RouterConfig {
        curve: args
            .router
            .curve_config(internal.as_ref().map(|keys| keys.pair.public()))?,
        ..args.router.config()
    };
    let client_curve = match (&config.curve, &internal) {
        (Some(curve), Some(internal)) => Some(ClientCurve {
            server: curve.keys.public(),
            own: internal.pair.clone(),
        }),
        _ => None,
    };
    if let (Some(curve), Some(internal)) = (&config.curve, &internal) {
        internal.write_server_key(&curve.keys.public())?;
    }
    let worker_endpoint = local_endpoint(&config.workers);
    let control_endpoint = local_endpoint(&config.control);
    let client_endpoint = config.clients.clone();
    let mut supervisor_config = supervise::config(
        format!("serve-{}", zinfer_supervisor::host_name()),
        control_endpoint.clone(),
        worker_endpoint,
        &args.engine,
        &args.supervisor,
        devices.clone(),
        threads,
    )?;
    supervisor_config.metrics_base = Some(args.worker_metrics_port);
    supervisor_config.curve = client_curve.clone();
    if let Some(internal) = &internal {
        supervisor_config.worker.curve =
            supervise::worker_curve_files(&internal.server_key_path(), &internal.key_path())?;
    }
    supervisor_config.stop_grace = Duration::from_secs(args.grace + 5);
    supervisor_config.worker.grace_secs = args.grace;
    let models = supervisor_config.models.clone();
    let preload = preloaded(&models, &args.preload)?;

    let (router_stop_tx, router_stop_rx) = crossbeam_channel::bounded::<()>(1);
    let router = std::thread::Builder::new()
        .name("router".into())
        .spawn(move || zinfer_router::run(config, router_stop_rx))?;
    let (supervisor_stop_tx, supervisor_stop_rx) = crossbeam_channel::bounded::<()>(1);
    let supervisor = std::thread::Builder::new()
        .name("supervisor".into())
        .spawn(move || zinfer_supervisor::run(supervisor_config, supervisor_stop_rx))?;

    let front = match args.http {
        Some(listen) => {
            let router = local_endpoint(&client_endpoint);
            let config = zinfer_http::HttpConfig {
                curve: client_curve.clone(),
                ..args.http_options.config(&router, listen)
            };
            let (front, addr) = Front::start(config)?;
            eprintln!("zinfer serve: OpenAI API on http://{addr}/v1");
            Some(front)
        }
        None => None,
    };

    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.startup_timeout);
    let result = match &models[..] {
        [model] => start_workers(
            &control_endpoint,
            &model.name,
            devices.len(),
            deadline,
            client_curve.as_ref(),
        )
        .map(|message| {
            format!(
                "{message} ({threads} thread(s) each, from {})",
                model.path.display()
            )
        }),
        _ => start_several(
            &control_endpoint,
            &local_endpoint(&client_endpoint),
            &models,
            &preload,
            devices.len(),
            deadline,
            client_curve.as_ref(),
        ),
    }
    .map(|message| {
        eprintln!(
            "zinfer serve: ready in {:.1} s: {message}; clients connect to {}",
            started.elapsed().as_secs_f64(),
            client_endpoint.replace("*", "127.0.0.1"),
        );
        let _ = stop_rx.recv();
    });

    eprintln!("zinfer serve: shutting down");
    if let Some(front) = front
        && let Err(error) = front.stop()
    {
        tracing::warn!(%error, "stopping the HTTP front");
    }
    let _ = supervisor_stop_tx.send(());
    match supervisor.join() {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, "the supervisor failed"),
        Err(_) => tracing::warn!("the supervisor thread panicked"),
    }
    let _ = router_stop_tx.send(());
    match router.join() {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(error.into()),
        Err(_) => bail!("the router thread panicked"),
    }
    result
}

/// The models `--preload` names, in order and once each; the one model
/// when there is only one (it always starts). An unknown name is an error
/// listing the offered ones.
fn preloaded(models: &[OfferedModel], names: &[String]) -> anyhow::Result<Vec<OfferedModel>> {
    let mut chosen: Vec<OfferedModel> = Vec::new();
    for name in names {
        let Some(model) = models.iter().find(|model| &model.name == name) else {
            bail!(
                "--preload {name:?}: no such model; the models offered are {}",
                supervise::model_names(models)
            );
        };
        if !chosen.contains(model) {
            chosen.push(model.clone());
        }
    }
    if let [model] = models {
        return Ok(vec![model.clone()]);
    }
    Ok(chosen)
}

/// Several models: starts the `preload` ones, waits until the router lists
/// every model (the supervisor has told it what it offers), and says so.
fn start_several(
    control: &str,
    clients: &str,
    models: &[OfferedModel],
    preload: &[OfferedModel],
    workers: usize,
    deadline: Instant,
    curve: Option<&ClientCurve>,
) -> anyhow::Result<String> {
    let mut started = Vec::new();
    for model in preload {
        started.push(start_workers(
            control,
            &model.name,
            workers,
            deadline,
            curve,
        )?);
    }
    wait_until_listed(clients, models, deadline, curve)?;
    let names = supervise::model_names(models);
    Ok(if started.is_empty() {
        format!(
            "offering {} models, each loaded on its first request ({names})",
            models.len()
        )
    } else {
        format!(
            "offering {} models ({names}); {}; the others load on their first request",
            models.len(),
            started.join("; ")
        )
    })
}

/// Asks the router for its model list until it names every one of
/// `models`, or fails at `deadline` naming the missing ones.
fn wait_until_listed(
    endpoint: &str,
    models: &[OfferedModel],
    deadline: Instant,
    curve: Option<&ClientCurve>,
) -> anyhow::Result<()> {
    const ID: &str = "zinfer-serve-startup";
    let context = zmq::Context::new();
    let socket = crate::zmq_util::client_socket(&context, endpoint, curve)?;
    let request = zinfer_protocol::encode(&ClientRequest::Models {
        id: Some(ID.into()),
    })?;
    let mut missing: Vec<&str> = models.iter().map(|model| model.name.as_str()).collect();
    loop {
        socket
            .send(request.as_slice(), 0)
            .with_context(|| format!("asking {endpoint} for its models"))?;
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = left.clamp(Duration::from_millis(1), Duration::from_secs(1));
        if socket.poll(zmq::POLLIN, wait.as_millis() as i64)? > 0 {
            while let Ok(frame) = socket.recv_bytes(zmq::DONTWAIT) {
                if let Ok(ClientReply::Models {
                    id: Some(id),
                    models: listed,
                }) = zinfer_protocol::decode(&frame, &Limits::default())
                    && id == ID
                {
                    missing.retain(|name| !listed.iter().any(|model| model.name == *name));
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "the router did not list the offered model(s) {} in time (--startup-timeout); \
                 the supervisor may not have reached it",
                missing.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Asks the control plane for `workers` workers of `model` and waits until
/// they serve (or `deadline`); the router's message on success.
fn start_workers(
    control: &str,
    model: &str,
    workers: usize,
    deadline: Instant,
    curve: Option<&ClientCurve>,
) -> anyhow::Result<String> {
    let request = AdminRequest::Scale {
        model: model.to_string(),
        workers: u32::try_from(workers).unwrap_or(u32::MAX),
        device: None,
    };
    loop {
        // The first call can beat the supervisor's registration; it then
        // says no supervisor is connected, and we ask again.
        let left = deadline.saturating_duration_since(Instant::now());
        match crate::ctl::call(control, &request, left.max(Duration::from_secs(1)), curve)? {
            AdminReply::Ack { ok: true, message } => return Ok(message),
            AdminReply::Ack { ok: false, message }
                if message.contains("no supervisor") && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            AdminReply::Ack { message, .. } | AdminReply::Error { message, .. } => {
                bail!("starting the workers failed: {message}")
            }
            AdminReply::Workers { .. } => bail!("the router answered scale with a worker list"),
        }
    }
}

/// The throwaway key pair of `serve`'s own supervisor and workers, in a
/// private directory removed when dropped.
struct InternalKeys {
    dir: PathBuf,
    pair: KeyPair,
}

impl InternalKeys {
    fn create() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "zinfer-serve-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(&dir)
            .with_context(|| format!("creating {} for serve's worker keys", dir.display()))?;
        let keys = InternalKeys {
            dir,
            pair: KeyPair::generate()?,
        };
        keys.pair.write(&keys.dir, "serve", false)?;
        Ok(keys)
    }

    fn key_path(&self) -> PathBuf {
        self.dir.join("serve.key")
    }

    fn server_key_path(&self) -> PathBuf {
        self.dir.join("router.pub")
    }

    fn write_server_key(&self, key: &PublicKey) -> anyhow::Result<()> {
        let path = self.server_key_path();
        std::fs::write(&path, format!("{key}\n"))
            .with_context(|| format!("writing {}", path.display()))
    }
}

impl Drop for InternalKeys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A bind address such as `tcp://*:5556` as a peer on this host dials it.
fn local_endpoint(bind: &str) -> String {
    bind.replace("*", "127.0.0.1")
        .replace("0.0.0.0", "127.0.0.1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_expand_and_reject_unknown() {
        let check = supervise::check_devices;
        let auto = check(&[Device::Auto]).unwrap();
        assert!(auto == ["cpu"] || auto == ["cuda:0"], "{auto:?}");
        assert_eq!(check(&[Device::CpuSet(1)]).unwrap(), ["cpu:1"]);
        if !Device::Cuda(0).is_built() {
            let err = check(&[Device::Cuda(0)]).unwrap_err().to_string();
            assert!(err.contains("--features cuda"), "{err}");
        }
    }

    #[test]
    fn device_flags_parse_into_devices() {
        use clap::Parser;
        let cli =
            crate::Cli::try_parse_from(["zinfer", "serve", "--device", "cpu:0,cuda:1"]).unwrap();
        let crate::Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(args.devices, [Device::CpuSet(0), Device::Cuda(1)]);
        let err = crate::Cli::try_parse_from(["zinfer", "serve", "--device", "tpu"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown device `tpu`"), "{err}");
    }

    #[test]
    fn several_models_and_preloads_parse() {
        use clap::Parser;
        let cli = crate::Cli::try_parse_from([
            "zinfer",
            "serve",
            "--model",
            "/m/a.gguf",
            "--model",
            "/m/b.gguf",
            "--models-dir",
            "/more",
            "--preload",
            "a,b",
            "--preload",
            "c",
        ])
        .unwrap();
        let crate::Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        let models = &args.supervisor.models;
        assert_eq!(
            models.model,
            [PathBuf::from("/m/a.gguf"), PathBuf::from("/m/b.gguf")]
        );
        assert_eq!(models.models_dir, Some(PathBuf::from("/more")));
        assert_eq!(args.preload, ["a", "b", "c"]);
    }

    #[test]
    fn preloads_name_offered_models() {
        let spec = |name: &str| OfferedModel::from_path(&PathBuf::from(format!("/m/{name}.gguf")));
        let models = [spec("a"), spec("b"), spec("c")];
        let names = |chosen: Vec<OfferedModel>| -> Vec<String> {
            chosen.into_iter().map(|model| model.name).collect()
        };
        assert!(preloaded(&models, &[]).unwrap().is_empty());
        let asked = ["c", "a", "c"].map(String::from);
        assert_eq!(names(preloaded(&models, &asked).unwrap()), ["c", "a"]);
        let err = preloaded(&models, &["d".into()]).unwrap_err().to_string();
        assert!(err.contains("\"d\"") && err.contains("a, b, c"), "{err}");
        // One model always starts, named or not.
        assert_eq!(names(preloaded(&models[..1], &[]).unwrap()), ["a"]);
        assert!(preloaded(&models[..1], &["b".into()]).is_err());
    }

    #[test]
    fn bind_addresses_become_dialable() {
        assert_eq!(local_endpoint("tcp://*:5556"), "tcp://127.0.0.1:5556");
        assert_eq!(local_endpoint("tcp://0.0.0.0:9"), "tcp://127.0.0.1:9");
        assert_eq!(local_endpoint("ipc:///tmp/x"), "ipc:///tmp/x");
    }
}
