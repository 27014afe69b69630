//! Protocol replies to OpenAI response bodies and server-sent events. Pure:
//! the caller supplies the response id, the time and the replies.

use serde_json::{Value, json};
use zinfer_protocol::{ClientReply, FinishReason, Usage};

use crate::error::ApiError;

/// Which OpenAI endpoint a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// What every response and chunk of one request repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The response id (`cmpl-...` or `chatcmpl-...`).
    pub id: String,
    /// Unix seconds when the request arrived.
    pub created: u64,
    /// The model name echoed back.
    pub model: String,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

/// OpenAI's `finish_reason` for the protocol's.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Length | FinishReason::Deadline => "length",
    }
}

/// OpenAI's `usage` object, cached prompt tokens included.
pub fn usage(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    })
}

/// The whole (non-streaming) response.
pub fn full_response(meta: &Meta, text: &str, reason: FinishReason, used: &Usage) -> Value {
    let choice = match meta.endpoint {
        Endpoint::Completions => json!({
            "index": 0, "text": text, "logprobs": null,
            "finish_reason": finish_reason(reason),
        }),
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": finish_reason(reason),
        }),
    };
    let mut body = meta.envelope(false, json!([choice]));
    body["usage"] = usage(used);
    body
}

/// Turns the replies of one streamed request into SSE `data:` payloads:
/// text chunks, a last chunk with `finish_reason`, the usage chunk when
/// asked for, then `[DONE]`.
#[derive(Debug)]
pub struct StreamEncoder {
    meta: Meta,
    include_usage: bool,
    sent_role: bool,
    finished: bool,
}

/// The payload that ends every stream.
pub const DONE: &str = "[DONE]";

impl StreamEncoder {
    /// An encoder for one request.
    pub fn new(meta: Meta, include_usage: bool) -> Self {
        StreamEncoder {
            meta,
            include_usage,
            sent_role: false,
            finished: false,
        }
    }

    /// Whether the terminal reply has been encoded.
    pub fn finished(&self) -> bool {
        self.finished
    }

    fn chunk(&self, delta_text: Option<&str>, role: bool, reason: Option<FinishReason>) -> Value {
        let reason = reason.map(finish_reason);
        let choice = match self.meta.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": delta_text.unwrap_or(""), "logprobs": null,
                "finish_reason": reason,
            }),
            Endpoint::Chat => {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                }
                if let Some(text) = delta_text {
                    delta["content"] = json!(text);
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
        };
        let mut body = self.meta.envelope(true, json!([choice]));
        if self.include_usage {
            body["usage"] = Value::Null;
        }
        body
    }

    /// The payloads for one reply of this request (none for an empty text
    /// chunk after the first).
    pub fn on_reply(&mut self, reply: ClientReply) -> Vec<String> {
        if self.finished {
            return Vec::new();
        }
        let mut out = Vec::new();
        match reply {
            ClientReply::Chunk { text, .. } => {
                let role = self.meta.endpoint == Endpoint::Chat && !self.sent_role;
                if role || !text.is_empty() {
                    out.push(self.chunk(Some(&text), role, None).to_string());
                    self.sent_role = true;
                }
            }
            ClientReply::Done {
                finish_reason,
                usage: used,
                text,
                ..
            } => {
                let role = self.meta.endpoint == Endpoint::Chat && !self.sent_role;
                let text = text.filter(|t| !t.is_empty());
                if role || text.is_some() {
                    out.push(
                        self.chunk(Some(text.as_deref().unwrap_or("")), role, None)
                            .to_string(),
                    );
                }
                out.push(self.chunk(None, false, Some(finish_reason)).to_string());
                if self.include_usage {
                    let mut body = self.meta.envelope(true, json!([]));
                    body["usage"] = usage(&used);
                    out.push(body.to_string());
                }
                out.push(DONE.to_string());
                self.finished = true;
            }
            ClientReply::Error { code, message, .. } => {
                out.push(
                    ApiError::from_router(code, message, None)
                        .body()
                        .to_string(),
                );
                out.push(DONE.to_string());
                self.finished = true;
            }
            ClientReply::Models { .. } | ClientReply::Pong { .. } => {}
        }
        out
    }

    /// The payloads for a failure of the front itself mid-stream.
    pub fn on_error(&mut self, error: &ApiError) -> Vec<String> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        vec![error.body().to_string(), DONE.to_string()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_protocol::{ErrorCode, Timings};

    fn meta(endpoint: Endpoint) -> Meta {
        Meta {
            endpoint,
            id: "chatcmpl-1".into(),
            created: 1_700_000_000,
            model: "smol".into(),
        }
    }

    fn chunk(index: u32, text: &str) -> ClientReply {
        ClientReply::Chunk {
            id: "h-1".into(),
            index,
            text: text.into(),
            tokens: vec![1],
        }
    }

    fn done() -> ClientReply {
        ClientReply::Done {
            id: "h-1".into(),
            finish_reason: FinishReason::Length,
            text: None,
            usage: Usage {
                prompt_tokens: 10,
                cached_tokens: 4,
                completion_tokens: 2,
            },
            timings: Timings::default(),
            worker: "w0".into(),
        }
    }

    fn parse(payloads: &[String]) -> Vec<Value> {
        payloads
            .iter()
            .filter(|p| p.as_str() != DONE)
            .map(|p| serde_json::from_str(p).unwrap())
            .collect()
    }

    #[test]
    fn chat_stream_sends_role_text_finish_usage_done() {
        let mut encoder = StreamEncoder::new(meta(Endpoint::Chat), true);
        let mut payloads = encoder.on_reply(chunk(0, "Hel"));
        payloads.extend(encoder.on_reply(chunk(1, "")));
        payloads.extend(encoder.on_reply(chunk(2, "lo")));
        assert!(!encoder.finished());
        payloads.extend(encoder.on_reply(done()));
        assert!(encoder.finished());
        assert_eq!(payloads.last().map(String::as_str), Some(DONE));
        let events = parse(&payloads);
        assert_eq!(events.len(), 4, "{events:?}");
        assert_eq!(events[0]["object"], "chat.completion.chunk");
        assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(events[0]["choices"][0]["delta"]["content"], "Hel");
        assert!(events[0]["usage"].is_null());
        assert_eq!(events[1]["choices"][0]["delta"]["content"], "lo");
        assert!(events[1]["choices"][0]["delta"].get("role").is_none());
        assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
        assert_eq!(events[2]["choices"][0]["delta"], json!({}));
        assert_eq!(events[3]["choices"], json!([]));
        assert_eq!(events[3]["usage"]["total_tokens"], 12);
        assert_eq!(
            events[3]["usage"]["prompt_tokens_details"]["cached_tokens"],
            4
        );
        assert!(encoder.on_reply(chunk(3, "late")).is_empty());
    }

    #[test]
    fn completion_stream_without_usage() {
        let mut encoder = StreamEncoder::new(meta(Endpoint::Completions), false);
        let mut payloads = encoder.on_reply(chunk(0, ""));
        assert!(payloads.is_empty(), "no role chunk for completions");
        payloads.extend(encoder.on_reply(chunk(1, "Hi")));
        payloads.extend(encoder.on_reply(done()));
        let events = parse(&payloads);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["object"], "text_completion");
        assert_eq!(events[0]["choices"][0]["text"], "Hi");
        assert!(events[0].get("usage").is_none());
        assert_eq!(events[1]["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn a_router_error_mid_stream_is_an_error_event() {
        let mut encoder = StreamEncoder::new(meta(Endpoint::Chat), false);
        let payloads = encoder.on_reply(ClientReply::Error {
            id: Some("h-1".into()),
            code: ErrorCode::WorkerLost,
            message: "gone".into(),
            retryable: true,
        });
        let events = parse(&payloads);
        assert_eq!(events[0]["error"]["code"], "worker_lost");
        assert_eq!(payloads.last().map(String::as_str), Some(DONE));
        assert!(encoder.finished());
    }

    #[test]
    fn full_responses() {
        let used = Usage {
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 1,
        };
        let body = full_response(&meta(Endpoint::Chat), "Paris", FinishReason::Stop, &used);
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["choices"][0]["message"]["content"], "Paris");
        assert_eq!(body["choices"][0]["message"]["role"], "assistant");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["total_tokens"], 4);
        let body = full_response(
            &meta(Endpoint::Completions),
            "x",
            FinishReason::Length,
            &used,
        );
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["choices"][0]["text"], "x");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
    }
}
