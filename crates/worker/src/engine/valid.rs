//! The engine's edge: a request is checked once, here, into a
//! [`ValidRequest`]; the engine thread takes only that type.

use std::time::Instant;

use zinfer_protocol::{Constraint, GenerateRequest, Limits, ToolChoice};
use zinfer_text::tools::{Thinking, forced_call_grammar};
use zinfer_text::{TemplateInput, TextError, ToolFormat};

use super::handle::ModelFacts;
use super::{EngineError, TextCodec};
use crate::constraint::{CompiledConstraint, Grammars};

/// How a request's output text is read: plain, or split into content,
/// reasoning and tool calls.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputPlan {
    /// The tool-call syntax to parse, when the request has tools.
    pub tools: Option<ToolFormat>,
    /// Where the output's reasoning is: a `<think>` block, or harmony's
    /// `analysis` channel.
    pub thinking: Thinking,
    /// Control tokens the parser must see although decoding drops them
    /// (`<|python_tag|>`, `[TOOL_CALLS]`, `<|call|>`, ...), with their text.
    pub markers: Vec<(u32, String)>,
}

impl OutputPlan {
    /// Whether the text needs parsing at all.
    pub fn parses(&self) -> bool {
        self.tools.is_some() || self.thinking != Thinking::Off
    }
}

/// The id of the one token `text` is, when the vocabulary has it.
fn single_token(text: &dyn TextCodec, piece: &str) -> Option<u32> {
    match text.tokenize_text(piece, false, true).ok()?.as_slice() {
        [id] => Some(*id),
        _ => None,
    }
}

/// A request valid under the engine's limits, tokenized, fitting the KV
/// pool and the context length, its output bounded by the context.
/// Made only by [`super::EngineHandle::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    request: GenerateRequest,
    prompt: Vec<u32>,
    arrival: Instant,
    /// One matcher per choice, when the request is constrained.
    constraints: Vec<CompiledConstraint>,
    output: OutputPlan,
}

impl ValidRequest {
    /// Checks and tokenizes `request`, which arrived at `arrival`.
    pub(super) fn new(
        mut request: GenerateRequest,
        arrival: Instant,
        limits: &Limits,
        text: &dyn TextCodec,
        info: &ModelFacts,
        grammars: &Grammars,
    ) -> Result<Self, EngineError> {
        request
            .validate(limits)
            .map_err(|error| EngineError::BadRequest(error.to_string()))?;
        let (prompt, output) = tokenize(&request, text, info.vocab_size)?;
        if let Some(top) = request.prompt_logprobs {
            let entries = prompt.len().saturating_mul(1 + top as usize);
            if entries > limits.max_logprob_entries {
                return Err(EngineError::BadRequest(format!(
                    "prompt_logprobs would report {} prompt tokens x (1 + {top}) = {entries} \
                     entries in one done, over the limit of {}; shorten the prompt or ask for \
                     fewer alternatives",
                    prompt.len(),
                    limits.max_logprob_entries
                )));
            }
        }
        if let Some((bad, _)) = request
            .logit_bias_ids()
            .into_iter()
            .find(|&(id, _)| id as usize >= info.vocab_size)
        {
            return Err(EngineError::BadRequest(format!(
                "logit_bias names token {bad}, outside the vocabulary of {} tokens",
                info.vocab_size
            )));
        }
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
        let forced = forced_call(&request, text)?.map(Box::new);
        // Compiled here, on the caller's thread, never in the step loop;
        // once per choice (the grammar is cached, each choice needs its
        // own matcher state).
        let constraints = match forced.as_ref().or(request.constraint.as_ref()) {
            Some(constraint) => (0..request.n)
                .map(|_| {
                    grammars
                        .compile(constraint)
                        .map(CompiledConstraint)
                        .map_err(|error| EngineError::BadRequest(error.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        Ok(ValidRequest {
            request,
            prompt,
            arrival,
            constraints,
            output,
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

    /// How the output text is read.
    pub fn output(&self) -> &OutputPlan {
        &self.output
    }

    /// The parts, for the engine thread.
    pub(super) fn into_parts(
        self,
    ) -> (
        GenerateRequest,
        Vec<u32>,
        Instant,
        Vec<CompiledConstraint>,
        OutputPlan,
    ) {
        (
            self.request,
            self.prompt,
            self.arrival,
            self.constraints,
            self.output,
        )
    }
}

/// The constraint of `required` or a named `tool_choice`: the tools'
/// calls in the model's own syntax, arguments valid under their schemas.
fn forced_call(
    request: &GenerateRequest,
    text: &dyn TextCodec,
) -> Result<Option<Constraint>, EngineError> {
    if !request.tool_choice.forces_a_call() {
        return Ok(None);
    }
    forced_call_grammar(
        text.chat_features().tool_format,
        &request.tools,
        &request.tool_choice,
        request.parallel_tool_calls,
        &|piece| single_token(text, piece),
    )
    .map(|grammar| Some(Constraint::lark(grammar)))
    .map_err(|error| EngineError::BadRequest(error.to_string()))
}

/// The prompt's token ids: given ids checked against the vocabulary, a
/// conversation rendered by the chat template, or text encoded; and how
/// the output is read (only a conversation's output is parsed).
fn tokenize(
    request: &GenerateRequest,
    text: &dyn TextCodec,
    vocab_size: usize,
) -> Result<(Vec<u32>, OutputPlan), EngineError> {
    let mut output = OutputPlan {
        tools: None,
        thinking: Thinking::Off,
        markers: Vec::new(),
    };
    let tokenizer = |error: TextError| EngineError::Tokenizer(error.to_string());
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
        let tools: Vec<serde_json::Value> = request
            .tools
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()
            .map_err(|error| EngineError::BadRequest(error.to_string()))?;
        let input = TemplateInput {
            tools: (!tools.is_empty()).then_some(tools.as_slice()),
            variables: request.chat_template_kwargs.as_deref(),
            ..TemplateInput::new(messages)
        };
        let rendered = text.render_request(&input).map_err(|error| match error {
            TextError::ChatTemplate(_) => EngineError::BadRequest(error.to_string()),
            other => tokenizer(other),
        })?;
        output = output_plan(request, text, &rendered);
        text.encode_prompt(&rendered).map_err(tokenizer)?
    } else if let Some(document) = &request.document {
        let query = request.prompt.as_deref().unwrap_or_default();
        text.rerank_prompt(query, document).map_err(tokenizer)?
    } else {
        let prompt = request.prompt.as_deref().unwrap_or_default();
        text.encode_prompt(prompt).map_err(tokenizer)?
    };
    if prompt.is_empty() {
        return Err(EngineError::BadRequest(
            "the prompt is empty after tokenization; give some text".into(),
        ));
    }
    Ok((prompt, output))
}

/// How a conversation's output is read: tool calls in the template's
/// syntax when the request has tools the model may call; a `<think>`
/// block when the template thinks, already open when the prompt ends
/// with `<think>` (DeepSeek-R1 distills, QwQ); harmony's channels, with or
/// without tools, when the template is gpt-oss's.
fn output_plan(request: &GenerateRequest, text: &dyn TextCodec, rendered: &str) -> OutputPlan {
    let features = text.chat_features();
    let tools = (!request.tools.is_empty() && request.tool_choice != ToolChoice::None)
        .then_some(features.tool_format);
    let thinking = Thinking::after_prompt(&features, rendered);
    let mut texts: Vec<&str> = tools.map_or(&[][..], ToolFormat::markers).to_vec();
    for piece in thinking.markers() {
        if !texts.contains(piece) {
            texts.push(piece);
        }
    }
    // Only tokens that decoding drops: the others reach the parser as text.
    let markers = texts
        .into_iter()
        .filter_map(|piece| {
            let id = single_token(text, piece)?;
            let decoded = text.decode(&[id]).ok()?;
            decoded.is_empty().then(|| (id, piece.to_string()))
        })
        .collect();
    OutputPlan {
        tools,
        thinking,
        markers,
    }
}
