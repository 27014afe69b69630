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
    /// CURVE: the router's public key and an admin key pair (on the
    /// router's --admin-keys list).
    #[command(flatten)]
    curve: zmq_util::CurveArgs,
    /// Print the raw reply as JSON.
    #[arg(long, global = true, env = "ZINFER_JSON")]
    json: bool,
    /// Seconds to wait for `scale`, `migrate` and `reload`, which the
    /// router answers once workers have loaded.
    #[arg(long, global = true, default_value_t = 600, env = "ZINFER_TIMEOUT")]
    timeout: u64,
    /// The operation, parsed straight into the protocol's request.
    #[command(subcommand)]
    command: AdminRequest,
}

/// Sends one admin request and prints the reply; fails (exit status 1)
/// with the router's reason when the operation failed.
pub(crate) fn run(args: &CtlArgs) -> anyhow::Result<()> {
    let request = &args.command;
    let timeout = match request {
        AdminRequest::Workers {} | AdminRequest::Drain { .. } | AdminRequest::Resume { .. } => {
            Duration::from_secs(5)
        }
        // Loading a model takes a while; the router answers when done.
        AdminRequest::Migrate { .. } | AdminRequest::Reload { .. } | AdminRequest::Scale { .. } => {
            Duration::from_secs(args.timeout)
        }
    };
    let curve = args.curve.load()?;
    let reply = call(&args.control, request, timeout, curve.as_ref())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    }
    match reply {
        AdminReply::Workers { workers } if !args.json => print!("{}", workers_table(&workers)),
        AdminReply::Workers { .. } => {}
        AdminReply::Ack { ok: true, message } if !args.json => println!("ok: {message}"),
        AdminReply::Ack { ok: true, .. } => {}
        AdminReply::Ack { ok: false, message } => bail!("failed: {message}"),
        AdminReply::Error { code, message } => bail!("{code}: {message}"),
    }
    Ok(())
}

/// One request-reply exchange on the control socket.
pub(crate) fn call(
    endpoint: &str,
    request: &AdminRequest,
    timeout: Duration,
    curve: Option<&zinfer_curve::ClientCurve>,
) -> anyhow::Result<AdminReply> {
    let context = zmq::Context::new();
    let socket = zmq_util::client_socket(&context, endpoint, curve)?;
    socket.send(zinfer_protocol::encode(request)?, 0)?;
    if socket.poll(zmq::POLLIN, timeout.as_millis() as i64)? == 0 {
        bail!(
            "no reply from the router's control socket at {endpoint} within {} s; is the router running, and is --control the address it binds?{}",
            timeout.as_secs(),
            if curve.is_some() {
                " With CURVE, a key not on the router's --admin-keys list gets no reply at all: \
                 check --curve-key and --curve-server-key."
            } else {
                " If the router runs with --curve-key, pass --curve-server-key and --curve-key."
            }
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
        "{:<24} {:<8} {:<32} {:<10} {:>7} {:>7} {:>9} {:>8} {:>9}\n",
        "ID", "DEVICE", "MODEL", "STATE", "RUNNING", "WAITING", "KV USED", "HIT RATE", "MEMORY"
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
        let memory = if load.rss_bytes == 0 {
            "-".to_string()
        } else {
            format!("{:.0} MiB", load.rss_bytes as f64 / (1 << 20) as f64)
        };
        out.push_str(&format!(
            "{:<24} {:<8} {:<32} {:<10} {:>7} {:>7} {:>9} {:>8} {:>9}\n",
            worker.id,
            worker.device,
            worker.models.join(","),
            worker.state.as_str(),
            load.running,
            load.waiting,
            kv,
            hit,
            memory
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

    fn parse(argv: &[&str]) -> Result<AdminRequest, clap::Error> {
        use clap::Parser;
        let argv = ["zinfer", "ctl"].iter().chain(argv);
        match crate::Cli::try_parse_from(argv)?.command {
            crate::Command::Ctl(args) => Ok(args.command),
            other => panic!("not ctl: {other:?}"),
        }
    }

    /// The variant's name; exhaustive, so a new `AdminRequest` variant
    /// does not compile until the test below reaches it from the command
    /// line.
    fn variant(request: &AdminRequest) -> &'static str {
        match request {
            AdminRequest::Workers {} => "workers",
            AdminRequest::Drain { .. } => "drain",
            AdminRequest::Resume { .. } => "resume",
            AdminRequest::Migrate { .. } => "migrate",
            AdminRequest::Reload { .. } => "reload",
            AdminRequest::Scale { .. } => "scale",
        }
    }

    #[test]
    fn every_admin_request_is_reachable_from_the_command_line() {
        let cases: Vec<(&[&str], AdminRequest)> = vec![
            (&["workers"], AdminRequest::Workers {}),
            (
                &["drain", "w1", "--park"],
                AdminRequest::Drain {
                    worker: "w1".into(),
                    park: true,
                },
            ),
            (
                &["resume", "w1"],
                AdminRequest::Resume {
                    worker: "w1".into(),
                },
            ),
            (
                &["migrate", "w1", "cuda:0", "--carry-tokens", "0"],
                AdminRequest::Migrate {
                    worker: "w1".into(),
                    device: "cuda:0".into(),
                    carry_tokens: Some(0),
                },
            ),
            (
                &["reload", "w1", "--model-path", "new.gguf"],
                AdminRequest::Reload {
                    worker: "w1".into(),
                    model_path: Some("new.gguf".into()),
                },
            ),
            (
                &["scale", "smollm2", "3", "--device", "cpu:1"],
                AdminRequest::Scale {
                    model: "smollm2".into(),
                    workers: 3,
                    device: Some("cpu:1".into()),
                },
            ),
        ];
        for (argv, expected) in &cases {
            assert_eq!(&parse(argv).unwrap(), expected, "{argv:?}");
            assert_eq!(argv[0], variant(expected));
        }
        let reached: std::collections::BTreeSet<_> =
            cases.iter().map(|(_, request)| variant(request)).collect();
        assert_eq!(reached.len(), 6, "every variant has a case: {reached:?}");
        assert_eq!(
            parse(&["drain", "w1"]).unwrap(),
            AdminRequest::Drain {
                worker: "w1".into(),
                park: false
            }
        );
        assert!(parse(&["scale", "smollm2"]).is_err(), "workers is required");
        assert!(parse(&["frobnicate"]).is_err());
    }

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
                rss_bytes: 300 << 20,
            },
            last_seen_s: 0.2,
        };
        let table = workers_table(&[worker]);
        let row = table.lines().nth(1).unwrap();
        assert!(row.starts_with("w1"));
        assert!(row.contains("ready"));
        assert!(row.contains("25.0%"));
        assert!(row.ends_with("300 MiB"), "{row}");
        assert!(workers_table(&[]).contains("no workers"));
    }
}
