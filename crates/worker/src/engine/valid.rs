//! The engine's edge: a request is checked once, here, into a
//! [`ValidRequest`]; the engine thread takes only that type.

use std::time::Instant;

use zinfer_protocol::{GenerateRequest, Limits};

use super::handle::ModelInfo;
use super::{EngineError, TextCodec};
use crate::constraint::{CompiledConstraint, Grammars};

/// A request valid under the engine's limits, tokenized, fitting the KV
/// pool and the context length, its output bounded by the context.
/// Made only by [`super::EngineHandle::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    request: GenerateRequest,
    prompt: Vec<u32>,
    arrival: Instant,
    constraint: Option<CompiledConstraint>,
}

impl ValidRequest {
    /// Checks and tokenizes `request`, which arrived at `arrival`.
    pub(super) fn new(
        mut request: GenerateRequest,
        arrival: Instant,
        limits: &Limits,
        text: &dyn TextCodec,
        info: &ModelInfo,
        grammars: &Grammars,
    ) -> Result<Self, EngineError> {
        request
            .validate(limits)
            .map_err(|error| EngineError::BadRequest(error.to_string()))?;
        let prompt = tokenize(&request, text, info.vocab_size)?;
        let capacity = info.kv_capacity.min(info.max_positions);
        if prompt.len() + 1 > capacity {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                capacity,
            });
        }
        // Output stops at the context length with `length`.
        let room = u32::try_from(info.max_positions - prompt.len()).unwrap_or(u32::MAX);
        request.max_tokens = request.max_tokens.min(room);
        // Compiled here, on the caller's thread, never in the step loop.
        let constraint = match &request.constraint {
            Some(constraint) => {
                Some(CompiledConstraint(grammars.compile(constraint).map_err(
                    |error| EngineError::BadRequest(error.to_string()),
                )?))
            }
            None => None,
        };
        Ok(ValidRequest {
            request,
            prompt,
            arrival,
            constraint,
        })
    }

    /// The request, `max_tokens` bounded by the context length.
    pub fn request(&self) -> &GenerateRequest {
        &self.request
    }

    /// The prompt's token ids: never empty, and with one token of room
    /// left in the KV pool and the context.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// When the engine's clock saw it arrive.
    pub fn arrival(&self) -> Instant {
        self.arrival
    }

    /// The parts, for the engine thread.
    pub(super) fn into_parts(
        self,
    ) -> (
        GenerateRequest,
        Vec<u32>,
        Instant,
        Option<CompiledConstraint>,
    ) {
        (self.request, self.prompt, self.arrival, self.constraint)
    }
}

/// The prompt's token ids: given ids checked against the vocabulary, a
/// conversation rendered by the chat template, or text encoded.
fn tokenize(
    request: &GenerateRequest,
    text: &dyn TextCodec,
    vocab_size: usize,
) -> Result<Vec<u32>, EngineError> {
    let tokenizer = |error: zinfer_model::ModelError| EngineError::Tokenizer(error.to_string());
    let prompt = if let Some(tokens) = &request.tokens {
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(EngineError::BadRequest(format!(
                "token id {bad} is outside the vocabulary of {vocab_size} tokens"
            )));
        }
        tokens.clone()
    } else if let Some(messages) = &request.messages {
        // A template refusing a conversation (`raise_exception`, roles out
        // of order, a null it cannot print) is the client's to fix.
        let rendered = text.render_chat(messages).map_err(|error| match error {
            zinfer_model::ModelError::ChatTemplate(_) => EngineError::BadRequest(error.to_string()),
            other => tokenizer(other),
        })?;
        text.encode_prompt(&rendered).map_err(tokenizer)?
    } else {
        let prompt = request.prompt.as_deref().unwrap_or_default();
        text.encode_prompt(prompt).map_err(tokenizer)?
    };
    if prompt.is_empty() {
        return Err(EngineError::BadRequest(
            "the prompt is empty after tokenization; give some text".into(),
        ));
    }
    Ok(prompt)
}
