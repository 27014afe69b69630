//! Feeds arbitrary frames to the decoder of every socket direction.
//!
//! Properties: `decode` never panics; a frame that decodes re-encodes to a
//! frame that decodes again and re-encodes to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zinfer_protocol::{
    AdminReply, AdminRequest, ClientReply, ClientRequest, Limits, RouterToWorker, WireMessage,
    WorkerToRouter, decode, encode,
};

fuzz_target!(|frame: &[u8]| {
    let tight = Limits {
        max_depth: 3,
        max_prompt_bytes: 8,
        max_prompt_items: 2,
        max_stop: 1,
        max_stop_bytes: 2,
        max_stop_token_ids: 1,
        max_tokens_cap: 10,
        max_name_bytes: 4,
        ..Limits::default()
    };
    for limits in [Limits::default(), tight] {
        check::<ClientRequest>(frame, &limits);
        check::<ClientReply>(frame, &limits);
        check::<RouterToWorker>(frame, &limits);
        check::<WorkerToRouter>(frame, &limits);
        check::<AdminRequest>(frame, &limits);
        check::<AdminReply>(frame, &limits);
    }
});

fn check<T: WireMessage>(frame: &[u8], limits: &Limits) {
    let Ok(message) = decode::<T>(frame, limits) else {
        return;
    };
    let again = encode(&message).expect("a decoded message must encode");
    // Defaults left out of the input are written out, so the frame may grow.
    let unbounded = Limits {
        max_frame_bytes: usize::MAX,
        ..limits.clone()
    };
    let reread = decode::<T>(&again, &unbounded).expect("a re-encoded message must decode");
    assert_eq!(
        encode(&reread).expect("encode"),
        again,
        "re-encoding is not stable"
    );
}
