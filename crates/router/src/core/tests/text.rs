//! Text requests: routed like `generate`, one reply each, and never left
//! waiting on a worker that is gone.

use super::*;
use zinfer_protocol::{TextResult, TokenizeRequest};

fn tokenize(id: &str, model: Option<&str>) -> ClientRequest {
    ClientRequest::Tokenize(TokenizeRequest {
        id: id.into(),
        model: model.map(String::from),
        content: "hello".into(),
        add_special: true,
        parse_special: true,
        with_pieces: false,
    })
}

/// Text requests sent to workers: (worker, rid, model).
fn text_dispatched(h: &mut Harness) -> Vec<(String, u64, Option<String>)> {
    h.sent()
        .into_iter()
        .filter_map(|out| match out {
            Out::Worker(to, RouterToWorker::Tokenize { rid, request }) => {
                Some((String::from_utf8(to).unwrap(), rid, request.model))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn routed_to_a_worker_of_the_model_and_answered_once() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["small"], 4);
    h.ready("w2", &["big"], 4);
    h.client("c", &tokenize("t1", Some("big")));
    let sent = text_dispatched(&mut h);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (worker, rid, model) = sent[0].clone();
    assert_eq!((worker.as_str(), model.as_deref()), ("w2", Some("big")));
    // A reply from a worker that does not run it is dropped.
    let answer = TextResult::Tokenized {
        tokens: vec![1, 2],
        pieces: None,
    };
    h.worker("w1", &answer.clone().to_worker_reply(rid));
    assert!(h.client_replies().is_empty());
    h.worker("w2", &answer.clone().to_worker_reply(rid));
    assert_eq!(
        h.client_replies(),
        [ClientReply::Tokenized {
            id: "t1".into(),
            tokens: vec![1, 2],
            pieces: None
        }]
    );
    // Answered: a second reply goes nowhere, and the id is free again.
    h.worker("w2", &answer.to_worker_reply(rid));
    assert!(h.client_replies().is_empty());
    h.client("c", &tokenize("t1", None));
    assert_eq!(text_dispatched(&mut h).len(), 1);
}

#[test]
fn unknown_model_duplicates_and_no_worker_are_errors() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.client("c", &tokenize("t0", None));
    let code = |replies: Vec<ClientReply>| match &replies[..] {
        [ClientReply::Error { code, id, .. }] => (*code, id.clone()),
        other => panic!("expected one error, got {other:?}"),
    };
    assert_eq!(
        code(h.client_replies()),
        (ErrorCode::Unavailable, Some("t0".into()))
    );
    h.ready("w1", &["m"], 4);
    h.client("c", &tokenize("t1", Some("nope")));
    assert_eq!(
        code(h.client_replies()),
        (ErrorCode::UnknownModel, Some("t1".into()))
    );
    h.client("c", &tokenize("t2", None));
    assert_eq!(text_dispatched(&mut h).len(), 1);
    h.client("c", &tokenize("t2", None));
    assert_eq!(
        code(h.client_replies()),
        (ErrorCode::BadRequest, Some("t2".into()))
    );
    // A worker's error ends it.
    h.client("c", &tokenize("t3", None));
    let rid = text_dispatched(&mut h)[0].1;
    h.worker(
        "w1",
        &WorkerToRouter::Error {
            rid,
            code: ErrorCode::BadRequest,
            message: "no".into(),
        },
    );
    assert_eq!(
        code(h.client_replies()),
        (ErrorCode::BadRequest, Some("t3".into()))
    );
}

#[test]
fn a_lost_worker_ends_its_text_requests() {
    let mut h = Harness::new(config(Policy::CacheAware));
    h.ready("w1", &["m"], 4);
    h.client("c", &tokenize("t1", None));
    assert_eq!(text_dispatched(&mut h).len(), 1);
    let now = h.now;
    h.core.handle_send_failure(
        now,
        &Peer::Worker(Addr::new(b"w1".to_vec())),
        SendFailure::Unreachable,
    );
    match &h.client_replies()[..] {
        [ClientReply::Error { code, id, .. }] => {
            assert_eq!((*code, id.as_deref()), (ErrorCode::WorkerLost, Some("t1")));
        }
        other => panic!("expected worker_lost, got {other:?}"),
    }
    assert_eq!(h.core.active_text_requests(), 0);
}
