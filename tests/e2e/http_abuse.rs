//! The HTTP front under load and abuse, with a real router, worker and
//! TCP clients: bad bodies, slow senders, clients that stop reading, and
//! a thousand SSE streams at once.
//!
//! The figures (memory and CPU per stream, a normal client's TTFT and ITL
//! with and without the abusers) are printed; run with `--nocapture` to
//! see them. The assertions are what must hold on any machine.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::harness::{self, Cluster, HttpFront};

/// `POST path` with raw `body` bytes; the status and the body.
fn post_raw(addr: &str, path: &str, body: &[u8]) -> (u16, String) {
    harness::http_post_bytes(addr, path, body, Duration::from_secs(60))
}

/// Resident memory of process `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which may hold spaces, in parentheses.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // utime and stime count USER_HZ ticks: 100 a second on Linux.
    ticks / 100.0
}

/// The `error` object of an OpenAI-shaped error body.
fn error_of(body: &str) -> serde_json::Value {
    let value: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    value["error"].clone()
}

/// A chat body with `field` set to `value`.
fn chat_with(field: &str, value: serde_json::Value) -> String {
    let mut body = serde_json::json!({
        "model": "smol",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    });
    body[field] = value;
    body.to_string()
}

/// Every chat field with a value of the wrong type.
fn wrong_types() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        ("model", json!(5)),
        ("messages", json!("hello")),
        ("max_tokens", json!("many")),
        ("max_completion_tokens", json!([1])),
        ("temperature", json!("hot")),
        ("top_p", json!([])),
        ("top_k", json!({})),
        ("min_p", json!("x")),
        ("repetition_penalty", json!(true)),
        ("seed", json!("x")),
        ("stop", json!(5)),
        ("stop_token_ids", json!("x")),
        ("ignore_eos", json!("yes")),
        ("n", json!("two")),
        ("stream", json!("yes")),
        ("stream_options", json!(5)),
        ("logprobs", json!("yes")),
        ("top_logprobs", json!("x")),
        ("presence_penalty", json!("x")),
        ("frequency_penalty", json!({})),
        ("logit_bias", json!(5)),
        ("user", json!(5)),
        ("tools", json!(5)),
        ("tool_choice", json!(5)),
        ("parallel_tool_calls", json!("x")),
        ("response_format", json!(5)),
        ("chat_template_kwargs", json!(5)),
        ("metadata", json!(5)),
        ("priority", json!("high")),
        ("speculative", json!(5)),
        ("keep_alive", json!([])),
    ]
}

#[test]
fn bad_bodies_get_a_clear_4xx_and_leave_memory_flat() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = harness::http_front(&cluster);
    let addr = front.addr.as_str();
    let chat = "/v1/chat/completions";

    let (status, body) = post_raw(addr, chat, &vec![b' '; 3 << 20]);
    assert_eq!(status, 413, "{body}");
    assert_eq!(error_of(&body)["code"], "request_too_large", "{body}");

    let mut invalid = br#"{"model": "smol", "messages": [{"role": "user", "content": "#.to_vec();
    invalid.extend_from_slice(b"\"\xff\xfe\"}]}");
    let (status, body) = post_raw(addr, chat, &invalid);
    assert_eq!(status, 400, "{body}");
    assert!(
        error_of(&body)["message"]
            .as_str()
            .unwrap()
            .contains("JSON"),
        "{body}"
    );

    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let (status, body) = post_raw(addr, chat, nested.as_bytes());
    assert_eq!(status, 400, "{body}");
    let nested_object = format!(
        r#"{{"model": "smol", "messages": [{{"role": "user", "content": "hi"}}], "metadata": {}1{}}}"#,
        "{\"a\":".repeat(5_000),
        "}".repeat(5_000)
    );
    let (status, body) = post_raw(addr, chat, nested_object.as_bytes());
    assert_eq!(status, 400, "{body}");

    for (field, value) in wrong_types() {
        let (status, body) = post_raw(addr, chat, chat_with(field, value.clone()).as_bytes());
        assert!(
            (400..500).contains(&status),
            "{field} = {value}: {status} {body}"
        );
        let error = error_of(&body);
        let named = error["param"] == field
            || error["message"]
                .as_str()
                .is_some_and(|message| message.contains(field));
        assert!(named, "{field} = {value}: the error names no field: {body}");
    }

    // A good request still works after all that.
    let (status, body) = post_raw(addr, chat, chat_with("max_tokens", 2.into()).as_bytes());
    assert_eq!(status, 200, "{body}");

    // Memory: thousands of bad bodies (most near the size limit) later,
    // the process holds what it held.
    let big_bad = {
        let mut body = br#"{"model": "smol", "messages": [{"role": "user", "content": ""#.to_vec();
        body.extend(std::iter::repeat_n(b'a', (2 << 20) - 200));
        body.extend_from_slice(b"\x01\"}]}");
        body
    };
    let rounds = |n: usize| {
        for i in 0..n {
            let body: Vec<u8> = match i % 4 {
                0 => big_bad.clone(),
                1 => nested.clone().into_bytes(),
                2 => invalid.clone(),
                _ => {
                    let (field, value) = &wrong_types()[i % wrong_types().len()];
                    chat_with(field, value.clone()).into_bytes()
                }
            };
            let (status, _) = post_raw(addr, chat, &body);
            assert!((400..500).contains(&status), "round {i}: {status}");
        }
    };
    rounds(200);
    let before = rss(front.pid());
    let started = Instant::now();
    rounds(2_000);
    let after = rss(front.pid());
    eprintln!(
        "bad bodies: 2,000 in {:.1} s; zinfer http resident {:.1} MiB before, {:.1} MiB after",
        started.elapsed().as_secs_f64(),
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    assert!(
        after < before + (16 << 20),
        "resident memory grew from {before} to {after} bytes"
    );
}

/// Streams one chat completion; (time to first token, gaps between the
/// later tokens) in seconds.
fn timed_stream(front: &HttpFront, max_tokens: u32) -> (f64, Vec<f64>) {
    let body = serde_json::json!({
        "model": "smol",
        "messages": [{"role": "user", "content": "Count from one to twenty in words."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "ignore_eos": true,
    })
    .to_string();
    let mut stream = TcpStream::connect(&front.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let started = Instant::now();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = String::new();
    let mut arrivals = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer).unwrap_or(0);
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buffer[..n]);
        let at = started.elapsed().as_secs_f64();
        arrivals.extend(std::iter::repeat_n(
            at,
            text.matches("\"content\":\"").count(),
        ));
        seen.push_str(&text);
        if seen.contains("data: [DONE]") {
            break;
        }
    }
    assert!(
        seen.contains("data: [DONE]"),
        "the stream ended early: {seen}"
    );
    // A chunk can carry more than one token (a character split across
    // tokens waits for its last byte), so count loosely.
    assert!(arrivals.len() >= max_tokens as usize / 2, "{seen}");
    let gaps = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    (arrivals[0], gaps)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// TTFT and ITL medians of `rounds` streamed requests of 32 tokens.
fn normal_client(front: &HttpFront, rounds: usize) -> (f64, f64) {
    let mut ttfts = Vec::new();
    let mut gaps = Vec::new();
    for _ in 0..rounds {
        let (ttft, itl) = timed_stream(front, 32);
        ttfts.push(ttft);
        gaps.extend(itl);
    }
    (median(ttfts), median(gaps))
}

#[test]
fn slow_senders_are_cut_off_and_stalled_readers_do_not_slow_a_normal_client() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = harness::http_front_for(
        &cluster.clients,
        &["--served-model-name", "smol", "--header-timeout", "2"],
    );
    let (ttft_alone, itl_alone) = normal_client(&front, 5);

    // 100 slow senders: headers a byte every 200 ms, never finished.
    let opened = Instant::now();
    let slow: Vec<std::thread::JoinHandle<Option<Duration>>> = (0..100)
        .map(|_| {
            let addr = front.addr.clone();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(&addr).ok()?;
                stream
                    .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                    .ok()?;
                stream
                    .set_read_timeout(Some(Duration::from_millis(200)))
                    .ok()?;
                let started = Instant::now();
                let mut answer = [0u8; 256];
                while started.elapsed() < Duration::from_secs(20) {
                    // One more header byte; a closed connection refuses it
                    // or reads as EOF (or as a last answer).
                    if stream.write_all(b"X").is_err() {
                        return Some(started.elapsed());
                    }
                    if let Ok(_answered_or_closed) = stream.read(&mut answer) {
                        return Some(started.elapsed());
                    }
                }
                None
            })
        })
        .collect();

    // 100 clients that send a streamed request and never read a byte.
    let stalled: Vec<TcpStream> = (0..100)
        .map(|i| {
            let body = serde_json::json!({
                "model": "smol",
                "messages": [{"role": "user", "content": format!("Tell story {i}.")}],
                "max_tokens": 16,
                "stream": true,
            })
            .to_string();
            let mut stream = TcpStream::connect(&front.addr).unwrap();
            write!(
                stream,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            stream
        })
        .collect();
    // Their tokens are generated (nobody reads them); the front holds them.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let page = harness::scrape(&cluster.router_metrics);
        let ended: f64 = page
            .lines()
            .filter(|line| line.starts_with("zinfer_router_requests_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if ended >= 105.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stalled readers' requests never ended"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let (ttft_abused, itl_abused) = normal_client(&front, 5);
    eprintln!(
        "normal client alone: TTFT p50 {:.1} ms, ITL p50 {:.2} ms; beside 100 slow senders and \
         100 stalled readers: TTFT p50 {:.1} ms, ITL p50 {:.2} ms",
        ttft_alone * 1e3,
        itl_alone * 1e3,
        ttft_abused * 1e3,
        itl_abused * 1e3
    );

    let cut: Vec<Option<Duration>> = slow.into_iter().map(|h| h.join().unwrap()).collect();
    let cut_off = cut.iter().filter(|c| c.is_some()).count();
    assert_eq!(cut_off, 100, "every slow sender is cut off: {cut:?}");
    let latest = cut.iter().flatten().max().copied().unwrap_or_default();
    assert!(
        latest < Duration::from_secs(12),
        "cut off {latest:?} after sending (header timeout 2 s); opened {:?} ago",
        opened.elapsed()
    );
    drop(stalled);
    // The front is still whole: a last request is answered.
    let (status, body) = post_raw(
        &front.addr,
        "/v1/chat/completions",
        chat_with("max_tokens", 2.into()).as_bytes(),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_thousand_sse_streams_at_once_all_complete() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = harness::http_front(&cluster);
    let streams = 1_000;
    let before_rss = rss(front.pid());
    let before_cpu = cpu_seconds(front.pid());
    let pid = front.pid();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before_rss));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss(pid), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let started = Instant::now();
    let outcomes: Vec<Result<usize, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..streams)
            .map(|i| {
                let addr = front.addr.clone();
                std::thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(scope, move || -> Result<usize, String> {
                        let body = serde_json::json!({
                            "model": "smol",
                            "messages": [{"role": "user", "content": format!("Say {i}.")}],
                            "max_tokens": 4,
                            "ignore_eos": true,
                            "temperature": 0,
                            "stream": true,
                        })
                        .to_string();
                        let (status, text) = harness::http_post_bytes(
                            &addr,
                            "/v1/chat/completions",
                            body.as_bytes(),
                            Duration::from_secs(600),
                        );
                        if status != 200 || !text.contains("data: [DONE]") {
                            return Err(format!("{status}: {text}"));
                        }
                        Ok(text.matches("\"content\":\"").count())
                    })
                    .unwrap()
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = started.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {streams} failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    let chunks: usize = outcomes.iter().filter_map(|o| o.as_ref().ok()).sum();
    assert!(
        outcomes.iter().all(|o| o.as_ref().is_ok_and(|&n| n > 0)),
        "every stream carries text"
    );
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let cpu = cpu_seconds(front.pid()) - before_cpu;
    eprintln!(
        "{streams} concurrent SSE streams of 4 tokens ({chunks} text chunks): all complete in \
         {took:.1} s; zinfer http \
         resident {:.1} MiB before, {:.1} MiB peak ({:.1} KiB per stream), CPU {cpu:.2} s \
         ({:.2} ms per stream)",
        before_rss as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        peak.saturating_sub(before_rss) as f64 / 1024.0 / streams as f64,
        cpu * 1e3 / streams as f64
    );
}
