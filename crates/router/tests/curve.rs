//! CURVE on the router's real sockets: allow-lists per socket, refused
//! peers get nothing and are counted, and a client's key becomes the
//! tenant of its requests' cache namespace.

#[path = "support/http.rs"]
mod http;

use std::time::{Duration, Instant};

use http::http_get;

use zinfer_curve::{AllowList, ClientCurve, KeyPair};
use zinfer_protocol::{
    AdminReply, AdminRequest, ClientReply, ClientRequest, DoneBody, FinishReason, GenerateRequest,
    Limits, PROTOCOL_VERSION, ReadyBody, RouterToWorker, Timings, Usage, WorkerToRouter, decode,
    encode,
};
use zinfer_router::{CurveConfig, Router, RouterConfig, RouterError};

fn key() -> KeyPair {
    KeyPair::generate().expect("libzmq with CURVE")
}

fn list(keys: &[&KeyPair]) -> AllowList {
    keys.iter().map(|k| k.public()).collect()
}

/// A DEALER, CURVE client with `own` when given, connected to `endpoint`.
fn dealer(
    context: &zmq::Context,
    endpoint: &str,
    server: &KeyPair,
    own: Option<&KeyPair>,
) -> zmq::Socket {
    let socket = context.socket(zmq::DEALER).expect("dealer");
    socket.set_linger(0).expect("linger");
    if let Some(own) = own {
        let curve = ClientCurve {
            server: server.public(),
            own: own.clone(),
        };
        zinfer_curve::apply_client(&socket, Some(&curve)).expect("curve client");
    }
    socket.connect(endpoint).expect("connect");
    socket
}

fn recv_within<T: zinfer_protocol::WireMessage>(socket: &zmq::Socket, millis: i64) -> Option<T> {
    if socket.poll(zmq::POLLIN, millis).expect("poll") == 0 {
        return None;
    }
    let frame = socket.recv_bytes(0).expect("recv");
    Some(decode(&frame, &Limits::default()).expect("a valid message"))
}

fn ping(socket: &zmq::Socket, millis: i64) -> bool {
    let frame = encode(&ClientRequest::Ping {
        id: Some("p".into()),
    })
    .expect("encode");
    socket.send(frame, zmq::DONTWAIT).expect("send");
    matches!(
        recv_within::<ClientReply>(socket, millis),
        Some(ClientReply::Pong { .. })
    )
}

fn refusals(addr: std::net::SocketAddr, socket: &str) -> f64 {
    let response = http_get(addr, "/metrics");
    let series = format!("zinfer_router_auth_refusals_total{{socket=\"{socket}\"}} ");
    response
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
}

#[test]
fn allow_lists_admit_known_keys_refuse_others_and_tenants_scope_namespaces() {
    let (router_keys, alice, stranger, worker, admin) = (key(), key(), key(), key(), key());
    let config = RouterConfig {
        clients: "tcp://127.0.0.1:*".into(),
        workers: "tcp://127.0.0.1:*".into(),
        control: "tcp://127.0.0.1:*".into(),
        metrics: Some("127.0.0.1:0".parse().expect("address")),
        curve: Some(CurveConfig {
            keys: router_keys.clone(),
            clients: Some(list(&[&alice])),
            workers: list(&[&worker]),
            admins: list(&[&admin]),
        }),
        ..RouterConfig::default()
    };
    let router = Router::bind(config).expect("router binds");
    let endpoints = router.endpoints().clone();
    let metrics = endpoints.metrics.expect("metrics on");
    let (shutdown, receiver) = crossbeam_channel::bounded(1);
    let thread = std::thread::spawn(move || router.serve(receiver));
    let context = zmq::Context::new();

    let client = dealer(&context, &endpoints.clients, &router_keys, Some(&alice));
    assert!(ping(&client, 5_000), "an allowed client is answered");

    let before = refusals(metrics, "clients");
    let unknown = dealer(&context, &endpoints.clients, &router_keys, Some(&stranger));
    assert!(!ping(&unknown, 500), "an unknown key gets nothing");
    let plain = context.socket(zmq::DEALER).expect("dealer");
    plain.set_linger(0).expect("linger");
    plain.connect(&endpoints.clients).expect("connect");
    assert!(!ping(&plain, 500), "a plaintext client gets nothing");
    assert!(
        refusals(metrics, "clients") >= before + 2.0,
        "both refusals counted"
    );

    // Control: only the admin key.
    let workers = encode(&AdminRequest::Workers {}).expect("encode");
    let outsider = dealer(&context, &endpoints.control, &router_keys, Some(&alice));
    outsider.send(&workers[..], 0).expect("send");
    assert!(recv_within::<AdminReply>(&outsider, 500).is_none());
    let admin_socket = dealer(&context, &endpoints.control, &router_keys, Some(&admin));
    admin_socket.send(&workers[..], 0).expect("send");
    assert!(recv_within::<AdminReply>(&admin_socket, 5_000).is_some());
    assert!(refusals(metrics, "control") >= 1.0);

    // A worker with an allowed key registers and sees the tenant namespace.
    let back = dealer(&context, &endpoints.workers, &router_keys, Some(&worker));
    back.set_identity(b"w1").expect("identity");
    let ready = WorkerToRouter::Ready(ReadyBody {
        worker_id: "w1".into(),
        protocol: PROTOCOL_VERSION,
        models: vec!["m".into()],
        device: "cpu".into(),
        kv_capacity: 1 << 20,
        max_batch: 8,
        context_length: None,
        vocab_size: None,
        import_endpoint: None,
        import_key: None,
    });
    back.send(encode(&ready).expect("encode"), 0).expect("send");
    let mut request = GenerateRequest::from_prompt("g1", "hi");
    request.namespace = Some("docs".into());
    let start = Instant::now();
    let forwarded = loop {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the worker never got the request"
        );
        client
            .send(
                encode(&ClientRequest::Generate(request.clone())).expect("encode"),
                0,
            )
            .expect("send");
        match recv_within::<RouterToWorker>(&back, 200) {
            Some(RouterToWorker::Generate { rid, request }) => break (rid, request),
            _ => {
                // Not registered yet: the client got `unavailable`; drain it.
                while recv_within::<ClientReply>(&client, 0).is_some() {}
            }
        }
    };
    let (rid, forwarded) = forwarded;
    assert_eq!(
        forwarded.namespace,
        Some(format!("{}/docs", alice.public().tenant()))
    );
    let done = WorkerToRouter::Done {
        rid,
        body: DoneBody::new(FinishReason::Stop, Usage::default(), Timings::default()),
    };
    back.send(encode(&done).expect("encode"), 0).expect("send");
    let reply = loop {
        match recv_within::<ClientReply>(&client, 5_000) {
            Some(ClientReply::Done { id, .. }) if id == "g1" => break id,
            Some(_) => continue,
            None => panic!("no done for g1"),
        }
    };
    assert_eq!(reply, "g1");

    shutdown.send(()).expect("router alive");
    thread.join().expect("no panic").expect("clean stop");
}

#[test]
fn a_control_socket_off_loopback_needs_curve() {
    let config = RouterConfig {
        clients: "tcp://127.0.0.1:*".into(),
        workers: "tcp://127.0.0.1:*".into(),
        control: "tcp://0.0.0.0:*".into(),
        metrics: None,
        ..RouterConfig::default()
    };
    match Router::bind(config) {
        Err(err @ RouterError::ControlExposed { .. }) => {
            let message = err.to_string();
            assert!(
                message.contains("--curve-key") && message.contains("--admin-keys"),
                "{message}"
            );
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("an exposed control socket was bound"),
    }
}
