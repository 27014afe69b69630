//! [`TextCodec`]: the text side of a model as the engine uses it, so the
//! engine runs on a [`ModelTokenizer`] or on a fake in tests alike.

use zinfer_protocol::ChatMessage;

use crate::detokenize::{DetokenizeError, TokenDecoder};
use crate::{ChatFeatures, ModelTokenizer, TemplateInput, TextError, TokenBytes, TokenizerError};

/// The text side of a model as the engine uses it; implemented by
/// [`ModelTokenizer`], and by fakes in tests.
pub trait TextCodec: TokenDecoder + Send + Sync {
    /// Token ids of `text`, no special tokens added.
    fn encode(&self, text: &str) -> Result<Vec<u32>, TextError>;
    /// Token ids of a prompt, with the BOS/EOS the model asks for (at most
    /// one BOS when the text already starts with it).
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.encode(text)
    }
    /// Text of `ids`, special tokens skipped.
    fn decode(&self, ids: &[u32]) -> Result<String, TextError>;
    /// The prompt text for a conversation.
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TextError>;
    /// The prompt text of a `generate` request's conversation, with its
    /// tools and template variables; a codec without them renders the
    /// turns alone.
    fn render_request(&self, input: &TemplateInput<'_>) -> Result<String, TextError> {
        self.render_chat(input.messages)
    }
    /// What the chat template supports: tool-call syntax, reasoning.
    fn chat_features(&self) -> ChatFeatures {
        ChatFeatures::default()
    }
    /// Tokens that end generation: every end-of-generation token of the model.
    fn eos_token_ids(&self) -> &[u32];
    /// llama.cpp's `llama_tokenize(text, add_special, parse_special)`; with
    /// both set, exactly [`Self::encode_prompt`] (what `generate` feeds the
    /// model).
    fn tokenize_text(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TextError> {
        match (add_special, parse_special) {
            (true, true) => self.encode_prompt(text),
            (false, true) => self.encode(text),
            (_, false) => Err(TokenizerError::Unsupported(
                "this tokenizer always recognises special tokens",
            )
            .into()),
        }
    }
    /// A reranker's prompt for one query/document pair (see
    /// [`ModelTokenizer::rerank_prompt`]); a codec without one refuses.
    fn rerank_prompt(&self, query: &str, document: &str) -> Result<Vec<u32>, TextError> {
        let _ = (query, document);
        Err(TokenizerError::Unsupported("this tokenizer has no rerank prompt").into())
    }
    /// The bytes of one token, special tokens written out.
    fn token_piece(&self, id: u32) -> Result<Vec<u8>, TextError> {
        Ok(self.decode(&[id])?.into_bytes())
    }
    /// The text of `ids` with special tokens written out (`detokenize`).
    fn detokenize_text(&self, ids: &[u32]) -> Result<String, TextError> {
        self.decode(ids)
    }
    /// The prompt text for a conversation, with or without the opening of
    /// the assistant's turn.
    fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        if add_generation_prompt {
            self.render_chat(messages)
        } else {
            Err(TextError::ChatTemplate(
                "this model renders only with the generation prompt".into(),
            ))
        }
    }
    /// Every token's bytes by id, for constrained decoding; a codec that
    /// cannot tell refuses constrained requests with this error.
    fn token_bytes(&self) -> Result<Vec<TokenBytes>, TextError> {
        Err(TokenizerError::Unsupported("this tokenizer does not expose its token bytes").into())
    }
}

/// The detokenizer decodes through any codec.
impl<T: TextCodec + ?Sized> TokenDecoder for T {
    fn decode_ids(&self, ids: &[u32]) -> Result<String, DetokenizeError> {
        self.decode(ids)
            .map_err(|error| DetokenizeError(error.to_string()))
    }
}

impl TextCodec for ModelTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        ModelTokenizer::encode(self, text)
    }
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TextError> {
        ModelTokenizer::encode_prompt(self, text)
    }
    fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        ModelTokenizer::decode(self, ids)
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TextError> {
        self.apply_chat_template(messages)
    }
    fn render_request(&self, input: &TemplateInput<'_>) -> Result<String, TextError> {
        ModelTokenizer::render_request(self, input)
    }
    fn chat_features(&self) -> ChatFeatures {
        ModelTokenizer::chat_features(self)
    }
    fn eos_token_ids(&self) -> &[u32] {
        ModelTokenizer::eos_token_ids(self)
    }
    fn tokenize_text(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TextError> {
        if add_special && parse_special {
            // The double-BOS guard of `generate`'s prompts included.
            ModelTokenizer::encode_prompt(self, text)
        } else {
            self.tokenize(text, add_special, parse_special)
        }
    }
    fn rerank_prompt(&self, query: &str, document: &str) -> Result<Vec<u32>, TextError> {
        ModelTokenizer::rerank_prompt(self, query, document)
    }
    fn token_piece(&self, id: u32) -> Result<Vec<u8>, TextError> {
        self.token_to_piece(id).ok_or_else(|| {
            TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            }
            .into()
        })
    }
    fn detokenize_text(&self, ids: &[u32]) -> Result<String, TextError> {
        Ok(self.detokenize(ids)?)
    }
    fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.apply_chat_template_with(messages, add_generation_prompt)
    }
    fn token_bytes(&self) -> Result<Vec<TokenBytes>, TextError> {
        ModelTokenizer::token_bytes(self)
    }
}
