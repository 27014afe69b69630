//! With CURVE on, the authenticated tenant scopes cache namespaces and
//! per-client limits.

use super::*;

impl Harness {
    fn generate_as(&mut self, client: &str, tenant: &str, request: GenerateRequest) {
        let frame = encode(&ClientRequest::Generate(request)).unwrap();
        self.core.handle_client_as(
            self.now,
            &Addr::new(client.as_bytes()),
            Some(tenant),
            &frame,
        );
    }
}

#[test]
fn the_tenant_prefixes_every_namespace_so_no_client_reaches_another_tenants() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["m"], 8);
    h.sent();
    h.generate_as("a", "tenant:aaaa", prompt("1", "same prompt"));
    let mut spoof = prompt("2", "same prompt");
    // B names A's namespace outright; it still lands under B's tenant.
    spoof.namespace = Some("tenant:aaaa".into());
    h.generate_as("b", "tenant:bbbb", spoof);
    let mut own = prompt("3", "same prompt");
    own.namespace = Some("docs".into());
    h.generate_as("b", "tenant:bbbb", own);
    let mut empty = prompt("4", "same prompt");
    empty.namespace = Some(String::new());
    h.generate_as("a", "tenant:aaaa", empty);
    // Without a tenant (CURVE off) the namespace passes through as sent.
    let mut plain = prompt("5", "same prompt");
    plain.namespace = Some("tenant:aaaa".into());
    h.generate("c", plain);
    let namespaces: Vec<Option<String>> = h
        .dispatched()
        .into_iter()
        .map(|(_, _, request)| request.namespace)
        .collect();
    assert_eq!(
        namespaces,
        [
            Some("tenant:aaaa".to_string()),
            Some("tenant:bbbb/tenant:aaaa".to_string()),
            Some("tenant:bbbb/docs".to_string()),
            Some("tenant:aaaa".to_string()),
            Some("tenant:aaaa".to_string()),
        ]
    );
}

#[test]
fn a_namespace_too_long_once_prefixed_is_a_bad_request() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    h.ready("w1", &["m"], 8);
    h.sent();
    let max = RouterConfig::default().limits.max_name_bytes;
    let mut long = prompt("1", "x");
    long.namespace = Some("n".repeat(max));
    h.generate_as("a", "tenant:aaaa", long);
    let replies = h.client_replies();
    assert_eq!(error_code(&replies[0]), (Some("1"), ErrorCode::BadRequest));
    assert!(
        matches!(&replies[0], ClientReply::Error { message, .. } if message.contains("tenant")),
        "{replies:?}"
    );
}

#[test]
fn per_client_limits_follow_the_tenant_across_connections() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_client: Some(1),
        ..config(Policy::RoundRobin)
    });
    h.ready("w1", &["m"], 8);
    h.sent();
    h.generate_as("conn-1", "tenant:aaaa", prompt("1", "a"));
    let rid = h.dispatched()[0].1;
    // The same tenant on a new connection (a reconnect) is still at its limit.
    h.generate_as("conn-2", "tenant:aaaa", prompt("2", "b"));
    let replies = h.client_replies();
    assert_eq!(error_code(&replies[0]), (Some("2"), ErrorCode::Overloaded));
    // Another tenant is not.
    h.generate_as("conn-3", "tenant:bbbb", prompt("3", "c"));
    assert!(h.client_replies().is_empty());
    h.done("w1", rid, FinishReason::Stop);
    h.client_replies();
    h.generate_as("conn-2", "tenant:aaaa", prompt("4", "d"));
    assert!(
        h.client_replies().is_empty(),
        "its request ended: free again"
    );
}
