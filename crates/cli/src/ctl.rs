//! `zinfer ctl`: administer a running router over its control socket.

use std::time::Duration;

use anyhow::{Context, bail};
use zinfer_protocol::{AdminReply, AdminRequest, Limits, WorkerInfo};

use crate::zmq_util;

/// Flags of `zinfer ctl`.
#[derive(Debug, clap::Args)]
pub(crate) struct CtlArgs {
    /// Router control endpoint (bound to localhost by default).
    #[arg(long, default_value = "tcp://127.0.0.1:5557", env = "ZINFER_CONTROL")]
    control: String,
    /// Print the raw reply as JSON.
    #[arg(long, global = true, env = "ZINFER_JSON")]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CtlCommand {
    /// List workers: id, device, model, state, running / waiting, KV usage, hit rate.
    Workers,
    /// Stop routing new requests to a worker and let it finish its running ones.
    Drain {
        /// Worker id, as `ctl workers` shows it.
        worker: String,
    },
    /// Move a worker to another device.
    Migrate {
        /// Worker id.
        worker: String,
        /// Target device, e.g. `cpu` or `cuda:1`.
        device: String,
    },
    /// Set the number of workers for a model.
    Scale {
        /// Model name.
        model: String,
        /// Wanted workers.
        workers: u32,
    },
}

/// Sends one admin request and prints the reply.
pub(crate) fn run(args: &CtlArgs) -> anyhow::Result<()> {
    let request = match &args.command {
        CtlCommand::Workers => AdminRequest::Workers {},
        CtlCommand::Drain { worker } => AdminRequest::Drain {
            worker: worker.clone(),
        },
        CtlCommand::Migrate { worker, device } => AdminRequest::Migrate {
            worker: worker.clone(),
            device: device.clone(),
        },
        CtlCommand::Scale { model, workers } => AdminRequest::Scale {
            model: model.clone(),
            workers: *workers,
        },
    };
    let reply = call(&args.control, &request, Duration::from_secs(5))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
        return Ok(());
    }
    match reply {
        AdminReply::Workers { workers } => print!("{}", workers_table(&workers)),
        AdminReply::Ack { ok: true, message } => println!("ok: {message}"),
        AdminReply::Ack { ok: false, message } => bail!("refused: {message}"),
        AdminReply::Error { code, message } => bail!("{code}: {message}"),
    }
    Ok(())
}

/// One request-reply exchange on the control socket.
pub(crate) fn call(
    endpoint: &str,
    request: &AdminRequest,
    timeout: Duration,
) -> anyhow::Result<AdminReply> {
    let context = zmq::Context::new();
    let socket = zmq_util::client_socket(&context, endpoint)?;
    socket.send(zinfer_protocol::encode(request)?, 0)?;
    if socket.poll(zmq::POLLIN, timeout.as_millis() as i64)? == 0 {
        bail!(
            "no reply from the router's control socket at {endpoint} within {} s; is the router running, and is --control the address it binds?",
            timeout.as_secs()
        );
    }
    let frame = socket.recv_bytes(0).context("reading the reply")?;
    Ok(zinfer_protocol::decode::<AdminReply>(
        &frame,
        &Limits::default(),
    )?)
}

fn workers_table(workers: &[WorkerInfo]) -> String {
    let mut out = format!(
        "{:<24} {:<8} {:<32} {:<10} {:>7} {:>7} {:>9} {:>8}\n",
        "ID", "DEVICE", "MODEL", "STATE", "RUNNING", "WAITING", "KV USED", "HIT RATE"
    );
    for worker in workers {
        let load = &worker.load;
        let kv_total = load.kv_used + load.kv_free;
        let kv = if kv_total == 0 {
            "-".to_string()
        } else {
            format!("{:.1}%", 100.0 * load.kv_used as f64 / kv_total as f64)
        };
        let hit = if load.cache_query_tokens == 0 {
            "-".to_string()
        } else {
            format!(
                "{:.1}%",
                100.0 * load.cache_hit_tokens as f64 / load.cache_query_tokens as f64
            )
        };
        out.push_str(&format!(
            "{:<24} {:<8} {:<32} {:<10} {:>7} {:>7} {:>9} {:>8}\n",
            worker.id,
            worker.device,
            worker.models.join(","),
            worker.state.as_str(),
            load.running,
            load.waiting,
            kv,
            hit
        ));
    }
    if workers.is_empty() {
        out.push_str("(no workers registered)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_protocol::{LoadReport, WorkerState};

    #[test]
    fn table_shows_usage_and_hit_rate() {
        let worker = WorkerInfo {
            id: "w1".into(),
            device: "cpu".into(),
            models: vec!["smollm2".into()],
            state: WorkerState::Ready,
            inflight: 2,
            kv_capacity: 1000,
            load: LoadReport {
                running: 2,
                waiting: 1,
                kv_used: 250,
                kv_free: 750,
                cache_hit_tokens: 30,
                cache_query_tokens: 120,
            },
            last_seen_s: 0.2,
        };
        let table = workers_table(&[worker]);
        let row = table.lines().nth(1).unwrap();
        assert!(row.starts_with("w1"));
        assert!(row.contains("ready"));
        assert!(row.contains("25.0%"));
        assert!(row.ends_with("25.0%"), "{row}");
        assert!(workers_table(&[]).contains("no workers"));
    }
}
