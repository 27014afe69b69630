//! Per-client limits: requests in flight and generated tokens per second.

use super::*;

fn limited(inflight: Option<u32>, rate: Option<f64>) -> Harness {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_client: inflight,
        max_tokens_per_second_per_client: rate,
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.sent();
    h
}

#[test]
fn a_client_over_its_inflight_limit_is_overloaded_others_are_not() {
    let mut h = limited(Some(2), None);
    h.generate("greedy", prompt("1", "a"));
    let rid = h.dispatched()[0].1;
    h.generate("greedy", prompt("2", "b"));
    h.generate("greedy", prompt("3", "c"));
    let replies = h.client_replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(error_code(&replies[0]), (Some("3"), ErrorCode::Overloaded));
    assert!(
        matches!(&replies[0], ClientReply::Error { message, .. } if message.contains("in flight"))
    );
    // Another client is not affected.
    h.generate("polite", prompt("1", "d"));
    assert!(h.client_replies().is_empty());
    assert_eq!(
        h.metrics
            .client_limited
            .with_label_values(&["inflight"])
            .get(),
        1
    );
    assert_eq!(h.outcome("overloaded"), 1);
    // When one ends, the greedy client may send again.
    h.done("w1", rid, FinishReason::Stop);
    h.client_replies();
    h.generate("greedy", prompt("4", "e"));
    assert!(h.client_replies().is_empty());
    assert_eq!(h.core.active_requests(), 3);
}

#[test]
fn a_client_over_its_token_rate_waits_for_its_bucket_to_refill() {
    let mut h = limited(None, Some(10.0));
    h.generate("c", prompt("1", "a"));
    let rid = h.dispatched()[0].1;
    // 12 tokens relayed: more than the bucket's 10.
    for index in 0..12 {
        h.chunk("w1", rid, index, "x");
    }
    h.done("w1", rid, FinishReason::Length);
    h.client_replies();
    h.generate("c", prompt("2", "b"));
    let replies = h.client_replies();
    assert_eq!(error_code(&replies[0]), (Some("2"), ErrorCode::Overloaded));
    assert_eq!(
        h.metrics
            .client_limited
            .with_label_values(&["tokens_per_second"])
            .get(),
        1
    );
    // Another client has its own bucket.
    h.generate("d", prompt("1", "b"));
    assert!(h.client_replies().is_empty());
    // 0.3 s refills 3 tokens: the bucket is above zero again.
    h.advance(300);
    h.generate("c", prompt("3", "b"));
    assert!(h.client_replies().is_empty());
}

#[test]
fn idle_clients_are_forgotten() {
    let mut h = limited(Some(4), Some(10.0));
    h.generate("c", prompt("1", "a"));
    let rid = h.dispatched()[0].1;
    h.chunk("w1", rid, 0, "x");
    h.done("w1", rid, FinishReason::Stop);
    assert_eq!(h.core.quotas.len(), 1, "its bucket is still refilling");
    h.advance(1_000);
    assert!(h.core.quotas.is_empty());
}
