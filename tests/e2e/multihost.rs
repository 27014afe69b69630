//! Router and workers on separate "hosts": each in its own network
//! namespace, joined by veth links, so cutting a link drops packets the way
//! a failed switch port does (no RST, no FIN; only heartbeats notice).
//!
//! Needs root (or CAP_NET_ADMIN) and `ip` from iproute2. Where namespaces
//! cannot be made, the test says so on stderr and skips only itself.

use std::process::Command;
use std::time::{Duration, Instant};

use zinfer_protocol::{ClientReply, ClientRequest, DoneBody, ErrorCode};

use crate::harness::{self, Proc};

/// Ports inside the router's namespace: nothing else lives there.
const CLIENTS_PORT: u16 = 5555;
const WORKERS_PORT: u16 = 5556;
const METRICS_PORT: u16 = 9100;

/// Runs `ip ARGS`; the error names the command and what `ip` said.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running `ip`: {e} (install iproute2)"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Three namespaces (router, worker a, worker b) and the test's own
/// namespace, linked point to point:
/// test 10.213.0.1 <-> 10.213.0.2 router 10.213.1.1 <-> 10.213.1.2 a,
/// router 10.213.2.1 <-> 10.213.2.2 b. Removed on drop.
struct Hosts {
    router: String,
    a: String,
    b: String,
    /// The test's end of its link to the router.
    uplink: String,
}

impl Hosts {
    fn create() -> Result<Hosts, String> {
        let tag = std::process::id() % 100_000;
        let hosts = Hosts {
            router: format!("zi{tag}r"),
            a: format!("zi{tag}a"),
            b: format!("zi{tag}b"),
            uplink: format!("zi{tag}t"),
        };
        hosts.build().inspect_err(|_| drop(hosts.teardown()))?;
        Ok(hosts)
    }

    fn build(&self) -> Result<(), String> {
        for ns in [&self.router, &self.a, &self.b] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        let up = format!("{}r", self.uplink);
        ip(&[
            "link",
            "add",
            &self.uplink,
            "type",
            "veth",
            "peer",
            "name",
            &up,
            "netns",
            &self.router,
        ])?;
        ip(&["addr", "add", "10.213.0.1/24", "dev", &self.uplink])?;
        ip(&["link", "set", &self.uplink, "up"])?;
        ip(&[
            "-n",
            &self.router,
            "addr",
            "add",
            "10.213.0.2/24",
            "dev",
            &up,
        ])?;
        ip(&["-n", &self.router, "link", "set", &up, "up"])?;
        for (worker, net) in [(&self.a, 1), (&self.b, 2)] {
            let (near, far) = (format!("{worker}x"), format!("{worker}y"));
            ip(&[
                "-n",
                &self.router,
                "link",
                "add",
                &near,
                "type",
                "veth",
                "peer",
                "name",
                &far,
                "netns",
                worker,
            ])?;
            ip(&[
                "-n",
                &self.router,
                "addr",
                "add",
                &format!("10.213.{net}.1/24"),
                "dev",
                &near,
            ])?;
            ip(&["-n", &self.router, "link", "set", &near, "up"])?;
            ip(&[
                "-n",
                worker,
                "addr",
                "add",
                &format!("10.213.{net}.2/24"),
                "dev",
                &far,
            ])?;
            ip(&["-n", worker, "link", "set", &far, "up"])?;
        }
        Ok(())
    }

    /// Takes worker `ns`'s link down (`up = false`) or back up, on the
    /// router's side: packets are dropped silently.
    fn set_link(&self, ns: &str, up: bool) {
        let near = format!("{ns}x");
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.router, "link", "set", &near, state])
            .unwrap_or_else(|e| panic!("setting {near} {state}: {e}"));
    }

    fn teardown(&self) -> Result<(), String> {
        let _ = ip(&["link", "del", &self.uplink]);
        for ns in [&self.router, &self.a, &self.b] {
            let _ = ip(&["netns", "del", ns]);
        }
        Ok(())
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// `zinfer ARGS` inside namespace `ns`.
fn spawn_in(ns: &str, name: &str, args: &[&str]) -> Proc {
    let mut full = vec!["netns", "exec", ns, harness::zinfer()];
    full.extend_from_slice(args);
    let child = Command::new("ip")
        .args(&full)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name} in {ns}: {e}"));
    Proc { child }
}

fn ready_workers(metrics: &str) -> Option<f64> {
    let page = harness::try_scrape(metrics)?;
    page.lines()
        .find(|l| l.starts_with("zinfer_router_workers{state=\"ready\"}"))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
}

fn wait_for_ready(metrics: &str, n: f64, within: Duration) -> Duration {
    let start = Instant::now();
    while ready_workers(metrics) != Some(n) {
        assert!(
            start.elapsed() < within,
            "the router did not show {n} ready workers within {within:?} (now {:?})",
            ready_workers(metrics)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

fn stream(id: &str) -> ClientRequest {
    let mut request = harness::greedy(id, "Count slowly: 1, 2, 3, 4,", 400);
    request.ignore_eos = true;
    request.stream = true;
    ClientRequest::Generate(request)
}

#[test]
fn cutting_one_hosts_link_ends_its_requests_and_spares_the_other() {
    let _guard = harness::exclusive();
    let hosts = match Hosts::create() {
        Ok(hosts) => hosts,
        Err(why) => {
            eprintln!(
                "\n*** SKIPPED multihost::cutting_one_hosts_link_ends_its_requests_and_spares_the_other: \
                 network namespaces cannot be made here ({why}); it needs root or CAP_NET_ADMIN \
                 and iproute2 ***\n"
            );
            return;
        }
    };
    let model = harness::model_path().display().to_string();
    let _router = spawn_in(
        &hosts.router,
        "router",
        &[
            "router",
            "--clients",
            &format!("tcp://10.213.0.2:{CLIENTS_PORT}"),
            "--workers",
            &format!("tcp://*:{WORKERS_PORT}"),
            "--control",
            "tcp://127.0.0.1:5557",
            "--metrics",
            &format!("10.213.0.2:{METRICS_PORT}"),
            "--policy",
            "round_robin",
        ],
    );
    let worker = |ns: &str, net: u8, id: &str| {
        spawn_in(
            ns,
            id,
            &[
                "worker",
                "--router",
                &format!("tcp://10.213.{net}.1:{WORKERS_PORT}"),
                "--model",
                &model,
                "--id",
                id,
                "--threads",
                "1",
                "--kv-tokens",
                "4096",
            ],
        )
    };
    let _a = worker(&hosts.a, 1, "host-a");
    let _b = worker(&hosts.b, 2, "host-b");
    let metrics = format!("10.213.0.2:{METRICS_PORT}");
    wait_for_ready(&metrics, 2.0, Duration::from_secs(120));

    let client = harness::Client::connect(&format!("tcp://10.213.0.2:{CLIENTS_PORT}"));
    let ids = ["s0", "s1", "s2", "s3"];
    for id in ids {
        client.send(&stream(id));
    }
    // Round robin put two streams on each host; wait until all four stream.
    let mut first_chunk = std::collections::HashSet::new();
    let started = Instant::now();
    while first_chunk.len() < ids.len() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "streams never started"
        );
        if let Some(ClientReply::Chunk { id, .. }) = client.recv(Duration::from_secs(1)) {
            first_chunk.insert(id);
        }
    }

    hosts.set_link(&hosts.a, false);
    let cut = Instant::now();
    let detected = wait_for_ready(&metrics, 1.0, Duration::from_secs(15));
    eprintln!("multihost: host-a's cut link detected after {detected:?}");

    // While host-a is cut off, new work goes to host-b and is served.
    let fresh = client_request_done(&client, "fresh");
    let mut ended = fresh.1;
    assert_eq!(fresh.0, "host-b", "new work after the cut goes to host-b");

    // host-a's streams end with worker_lost; host-b's keep streaming until
    // they finish or are cancelled, and end once.
    let lost = |ended: &[(String, Option<String>)]| -> Vec<String> {
        ended
            .iter()
            .filter(|(_, code)| code.as_deref() == Some("worker_lost"))
            .map(|(id, _)| id.clone())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while lost(&ended).len() < 2 && Instant::now() < deadline {
        if let Some(reply) = client.recv(Duration::from_millis(500)) {
            record_end(&reply, &mut ended);
        }
    }
    let lost = lost(&ended);
    assert_eq!(
        lost.len(),
        2,
        "host-a's two streams end with worker_lost: {ended:?}"
    );
    eprintln!(
        "multihost: host-a's streams ended {:?} after the cut",
        cut.elapsed()
    );

    hosts.set_link(&hosts.a, true);
    let back = wait_for_ready(&metrics, 2.0, Duration::from_secs(30));
    eprintln!("multihost: host-a ready again {back:?} after its link came back");

    for id in ids {
        client.send(&ClientRequest::Cancel { id: id.into() });
    }
    let linger = Instant::now() + Duration::from_secs(3);
    while Instant::now() < linger {
        if let Some(reply) = client.recv(Duration::from_millis(200)) {
            record_end(&reply, &mut ended);
        }
    }
    for id in ids {
        let endings = ended.iter().filter(|(e, _)| e == id).count();
        assert_eq!(endings, 1, "{id} ended exactly once: {ended:?}");
    }
}

/// Sends a short request and waits for its `done`, recording any other
/// request's ending seen meanwhile. Returns the serving worker.
fn client_request_done(
    client: &harness::Client,
    id: &str,
) -> (String, Vec<(String, Option<String>)>) {
    client.send(&ClientRequest::Generate(harness::greedy(id, "Hello", 4)));
    let mut ended = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some(reply) = client.recv(Duration::from_millis(500)) else {
            continue;
        };
        match &reply {
            ClientReply::Done {
                id: done,
                body: DoneBody { worker, .. },
                ..
            } if done == id => {
                return (worker.clone().unwrap_or_default(), ended);
            }
            ClientReply::Error {
                id: Some(e), code, ..
            } if e == id => {
                panic!("{id} failed with {code:?} while host-b was up")
            }
            _ => record_end(&reply, &mut ended),
        }
    }
    panic!("{id} got no done within 60 s");
}

/// Adds a terminal reply to `ended` as (id, error code or `None` for done).
fn record_end(reply: &ClientReply, ended: &mut Vec<(String, Option<String>)>) {
    match reply {
        ClientReply::Done { id, .. } => ended.push((id.clone(), None)),
        ClientReply::Error {
            id: Some(id), code, ..
        } => {
            let code: ErrorCode = *code;
            ended.push((id.clone(), Some(code.as_str().to_string())));
        }
        _ => {}
    }
}
