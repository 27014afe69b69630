//! The text requests: `tokenize`, `detokenize` and `apply_template`, and
//! their replies. They run the model's tokenizer or chat template on a
//! worker serving the model, never its forward pass or its KV cache, so a
//! client can count, inspect or prepare a prompt exactly as `generate`
//! would see it.

use serde::{Deserialize, Serialize};

use crate::chat::ChatMessage;
use crate::ids::RequestId;

fn default_true() -> bool {
    true
}
fn nil_is_true<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::deserialize(deserializer)?.unwrap_or(true))
}
fn nil_is_false<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::deserialize(deserializer)?.unwrap_or(false))
}
fn is_false(value: &bool) -> bool {
    !*value
}

/// `tokenize`: the token ids of `content` under a model's tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeRequest {
    /// Client request id, echoed on the reply.
    pub id: RequestId,
    /// Model name; the router's default model when absent (as `generate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The text, taken as is.
    pub content: String,
    /// Add BOS/EOS as the model file asks (default true); with
    /// `parse_special` too, the ids are exactly those a `generate` with
    /// this `prompt` feeds the model.
    #[serde(default = "default_true", deserialize_with = "nil_is_true")]
    pub add_special: bool,
    /// Recognise special-token text such as `<|im_start|>` as the special
    /// token (default true); false tokenizes it as plain text.
    #[serde(default = "default_true", deserialize_with = "nil_is_true")]
    pub parse_special: bool,
    /// Also return each token's piece (default false).
    #[serde(
        default,
        deserialize_with = "nil_is_false",
        skip_serializing_if = "is_false"
    )]
    pub with_pieces: bool,
}

/// `detokenize`: the text of token ids, special tokens written out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeRequest {
    /// Client request id, echoed on the reply.
    pub id: RequestId,
    /// Model name; the router's default model when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Token ids, each below the model's `vocab_size`.
    pub tokens: Vec<u32>,
}

/// `apply_template`: the prompt text the model's chat template makes of
/// `messages`, as `generate` with `messages` would feed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyTemplateRequest {
    /// Client request id, echoed on the reply.
    pub id: RequestId,
    /// Model name; the router's default model when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Chat turns, as in `generate`; at least one.
    pub messages: Vec<ChatMessage>,
    /// End with the opening of the assistant's turn (default true, what
    /// `generate` does).
    #[serde(default = "default_true", deserialize_with = "nil_is_true")]
    pub add_generation_prompt: bool,
}

/// A token's piece: its text, or its bytes when they are not valid UTF-8
/// on their own (a byte token, part of a character), as llama-server
/// reports them. On the wire a `str`, or an array of integers 0 to 255.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Piece {
    /// Valid UTF-8.
    Text(String),
    /// Raw bytes (an array of integers, never `bin`).
    Bytes(Vec<u8>),
}

impl Piece {
    /// The piece of `bytes`: text when they are valid UTF-8.
    pub fn from_bytes(bytes: Vec<u8>) -> Piece {
        match String::from_utf8(bytes) {
            Ok(text) => Piece::Text(text),
            Err(error) => Piece::Bytes(error.into_bytes()),
        }
    }

    /// The piece's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Piece::Text(text) => text.as_bytes(),
            Piece::Bytes(bytes) => bytes,
        }
    }
}

/// A text request as the router forwards it to a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum TextRequest {
    /// `tokenize`.
    Tokenize(TokenizeRequest),
    /// `detokenize`.
    Detokenize(DetokenizeRequest),
    /// `apply_template`.
    ApplyTemplate(ApplyTemplateRequest),
}
