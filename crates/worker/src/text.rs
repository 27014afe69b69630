//! `tokenize`, `detokenize` and `apply_template`: the model's tokenizer
//! and chat template, answered beside the engine.
//!
//! They need neither the forward pass nor the KV pool, so they never enter
//! the engine's queue. They run on a thread of their own rather than the
//! I/O thread: tokenizing 512 KiB of text takes tens of milliseconds, time
//! in which the I/O thread would relay no streamed output (and a full
//! relay would stall the engine's decode steps behind it). The thread
//! takes jobs from a bounded queue (a full one is answered `overloaded` at
//! once) and hands encoded replies back to the I/O thread over an inproc
//! socket, which the I/O thread polls with the others.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use zinfer_protocol::{
    ApplyTemplateRequest, ChatMessage, ErrorCode, Limits, Piece, TextRequest, TextResult,
    WorkerToRouter,
};
use zinfer_text::TextError;

use crate::engine::TextCodec;

/// Text requests waiting for the text thread; beyond this, `overloaded`.
pub const TEXT_QUEUE: usize = 256;

/// Room left in a frame for the router to put the client's id (at most
/// 256 bytes) where the worker's `rid` was.
const REPLY_SLACK: usize = 1024;

/// Why a text request got no answer: a protocol code and a message for
/// the client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct TextRequestError {
    /// The protocol error code.
    pub code: ErrorCode,
    /// For a person.
    pub message: String,
}

impl TextRequestError {
    fn bad_request(message: impl Into<String>) -> Self {
        TextRequestError {
            code: ErrorCode::BadRequest,
            message: message.into(),
        }
    }
}

/// Errors of the tokenizer and template come from what the client sent
/// (text with a byte the vocabulary lacks, a template's
/// `raise_exception`), so they are `bad_request`; anything else is ours.
impl From<TextError> for TextRequestError {
    fn from(error: TextError) -> Self {
        match error {
            TextError::Tokenizer(_) | TextError::ChatTemplate(_) => {
                TextRequestError::bad_request(error.to_string())
            }
            other => {
                tracing::error!(error = %other, "text request failed");
                TextRequestError {
                    code: ErrorCode::Internal,
                    message: "the worker failed on this request; see its log".into(),
                }
            }
        }
    }
}

/// The prompt text of `messages`: the one call of the chat template for
/// `apply_template`. With `add_generation_prompt` it is the very call
/// `generate` makes, so the two cannot disagree.
pub fn render_template(
    codec: &dyn TextCodec,
    request: &ApplyTemplateRequest,
) -> Result<String, TextError> {
    render(codec, &request.messages, request.add_generation_prompt)
}

fn render(
    codec: &dyn TextCodec,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String, TextError> {
    if add_generation_prompt {
        codec.render_chat(messages)
    } else {
        codec.render_chat_with(messages, false)
    }
}

/// Answers one text request with the model's tokenizer and template.
pub fn answer(
    codec: &dyn TextCodec,
    vocab_size: usize,
    request: &TextRequest,
) -> Result<TextResult, TextRequestError> {
    match request {
        TextRequest::Tokenize(request) => {
            let tokens = codec.tokenize_text(
                &request.content,
                request.add_special,
                request.parse_special,
            )?;
            let pieces = request
                .with_pieces
                .then(|| {
                    tokens
                        .iter()
                        .map(|&id| codec.token_piece(id).map(Piece::from_bytes))
                        .collect::<Result<Vec<_>, _>>()
                })
                .transpose()?;
            Ok(TextResult::Tokenized { tokens, pieces })
        }
        TextRequest::Detokenize(request) => {
            if let Some(bad) = request.tokens.iter().find(|&&t| t as usize >= vocab_size) {
                return Err(TextRequestError::bad_request(format!(
                    "token id {bad} is outside the vocabulary of {vocab_size} tokens"
                )));
            }
            let content = codec.detokenize_text(&request.tokens)?;
            Ok(TextResult::Detokenized { content })
        }
        TextRequest::ApplyTemplate(request) => {
            let prompt = render_template(codec, request)?;
            Ok(TextResult::AppliedTemplate { prompt })
        }
    }
}

/// The encoded reply to text request `rid`: its answer, or an `error`,
/// also when the answer would not fit a frame the router takes (the
/// router drops the connection of a peer that sends a larger one).
pub fn reply_frame(
    codec: &dyn TextCodec,
    vocab_size: usize,
    limits: &Limits,
    rid: u64,
    request: &TextRequest,
) -> Option<Vec<u8>> {
    let result = answer(codec, vocab_size, request);
    let max = limits.max_frame_bytes.saturating_sub(REPLY_SLACK);
    let error = |error: TextRequestError| WorkerToRouter::Error {
        rid,
        code: error.code,
        message: error.message,
    };
    let message = result.map_or_else(error, |result| result.to_worker_reply(rid));
    let frame = match zinfer_protocol::encode(&message) {
        Ok(frame) if frame.len() <= max => frame,
        Ok(frame) => {
            let message = format!(
                "the reply would be {} bytes, over the {max}-byte frame limit; send the text \
                 in parts (or without with_pieces)",
                frame.len()
            );
            encode_or_log(&error(TextRequestError::bad_request(message)))?
        }
        Err(encode) => {
            tracing::error!(%encode, "cannot encode a text reply");
            encode_or_log(&error(TextRequestError {
                code: ErrorCode::Internal,
                message: "the worker could not encode its reply".into(),
            }))?
        }
    };
    Some(frame)
}

fn encode_or_log(message: &WorkerToRouter) -> Option<Vec<u8>> {
    zinfer_protocol::encode(message)
        .map_err(|error| tracing::error!(%error, "cannot encode a text error"))
        .ok()
}

/// One text request for the text thread.
pub(crate) struct TextJob {
    pub(crate) rid: u64,
    pub(crate) request: TextRequest,
}

/// The I/O thread's side of the text thread.
pub(crate) struct TextThread {
    jobs: Option<Sender<TextJob>>,
    thread: Option<JoinHandle<()>>,
}

impl TextThread {
    /// Starts the thread; its reply frames go out on `out`.
    pub(crate) fn start(
        codec: Arc<dyn TextCodec>,
        vocab_size: usize,
        limits: Limits,
        out: zmq::Socket,
    ) -> std::io::Result<TextThread> {
        let (jobs, receiver) = crossbeam_channel::bounded(TEXT_QUEUE);
        let thread = std::thread::Builder::new()
            .name("worker-text".into())
            .spawn(move || serve(codec.as_ref(), vocab_size, &limits, &receiver, &out))?;
        Ok(TextThread {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Queues a job; the error to send at once when the queue is full or
    /// the thread is gone.
    pub(crate) fn submit(&self, job: TextJob) -> Result<(), TextRequestError> {
        let Some(jobs) = &self.jobs else {
            return Err(stopped());
        };
        match jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(TextRequestError {
                code: ErrorCode::Overloaded,
                message: format!(
                    "the worker has {TEXT_QUEUE} text requests waiting; retry with backoff"
                ),
            }),
            Err(TrySendError::Disconnected(_)) => Err(stopped()),
        }
    }
}

fn stopped() -> TextRequestError {
    TextRequestError {
        code: ErrorCode::Unavailable,
        message: "the worker is stopping; retry".into(),
    }
}

impl Drop for TextThread {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has answered the rest.
        self.jobs = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the text thread panicked");
        }
    }
}

fn serve(
    codec: &dyn TextCodec,
    vocab_size: usize,
    limits: &Limits,
    jobs: &Receiver<TextJob>,
    out: &zmq::Socket,
) {
    for job in jobs {
        let span = tracing::debug_span!("text", rid = job.rid, id = %job.request.id());
        let _enter = span.enter();
        if let Some(frame) = reply_frame(codec, vocab_size, limits, job.rid, &job.request)
            && out.send(frame, 0).is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use zinfer_protocol::{DetokenizeRequest, TokenizeRequest, decode};

    use super::*;
    use crate::engine::tests::Bytes;

    fn tokenize(content: &str, with_pieces: bool) -> TextRequest {
        TextRequest::Tokenize(TokenizeRequest {
            id: "t".into(),
            model: None,
            content: content.into(),
            add_special: true,
            parse_special: true,
            with_pieces,
        })
    }

    #[test]
    fn pieces_are_text_or_bytes_and_join_to_the_input() {
        let result = answer(&Bytes, 256, &tokenize("wö", true)).unwrap();
        let TextResult::Tokenized { tokens, pieces } = result else {
            panic!("not tokenized: {result:?}")
        };
        assert_eq!(tokens, [119, 0xc3, 0xb6]);
        let pieces = pieces.unwrap();
        assert_eq!(
            pieces,
            [
                Piece::Text("w".into()),
                Piece::Bytes(vec![0xc3]),
                Piece::Bytes(vec![0xb6])
            ]
        );
        let joined: Vec<u8> = pieces.iter().flat_map(|p| p.as_bytes().to_vec()).collect();
        assert_eq!(joined, "wö".as_bytes());
        let plain = answer(&Bytes, 256, &tokenize("wö", false)).unwrap();
        assert!(matches!(plain, TextResult::Tokenized { pieces: None, .. }));
    }

    #[test]
    fn ids_outside_the_vocabulary_are_bad_requests() {
        let request = TextRequest::Detokenize(DetokenizeRequest {
            id: "d".into(),
            model: None,
            tokens: vec![104, 300],
        });
        let error = answer(&Bytes, 256, &request).unwrap_err();
        assert_eq!(error.code, ErrorCode::BadRequest);
        assert!(error.message.contains("300"), "{}", error.message);
    }

    #[test]
    fn a_reply_over_the_frame_limit_is_an_error_not_a_dropped_connection() {
        let limits = Limits::default();
        // 256 Ki tokens: 512 KiB of ids, 768 KiB more of byte pieces.
        let text = "é".repeat(limits.max_prompt_bytes / 4);
        let frame = reply_frame(&Bytes, 256, &limits, 7, &tokenize(&text, true)).unwrap();
        assert!(frame.len() < limits.max_frame_bytes);
        match decode::<WorkerToRouter>(&frame, &limits).unwrap() {
            WorkerToRouter::Error { rid, code, message } => {
                assert_eq!((rid, code), (7, ErrorCode::BadRequest));
                assert!(message.contains("frame limit"), "{message}");
            }
            other => panic!("expected an error, got {other:?}"),
        }
        // Without pieces the same text fits.
        let frame = reply_frame(&Bytes, 256, &limits, 7, &tokenize(&text, false)).unwrap();
        assert!(matches!(
            decode::<WorkerToRouter>(&frame, &limits).unwrap(),
            WorkerToRouter::Tokenized { rid: 7, .. }
        ));
    }

    #[test]
    fn the_template_is_the_chat_path_and_its_errors_are_the_clients() {
        let messages = vec![ChatMessage::new("user", "hi")];
        let mut request = ApplyTemplateRequest {
            id: "a".into(),
            model: None,
            messages: messages.clone(),
            add_generation_prompt: true,
        };
        let rendered = render_template(&Bytes, &request).unwrap();
        assert_eq!(rendered, Bytes.render_chat(&messages).unwrap());
        request.add_generation_prompt = false;
        let error = answer(&Bytes, 256, &TextRequest::ApplyTemplate(request)).unwrap_err();
        assert_eq!(error.code, ErrorCode::BadRequest);
    }
}
