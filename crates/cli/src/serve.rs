//! `zinfer serve`: a router in this process plus one worker process per
//! device, supervised: a worker that dies is started again.

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use zinfer_protocol::{AdminReply, AdminRequest, WorkerState};
use zinfer_worker::device::Device;

use crate::http_cmd::{Front, HttpOptions};
use crate::router_cmd::RouterArgs;
use crate::worker_cmd::{self, EngineArgs};

/// Flags of `zinfer serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    router: RouterArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// Device for a worker; repeat for one worker per device (`cpu`,
    /// `cuda:0`, ...). `auto` picks the best device present: the CPU on a
    /// machine without a GPU.
    #[arg(long = "device", default_value = "auto", env = "ZINFER_DEVICE")]
    devices: Vec<String>,
    /// First port of the workers' /metrics endpoints (worker i uses port + i).
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
}

struct Supervised {
    id: String,
    args: Vec<String>,
    child: Child,
    restarts: u32,
}

/// Runs router and workers until Ctrl-C or SIGTERM.
pub(crate) fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let model = worker_cmd::resolve_model(args.engine.model.as_deref())?;
    let devices = expand_devices(&args.devices)?;
    let threads = args
        .engine
        .threads
        .unwrap_or_else(|| default_threads(devices.len()));

    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(4);
    let (router_stop_tx, router_stop_rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .context("installing the Ctrl-C handler")?;

    let config = args.router.config();
    let worker_endpoint = local_endpoint(&config.workers);
    let control_endpoint = local_endpoint(&config.control);
    let client_endpoint = config.clients.clone();
    let router = std::thread::Builder::new()
        .name("router".into())
        .spawn(move || zinfer_router::run(config, router_stop_rx))?;

    let front = match args.http {
        Some(listen) => {
            let router = local_endpoint(&client_endpoint);
            let (front, addr) = Front::start(args.http_options.config(&router, listen))?;
            eprintln!("zinfer serve: OpenAI API on http://{addr}/v1");
            Some(front)
        }
        None => None,
    };

    let exe = std::env::current_exe().context("finding the zinfer binary")?;
    let mut workers = Vec::new();
    for (i, device) in devices.iter().enumerate() {
        let id = format!("worker-{i}-{device}");
        let mut worker_args = vec![
            "worker".to_string(),
            "--router".into(),
            worker_endpoint.clone(),
            "--model".into(),
            model.display().to_string(),
            "--device".into(),
            device.clone(),
            "--id".into(),
            id.clone(),
            "--metrics".into(),
            format!("127.0.0.1:{}", args.worker_metrics_port + i as u16),
            "--grace".into(),
            args.grace.to_string(),
        ];
        worker_args.extend(args.engine.to_args(threads));
        let child = Command::new(&exe)
            .args(&worker_args)
            .env("ZINFER_LOG_FORMAT", log_format())
            .spawn()
            .with_context(|| format!("starting worker {id}"))?;
        workers.push(Supervised {
            id,
            args: worker_args,
            child,
            restarts: 0,
        });
    }

    let started = Instant::now();
    let result = wait_ready(
        &control_endpoint,
        workers.len(),
        Duration::from_secs(args.startup_timeout),
        &stop_rx,
        &mut workers,
    )
    .and_then(|()| {
        eprintln!(
            "zinfer serve: ready in {:.1} s: {} worker(s) serving {} ({} thread(s) each); clients connect to {}",
            started.elapsed().as_secs_f64(),
            workers.len(),
            model.display(),
            threads,
            client_endpoint.replace("*", "127.0.0.1"),
        );
        supervise(&exe, &mut workers, &stop_rx)
    });

    eprintln!("zinfer serve: shutting down");
    if let Some(front) = front
        && let Err(error) = front.stop()
    {
        tracing::warn!(%error, "stopping the HTTP front");
    }
    stop_workers(&mut workers, Duration::from_secs(args.grace + 5));
    let _ = router_stop_tx.send(());
    match router.join() {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(error.into()),
        Err(_) => bail!("the router thread panicked"),
    }
    result
}

/// Restarts workers that exit on their own until a stop signal arrives.
fn supervise(
    exe: &std::path::Path,
    workers: &mut [Supervised],
    stop: &crossbeam_channel::Receiver<()>,
) -> anyhow::Result<()> {
    loop {
        if stop.recv_timeout(Duration::from_millis(500)).is_ok() {
            return Ok(());
        }
        for worker in workers.iter_mut() {
            if let Some(status) = worker.child.try_wait()? {
                worker.restarts += 1;
                let backoff = Duration::from_secs(u64::from(worker.restarts.min(5)));
                tracing::warn!(worker = %worker.id, %status, restarts = worker.restarts,
                    "worker exited; restarting in {backoff:?}");
                if stop.recv_timeout(backoff).is_ok() {
                    return Ok(());
                }
                worker.child = Command::new(exe)
                    .args(&worker.args)
                    .env("ZINFER_LOG_FORMAT", log_format())
                    .spawn()
                    .with_context(|| format!("restarting worker {}", worker.id))?;
            }
        }
    }
}

/// Polls the router's control socket until `expected` workers are ready.
fn wait_ready(
    control: &str,
    expected: usize,
    timeout: Duration,
    stop: &crossbeam_channel::Receiver<()>,
    workers: &mut [Supervised],
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if stop.try_recv().is_ok() {
            bail!("stopped before the workers were ready");
        }
        for worker in workers.iter_mut() {
            if let Some(status) = worker.child.try_wait()? {
                bail!(
                    "worker {} exited during start-up ({status}); see its log above",
                    worker.id
                );
            }
        }
        if let Ok(AdminReply::Workers { workers: listed }) = crate::ctl::call(
            control,
            &AdminRequest::Workers {},
            Duration::from_millis(500),
        ) {
            let ready = listed
                .iter()
                .filter(|w| w.state == WorkerState::Ready)
                .count();
            if ready >= expected {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "workers did not register within {} s; raise --startup-timeout or check the worker logs",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sends SIGTERM, waits up to `grace`, then kills what is left.
fn stop_workers(workers: &mut [Supervised], grace: Duration) {
    for worker in workers.iter() {
        if let Ok(pid) = i32::try_from(worker.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + grace;
    for worker in workers.iter_mut() {
        loop {
            match worker.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    tracing::warn!(worker = %worker.id, "worker did not stop in time; killing it");
                    let _ = worker.child.kill();
                    let _ = worker.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// This process's `--log-format`, for its workers.
fn log_format() -> &'static str {
    crate::LOG_FORMAT
        .get()
        .copied()
        .unwrap_or(crate::LogFormat::Text)
        .as_str()
}

/// Parses and checks each device; `auto` becomes the best one present (the
/// first GPU in a CUDA build that has one, else the CPU).
fn expand_devices(devices: &[String]) -> anyhow::Result<Vec<String>> {
    devices
        .iter()
        .map(|d| Ok(d.parse::<Device>()?.check()?.to_string()))
        .collect()
}

/// CPU threads per worker: the cores split evenly, at least one each, so
/// workers do not fight over cores (candle's thread pool spins).
fn default_threads(workers: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / workers.max(1)).max(1)
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
        let auto = expand_devices(&["auto".into()]).unwrap();
        assert!(auto == ["cpu"] || auto == ["cuda:0"], "{auto:?}");
        let err = expand_devices(&["tpu".into()]).unwrap_err().to_string();
        assert!(err.contains("unknown device"), "{err}");
        if !Device::Cuda(0).is_built() {
            let err = expand_devices(&["cuda:0".into()]).unwrap_err().to_string();
            assert!(err.contains("--features cuda"), "{err}");
        }
    }

    #[test]
    fn bind_addresses_become_dialable() {
        assert_eq!(local_endpoint("tcp://*:5556"), "tcp://127.0.0.1:5556");
        assert_eq!(local_endpoint("tcp://0.0.0.0:9"), "tcp://127.0.0.1:9");
        assert_eq!(local_endpoint("ipc:///tmp/x"), "ipc:///tmp/x");
    }

    #[test]
    fn threads_split_cores() {
        assert!(default_threads(1) >= 1);
        assert_eq!(default_threads(10_000), 1);
    }
}
