//! Feeds arbitrary request bodies to the OpenAI front's translation of
//! `/v1/completions`, `/v1/chat/completions` and `/v1/embeddings`.
//!
//! Properties: translation never panics; a refusal is a 4xx; a request it
//! accepts passes the router's own checks (it encodes, and decodes under
//! the same limits), so the front never forwards what the router refuses.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zinfer_http::translate::{self, Context};
use zinfer_protocol::{ClientRequest, GenerateRequest, Limits, decode, encode};

fuzz_target!(|body: &[u8]| {
    let limits = Limits::default();
    let ctx = Context {
        id: "fuzz",
        alias: Some("served"),
        limits: &limits,
    };
    for translated in [translate::completion(body, ctx), translate::chat(body, ctx)] {
        match translated {
            Ok(translated) => on_the_wire(translated.request, &limits),
            Err(error) => assert!(error.status().is_client_error(), "{error:?}"),
        }
    }
    match zinfer_http::embeddings::request(body, ctx) {
        Ok(_) => {}
        Err(error) => assert!(error.status().is_client_error(), "{error:?}"),
    }
});

fn on_the_wire(request: GenerateRequest, limits: &Limits) {
    let frame = encode(&ClientRequest::Generate(request)).expect("a translated request encodes");
    if let Err(error) = decode::<ClientRequest>(&frame, limits) {
        panic!("the router would refuse a translated request: {error}");
    }
}
