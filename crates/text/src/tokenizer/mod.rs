//! The model's tokenizer and chat template.
//!
//! A GGUF file is tokenized exactly as llama.cpp tokenizes it (`vocab`:
//! its SentencePiece and BPE algorithms, the pre-tokenizer each
//! `tokenizer.ggml.pre` names, special tokens, BOS/EOS and the
//! end-of-generation set), checked against llama.cpp's own test
//! vocabularies. A safetensors checkpoint's `tokenizer.json` runs through
//! Hugging Face `tokenizers`.

mod rerank;
mod split;
mod unicode;
mod unicode_data;
mod vocab;

use std::path::Path;

use tokenizers::Tokenizer;
use zinfer_probe::{GgufHeader, HeaderError};
use zinfer_protocol::ChatMessage;

use crate::ChatFeatures;
use crate::TextError;
use crate::chat::{ChatTemplate, TemplateInput};
use rerank::RerankFormat;
use vocab::GgufVocab;

/// Tokens that end a turn in common chat formats; each one present in a
/// `tokenizer.json` vocabulary as a special token also stops generation.
const END_OF_TURN_TOKENS: [&str; 4] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
];

/// Why a tokenizer could not be built, or failed on input.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names an algorithm zinfer does not run.
    #[error(
        "tokenizer model `{0}` (tokenizer.ggml.model) is not supported: zinfer runs llama (SentencePiece), gpt2 and gemma4 (BPE) vocabularies, not bert (WordPiece), t5 (Unigram), rwkv or plamo2 ones"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer zinfer does not reproduce.
    #[error(
        "pre-tokenizer `{0}` (tokenizer.ggml.pre) is not supported: zinfer splits words as llama.cpp does for default, llama3/llama-bpe, qwen2, qwen35, gpt-2, mpt, starcoder, refact, command-r, smollm, falcon, deepseek-llm, deepseek-coder, gemma4 and their aliases"
    )]
    UnsupportedPre(String),
    /// A `tokenizer.*` key is missing or malformed.
    #[error("GGUF metadata `{key}`: {reason}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Text needs a byte the SentencePiece vocabulary has no token for.
    #[error(
        "the vocabulary has no token for byte 0x{0:02X} (neither <0x{0:02X}> nor the byte itself)"
    )]
    NoByteToken(u8),
    /// The Hugging Face tokenizer failed.
    #[error("{0}")]
    Hf(String),
    /// The `tokenizer.json` tokenizer cannot do what was asked.
    #[error("{0}")]
    Unsupported(&'static str),
    /// A token id at or past the end of the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId {
        /// The id.
        id: u32,
        /// Valid ids are below this.
        vocab_size: usize,
    },
}

/// What one token adds to the output, for constrained decoding: bytes of
/// text, or a special token that is no text (named by its own text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenBytes {
    /// Text bytes (possibly part of a UTF-8 character; empty for a token
    /// that never shows, such as an unused one).
    Text(Vec<u8>),
    /// A control token: decoding leaves it out of the text.
    Special(String),
}

#[derive(Debug)]
enum Backend {
    Gguf(Box<GgufVocab>),
    Hf {
        tokenizer: Box<Tokenizer>,
        bos: Option<u32>,
    },
}

/// Text <-> token ids, and chat messages -> prompt text.
#[derive(Debug)]
pub struct ModelTokenizer {
    backend: Backend,
    chat: ChatTemplate,
    eos: Vec<u32>,
    rerank: RerankFormat,
}

impl ModelTokenizer {
    /// Token ids of `text`, special tokens in it recognised, no BOS/EOS added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.tokenize(text, false, true)
    }

    /// Token ids of a prompt: BOS and EOS added as the model asks (GGUF
    /// `tokenizer.ggml.add_bos_token`, or the `tokenizer.json` post-processor),
    /// special tokens recognised, and never two BOS at the start when the
    /// text (a chat template's output, say) already begins with one.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let mut ids = self.tokenize(text, true, true)?;
        if let Some(bos) = self.bos_token_id()
            && ids.len() >= 2
            && ids[0] == bos
            && ids[1] == bos
        {
            ids.remove(0);
        }
        Ok(ids)
    }

    /// llama.cpp's `llama_tokenize(text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS as the model asks; `parse_special` lets
    /// control tokens written in the text be recognised (user-defined ones
    /// always are).
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TextError> {
        match &self.backend {
            Backend::Gguf(vocab) => Ok(vocab.tokenize(text, add_special, parse_special)?),
            Backend::Hf { tokenizer, .. } => {
                if !parse_special {
                    return Err(TokenizerError::Unsupported(
                        "a tokenizer.json tokenizer always recognises special tokens",
                    )
                    .into());
                }
                let enc = tokenizer.encode_fast(text, add_special).map_err(hf_err)?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }

    /// The prompt of a reranker for one query/document pair, as
    /// llama-server builds it: the file's `tokenizer.chat_template.rerank`
    /// with `{query}` and `{document}` put in, else `[BOS] query [EOS]
    /// [SEP] document [EOS]` as the model adds those (see `rerank.rs`).
    pub fn rerank_prompt(&self, query: &str, document: &str) -> Result<Vec<u32>, TextError> {
        self.rerank.prompt(query, document, |text, parse_special| {
            self.tokenize(text, false, parse_special)
        })
    }

    /// Text of `ids`, leaving out control tokens. Invalid UTF-8 (a
    /// character split across byte tokens) decodes as U+FFFD, so a stream
    /// can hold back text that ends in one.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        match &self.backend {
            Backend::Gguf(vocab) => Ok(vocab.decode(ids)),
            Backend::Hf { tokenizer, .. } => Ok(tokenizer.decode(ids, true).map_err(hf_err)?),
        }
    }

    /// The prompt for a conversation, ending where the assistant's reply starts.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, TextError> {
        self.chat.render_messages(messages)
    }

    /// The prompt for a conversation with tools, extra template variables
    /// or a fixed clock, as transformers' `apply_chat_template` renders it.
    pub fn render_chat(&self, input: &TemplateInput<'_>) -> Result<String, TextError> {
        self.chat.render(input)
    }

    /// What the chat template supports: tool-call syntax, tools, reasoning.
    pub fn chat_features(&self) -> ChatFeatures {
        self.chat.features()
    }

    /// The prompt of a `generate` request's conversation, tools included
    /// (through the Hermes fallback when the template does not show them).
    pub fn render_request(&self, input: &TemplateInput<'_>) -> Result<String, TextError> {
        self.chat.render_request(input)
    }

    /// The prompt for a conversation; with `add_generation_prompt` it is
    /// [`Self::apply_chat_template`]'s, without it the template stops
    /// after the last message.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.chat.render(&TemplateInput {
            add_generation_prompt,
            ..TemplateInput::new(messages)
        })
    }

    /// llama.cpp's `token_to_piece(id, special = true)`: the token's bytes,
    /// special tokens written out; `None` for an id outside the vocabulary.
    /// A piece need not be UTF-8 (a byte token holds part of a character).
    pub fn token_to_piece(&self, id: u32) -> Option<Vec<u8>> {
        if id as usize >= self.vocab_size() {
            return None;
        }
        match &self.backend {
            Backend::Gguf(vocab) => vocab.piece_special(id).map(<[u8]>::to_vec),
            Backend::Hf { tokenizer, .. } => {
                tokenizer.decode(&[id], false).ok().map(String::into_bytes)
            }
        }
    }

    /// The pieces of `ids` joined (llama-server's `/detokenize`): special
    /// tokens written out, nothing stripped, invalid UTF-8 as U+FFFD. An id
    /// outside the vocabulary is an error naming it.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let vocab_size = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(TokenizerError::UnknownId { id, vocab_size });
        }
        if let Backend::Hf { tokenizer, .. } = &self.backend {
            // Byte-level pieces decode only together (one alone may be
            // part of a character).
            return tokenizer.decode(ids, false).map_err(hf_err);
        }
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = self.token_to_piece(id).ok_or(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            })?;
            bytes.extend_from_slice(&piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Tokens that end generation, sorted: for a GGUF file llama.cpp's
    /// end-of-generation set (EOS, EOT, EOM and every end-of-turn token).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The token a prompt starts with, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        match &self.backend {
            Backend::Gguf(vocab) => vocab.bos,
            Backend::Hf { bos, .. } => *bos,
        }
    }

    /// Every token's bytes, by id, as generated text holds them; special
    /// tokens flagged. Built once per model for constrained decoding.
    pub fn token_bytes(&self) -> Result<Vec<TokenBytes>, TextError> {
        match &self.backend {
            Backend::Gguf(vocab) => Ok(vocab.token_bytes()),
            Backend::Hf { tokenizer, .. } => hf_token_bytes(tokenizer),
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Gguf(vocab) => vocab.len(),
            Backend::Hf { tokenizer, .. } => tokenizer.get_vocab_size(true),
        }
    }

    /// The tokenizer and chat template of a model on disk, without its
    /// weights: a GGUF file's metadata (llama.cpp's vocabulary-only files
    /// included), or a Hugging Face directory's `tokenizer.json` (with the
    /// end-of-generation ids of its `config.json`).
    pub fn open(path: &Path) -> Result<Self, TextError> {
        if path.is_dir() {
            Self::from_hf_dir(path, &config_eos(path))
        } else {
            Self::from_gguf_file(path)
        }
    }

    /// Reads the tokenizer and chat template of a GGUF file, weights or
    /// not (llama.cpp's vocabulary-only files have none).
    pub fn from_gguf_file(path: &Path) -> Result<Self, TextError> {
        let header = zinfer_probe::read_header(path).map_err(|e| match e {
            HeaderError::Io { path, source } => TextError::Io { path, source },
            other => TextError::Gguf(other),
        })?;
        Self::from_gguf(&header)
    }

    /// Builds the tokenizer and chat template from a GGUF file's metadata
    /// (its arrays are read from the file as the vocabulary needs them).
    fn from_gguf(header: &GgufHeader) -> Result<Self, TextError> {
        let vocab = GgufVocab::from_metadata(header)?;
        let text = |id: Option<u32>| {
            id.and_then(|id| vocab.text(id))
                .map(String::from)
                .unwrap_or_default()
        };
        let template = header.str("tokenizer.chat_template").map(String::from);
        let chat = ChatTemplate::new(template, text(vocab.bos), text(vocab.eos));
        chat.check_limits()?;
        let eos = vocab.eog.clone();
        let rerank = RerankFormat::from_header(header, vocab.bos, vocab.eos, vocab.add_bos);
        Ok(Self {
            backend: Backend::Gguf(Box::new(vocab)),
            chat,
            eos,
            rerank,
        })
    }

    /// Loads `tokenizer.json` and the chat template from a Hugging Face checkpoint directory.
    pub(crate) fn from_hf_dir(dir: &Path, eos_from_config: &[u32]) -> Result<Self, TextError> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path)
            .map_err(|e| TokenizerError::Hf(format!("{}: {e}", path.display())))?;
        let config: serde_json::Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        let token_of = |key: &str| {
            let text = match &config[key] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => {
                    o.get("content").and_then(|c| c.as_str()).map(String::from)
                }
                _ => None,
            }?;
            tokenizer.token_to_id(&text).map(|id| (id, text))
        };
        let bos = token_of("bos_token");
        let eos = token_of("eos_token");
        // As transformers does: `chat_template.jinja` beside the checkpoint
        // wins over the `chat_template` of `tokenizer_config.json`.
        let jinja = dir.join("chat_template.jinja");
        let template = match std::fs::read_to_string(&jinja) {
            Ok(source) => Some(source),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match &config["chat_template"] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Array(list) => list
                    .iter()
                    .find(|t| t["name"] == "default")
                    .and_then(|t| t["template"].as_str())
                    .map(String::from),
                _ => None,
            },
            Err(e) => {
                return Err(TextError::ChatTemplate(format!("{}: {e}", jinja.display())));
            }
        };
        let mut eos_ids: Vec<u32> = eos.iter().map(|(id, _)| *id).collect();
        for tok in END_OF_TURN_TOKENS {
            let special = tokenizer.get_added_vocabulary().is_special_token(tok);
            if let (true, Some(id)) = (special, tokenizer.token_to_id(tok)) {
                eos_ids.push(id);
            }
        }
        eos_ids.extend_from_slice(eos_from_config);
        eos_ids.sort_unstable();
        eos_ids.dedup();
        let chat = ChatTemplate::new(
            template,
            bos.as_ref().map(|(_, t)| t.clone()).unwrap_or_default(),
            eos.map(|(_, t)| t).unwrap_or_default(),
        );
        chat.check_limits()?;
        Ok(Self {
            backend: Backend::Hf {
                tokenizer: Box::new(tokenizer),
                bos: bos.map(|(id, _)| id),
            },
            chat,
            eos: eos_ids,
            // A directory has no rerank template or GGUF flags: the
            // plain-text fallback, which needs a GGUF vocabulary.
            rerank: RerankFormat::default(),
        })
    }
}

/// The `eos_token_id`s of a checkpoint directory's `config.json` (one id
/// or a list): they end generation too. None when the file is missing or
/// unreadable (loading the weights reports that).
fn config_eos(dir: &Path) -> Vec<u32> {
    let config: serde_json::Value = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    match &config["eos_token_id"] {
        serde_json::Value::Number(n) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
        serde_json::Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_u64())
            .map(|v| v as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// Token bytes of a `tokenizer.json` vocabulary: byte-level (GPT-2's
/// stand-in characters) or SentencePiece-style (`▁` for a space, `<0xAB>`
/// byte fallback), told apart by its decoder; added special tokens are
/// special.
fn hf_token_bytes(tokenizer: &Tokenizer) -> Result<Vec<TokenBytes>, TextError> {
    let decoder = serde_json::to_value(tokenizer.get_decoder()).map_err(hf_err)?;
    let kinds = |d: &serde_json::Value| -> Vec<String> {
        match d["type"].as_str() {
            Some("Sequence") => d["decoders"]
                .as_array()
                .map(|list| {
                    list.iter()
                        .filter_map(|d| d["type"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default(),
            Some(kind) => vec![kind.to_string()],
            None => Vec::new(),
        }
    };
    let kinds = kinds(&decoder);
    let byte_level = kinds.iter().any(|k| k == "ByteLevel");
    let byte_fallback = kinds.iter().any(|k| k == "ByteFallback");
    if !byte_level && !byte_fallback {
        return Err(TokenizerError::Unsupported(
            "constrained decoding needs a byte-level or byte-fallback tokenizer.json decoder",
        )
        .into());
    }
    let n = tokenizer.get_vocab_size(true);
    let added = tokenizer.get_added_vocabulary();
    let mut out = Vec::with_capacity(n);
    for id in 0..n as u32 {
        let Some(text) = tokenizer.id_to_token(id) else {
            out.push(TokenBytes::Text(Vec::new()));
            continue;
        };
        if added.is_special_token(&text) {
            out.push(TokenBytes::Special(text));
            continue;
        }
        let bytes = if byte_level {
            text.chars()
                .map(unicode::char_to_byte)
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| text.as_bytes().to_vec())
        } else if let Some(byte) = text
            .strip_prefix("<0x")
            .and_then(|t| t.strip_suffix('>'))
            .filter(|hex| hex.len() == 2)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            vec![byte]
        } else {
            text.replace('\u{2581}', " ").into_bytes()
        };
        out.push(TokenBytes::Text(bytes));
    }
    Ok(out)
}

fn hf_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Hf(e.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A GGUF metadata value of the types these tests write.
    enum Value {
        String(String),
        U32(u32),
        F32(f32),
        Array(Vec<Value>),
    }

    impl Value {
        /// GGUF's type code.
        fn code(&self) -> u32 {
            match self {
                Value::U32(_) => 4,
                Value::F32(_) => 6,
                Value::String(_) => 8,
                Value::Array(_) => 9,
            }
        }

        /// The value's bytes, without its type code.
        fn write(&self, out: &mut Vec<u8>) {
            match self {
                Value::String(s) => {
                    out.extend((s.len() as u64).to_le_bytes());
                    out.extend(s.as_bytes());
                }
                Value::U32(x) => out.extend(x.to_le_bytes()),
                Value::F32(x) => out.extend(x.to_le_bytes()),
                Value::Array(items) => {
                    out.extend(items.first().map_or(8, Value::code).to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for item in items {
                        item.write(out);
                    }
                }
            }
        }
    }

    fn strings(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
    }

    /// The tokenizer of a GGUF file (version 3, no tensors) holding
    /// `metadata`, read back through the file as a model's is.
    fn from_metadata(metadata: HashMap<String, Value>) -> Result<ModelTokenizer, TextError> {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        bytes.extend((metadata.len() as u64).to_le_bytes());
        for (key, value) in &metadata {
            Value::String(key.clone()).write(&mut bytes);
            bytes.extend(value.code().to_le_bytes());
            value.write(&mut bytes);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vocab.gguf");
        std::fs::write(&path, bytes).unwrap();
        ModelTokenizer::from_gguf_file(&path)
    }

    /// A tiny SentencePiece (llama) vocabulary with byte tokens for `!`.
    fn spm_metadata() -> HashMap<String, Value> {
        let tokens = [
            "<unk>",
            "<s>",
            "</s>",
            "\u{2581}",
            "h",
            "e",
            "l",
            "o",
            "\u{2581}h",
            "el",
            "lo",
            "\u{2581}hel",
            "\u{2581}hello",
            "<0x21>",
        ];
        let scores = [
            0.0, 0.0, 0.0, -10.0, -11.0, -12.0, -13.0, -14.0, -1.0, -2.0, -3.0, -5.0, -6.0, 0.0,
        ];
        let types = [2u32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6];
        let mut metadata = HashMap::new();
        metadata.insert(
            "tokenizer.ggml.model".to_string(),
            Value::String("llama".to_string()),
        );
        metadata.insert("tokenizer.ggml.tokens".to_string(), strings(&tokens));
        metadata.insert(
            "tokenizer.ggml.scores".to_string(),
            Value::Array(scores.iter().map(|&s| Value::F32(s)).collect()),
        );
        metadata.insert(
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(types.iter().map(|&t| Value::U32(t)).collect()),
        );
        metadata.insert("tokenizer.ggml.bos_token_id".to_string(), Value::U32(1));
        metadata.insert("tokenizer.ggml.eos_token_id".to_string(), Value::U32(2));
        metadata
    }

    /// Pieces as llama-server's `/tokenize` `with_pieces` and
    /// `/detokenize` give them: control tokens written out, byte tokens as
    /// their byte, nothing stripped.
    #[test]
    fn pieces_write_special_tokens_and_bytes() {
        let tok = from_metadata(spm_metadata()).unwrap();
        assert_eq!(tok.token_to_piece(1).unwrap(), b"<s>");
        assert_eq!(tok.token_to_piece(12).unwrap(), b" hello");
        assert_eq!(tok.token_to_piece(13).unwrap(), b"!");
        assert_eq!(tok.token_to_piece(14), None);
        assert_eq!(tok.detokenize(&[1, 12, 13, 2]).unwrap(), "<s> hello!</s>");
        assert!(matches!(
            tok.detokenize(&[1, 99]),
            Err(TokenizerError::UnknownId { id: 99, .. })
        ));
    }

    /// SentencePiece as llama.cpp runs it: the highest-scoring pair merges
    /// first, a space is prepended to text after a special token, bytes
    /// without a token fall back to `<0xXX>`, control tokens are matched
    /// only when asked, and BOS comes with `add_special`.
    #[test]
    fn sentencepiece_merges_by_score_with_a_space_prefix() {
        let tok = from_metadata(spm_metadata()).unwrap();

        assert_eq!(tok.encode("hello").unwrap(), [12]);
        assert_eq!(tok.encode("hell").unwrap(), [11, 6]);
        assert_eq!(tok.encode("hello!").unwrap(), [12, 13]);
        assert_eq!(tok.encode("<s>hello hello</s>").unwrap(), [1, 12, 12, 2]);
        // Unparsed, `<s>` is plain text, and `<` has no token, not even a
        // byte token (llama.cpp throws there).
        assert!(matches!(
            tok.tokenize("<s>", false, false),
            Err(TextError::Tokenizer(TokenizerError::NoByteToken(b'<')))
        ));
        assert_eq!(tok.encode_prompt("hello").unwrap(), [1, 12]);
        // A prompt that already starts with BOS gets no second one.
        assert_eq!(tok.encode_prompt("<s>hello").unwrap(), [1, 12]);
        // llama.cpp drops the prefix space of the first token only.
        assert_eq!(tok.decode(&[12, 12, 13]).unwrap(), "hello hello!");
        assert_eq!(tok.decode(&[1, 12, 2]).unwrap(), " hello");
        assert_eq!(tok.eos_token_ids(), [2]);
        // No template in the file: ChatML.
        let chat = tok
            .apply_chat_template(&[ChatMessage::new("user".to_string(), "hi".to_string())])
            .unwrap();
        assert_eq!(
            chat,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn unsupported_tokenizers_are_named() {
        let mut md = spm_metadata();
        md.insert(
            "tokenizer.ggml.model".to_string(),
            Value::String("bert".to_string()),
        );
        let err = from_metadata(md).unwrap_err();
        assert!(err.to_string().contains("`bert`"), "{err}");

        let mut md = spm_metadata();
        md.insert(
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".to_string()),
        );
        md.insert("tokenizer.ggml.merges".to_string(), strings(&["h e"]));
        md.insert(
            "tokenizer.ggml.pre".to_string(),
            Value::String("tekken".to_string()),
        );
        let err = from_metadata(md).unwrap_err();
        assert!(
            matches!(&err, TextError::Tokenizer(TokenizerError::UnsupportedPre(p)) if p == "tekken"),
            "{err}"
        );
    }

    /// A word-level `tokenizer.json` with `<s>` and `</s>` as special tokens.
    const TINY_TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,
        "added_tokens":[
          {"id":0,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
          {"id":1,"content":"</s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
        "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"<s>":0,"</s>":1,"hi":2,"[UNK]":3},"unk_token":"[UNK]"}}"#;

    #[test]
    fn tokenizer_json_token_bytes_follow_the_decoder() {
        // No byte-level or byte-fallback decoder: refused by name.
        let dir = hf_dir(&[]);
        let tok = ModelTokenizer::from_hf_dir(dir.path(), &[]).unwrap();
        assert!(tok.token_bytes().is_err());
        // SentencePiece style: `▁` is a space, `<0x0A>` its byte, `<s>` special.
        let json = TINY_TOKENIZER
            .replace(
                r#""decoder":null"#,
                r#""decoder":{"type":"Sequence","decoders":[
                    {"type":"Replace","pattern":{"String":"▁"},"content":" "},
                    {"type":"ByteFallback"}]}"#,
            )
            .replace(r#""hi":2"#, r#""▁hi":2,"<0x0A>":4"#);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), json).unwrap();
        let tok = ModelTokenizer::from_hf_dir(dir.path(), &[]).unwrap();
        let bytes = tok.token_bytes().unwrap();
        assert_eq!(bytes[0], TokenBytes::Special("<s>".into()));
        assert_eq!(bytes[2], TokenBytes::Text(b" hi".to_vec()));
        assert_eq!(bytes[4], TokenBytes::Text(b"\n".to_vec()));
    }

    /// A checkpoint directory with the tiny tokenizer and the given files.
    fn hf_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), TINY_TOKENIZER).unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    fn chat_of(dir: &tempfile::TempDir) -> String {
        let tok = ModelTokenizer::from_hf_dir(dir.path(), &[]).unwrap();
        tok.apply_chat_template(&[ChatMessage::new("user".to_string(), "  hi ".to_string())])
            .unwrap()
    }

    const CONFIG: &str = r#"{"bos_token":"<s>","eos_token":"</s>",
        "chat_template":"{{ bos_token }}{% for m in messages %}[config {{ m['content'].strip() }}]{% endfor %}"}"#;

    #[test]
    fn checkpoint_template_comes_from_chat_template_jinja_before_tokenizer_config() {
        // tokenizer_config.json alone: its template, with its special tokens.
        let dir = hf_dir(&[("tokenizer_config.json", CONFIG)]);
        assert_eq!(chat_of(&dir), "<s>[config hi]");
        assert_eq!(
            ModelTokenizer::from_hf_dir(dir.path(), &[])
                .unwrap()
                .eos_token_ids(),
            [1]
        );

        // chat_template.jinja beside it wins, Python methods and all.
        let jinja = "{% for m in messages %}\n{% if m['content'].strip().startswith('hi') %}\n[jinja {{ m['content'].strip().title() }}]{{ eos_token }}\n{% endif %}\n{% endfor %}";
        let dir = hf_dir(&[
            ("tokenizer_config.json", CONFIG),
            ("chat_template.jinja", jinja),
        ]);
        assert_eq!(chat_of(&dir), "[jinja Hi]</s>\n");

        // Neither: ChatML.
        let dir = hf_dir(&[]);
        assert_eq!(
            chat_of(&dir),
            "<|im_start|>user\n  hi <|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
