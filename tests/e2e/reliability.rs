//! Reliability: an idle router sleeps, worker ids do not collide, and a
//! client without a router says so quickly.

use std::time::{Duration, Instant};

use crate::harness::{self, Cluster};

/// User plus system CPU time of process `pid` so far, from /proc/PID/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the parenthesised command name, which may hold spaces.
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // In USER_HZ, which Linux fixes at 100 per second on every
    // architecture zinfer builds for.
    Duration::from_millis(ticks * 10)
}

#[test]
fn an_idle_router_with_a_worker_uses_almost_no_cpu() {
    let cluster = Cluster::start("cache_aware", 1);
    let pid = cluster.router_pid();
    // Let registration traffic settle, then measure a quiet stretch.
    std::thread::sleep(Duration::from_millis(500));
    let window = Duration::from_secs(5);
    let (cpu_before, start) = (cpu_time(pid), Instant::now());
    std::thread::sleep(window);
    let used = cpu_time(pid).saturating_sub(cpu_before);
    let share = used.as_secs_f64() / start.elapsed().as_secs_f64();
    eprintln!(
        "idle router: {used:?} CPU in {window:?} ({:.2}% of a core)",
        share * 100.0
    );
    assert!(
        share < 0.03,
        "an idle router used {:.1}% of a core",
        share * 100.0
    );
    // The models reply carries what the worker reported of its model.
    let client = cluster.client();
    client.send(&zinfer_protocol::ClientRequest::Models { id: None });
    match client.recv(Duration::from_secs(5)) {
        Some(zinfer_protocol::ClientReply::Models { models, .. }) => {
            assert_eq!(models[0].context_length, Some(8192), "{models:?}");
            assert_eq!(models[0].vocab_size, Some(49152), "{models:?}");
        }
        other => panic!("expected models, got {other:?}"),
    }
    // Sleeping between timers still heartbeats: the worker stays ready.
    let info = cluster.worker_info("w0").expect("worker w0 listed");
    assert_eq!(info.state, zinfer_protocol::WorkerState::Ready, "{info:?}");
    assert!(info.last_seen_s < 1.5, "{info:?}");
}

#[test]
fn generate_without_a_router_says_so_within_seconds() {
    let endpoint = format!("tcp://127.0.0.1:{}", harness::free_port());
    let start = Instant::now();
    let output = std::process::Command::new(harness::zinfer())
        .args(["generate", "--router", &endpoint, "Hello"])
        .output()
        .expect("running zinfer generate");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("no reply from {endpoint}"))
            && stderr.contains("is the router running?"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
}
