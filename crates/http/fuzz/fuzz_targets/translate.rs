//! Feeds arbitrary request bodies to the HTTP front's translation of
//! `/v1/completions`, `/v1/chat/completions`, `/v1/embeddings`,
//! `/v1/responses` and Anthropic's `/v1/messages`.
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
    let messages = zinfer_http::anthropic::request(body, ctx, false).map(|m| m.translated);
    let responses = zinfer_http::responses::request(body, ctx, |_| None).map(|r| r.translated);
    for translated in [
        translate::completion(body, ctx),
        translate::chat(body, ctx),
        messages,
        responses,
    ] {
        match translated {
            Ok(translated) => {
                for request in translated.requests() {
                    on_the_wire(request, &limits);
                }
            }
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
