//! Chat turns as clients send them and chat templates see them.

use serde::{Deserialize, Serialize};

/// One turn of a chat, as in OpenAI's chat API. The chat template sees the
/// fields that are set, under these names, as Hugging Face's
/// `apply_chat_template` passes a message dict.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`; other roles go to the
    /// template as given.
    pub role: String,
    /// The turn's text: a string or text parts; absent (nil) only for an
    /// assistant turn that holds `tool_calls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// The speaker's name, for templates that show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The functions an assistant turn called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For a `tool` turn: the `id` of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning, kept apart from its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A turn with text content and no other field.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            ..Self::default()
        }
    }

    /// Bytes of every string the turn carries, for the prompt size limit.
    pub fn text_bytes(&self) -> usize {
        let content = match &self.content {
            Some(MessageContent::Text(text)) => text.len(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .map(|p| p.kind.len() + p.text.as_ref().map_or(0, String::len))
                .sum(),
            None => 0,
        };
        let calls: usize = self
            .tool_calls
            .iter()
            .flatten()
            .map(ToolCall::text_bytes)
            .sum();
        let optional = [&self.name, &self.tool_call_id, &self.reasoning_content];
        self.role.len()
            + content
            + calls
            + optional
                .iter()
                .map(|s| s.as_ref().map_or(0, String::len))
                .sum::<usize>()
    }
}

/// A turn's content: one string, or a list of parts as OpenAI's API allows
/// (only `{"type": "text", "text": ...}` parts are accepted).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts, in order.
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text: the string, or the text parts joined with `"\n"` (as the
    /// HTTP front and vLLM join them for templates that expect a string).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Text(text) => text.as_str().into(),
            Self::Parts(parts) => parts
                .iter()
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join("\n")
                .into(),
        }
    }
}

impl From<&str> for MessageContent {
    fn from(text: &str) -> Self {
        Self::Text(text.to_string())
    }
}

impl From<String> for MessageContent {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

// Written out rather than `untagged`, so a wrong type gets an error that
// says what is expected.
impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> serde::de::Visitor<'de> for ContentVisitor {
            type Value = MessageContent;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or an array of content parts")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(v.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                // The declared length is not trusted for the allocation.
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
                while let Some(part) = seq.next_element()? {
                    parts.push(part);
                }
                Ok(MessageContent::Parts(parts))
            }
        }
        deserializer.deserialize_any(ContentVisitor)
    }
}

/// One part of a turn's content. Parts of other types (images, audio)
/// decode, so that validation can name them, and are refused there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// `text`; any other type is refused.
    #[serde(rename = "type")]
    pub kind: String,
    /// The part's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A function call made by an assistant turn, as in OpenAI's API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which the `tool` turn answering it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, the only kind there is.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The function called and its arguments.
    pub function: FunctionCall,
}

impl ToolCall {
    fn text_bytes(&self) -> usize {
        let id = self.id.as_ref().map_or(0, String::len);
        let kind = self.kind.as_ref().map_or(0, String::len);
        id + kind + self.function.name.len() + json_bytes(&self.function.arguments)
    }
}

/// The function of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments, passed to the template as given: a JSON string (as
    /// OpenAI's API sends them) or a map (as some templates expect).
    pub arguments: serde_json::Value,
}

/// Bytes of the strings, keys and numbers in `value` (numbers count 8),
/// without serializing it.
pub(crate) fn json_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(_) => 1,
        Value::Number(_) => 8,
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(json_bytes).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| k.len() + json_bytes(v)).sum(),
    }
}
