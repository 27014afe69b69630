//! The model's tokenizer and chat template.
//!
//! A `tokenizer.json` is used as is. Without one, the tokenizer is rebuilt
//! from GGUF metadata: GPT-2 style byte-level BPE from the token list and
//! merges (with the pre-tokenizer that `tokenizer.ggml.pre` names), or a
//! SentencePiece (llama) vocabulary turned into an equivalent byte-fallback
//! BPE whose merges follow the token scores.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::tokenizer::SplitDelimiterBehavior;
use tokenizers::{AddedToken, Tokenizer};
use zinfer_protocol::ChatMessage;

use super::ModelError;
use super::chat::ChatTemplate;

/// Tokens that end a turn in common chat formats; each one present in the
/// vocabulary as a special token also stops generation.
const END_OF_TURN_TOKENS: [&str; 4] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
];

/// Pre-tokenizer regexes as llama.cpp names them in `tokenizer.ggml.pre`.
const REGEX_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const REGEX_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Text <-> token ids, and chat messages -> prompt text.
#[derive(Debug)]
pub struct ModelTokenizer {
    inner: Tokenizer,
    chat: ChatTemplate,
    eos: Vec<u32>,
}

impl ModelTokenizer {
    /// Token ids of `text`, without adding BOS/EOS (chat templates carry their own).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self.inner.encode_fast(text, false).map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, leaving out special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.inner.decode(ids, true).map_err(tok_err)
    }

    /// The prompt for a conversation, ending where the assistant's reply starts.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, ModelError> {
        self.chat.render(messages)
    }

    /// Tokens that end generation.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The underlying `tokenizers` tokenizer (to save it, or inspect special tokens).
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Builds the tokenizer and chat template from a GGUF file's metadata.
    pub(crate) fn from_gguf(ct: &Content) -> Result<Self, ModelError> {
        let md = &ct.metadata;
        let kind = md_str(md, "tokenizer.ggml.model")?;
        let tokens = md_strings(md, "tokenizer.ggml.tokens")?;
        let types = md_u32s(md, "tokenizer.ggml.token_type").unwrap_or_default();
        let mut tokenizer = match kind.as_str() {
            "gpt2" => {
                let pre =
                    md_str(md, "tokenizer.ggml.pre").unwrap_or_else(|_| "default".to_string());
                byte_level_bpe(&tokens, &md_strings(md, "tokenizer.ggml.merges")?, &pre)?
            }
            "llama" => {
                let scores = md_f32s(md, "tokenizer.ggml.scores")?;
                sentencepiece_bpe(&tokens, &scores, &types)?
            }
            other => {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer model `{other}` is not supported: use a file with a gpt2 or llama tokenizer, or a directory with tokenizer.json"
                )));
            }
        };
        // Control (3) and user-defined (4) tokens are matched whole and hidden when decoding.
        let specials = tokens
            .iter()
            .zip(&types)
            .filter(|&(_, t)| matches!(t, 3 | 4))
            .map(|(tok, _)| AddedToken::from(tok.clone(), true));
        tokenizer.add_special_tokens(specials).map_err(tok_err)?;
        let token_at = |key: &str| {
            md_u32(md, key)
                .ok()
                .and_then(|id| tokens.get(id as usize).map(|t| (id, t.clone())))
        };
        let bos = token_at("tokenizer.ggml.bos_token_id");
        let eos = token_at("tokenizer.ggml.eos_token_id");
        let template = md_str(md, "tokenizer.chat_template").ok();
        Ok(Self::assemble(tokenizer, template, bos, eos))
    }

    /// Loads `tokenizer.json` and the chat template from a Hugging Face checkpoint directory.
    pub(crate) fn from_hf_dir(dir: &Path, eos_from_config: &[u32]) -> Result<Self, ModelError> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
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
                return Err(ModelError::ChatTemplate(format!(
                    "{}: {e}",
                    jinja.display()
                )));
            }
        };
        let mut me = Self::assemble(tokenizer, template, bos, eos);
        for &id in eos_from_config {
            if !me.eos.contains(&id) {
                me.eos.push(id);
            }
        }
        Ok(me)
    }

    fn assemble(
        inner: Tokenizer,
        template: Option<String>,
        bos: Option<(u32, String)>,
        eos: Option<(u32, String)>,
    ) -> Self {
        let mut eos_ids: Vec<u32> = eos.iter().map(|(id, _)| *id).collect();
        for tok in END_OF_TURN_TOKENS {
            let special = inner.get_added_vocabulary().is_special_token(tok);
            if let (true, Some(id)) = (special, inner.token_to_id(tok))
                && !eos_ids.contains(&id)
            {
                eos_ids.push(id);
            }
        }
        let chat = ChatTemplate::new(
            template,
            bos.map(|(_, t)| t).unwrap_or_default(),
            eos.map(|(_, t)| t).unwrap_or_default(),
        );
        Self {
            inner,
            chat,
            eos: eos_ids,
        }
    }
}

/// GPT-2 style byte-level BPE with the pre-tokenizer llama.cpp calls `pre`.
fn byte_level_bpe(
    tokens: &[String],
    merges: &[String],
    pre: &str,
) -> Result<Tokenizer, ModelError> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    ModelError::Tokenizer(format!("invalid merge `{m}` in GGUF metadata"))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(tok_err)?;
    let mut tokenizer = Tokenizer::new(bpe);
    let split = |regex: &str| {
        Split::new(
            SplitPattern::Regex(regex.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tok_err)
    };
    let pre_tokenizer = match pre {
        // SmolLM: every digit alone, then GPT-2's byte-level split without a prefix space.
        "smollm" => PreSequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ]),
        "llama3" | "llama-bpe" | "smaug-bpe" => PreSequence::new(vec![
            split(REGEX_LLAMA3)?.into(),
            ByteLevel::new(false, true, false).into(),
        ]),
        "qwen2" => PreSequence::new(vec![
            split(REGEX_QWEN2)?.into(),
            ByteLevel::new(false, true, false).into(),
        ]),
        _ => PreSequence::new(vec![ByteLevel::new(false, true, true).into()]),
    };
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));
    Ok(tokenizer)
}

/// A SentencePiece vocabulary as a byte-fallback BPE, the way Hugging Face
/// converts llama tokenizers: a merge `(a, b)` exists for every token that is
/// the concatenation of two other tokens, ranked by that token's score.
fn sentencepiece_bpe(
    tokens: &[String],
    scores: &[f32],
    types: &[u32],
) -> Result<Tokenizer, ModelError> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut ranked: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        // Only normal tokens (type 1, or untyped) are built by merging.
        if types.get(id).is_some_and(|&t| t != 1) {
            continue;
        }
        let score = scores.get(id).copied().unwrap_or(0.0);
        for (cut, _) in tok.char_indices().skip(1) {
            let (a, b) = tok.split_at(cut);
            if let (Some(&ia), Some(&ib)) = (index.get(a), index.get(b)) {
                ranked.push((score, id, ia, ib));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let merges = ranked
        .into_iter()
        .map(|(_, _, a, b)| (tokens[a].clone(), tokens[b].clone()))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = types
        .iter()
        .position(|&t| t == 2)
        .and_then(|i| tokens.get(i))
    {
        builder = builder.unk_token(unk.clone());
    }
    let mut tokenizer = Tokenizer::new(builder.build().map_err(tok_err)?);
    let normalizer = NormalizerSequence::new(vec![
        Prepend::new("\u{2581}".to_string()).into(),
        Replace::new(" ", "\u{2581}").map_err(tok_err)?.into(),
    ]);
    tokenizer
        .with_normalizer(Some(normalizer))
        .map_err(tok_err)?;
    let decoder = DecoderSequence::new(vec![
        Replace::new("\u{2581}", " ").map_err(tok_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
        Strip::new(' ', 1, 0).into(),
    ]);
    tokenizer.with_decoder(Some(decoder));
    Ok(tokenizer)
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

fn md<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a Value, ModelError> {
    md.get(key)
        .ok_or_else(|| ModelError::Format(format!("GGUF metadata has no `{key}`")))
}

fn md_str(m: &HashMap<String, Value>, key: &str) -> Result<String, ModelError> {
    md(m, key)?
        .to_string()
        .cloned()
        .map_err(|e| ModelError::Format(format!("`{key}`: {e}")))
}

fn md_u32(m: &HashMap<String, Value>, key: &str) -> Result<u32, ModelError> {
    super::gguf::value_usize(md(m, key)?, key).map(|v| v as u32)
}

fn md_array<'a>(m: &'a HashMap<String, Value>, key: &str) -> Result<&'a Vec<Value>, ModelError> {
    md(m, key)?
        .to_vec()
        .map_err(|e| ModelError::Format(format!("`{key}`: {e}")))
}

fn md_strings(m: &HashMap<String, Value>, key: &str) -> Result<Vec<String>, ModelError> {
    md_array(m, key)?
        .iter()
        .map(|v| {
            v.to_string()
                .cloned()
                .map_err(|e| ModelError::Format(format!("`{key}`: {e}")))
        })
        .collect()
}

fn md_u32s(m: &HashMap<String, Value>, key: &str) -> Result<Vec<u32>, ModelError> {
    md_array(m, key)?
        .iter()
        .map(|v| super::gguf::value_usize(v, key).map(|v| v as u32))
        .collect()
}

fn md_f32s(m: &HashMap<String, Value>, key: &str) -> Result<Vec<f32>, ModelError> {
    md_array(m, key)?
        .iter()
        .map(|v| {
            v.to_f32()
                .map_err(|e| ModelError::Format(format!("`{key}`: {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};

    use super::*;

    fn strings(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
    }

    /// A SentencePiece (llama) vocabulary: merges follow the token scores,
    /// spaces become `▁`, control tokens are special, and decoding drops the
    /// leading space the normalizer added.
    #[test]
    fn sentencepiece_vocabulary_becomes_a_bpe() {
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
        ];
        let scores = [
            0.0, 0.0, 0.0, -10.0, -11.0, -12.0, -13.0, -14.0, -1.0, -2.0, -3.0, -5.0, -6.0,
        ];
        let types = [2u32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
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
        let ct = Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        };
        let tok = ModelTokenizer::from_gguf(&ct).unwrap();

        assert_eq!(tok.encode("hello").unwrap(), [12]);
        assert_eq!(tok.encode("hell").unwrap(), [11, 6]);
        assert_eq!(tok.encode("<s>hello hello</s>").unwrap(), [1, 12, 12, 2]);
        assert_eq!(tok.decode(&[1, 12, 12, 2]).unwrap(), "hello hello");
        assert_eq!(tok.eos_token_ids(), [2]);
        // No template in the file: ChatML.
        let chat = tok
            .apply_chat_template(&[ChatMessage {
                role: "user".to_string(),
                content: "hi".to_string(),
            }])
            .unwrap();
        assert_eq!(
            chat,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// A word-level `tokenizer.json` with `<s>` and `</s>` as special tokens.
    const TINY_TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,
        "added_tokens":[
          {"id":0,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
          {"id":1,"content":"</s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
        "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"<s>":0,"</s>":1,"hi":2,"[UNK]":3},"unk_token":"[UNK]"}}"#;

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
        tok.apply_chat_template(&[ChatMessage {
            role: "user".to_string(),
            content: "  hi ".to_string(),
        }])
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
