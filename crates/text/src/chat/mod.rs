//! Chat templates: the checkpoint's Jinja template, compiled once with
//! minijinja when the model loads, or ChatML when the checkpoint has none.
//!
//! Checkpoint templates are written for Python's Jinja2 as Hugging Face
//! `transformers` runs it (`apply_chat_template`), and the output must be
//! the same bytes, so the environment is transformers': `trim_blocks` and
//! `lstrip_blocks` on, loop controls, `raise_exception`, `strftime_now`,
//! `tojson` as Python's `json.dumps`, `{% generation %}` blocks, and the
//! variables `messages`, `tools`, `documents`, `add_generation_prompt`,
//! `bos_token`, `eos_token` and any extra ones (`enable_thinking`). Values
//! print as Python prints them (`None`, `True`, `{'a': 1}`), and Python's
//! string, list and dict methods (`.strip()`, `.startswith()`, `.items()`,
//! ...) come from minijinja-contrib's pycompat callback.
//! `tests/chat_templates.rs` checks all of it against Jinja2 itself.
//!
//! Known differences, none of which a reference template meets where
//! Jinja2 renders it: minijinja iterates `none` as empty (Jinja2 raises),
//! has no `'%s' % x`, does not HTML-escape what is added to a `|safe`
//! string, and `~` writes floats of 1e16 and more in full. A turn's
//! `content` left out reaches them as `none`. JSON maps (tools, arguments)
//! keep the client's key order, as transformers does: the workspace builds
//! serde_json with `preserve_order`.

mod clock;
pub(crate) mod features;
pub mod limits;
mod python;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use zinfer_protocol::{ChatMessage, MessageContent};

use crate::{TextError, ToolFormat};

/// ChatML, used when a checkpoint carries no template.
pub(crate) const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Variables that extra template variables may not set.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The template's name inside its environment.
const NAME: &str = "chat";

/// What a template renders: the conversation and the variables that
/// transformers' `apply_chat_template` passes besides it.
#[derive(Debug, Clone)]
pub struct TemplateInput<'a> {
    /// The conversation.
    pub messages: &'a [ChatMessage],
    /// OpenAI tool definitions (`{"type": "function", "function": {...}}`),
    /// or `None`: templates see `tools` as `none` then, as transformers
    /// passes it.
    pub tools: Option<&'a [serde_json::Value]>,
    /// End with the header of the assistant's turn (usually true).
    pub add_generation_prompt: bool,
    /// Extra template variables, such as `enable_thinking`; they override
    /// `bos_token` and `eos_token` when they name them, as in transformers.
    pub variables: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// The time `strftime_now` reads (its UTC date and time).
    pub now: SystemTime,
}

impl<'a> TemplateInput<'a> {
    /// `messages` with a generation prompt, no tools and no extra
    /// variables, at the current time.
    pub fn new(messages: &'a [ChatMessage]) -> Self {
        Self {
            messages,
            tools: None,
            add_generation_prompt: true,
            variables: None,
            now: SystemTime::now(),
        }
    }
}

/// A compiled chat template with the special-token strings templates refer to.
pub struct ChatTemplate {
    /// Shared with the threads renders run on (see [`limits`]).
    env: Arc<Environment<'static>>,
    /// Why the template did not compile; reported on every render, so a
    /// model with a broken template still serves plain completions.
    broken: Option<String>,
    /// The limit a plain conversation's render ran into, if it did: such
    /// a template can serve no chat, and the model does not load.
    over_limit: Option<String>,
    bos_token: String,
    eos_token: String,
    features: features::ChatFeatures,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("broken", &self.broken)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles the checkpoint's template, or ChatML when it has none.
    pub fn new(source: Option<String>, bos_token: String, eos_token: String) -> Self {
        let source = source
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| CHATML.to_string());
        let mut env = environment();
        let (broken, over_limit) = if source.len() > limits::TEMPLATE_BYTES {
            let why = limits::limit_message(&format!(
                "size limit of {} bytes ({} bytes)",
                limits::TEMPLATE_BYTES,
                source.len()
            ));
            (Some(why.clone()), Some(why))
        } else {
            let broken = env
                .add_template_owned(NAME, without_generation_tags(&source))
                .err()
                .map(|e| {
                    tracing::warn!(error = %e, "the model's chat template does not compile; chat requests will fail");
                    e.to_string()
                });
            (broken, None)
        };
        let features = if over_limit.is_some() {
            features::ChatFeatures::default()
        } else {
            features::detect(&source)
        };
        let mut template = Self {
            env: Arc::new(env),
            broken,
            over_limit,
            bos_token,
            eos_token,
            features,
        };
        if template.broken.is_none() {
            template.over_limit = template.plain_render_limit();
        }
        template
    }

    /// The limit a plain system + user conversation runs into, if any: a
    /// template that cannot render that within the limits is refused at
    /// load (a template that refuses a system turn is not).
    fn plain_render_limit(&self) -> Option<String> {
        let messages = [
            ChatMessage::new("system", "You are a helpful assistant."),
            ChatMessage::new("user", "Hello!"),
        ];
        match self.render_messages(&messages) {
            Err(TextError::ChatTemplate(why)) if limits::is_limit(&why) => Some(why),
            _ => None,
        }
    }

    /// Fails when the template cannot render a plain conversation within
    /// the [`limits`]: the load refuses such a model.
    pub fn check_limits(&self) -> Result<(), TextError> {
        match &self.over_limit {
            Some(why) => Err(TextError::ChatTemplate(why.clone())),
            None => Ok(()),
        }
    }

    /// Renders `messages` with `add_generation_prompt = true`, no tools,
    /// at the current time.
    pub fn render_messages(&self, messages: &[ChatMessage]) -> Result<String, TextError> {
        self.render(&TemplateInput::new(messages))
    }

    /// What the template supports: tool-call syntax, tools, reasoning.
    pub fn features(&self) -> features::ChatFeatures {
        self.features
    }

    /// Renders a `generate` request's conversation: as [`Self::render`],
    /// except that tools and tool turns go through the Hermes fallback
    /// when the template does not show tools itself.
    ///
    /// The fallback: tool calls and results become `<tool_call>` and
    /// `<tool_response>` text in assistant and user turns; the tools, if
    /// any, become a preamble in the system turn, or at the start of the
    /// first user turn when the template refuses a system turn (gemma-2);
    /// the template then sees no `tools`.
    pub fn render_request(&self, input: &TemplateInput<'_>) -> Result<String, TextError> {
        if self.features.renders_tools || !features::uses_tools(input) {
            return self.render(input);
        }
        let render = |messages: &[ChatMessage]| {
            self.render(&TemplateInput {
                messages,
                tools: None,
                ..*input
            })
        };
        let turns = crate::tools::fallback_turns(input.messages)?;
        let Some(preamble) = input
            .tools
            .filter(|t| !t.is_empty())
            .map(crate::tools::fallback_preamble)
            .transpose()?
        else {
            return render(&turns);
        };
        render(&features::in_system_turn(&turns, &preamble)).or_else(|system_refused| {
            // When both fail, the second error is the one closer to a
            // rendering the template accepts.
            match features::in_first_user_turn(&turns, &preamble) {
                Some(turns) => render(&turns),
                None => Err(system_refused),
            }
        })
    }

    /// Renders a conversation as transformers' `apply_chat_template` does.
    pub fn render(&self, input: &TemplateInput<'_>) -> Result<String, TextError> {
        // A template past its limits on the plainest conversation is not
        // run again (each overrun may leave a thread running).
        if let Some(why) = self.broken.as_ref().or(self.over_limit.as_ref()) {
            return Err(TextError::ChatTemplate(why.clone()));
        }
        let harmony = self.features.tool_format == ToolFormat::Harmony;
        let messages: Vec<Value> = input
            .messages
            .iter()
            .map(|m| message_value(m, harmony))
            .collect();
        let now = clock::DateTime::utc(input.now);
        let mut vars: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(messages)),
            (
                "tools".into(),
                input.tools.map_or(Value::from(()), Value::from_serialize),
            ),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(input.add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
            (
                "strftime_now".into(),
                Value::from_function(move |format: String| now.strftime(&format)),
            ),
        ];
        for (name, value) in input.variables.into_iter().flatten() {
            // transformers passes these as arguments of their own; a second
            // value is a `TypeError` there.
            if RESERVED.contains(&name.as_str()) {
                return Err(TextError::ChatTemplate(format!(
                    "template variable {name:?} comes from the request itself"
                )));
            }
            vars.push((name.clone(), Value::from_serialize(value)));
        }
        // Later entries win, so extra variables override the defaults.
        let context: Value = vars.into_iter().collect();
        limits::render(&self.env, NAME, context, describe).map_err(TextError::ChatTemplate)
    }
}

/// The Jinja environment transformers compiles templates in.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    limits::configure(&mut env);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(|state, value, method, args| {
        if let Some(s) = value.as_str()
            && let Some(result) = python::str_method(s, method, args)?
        {
            return Ok(result);
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });
    // `{{ x }}` and `|string` print what Python's `str(x)` prints.
    env.set_formatter(|out, _state, value| {
        out.write_str(&python::str_of(value))
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
    });
    env.add_filter("string", |value: Value| python::str_of(&value));
    env.add_filter("tojson", python::tojson);
    env.add_filter("round", python::round);
    env.add_filter("center", |s: Cow<'_, str>, width: Option<usize>| {
        python::justify(&s, width.unwrap_or(80), ' ', "center")
    });
    env.add_filter("dictsort", |value: Value, kwargs: Kwargs| {
        let pairs = minijinja::filters::dictsort(&value, kwargs)?;
        let tuples: Result<Vec<Value>, Error> = pairs
            .try_iter()?
            .map(|pair| Ok(python::Tuple::value(pair.try_iter()?.collect())))
            .collect();
        Ok::<_, Error>(Value::from(tuples?))
    });
    env.add_filter("wordcount", |s: Cow<'_, str>| python::wordcount(&s));
    env.add_test("callable", |value: Value| value.kind() == ValueKind::Plain);
    // Jinja2's `map`, `select`, `reject`, `selectattr`, `rejectattr` and
    // `unique` give generators: always true, without a length, refused by
    // `tojson`; minijinja's give lists.
    env.add_filter("map", |state: &State, value: Value, args: Rest<Value>| {
        minijinja::filters::map(state, value, args).map(Generator::value)
    });
    env.add_filter(
        "select",
        |state: &State, value: Value, test: Option<Cow<'_, str>>, args: Rest<Value>| {
            minijinja::filters::select(state, value, test, args).map(Generator::value)
        },
    );
    env.add_filter(
        "reject",
        |state: &State, value: Value, test: Option<Cow<'_, str>>, args: Rest<Value>| {
            minijinja::filters::reject(state, value, test, args).map(Generator::value)
        },
    );
    env.add_filter(
        "selectattr",
        |state: &State,
         value: Value,
         attr: Cow<'_, str>,
         test: Option<Cow<'_, str>>,
         args: Rest<Value>| {
            minijinja::filters::selectattr(state, value, attr, test, args).map(Generator::value)
        },
    );
    env.add_filter(
        "rejectattr",
        |state: &State,
         value: Value,
         attr: Cow<'_, str>,
         test: Option<Cow<'_, str>>,
         args: Rest<Value>| {
            minijinja::filters::rejectattr(state, value, attr, test, args).map(Generator::value)
        },
    );
    env.add_filter("unique", |state: &State, value: Value, kwargs: Kwargs| {
        let unique = minijinja::filters::unique(state, value, kwargs)?;
        Ok::<_, Error>(Generator::value(unique.try_iter()?.collect()))
    });
    // Jinja2's tests ask Python: `none` is not iterable (minijinja iterates
    // it as empty), and strings and dicts are sequences.
    env.add_test("iterable", |value: Value| {
        matches!(
            value.kind(),
            ValueKind::Undefined
                | ValueKind::String
                | ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Iterable
                | ValueKind::Bytes
        )
    });
    env.add_test("sequence", |value: Value| {
        matches!(
            value.kind(),
            ValueKind::Undefined
                | ValueKind::String
                | ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Bytes
        )
    });
    env.add_function(
        "raise_exception",
        |message: Value| -> Result<Value, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                python::str_of(&message),
            ))
        },
    );
    env
}

/// The items of a Jinja2 generator, computed at once.
#[derive(Debug)]
struct Generator(Vec<Value>);

impl Generator {
    fn value(items: Vec<Value>) -> Value {
        Value::from_object(Generator(items))
    }
}

impl Object for Generator {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Iterable
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.clone())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        None
    }

    fn is_true(self: &Arc<Self>) -> bool {
        true
    }
}

/// A message as the template sees it: the fields that are set, in
/// OpenAI's order; text parts joined into one string, as templates that
/// expect a string need (vLLM and the HTTP front join them the same way).
///
/// For a `harmony` template (gpt-oss) the reasoning is also `thinking`,
/// the field that template reads, and a turn with reasoning and tool calls
/// has no `content` (the template refuses both), as llama.cpp passes them:
/// the reasoning before a call is the one analysis gpt-oss sees again.
fn message_value(message: &ChatMessage, harmony: bool) -> Value {
    let mut fields: Vec<(&str, Value)> = vec![("role", Value::from(message.role.as_str()))];
    let thinking = message.reasoning_content.as_deref().filter(|_| harmony);
    let calls = message.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
    match &message.content {
        _ if thinking.is_some() && calls => {}
        Some(MessageContent::Text(text)) => fields.push(("content", Value::from(text.as_str()))),
        Some(parts @ MessageContent::Parts(_)) => {
            fields.push(("content", Value::from(parts.text().into_owned())));
        }
        None => fields.push(("content", Value::from(()))),
    }
    if let Some(name) = &message.name {
        fields.push(("name", Value::from(name.as_str())));
    }
    if let Some(calls) = &message.tool_calls {
        fields.push(("tool_calls", Value::from_serialize(calls)));
    }
    if let Some(id) = &message.tool_call_id {
        fields.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(reasoning) = &message.reasoning_content {
        fields.push(("reasoning_content", Value::from(reasoning.as_str())));
    }
    if let Some(thinking) = thinking {
        fields.push(("thinking", Value::from(thinking)));
    }
    fields.into_iter().collect()
}

/// The error and where it happened, without minijinja's multi-line debug
/// dump.
fn describe(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `source` with `{% generation %}` and `{% endgeneration %}` (transformers'
/// marker for assistant tokens, which renders its body unchanged) replaced
/// by a block of the same shape that minijinja knows, so whitespace control
/// works the same.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let inner = &tag[2..];
        let modifier_len = usize::from(inner.starts_with(['-', '+']));
        let body = inner[modifier_len..].trim_start();
        let replaced = ["endgeneration", "generation"].into_iter().find(|word| {
            body.starts_with(word)
                && body[word.len()..]
                    .trim_start()
                    .trim_start_matches(['-', '+'])
                    .starts_with("%}")
        });
        match replaced {
            Some(word) => {
                let lead = 2 + modifier_len + (inner.len() - modifier_len - body.len());
                out.push_str(&tag[..lead]);
                out.push_str(if word == "generation" {
                    "if true"
                } else {
                    "endif"
                });
                rest = &tag[lead + word.len()..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
