//! The `--compare-url` client: OpenAI-style `POST /v1/completions` with
//! `stream: true` (llama.cpp's `llama-server`, vLLM, SGLang).
//!
//! Each request runs on its own thread with a blocking HTTP client, reads
//! the server-sent events line by line and posts timestamped events to the
//! bench's I/O thread over a channel. One `data:` event counts as one chunk,
//! as vLLM's and SGLang's benchmarks count them. Token counts come from the
//! stream's `usage` object (asked for with `stream_options.include_usage`);
//! a server that sends none is credited one token per non-empty chunk and no
//! prompt tokens. Cached prompt tokens are read from
//! `usage.prompt_tokens_details.cached_tokens`, or from llama-server's
//! `timings.cache_n`.

use std::{
    io::{BufRead, BufReader, Read},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::BenchError;

use super::{
    Transport,
    client::RequestSettings,
    driver::{Event, EventKind, Outgoing, TokenCounts},
};

/// An OpenAI-compatible completions endpoint.
pub(crate) struct OpenAiTransport {
    agent: ureq::Agent,
    url: String,
    model: Option<String>,
    temperature: f32,
    ignore_eos: bool,
    sender: mpsc::Sender<Event>,
    receiver: mpsc::Receiver<Event>,
}

/// The completions URL for `base`: a URL that already ends in
/// `/v1/completions` is kept, anything else gets it appended.
pub(crate) fn completions_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/completions") {
        base.to_string()
    } else {
        format!("{}/v1/completions", base.trim_end_matches("/v1"))
    }
}

impl OpenAiTransport {
    /// A client for `base` (see [`completions_url`]); requests without an
    /// answer within `timeout` fail. When `settings.model` is `None` the
    /// first model of `GET /v1/models` is used, if the server lists one.
    pub(crate) fn new(
        base: &str,
        settings: &RequestSettings,
        timeout: Duration,
    ) -> OpenAiTransport {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .into();
        let url = completions_url(base);
        let model = settings
            .model
            .clone()
            .or_else(|| first_model(&agent, &url.replace("/v1/completions", "/v1/models")));
        let (sender, receiver) = mpsc::channel();
        OpenAiTransport {
            agent,
            url,
            model,
            temperature: settings.temperature,
            ignore_eos: settings.ignore_eos,
            sender,
            receiver,
        }
    }

    /// The URL requests go to.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

impl Transport for OpenAiTransport {
    fn send(&mut self, key: u64, request: &Outgoing) -> Result<(), BenchError> {
        let mut body = json!({
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
            "temperature": self.temperature,
            "seed": request.seed,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.ignore_eos
            && let Some(map) = body.as_object_mut()
        {
            map.insert("ignore_eos".into(), Value::from(true));
        }
        if let (Some(model), Some(map)) = (&self.model, body.as_object_mut()) {
            map.insert("model".into(), Value::from(model.clone()));
        }
        let (agent, url, sender) = (self.agent.clone(), self.url.clone(), self.sender.clone());
        std::thread::Builder::new()
            .name(format!("bench-http-{key}"))
            .spawn(move || {
                let kind = stream_completion(&agent, &url, &body.to_string(), |text| {
                    let chunk = EventKind::Chunk { text };
                    // The receiver only goes away once the run is over.
                    let _ = sender.send(Event {
                        key,
                        at: Instant::now(),
                        kind: chunk,
                    });
                });
                let _ = sender.send(Event {
                    key,
                    at: Instant::now(),
                    kind,
                });
            })
            .map_err(BenchError::Thread)?;
        Ok(())
    }

    /// Blocking HTTP requests cannot be interrupted; a timed-out one ends
    /// at the client's own timeout and its late events are ignored.
    fn cancel(&mut self, _key: u64) {}

    fn poll(&mut self, until: Instant, events: &mut Vec<Event>) -> Result<(), BenchError> {
        let wait = until.saturating_duration_since(Instant::now());
        if let Ok(event) = self.receiver.recv_timeout(wait) {
            events.push(event);
            events.extend(self.receiver.try_iter().take(1024));
        }
        Ok(())
    }
}

/// Posts one request and streams its events; returns the terminal event.
fn stream_completion(
    agent: &ureq::Agent,
    url: &str,
    body: &str,
    mut on_chunk: impl FnMut(String),
) -> EventKind {
    let response = match agent
        .post(url)
        .header("content-type", "application/json")
        .send(body)
    {
        Ok(response) => response,
        Err(e) => return transport_error(format!("POST {url}: {e}")),
    };
    let status = response.status().as_u16();
    let reader = response.into_body().into_reader();
    if status >= 400 {
        let mut text = String::new();
        let _ = reader.take(500).read_to_string(&mut text);
        return EventKind::Error {
            code: format!("http_{status}"),
            message: text,
        };
    }
    let mut sse = SseState::default();
    for line in BufReader::new(reader).lines() {
        let line = match line {
            Ok(line) => line,
            Err(e) => return transport_error(format!("reading the stream from {url}: {e}")),
        };
        match sse.line(&line) {
            Ok(Some(text)) => on_chunk(text),
            Ok(None) => {}
            Err(error) => return transport_error(error.to_string()),
        }
        if sse.finished {
            break;
        }
    }
    sse.terminal()
}

fn transport_error(message: String) -> EventKind {
    EventKind::Error {
        code: "transport".into(),
        message,
    }
}

/// What one completion stream said so far.
/// Why a stream line ends the request as a transport error.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    /// The event is not JSON.
    #[error("unreadable stream event {data:?}: {source}")]
    Unreadable {
        /// The event's data.
        data: String,
        /// What the JSON reader said.
        source: serde_json::Error,
    },
    /// The server sent an error event.
    #[error("the server reported an error: {0}")]
    Server(Value),
}

#[derive(Debug, Default)]
struct SseState {
    chunks: u64,
    counts: Option<TokenCounts>,
    cached: Option<u64>,
    finish_seen: bool,
    finished: bool,
}

impl SseState {
    /// Takes one line; returns the text of a non-empty chunk.
    fn line(&mut self, line: &str) -> Result<Option<String>, StreamError> {
        let Some(data) = line.strip_prefix("data:") else {
            return Ok(None);
        };
        let data = data.trim();
        if data == "[DONE]" {
            self.finished = true;
            return Ok(None);
        }
        let value: Value =
            serde_json::from_str(data).map_err(|source| StreamError::Unreadable {
                data: data.to_string(),
                source,
            })?;
        if let Some(error) = value.get("error") {
            return Err(StreamError::Server(error.clone()));
        }
        if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
            let number = |v: Option<&Value>| v.and_then(Value::as_u64);
            self.counts = Some(TokenCounts {
                prompt: number(usage.get("prompt_tokens")),
                completion: number(usage.get("completion_tokens")).unwrap_or(0),
                cached: number(usage.pointer("/prompt_tokens_details/cached_tokens")),
            });
        }
        if let Some(cache_n) = value.pointer("/timings/cache_n").and_then(Value::as_u64) {
            self.cached = Some(cache_n);
        }
        let choice = value.pointer("/choices/0");
        if choice
            .and_then(|c| c.get("finish_reason"))
            .is_some_and(|f| !f.is_null())
        {
            self.finish_seen = true;
        }
        let text = choice
            .and_then(|c| c.get("text"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if text.is_empty() {
            return Ok(None);
        }
        self.chunks += 1;
        Ok(Some(text.to_string()))
    }

    /// `done` when the stream ended properly, an error otherwise.
    fn terminal(self) -> EventKind {
        if !self.finished && !self.finish_seen {
            return transport_error("the stream ended before its last event".into());
        }
        let mut counts = self.counts.unwrap_or(TokenCounts {
            prompt: None,
            completion: self.chunks,
            cached: None,
        });
        counts.cached = counts.cached.or(self.cached);
        EventKind::Done { counts }
    }
}

fn first_model(agent: &ureq::Agent, url: &str) -> Option<String> {
    let response = agent.get(url).call().ok()?;
    let mut text = String::new();
    response
        .into_body()
        .into_reader()
        .take(1 << 20)
        .read_to_string(&mut text)
        .ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    value.pointer("/data/0/id")?.as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes;

    #[test]
    fn completions_url_accepts_a_base_or_the_full_path() {
        for base in [
            "http://h:8080",
            "http://h:8080/",
            "http://h:8080/v1",
            "http://h:8080/v1/completions",
        ] {
            assert_eq!(completions_url(base), "http://h:8080/v1/completions");
        }
    }

    #[test]
    fn sse_lines_give_chunks_usage_and_cached_tokens() {
        let mut sse = SseState::default();
        assert_eq!(sse.line(": keep-alive").unwrap(), None);
        let chunk = r#"data: {"choices":[{"text":" Hi","finish_reason":null}]}"#;
        assert_eq!(sse.line(chunk).unwrap().as_deref(), Some(" Hi"));
        let last =
            r#"data: {"choices":[{"text":"","finish_reason":"length"}],"timings":{"cache_n":7}}"#;
        assert_eq!(sse.line(last).unwrap(), None);
        let counts = TokenCounts {
            prompt: None,
            completion: 1,
            cached: Some(7),
        };
        assert_eq!(sse.terminal(), EventKind::Done { counts });

        let mut sse = SseState::default();
        assert!(sse.line("data: {not json").is_err());
        assert!(matches!(sse.terminal(), EventKind::Error { code, .. } if code == "transport"));
    }

    #[test]
    fn streams_a_completion_and_reports_http_errors_by_status() {
        let server = fakes::openai();
        let settings = RequestSettings {
            model: None,
            namespace: None,
            temperature: 0.0,
            ignore_eos: false,
        };
        let mut transport = OpenAiTransport::new(&server.url, &settings, Duration::from_secs(10));
        assert_eq!(transport.model.as_deref(), Some("fake-model"));
        let request = Outgoing {
            prompt: "w1 w2 w3 w4".into(),
            max_tokens: 3,
            seed: 5,
        };
        transport.send(1, &request).unwrap();
        transport
            .send(
                2,
                &Outgoing {
                    prompt: "FAIL".into(),
                    ..request
                },
            )
            .unwrap();
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let terminal = |e: &Event| !matches!(e.kind, EventKind::Chunk { .. });
        while events.iter().filter(|e| terminal(e)).count() < 2 && Instant::now() < deadline {
            transport
                .poll(Instant::now() + Duration::from_millis(50), &mut events)
                .unwrap();
        }
        let first: Vec<&EventKind> = events
            .iter()
            .filter(|e| e.key == 1)
            .map(|e| &e.kind)
            .collect();
        assert_eq!(first.len(), 4);
        assert_eq!(first[2], &EventKind::Chunk { text: " c".into() });
        let counts = TokenCounts {
            prompt: Some(4),
            completion: 3,
            cached: Some(1),
        };
        assert_eq!(first[3], &EventKind::Done { counts });
        let failed = events.iter().find(|e| e.key == 2).map(|e| &e.kind);
        assert!(
            matches!(failed, Some(EventKind::Error { code, message }) if code == "http_503" && message == "overloaded"),
            "{failed:?}"
        );
        let bodies = server.stop();
        let body = bodies
            .iter()
            .find(|b| b["prompt"] == "w1 w2 w3 w4")
            .unwrap();
        assert_eq!(body["model"], "fake-model");
        assert_eq!(
            (
                body["stream"].as_bool(),
                body["max_tokens"].as_u64(),
                body["seed"].as_u64()
            ),
            (Some(true), Some(3), Some(5))
        );
    }
}
