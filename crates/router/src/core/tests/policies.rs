//! Routing policies: round robin, least load, cache aware.

use super::*;

#[test]
fn round_robin_spreads_requests() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    for worker in ["w1", "w2", "w3"] {
        h.ready(worker, &["m"], 8);
    }
    for i in 0..6 {
        h.generate("c", prompt(&i.to_string(), "same prompt"));
    }
    let workers: Vec<String> = h.dispatched().into_iter().map(|d| d.0).collect();
    assert_eq!(workers, ["w1", "w2", "w3", "w1", "w2", "w3"]);
    assert_eq!(h.decisions("round_robin"), 6);
}

#[test]
fn least_load_counts_inflight_and_reported_waiting() {
    let mut h = Harness::new(config(Policy::LeastLoad));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    h.worker(
        "w1",
        &WorkerToRouter::Load(LoadReport {
            waiting: 3,
            ..LoadReport::default()
        }),
    );
    for i in 0..3 {
        h.generate("c", prompt(&i.to_string(), "p"));
    }
    let workers: Vec<String> = h.dispatched().into_iter().map(|d| d.0).collect();
    assert_eq!(workers, ["w2", "w2", "w2"]);
    h.generate("c", prompt("4", "p"));
    assert_eq!(h.dispatched()[0].0, "w1", "ties go to the first registered");
    assert_eq!(h.metrics.waiting.get(), 3);
}

#[test]
fn cache_aware_sticks_to_the_worker_holding_the_prefix() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    let system = "You are a helpful assistant. Answer briefly and cite sources. ";
    h.generate("c", prompt("a", &format!("{system}What is Rust?")));
    let first = h.dispatched()[0].0.clone();
    h.generate(
        "c",
        prompt("b", "Completely different prompt about cooking"),
    );
    let other = h.dispatched()[0].0.clone();
    assert_ne!(first, other, "a miss goes to the least loaded worker");
    for i in 0..4 {
        h.generate(
            "c",
            prompt(&format!("q{i}"), &format!("{system}Question {i}?")),
        );
        assert_eq!(h.dispatched()[0].0, first, "shared prefix sticks");
    }
    assert_eq!(h.decisions("cache_hit"), 4);
    assert_eq!(h.decisions("cache_miss"), 2);
}

#[test]
fn cache_aware_matches_chat_messages_and_separates_namespaces() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["m"], 8);
    h.ready("w2", &["m"], 8);
    let chat = |id: &str, question: &str, namespace: Option<&str>| {
        let mut request = prompt(id, "");
        request.prompt = None;
        request.namespace = namespace.map(str::to_string);
        request.messages = Some(vec![
            ChatMessage::new(
                "system",
                "A long shared system prompt that dominates the key.",
            ),
            ChatMessage::new("user", question),
        ]);
        request
    };
    h.generate("c", chat("1", "hi", Some("t1")));
    let first = h.dispatched()[0].0.clone();
    h.generate("c", chat("2", "hello", Some("t1")));
    assert_eq!(h.dispatched()[0].0, first);
    h.generate("c", chat("3", "hello", Some("t2")));
    assert_ne!(
        h.dispatched()[0].0,
        first,
        "other namespace: no match, least loaded"
    );
}

#[test]
fn cache_aware_falls_back_to_least_load_when_imbalanced() {
    let mut h = Harness::new(RouterConfig {
        balance_abs: 2,
        balance_rel: 1.5,
        ..config(Policy::CacheAware)
    });
    h.ready("w1", &["m"], 16);
    h.ready("w2", &["m"], 16);
    let shared = "shared prefix shared prefix shared prefix ";
    h.generate("c", prompt("0", &format!("{shared}0")));
    let hot = h.dispatched()[0].0.clone();
    let mut routed = Vec::new();
    for i in 1..6 {
        h.generate("c", prompt(&i.to_string(), &format!("{shared}{i}")));
        routed.push(h.dispatched()[0].0.clone());
    }
    // Loads: the hot worker takes requests until it leads by more than 2.
    assert_eq!(routed[..2], [hot.clone(), hot.clone()]);
    assert_ne!(routed[2], hot, "imbalance sends to the least loaded");
    assert!(h.decisions("balance") >= 1);
}
