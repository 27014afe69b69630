//! A GGUF vocabulary read and run the way llama.cpp's `llama_vocab` does
//! (`src/llama-vocab.cpp`): token attributes, special ids and the
//! end-of-generation set, special-token splitting, the SentencePiece and BPE
//! algorithms, and token pieces for decoding.
//!
//! The point is llama.cpp's exact ids, checked against its test
//! vocabularies; where llama.cpp does something odd, so does this port, and
//! the comment says so.

use std::collections::BinaryHeap;

use aho_corasick::AhoCorasick;
use zinfer_probe::{GgufHeader, HeaderError, MetaValue, ValueType};

use super::TokenizerError;
use super::split::{Step, Text, split};
use super::unicode::{byte_to_char, char_to_byte};

/// Token texts and id pairs from the model file are looked up millions of
/// times per prompt; SipHash's flood resistance buys nothing there.
type FastMap<K, V> = foldhash::HashMap<K, V>;

/// llama.cpp's `LLAMA_TOKEN_ATTR_*` bits.
mod attr {
    pub(super) const UNKNOWN: u16 = 1 << 0;
    pub(super) const UNUSED: u16 = 1 << 1;
    pub(super) const NORMAL: u16 = 1 << 2;
    pub(super) const CONTROL: u16 = 1 << 3;
    pub(super) const USER_DEFINED: u16 = 1 << 4;
    pub(super) const BYTE: u16 = 1 << 5;
    pub(super) const LSTRIP: u16 = 1 << 7;
    pub(super) const RSTRIP: u16 = 1 << 8;
}

/// An id past every real symbol: a character no merge or token knows.
const NONE: u32 = u32::MAX;

/// Token texts llama.cpp takes as end of turn when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Token texts that end generation (llama.cpp's `special_eog_ids`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// How a BPE vocabulary cuts text into words, after `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug)]
struct Pre {
    /// The regexes, in order.
    steps: &'static [Step],
    /// A word that is a token is taken whole, unmerged (Llama 3).
    ignore_merges: bool,
    /// BOS is added unless the file says otherwise (Llama 3).
    add_bos: bool,
    /// Spaces become `▁` before splitting (SentencePiece-style BPE).
    escape_whitespaces: bool,
    /// Raw UTF-8 words, byte tokens spelled `<0xXX>` (Gemma 4).
    raw_bytes: bool,
    /// A word of newlines is one token when the vocabulary has it (Gemma 4).
    newline_words: bool,
    /// No BOS unless the file names one (ChatGLM).
    no_bos: bool,
}

const fn plain(steps: &'static [Step]) -> Pre {
    Pre {
        steps,
        ignore_merges: false,
        add_bos: false,
        escape_whitespaces: false,
        raw_bytes: false,
        newline_words: false,
        no_bos: false,
    }
}

const DEFAULT: &[Step] = &[
    Step::PunctSymbols,
    Step::Gpt2,
    Step::Numbers,
    Step::ThreeDigits,
];
const LLAMA3: &[Step] = &[Step::Llama3];
const GPT2: &[Step] = &[Step::Gpt2];
const STARCODER: &[Step] = &[Step::Number, Step::Gpt2];
const QWEN2: &[Step] = &[Step::Qwen2];
const NEWLINES: &[Step] = &[Step::Newlines];

/// The pre-tokenizer llama.cpp runs for `name` (`llm_tokenizer_bpe`), or
/// None for one this port does not implement.
fn pre_tokenizer(name: &str) -> Option<Pre> {
    let llama3 = Pre {
        ignore_merges: true,
        add_bos: true,
        ..plain(LLAMA3)
    };
    Some(match name {
        "default" => plain(DEFAULT),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => llama3,
        "dbrx" | "smaug-bpe" => plain(LLAMA3),
        "chatglm-bpe" => Pre {
            no_bos: true,
            ..plain(LLAMA3)
        },
        "glm4" | "glm5" => Pre {
            no_bos: true,
            ignore_merges: true,
            ..plain(LLAMA3)
        },
        "deepseek-llm" => plain(&[
            Step::CrOrLf,
            Step::DeepseekLetters,
            Step::DeepseekPunct,
            Step::TrailingSpace,
            Step::Cjk,
            Step::Numbers,
        ]),
        "deepseek-coder" => plain(&[
            Step::CrOrLf,
            Step::SpaceLetters,
            Step::SpacePunct,
            Step::Cjk,
            Step::Number,
        ]),
        "falcon" => plain(&[Step::PunctSymbolsBacktick, Step::Gpt2, Step::ThreeDigits]),
        "mpt" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
        | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code"
        | "roberta-bpe" | "olmo" | "jais" | "exaone4" | "trillion" | "granite-docling" => {
            plain(GPT2)
        }
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => plain(STARCODER),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" | "grok-2" => plain(QWEN2),
        "qwen35" => plain(&[Step::Qwen35]),
        "laguna" => plain(&[Step::Newlines, Step::Qwen2]),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => plain(&[Step::Gpt4o]),
        "gemma4" | "granite-embed-multi-311m" => Pre {
            escape_whitespaces: true,
            raw_bytes: true,
            newline_words: true,
            ..plain(NEWLINES)
        },
        "sarvam-moe" => Pre {
            escape_whitespaces: true,
            raw_bytes: true,
            ..plain(NEWLINES)
        },
        _ => return None,
    })
}

/// BPE merges over interned symbol ids.
#[derive(Debug)]
struct Bpe {
    pre: Pre,
    /// (left, right) ids packed into a u64 -> (rank, id of the merged text).
    merges: FastMap<u64, (u32, u32)>,
    /// Id of the GPT-2 stand-in character of each byte.
    byte_ids: [u32; 256],
}

#[derive(Debug)]
enum Algorithm {
    /// SentencePiece (`llama`): merges by token score.
    Spm,
    /// Byte-pair encoding (`gpt2`, `gemma4`): merges by rank.
    Bpe(Box<Bpe>),
}

/// A piece of the input: text still to tokenize, or a special token found in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frag {
    Raw(usize, usize),
    Token(u32),
}

/// A GGUF vocabulary with llama.cpp's tokenizer.
#[derive(Debug)]
pub(super) struct GgufVocab {
    algorithm: Algorithm,
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u16>,
    /// Text -> id of every token; for BPE also of merge parts that are no
    /// token, numbered from `n_tokens` on.
    ids: FastMap<Box<str>, u32>,
    n_tokens: u32,
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    escape_whitespaces: bool,
    /// SentencePiece only: no token has a `▁` right after another character.
    spm_word_cuts: bool,
    /// Tokens that end generation, sorted.
    pub(super) eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the
    /// order llama.cpp splits them out of the input in.
    specials: Vec<u32>,
    /// Finds which of `specials` occur in a text at all.
    special_finder: Option<AhoCorasick>,
    /// Each token's text as llama.cpp renders it with `special = true`.
    pieces: Vec<u8>,
    piece_ends: Vec<u32>,
}

fn bad(key: &str, reason: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Metadata {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

fn get_str<'a>(md: &'a GgufHeader, key: &str) -> Result<Option<&'a str>, TokenizerError> {
    match md.metadata.get(key) {
        None => Ok(None),
        Some(MetaValue::Str(s)) => Ok(Some(s)),
        Some(other) => Err(bad(key, format!("not a string: {other:?}"))),
    }
}

fn get_bool(md: &GgufHeader, key: &str) -> Result<Option<bool>, TokenizerError> {
    match md.metadata.get(key) {
        None => Ok(None),
        Some(MetaValue::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(key, format!("not a bool: {other:?}"))),
    }
}

/// An array read from the file, its errors named by `key`.
fn get_array<T>(
    key: &str,
    read: impl FnOnce(&str) -> Result<Option<Vec<T>>, HeaderError>,
) -> Result<Option<Vec<T>>, TokenizerError> {
    read(key).map_err(|e| bad(key, e))
}

/// Token scores: f32 (or f64) values, or i32 ones as some writers store them.
fn get_scores(md: &GgufHeader, key: &str) -> Result<Option<Vec<f32>>, TokenizerError> {
    match md.metadata.get(key) {
        Some(MetaValue::Array { elem_type, .. }) if *elem_type == ValueType::I32 => {
            let ints = get_array(key, |k| md.i32s(k))?;
            Ok(ints.map(|v| v.into_iter().map(|x| x as f32).collect()))
        }
        _ => get_array(key, |k| md.floats(k)),
    }
}

/// An integer value, if `key` holds one that fits i64.
fn get_int(md: &GgufHeader, key: &str) -> Option<i64> {
    match md.metadata.get(key) {
        Some(MetaValue::Int(n)) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// Special token ids llama.cpp keeps in `llama_vocab::impl`.
#[derive(Clone, Copy, Default)]
struct Specials {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    fim_pre: Option<u32>,
    fim_suf: Option<u32>,
    fim_mid: Option<u32>,
    fim_pad: Option<u32>,
    fim_rep: Option<u32>,
    fim_sep: Option<u32>,
}

/// The token spelled `text` (not a merge part that is no token).
fn token_id(ids: &FastMap<Box<str>, u32>, texts: &[String], text: &str) -> Option<u32> {
    ids.get(text)
        .copied()
        .filter(|&id| (id as usize) < texts.len())
}

/// Whether `text` holds any of `parts`.
fn contains_any(text: &str, parts: &[&str]) -> bool {
    parts.iter().any(|p| text.contains(p))
}

/// C's `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t'..=b'\r')
}

impl GgufVocab {
    /// Reads the vocabulary from GGUF metadata (`llama_vocab::impl::load`).
    pub(super) fn from_metadata(md: &GgufHeader) -> Result<Self, TokenizerError> {
        let model = get_str(md, "tokenizer.ggml.model")?
            .ok_or_else(|| bad("tokenizer.ggml.model", "missing"))?;
        let pre_name = get_str(md, "tokenizer.ggml.pre")?;
        let mut sp = Specials::default();
        let mut pre = None;
        match model {
            "llama" => {
                sp.bos = Some(1);
                sp.eos = Some(2);
            }
            "gpt2" => {
                let name = match pre_name {
                    Some(name) if !name.is_empty() => name,
                    _ => {
                        tracing::warn!(
                            "GGUF has no tokenizer.ggml.pre: splitting words with llama.cpp's default pre-tokenizer, as llama.cpp does (generation quality may suffer)"
                        );
                        "default"
                    }
                };
                let found = pre_tokenizer(name)
                    .ok_or_else(|| TokenizerError::UnsupportedPre(name.to_string()))?;
                if found.no_bos {
                    sp.bos = None;
                } else {
                    sp.bos = Some(11);
                }
                sp.eos = Some(11);
                pre = Some(found);
            }
            "gemma4" => {
                pre = pre_tokenizer("gemma4");
            }
            other => {
                return Err(TokenizerError::UnsupportedModel(other.to_string()));
            }
        }
        let mut texts = get_array("tokenizer.ggml.tokens", |k| md.strings(k))?
            .ok_or_else(|| bad("tokenizer.ggml.tokens", "missing"))?;
        let n = texts.len();
        let n_tokens = u32::try_from(n).map_err(|_| bad("tokenizer.ggml.tokens", "too many"))?;
        for (i, text) in texts.iter_mut().enumerate() {
            if text.is_empty() {
                *text = format!("[EMPTY_{i}]");
            }
        }
        let scores = match get_scores(md, "tokenizer.ggml.scores")? {
            None => vec![0.0; n],
            Some(a) if a.len() < n => {
                return Err(bad(
                    "tokenizer.ggml.scores",
                    format!("{} scores for {n} tokens", a.len()),
                ));
            }
            Some(mut a) => {
                a.truncate(n);
                a
            }
        };
        let mut attrs = match get_array("tokenizer.ggml.token_type", |k| md.ints(k))? {
            None => vec![attr::NORMAL; n],
            Some(a) if a.len() < n => {
                return Err(bad(
                    "tokenizer.ggml.token_type",
                    format!("{} types for {n} tokens", a.len()),
                ));
            }
            Some(a) => a
                .iter()
                .take(n)
                .map(|&v| match v {
                    1 => attr::NORMAL,
                    2 => attr::UNKNOWN,
                    3 => attr::CONTROL,
                    4 => attr::USER_DEFINED,
                    5 => attr::UNUSED,
                    6 => attr::BYTE,
                    _ => 0,
                })
                .collect(),
        };
        let mut ids: FastMap<Box<str>, u32> = FastMap::default();
        ids.reserve(n);
        for (i, text) in texts.iter().enumerate() {
            ids.insert(text.as_str().into(), i as u32);
        }

        let is_spm = model == "llama";
        let (mut add_bos, add_space_prefix) = match pre {
            Some(p) => (p.add_bos, false),
            None => (true, true),
        };
        let add_space_prefix =
            get_bool(md, "tokenizer.ggml.add_space_prefix")?.unwrap_or(add_space_prefix);
        let mut add_eos = false;
        let algorithm = match pre {
            Some(p) => {
                let merges = get_array("tokenizer.ggml.merges", |k| md.strings(k))?
                    .ok_or_else(|| bad("tokenizer.ggml.merges", "missing"))?;
                Algorithm::Bpe(Box::new(Bpe::new(p, &merges, &mut ids, n_tokens)?))
            }
            None => Algorithm::Spm,
        };

        // Special ids: the type's defaults unless the file names one in range.
        let in_range = |id: Option<u32>| id.filter(|&i| i < n_tokens);
        sp.bos = in_range(sp.bos);
        sp.eos = in_range(sp.eos);
        let read_id = |key: &str, current: Option<u32>| -> Option<u32> {
            match get_int(md, key) {
                Some(id) if id >= 0 && id < i64::from(n_tokens) => Some(id as u32),
                Some(id) => {
                    tracing::warn!(key, id, "special token id out of the vocabulary; ignored");
                    current
                }
                None => current,
            }
        };
        sp.bos = read_id("tokenizer.ggml.bos_token_id", sp.bos);
        sp.eos = read_id("tokenizer.ggml.eos_token_id", sp.eos);
        sp.eot = read_id("tokenizer.ggml.eot_token_id", sp.eot);
        sp.eom = read_id("tokenizer.ggml.eom_token_id", sp.eom);
        sp.fim_pre = read_id("tokenizer.ggml.fim_pre_token_id", sp.fim_pre);
        sp.fim_suf = read_id("tokenizer.ggml.fim_suf_token_id", sp.fim_suf);
        sp.fim_mid = read_id("tokenizer.ggml.fim_mid_token_id", sp.fim_mid);
        sp.fim_pad = read_id("tokenizer.ggml.fim_pad_token_id", sp.fim_pad);
        sp.fim_rep = read_id("tokenizer.ggml.fim_rep_token_id", sp.fim_rep);
        sp.fim_sep = read_id("tokenizer.ggml.fim_sep_token_id", sp.fim_sep);
        sp.fim_pre = read_id("tokenizer.ggml.prefix_token_id", sp.fim_pre);
        sp.fim_suf = read_id("tokenizer.ggml.suffix_token_id", sp.fim_suf);
        sp.fim_mid = read_id("tokenizer.ggml.middle_token_id", sp.fim_mid);

        if let Some(b) = get_bool(md, "tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        if let Some(b) = get_bool(md, "tokenizer.ggml.add_eos_token")? {
            add_eos = b;
        }
        // llama.cpp's workaround for Gemma 4 files that say otherwise.
        if model == "gemma4" {
            add_bos = true;
        }

        mark_specials_by_text(&texts, &ids, &mut attrs, &mut sp);
        let eog = eog_set(&texts, &ids, &mut attrs, &sp);

        let mut specials: Vec<u32> = (0..n_tokens)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        // llama.cpp sorts unstably by length; equal lengths keep id order here.
        specials.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));
        let special_finder = if specials.is_empty() {
            None
        } else {
            let patterns = specials.iter().map(|&i| texts[i as usize].as_str());
            Some(AhoCorasick::new(patterns).map_err(|e| bad("tokenizer.ggml.tokens", e))?)
        };

        let escape_whitespaces = pre.is_some_and(|p| p.escape_whitespaces);
        let mut pieces = Vec::new();
        let mut piece_ends = Vec::with_capacity(n);
        for i in 0..n {
            piece_into(
                &texts[i],
                attrs[i],
                is_spm || escape_whitespaces,
                &mut pieces,
            );
            piece_ends.push(
                u32::try_from(pieces.len())
                    .map_err(|_| bad("tokenizer.ggml.tokens", "token texts over 4 GiB in all"))?,
            );
        }

        strip_attributes(md, pre_name, &texts, &ids, &specials, &mut attrs)?;

        if add_bos && sp.bos.is_none() {
            tracing::warn!("the vocabulary asks for BOS but has no BOS token; none is added");
            add_bos = false;
        }
        if add_eos && sp.eos.is_none() {
            tracing::warn!("the vocabulary asks for EOS but has no EOS token; none is added");
            add_eos = false;
        }
        let spm_word_cuts = is_spm
            && !texts.iter().any(|t| {
                t.chars()
                    .zip(t.chars().skip(1))
                    .any(|(a, b)| b == '\u{2581}' && a != '\u{2581}')
            });
        Ok(GgufVocab {
            algorithm,
            texts,
            scores,
            attrs,
            ids,
            n_tokens,
            bos: sp.bos,
            eos: sp.eos,
            add_bos,
            add_eos,
            add_space_prefix,
            escape_whitespaces,
            spm_word_cuts,
            eog,
            specials,
            special_finder,
            pieces,
            piece_ends,
        })
    }

    /// Number of tokens.
    pub(super) fn len(&self) -> usize {
        self.texts.len()
    }

    /// The text of token `id`, as the file spells it.
    pub(super) fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    fn token(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied().filter(|&id| id < self.n_tokens)
    }

    /// `llama_tokenize`: `add_special` adds BOS/EOS as the file asks,
    /// `parse_special` lets control tokens be matched in the text
    /// (user-defined ones always are).
    pub(super) fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let frags = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special
            && self.add_bos
            && let Some(bos) = self.bos
        {
            out.push(bos);
        }
        match &self.algorithm {
            Algorithm::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                let mut session = SpmSession::default();
                for frag in frags {
                    match frag {
                        Frag::Raw(s, e) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[s..e]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            self.spm(&escaped, &mut session, &mut out)?;
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Algorithm::Bpe(bpe) => {
                let mut session = BpeSession::default();
                for frag in frags {
                    match frag {
                        Frag::Raw(s, e) => {
                            let raw = &text[s..e];
                            if self.escape_whitespaces {
                                let escaped = raw.replace(' ', "\u{2581}");
                                bpe.tokenize(self, &escaped, &mut session, &mut out);
                            } else {
                                bpe.tokenize(self, raw, &mut session, &mut out);
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special
            && self.add_eos
            && let Some(eos) = self.eos
        {
            out.push(eos);
        }
        Ok(out)
    }

    /// `tokenizer_st_partition`: special tokens cut out of the text, longest
    /// first, each splitting every piece of text still left.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Frag::Raw(0, text.len())];
        let Some(finder) = &self.special_finder else {
            return frags;
        };
        // A token absent from the whole text cannot split any part of it.
        let mut present = vec![false; self.specials.len()];
        let mut any = false;
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
            any = true;
        }
        if !any {
            return frags;
        }
        let bytes = text.as_bytes();
        for (k, &id) in self.specials.iter().enumerate() {
            let a = self.attrs[id as usize];
            if !present[k] || (!parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0) {
                continue;
            }
            let tok = self.texts[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Frag::Raw(start, end) = frag else {
                    next.push(frag);
                    continue;
                };
                let mut base = start;
                loop {
                    let Some(at) = text[base..end].find(tok).map(|p| p + base) else {
                        if base < end {
                            next.push(Frag::Raw(base, end));
                        }
                        break;
                    };
                    let mut left_end = at;
                    if a & attr::LSTRIP != 0 {
                        while left_end > base && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > base {
                        next.push(Frag::Raw(base, left_end));
                    }
                    next.push(Frag::Token(id));
                    base = at + tok.len();
                    if base >= end {
                        break;
                    }
                    if a & attr::RSTRIP != 0 {
                        while base < end && is_c_space(bytes[base]) {
                            base += 1;
                        }
                    }
                }
            }
            frags = next;
        }
        frags
    }

    /// The SentencePiece merge (`llm_tokenizer_spm_session`) on text whose
    /// spaces are already `▁`.
    ///
    /// llama.cpp merges the whole text as one sequence. Where no token holds
    /// a `▁` after another character ([`GgufVocab::spm_word_cuts`]), no
    /// symbol can span a `▁` that follows another character, so the words
    /// starting there merge independently, in the same order, to the same
    /// tokens: merging them one by one keeps the queue small.
    fn spm(
        &self,
        text: &str,
        s: &mut SpmSession,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        if !self.spm_word_cuts {
            return self.spm_merge(text, s, out);
        }
        let mut start = 0;
        let mut prev = None;
        for (at, c) in text.char_indices() {
            if c == '\u{2581}' && prev.is_some_and(|p| p != '\u{2581}') {
                self.spm_merge(&text[start..at], s, out)?;
                start = at;
            }
            prev = Some(c);
        }
        self.spm_merge(&text[start..], s, out)
    }

    fn spm_merge(
        &self,
        text: &str,
        s: &mut SpmSession,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let syms = &mut s.syms;
        let queue = &mut s.queue;
        syms.clear();
        queue.clear();
        for (i, (at, c)) in text.char_indices().enumerate() {
            syms.push(Sym {
                start: at,
                end: at + c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
                id: NONE,
            });
            if let Some(p) = i.checked_sub(1) {
                syms[p].next = Some(i);
            }
        }
        let try_add = |syms: &[Sym], queue: &mut BinaryHeap<SpmBigram>, l: usize, r: usize| {
            let piece = &text[syms[l].start..syms[r].end];
            if let Some(id) = self.token(piece) {
                queue.push(SpmBigram {
                    score: self.scores[id as usize],
                    left: l,
                    right: r,
                    size: piece.len(),
                });
            }
        };
        for i in 1..syms.len() {
            try_add(syms, queue, i - 1, i);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (b.left, b.right);
            let (ln, rn) = (syms[l].len(), syms[r].len());
            if ln == 0 || rn == 0 || ln + rn != b.size {
                continue;
            }
            syms[l].end = syms[r].end;
            syms[r].end = syms[r].start;
            syms[l].next = syms[r].next;
            if let Some(n) = syms[r].next {
                syms[n].prev = Some(l);
            }
            if let Some(p) = syms[l].prev {
                try_add(syms, queue, p, l);
            }
            if let Some(n) = syms[l].next {
                try_add(syms, queue, l, n);
            }
        }
        let mut at = if syms.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let piece = &text[syms[i].start..syms[i].end];
            match self.token(piece) {
                Some(id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.push(self.spm_byte_token(b)?);
                    }
                }
            }
            at = syms[i].next;
        }
        Ok(())
    }

    /// `byte_to_token` of a SentencePiece vocabulary: `<0xXX>`, else the byte itself.
    fn spm_byte_token(&self, b: u8) -> Result<u32, TokenizerError> {
        if let Some(id) = self.token(&format!("<0x{b:02X}>")) {
            return Ok(id);
        }
        let single = [b];
        std::str::from_utf8(&single)
            .ok()
            .and_then(|s| self.token(s))
            .ok_or(TokenizerError::NoByteToken(b))
    }

    /// The text of `ids` (`llama_detokenize` with special tokens left out,
    /// without its space clean-up, which llama.cpp's server does not apply
    /// to generated text either): invalid UTF-8, such as a character cut
    /// between byte tokens, comes out as U+FFFD.
    pub(super) fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let mut piece = self.piece(id);
            if remove_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            remove_space = false;
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// `token_to_piece(id, special = true)`: every token's text as
    /// llama.cpp renders it, control tokens included; `None` past the end.
    pub(super) fn piece_special(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.piece_ends.get(i)? as usize;
        let start = i.checked_sub(1).map_or(0, |p| self.piece_ends[p] as usize);
        self.pieces.get(start..end)
    }

    /// Every token's bytes as generated output holds them, for grammars:
    /// control and unknown tokens are special (never text); user-defined
    /// ones are their text, as decoding shows it; unused ones are empty.
    pub(super) fn token_bytes(&self) -> Vec<super::TokenBytes> {
        (0..self.texts.len())
            .map(|i| {
                let a = self.attrs.get(i).copied().unwrap_or(0);
                let start = i.checked_sub(1).map_or(0, |p| self.piece_ends[p] as usize);
                let piece = self
                    .pieces
                    .get(start..self.piece_ends[i] as usize)
                    .unwrap_or_default();
                if a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                    super::TokenBytes::Special(self.texts[i].clone())
                } else {
                    super::TokenBytes::Text(piece.to_vec())
                }
            })
            .collect()
    }

    /// `token_to_piece(id, special = false)`: control and unknown tokens
    /// (and ids past the vocabulary) have no text.
    fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match self.attrs.get(i) {
            Some(&a) if a & (attr::CONTROL | attr::UNKNOWN) == 0 => {
                let start = i.checked_sub(1).map_or(0, |p| self.piece_ends[p] as usize);
                &self.pieces[start..self.piece_ends[i] as usize]
            }
            _ => &[],
        }
    }
}

/// Applies llama.cpp's guesses of special tokens from their text: EOT, EOM
/// and fill-in-the-middle tokens the file does not name, each forced to be
/// a control token, and "unused" control tokens.
///
/// llama.cpp walks a hash map, so when two texts qualify for one role the
/// winner is arbitrary there; here the lowest id wins.
fn mark_specials_by_text(
    texts: &[String],
    ids: &FastMap<Box<str>, u32>,
    attrs: &mut [u16],
    sp: &mut Specials,
) {
    let roles: [(&mut Option<u32>, &[&str]); 8] = [
        (&mut sp.eot, EOT_TEXTS),
        (&mut sp.eom, EOM_TEXTS),
        (&mut sp.fim_pre, FIM_PRE_TEXTS),
        (&mut sp.fim_suf, FIM_SUF_TEXTS),
        (&mut sp.fim_mid, FIM_MID_TEXTS),
        (&mut sp.fim_pad, FIM_PAD_TEXTS),
        (&mut sp.fim_rep, FIM_REP_TEXTS),
        (&mut sp.fim_sep, FIM_SEP_TEXTS),
    ];
    for (slot, candidates) in roles {
        if slot.is_some() {
            continue;
        }
        let found = candidates
            .iter()
            .filter_map(|t| token_id(ids, texts, t))
            .min();
        if let Some(id) = found {
            *slot = Some(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    for (i, text) in texts.iter().enumerate() {
        if attrs[i] & attr::CONTROL != 0 && text.contains("unused") {
            attrs[i] |= attr::UNUSED;
        }
    }
}

/// llama.cpp's end-of-generation set: fill-in-the-middle pad, repo and file
/// separators, every token whose text is a known end of turn (forced to be
/// control), EOS, EOT and EOM, less `<|end|>` in harmony-style vocabularies
/// and `</s>` where it is a normal token (Gemma 4).
fn eog_set(
    texts: &[String],
    ids: &FastMap<Box<str>, u32>,
    attrs: &mut [u16],
    sp: &Specials,
) -> Vec<u32> {
    let mut eog: Vec<u32> = [sp.fim_pad, sp.fim_rep, sp.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for text in EOG_TEXTS {
        if let Some(id) = token_id(ids, texts, text) {
            eog.push(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    // llama.cpp's hack for gpt-oss: these always render.
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = token_id(ids, texts, text) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend([sp.eos, sp.eot, sp.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    let has = |eog: &[u32], text: &str| {
        eog.iter()
            .copied()
            .filter(|&id| texts.get(id as usize).is_some_and(|t| t == text))
            .max()
    };
    let end = has(&eog, "<|end|>");
    let call = has(&eog, "<|call|>").or(has(&eog, "<|calls|>"));
    if let Some(end) = end
        && call.is_some()
        && (has(&eog, "<|return|>").is_some() || has(&eog, "<|flush|>").is_some())
    {
        eog.retain(|&id| id != end);
        attrs[end as usize] = attr::USER_DEFINED;
    }
    let normal_s = has(&eog, "<|tool_response>").is_some() || has(&eog, "<|plamo:eos|>").is_some();
    if let (true, Some(s)) = (normal_s, has(&eog, "</s>")) {
        eog.retain(|&id| id != s);
        attrs[s as usize] = attr::NORMAL;
    }
    eog
}

/// llama.cpp's per-model strip attributes: Phi-3's special tokens eat the
/// whitespace after them; some embedding models' mask token eats the
/// whitespace before it.
fn strip_attributes(
    md: &GgufHeader,
    pre_name: Option<&str>,
    texts: &[String],
    ids: &FastMap<Box<str>, u32>,
    specials: &[u32],
    attrs: &mut [u16],
) -> Result<(), TokenizerError> {
    let name = get_str(md, "general.name")?
        .unwrap_or_default()
        .to_ascii_lowercase();
    let arch = get_str(md, "general.architecture")?.unwrap_or_default();
    let pre_name = pre_name.unwrap_or_default();
    let mut set = |text: &str, bit: u16, on: bool| {
        if let Some(id) = token_id(ids, texts, text) {
            if on {
                attrs[id as usize] |= bit;
            } else {
                attrs[id as usize] &= !bit;
            }
        }
    };
    if contains_any(pre_name, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
        || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
    {
        set("<mask>", attr::LSTRIP, true);
    } else if contains_any(&name, &["phi-3", "phi3"]) {
        for &id in specials {
            set(&texts[id as usize], attr::RSTRIP, true);
        }
        set("</s>", attr::RSTRIP, true);
        for text in ["<unk>", "<s>", "<|endoftext|>"] {
            set(text, attr::RSTRIP, false);
        }
    } else if name.contains("modern-bert") {
        set("[MASK]", attr::LSTRIP, true);
    }
    Ok(())
}

/// Appends token text as `token_to_piece(special = true)` renders it:
/// control, unknown and user-defined tokens as written; normal ones with
/// `▁` as space (SentencePiece style) or GPT-2's stand-ins as bytes; byte
/// tokens as their byte; other kinds as nothing.
fn piece_into(text: &str, a: u16, spaces_escaped: bool, out: &mut Vec<u8>) {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        if spaces_escaped {
            out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes());
        } else {
            for c in text.chars() {
                match char_to_byte(c) {
                    Some(b) => out.push(b),
                    None => {
                        // llama.cpp's marker for a character no byte maps to.
                        out.extend_from_slice(b"[UNK_BYTE_0x");
                        let mut utf8 = [0u8; 4];
                        for b in c.encode_utf8(&mut utf8).bytes() {
                            out.extend_from_slice(format!("{b:02x}").as_bytes());
                        }
                        out.extend_from_slice(text.as_bytes());
                        out.push(b']');
                    }
                }
            }
        }
    } else if a & attr::BYTE != 0 {
        // `strtol(text.substr(3, 2), 16)`: the hex digits of `<0xAB>`.
        if let Some(hex) = text.get(3..).map(|t| t.bytes().take(2)) {
            let digits: Vec<u8> = hex.take_while(u8::is_ascii_hexdigit).collect();
            let value = std::str::from_utf8(&digits)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .unwrap_or(0);
            out.push(value);
        }
    }
}

/// A symbol of a word being merged: a byte range, and its interned id.
#[derive(Clone, Copy, Debug)]
struct Sym {
    start: usize,
    end: usize,
    prev: Option<usize>,
    next: Option<usize>,
    id: u32,
}

impl Sym {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// A candidate SentencePiece merge: highest score first, then leftmost.
#[derive(Debug)]
struct SpmBigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for SpmBigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for SpmBigram {}

impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SpmBigram {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // As llama.cpp's `<` on floats: NaN and -0.0 compare equal to anything/0.0.
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(other.left.cmp(&self.left))
    }
}

/// A candidate BPE merge; the heap pops the lowest (rank, left) first.
type BpeBigram = std::cmp::Reverse<(u32, usize, usize, u32, u32, u32)>;

/// Buffers reused across the words of one call.
#[derive(Default)]
struct SpmSession {
    syms: Vec<Sym>,
    queue: BinaryHeap<SpmBigram>,
}

/// Buffers reused across the words of one call.
#[derive(Default)]
struct BpeSession {
    syms: Vec<Sym>,
    queue: BinaryHeap<BpeBigram>,
    word: String,
}

fn pair(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

impl Bpe {
    /// Reads the merges; every merge part and result gets an id in `ids`
    /// (tokens keep theirs), so merging compares ids, not strings.
    fn new(
        pre: Pre,
        merges: &[String],
        ids: &mut FastMap<Box<str>, u32>,
        n_tokens: u32,
    ) -> Result<Self, TokenizerError> {
        let mut next_id = n_tokens;
        let mut intern = |s: &str| -> u32 {
            if let Some(&id) = ids.get(s) {
                return id;
            }
            let id = next_id;
            next_id = next_id.saturating_add(1);
            ids.insert(s.into(), id);
            id
        };
        let mut table: FastMap<u64, (u32, u32)> = FastMap::default();
        table.reserve(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte; none
            // makes both halves empty.
            let (first, second) = match m.as_bytes().iter().skip(1).position(|&b| b == b' ') {
                Some(p) => (&m[..p + 1], &m[p + 2..]),
                None => ("", ""),
            };
            let a = intern(first);
            let b = intern(second);
            joined.clear();
            joined.push_str(first);
            joined.push_str(second);
            let merged = intern(&joined);
            let rank = u32::try_from(rank).map_err(|_| bad("tokenizer.ggml.merges", "too many"))?;
            table.entry(pair(a, b)).or_insert((rank, merged));
        }
        let chars = byte_to_char();
        let mut byte_ids = [NONE; 256];
        let mut utf8 = [0u8; 4];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids
                .get(&*chars[b].encode_utf8(&mut utf8))
                .copied()
                .unwrap_or(NONE);
        }
        Ok(Bpe {
            pre,
            merges: table,
            byte_ids,
        })
    }

    /// `llm_tokenizer_bpe_session::tokenize` of one piece of text.
    fn tokenize(&self, vocab: &GgufVocab, text: &str, s: &mut BpeSession, out: &mut Vec<u32>) {
        let t = Text::new(text);
        let mut byte_at = Vec::with_capacity(t.cps.len() + 1);
        byte_at.extend(text.char_indices().map(|(i, _)| i));
        byte_at.push(text.len());
        for (start, end) in split(&t, self.pre.steps) {
            self.word(vocab, &text[byte_at[start]..byte_at[end]], s, out);
        }
    }

    fn word(&self, vocab: &GgufVocab, word: &str, s: &mut BpeSession, out: &mut Vec<u32>) {
        if self.pre.ignore_merges {
            let key = self.encoded(word, &mut s.word);
            if let Some(id) = vocab.token(key) {
                out.push(id);
                return;
            }
        } else if self.pre.newline_words
            && word.bytes().all(|b| b == b'\n')
            && let Some(id) = vocab.token(word)
        {
            out.push(id);
            return;
        }
        s.syms.clear();
        if self.pre.raw_bytes {
            for (at, c) in word.char_indices() {
                let end = at + c.len_utf8();
                let id = vocab.ids.get(&word[at..end]).copied().unwrap_or(NONE);
                s.syms.push(Sym {
                    start: at,
                    end,
                    prev: None,
                    next: None,
                    id,
                });
            }
        } else {
            for (at, &b) in word.as_bytes().iter().enumerate() {
                s.syms.push(Sym {
                    start: at,
                    end: at + 1,
                    prev: None,
                    next: None,
                    id: self.byte_ids[b as usize],
                });
            }
        }
        let n = s.syms.len();
        for i in 0..n {
            s.syms[i].prev = i.checked_sub(1);
            s.syms[i].next = (i + 1 < n).then_some(i + 1);
        }
        s.queue.clear();
        for i in 1..n {
            self.add_bigram(&s.syms, &mut s.queue, i - 1, i);
        }
        while let Some(std::cmp::Reverse((_, l, r, lid, rid, merged))) = s.queue.pop() {
            let (left, right) = (s.syms[l], s.syms[r]);
            if left.len() == 0 || right.len() == 0 || left.id != lid || right.id != rid {
                continue;
            }
            s.syms[l].end = right.end;
            s.syms[l].id = merged;
            s.syms[l].next = right.next;
            s.syms[r].end = right.start;
            if let Some(nx) = right.next {
                s.syms[nx].prev = Some(l);
            }
            if let Some(p) = left.prev {
                self.add_bigram(&s.syms, &mut s.queue, p, l);
            }
            if let Some(nx) = right.next {
                self.add_bigram(&s.syms, &mut s.queue, l, nx);
            }
        }
        for i in 0..n {
            let sym = s.syms[i];
            if sym.len() == 0 {
                continue;
            }
            if sym.id < vocab.n_tokens {
                out.push(sym.id);
                continue;
            }
            // No token: llama.cpp looks each byte up alone, and drops the
            // ones the vocabulary lacks.
            let piece = &word[sym.start..sym.end];
            if self.pre.raw_bytes {
                for &b in piece.as_bytes() {
                    if let Some(id) = vocab.token(&format!("<0x{b:02X}>")) {
                        out.push(id);
                    }
                }
            } else {
                let mut buf = String::new();
                for &b in self.encoded(piece, &mut buf).as_bytes() {
                    let single = [b];
                    if let Some(id) = std::str::from_utf8(&single)
                        .ok()
                        .and_then(|t| vocab.token(t))
                    {
                        out.push(id);
                    }
                }
            }
        }
    }

    /// `word` as the vocabulary spells it: GPT-2 stand-ins for its bytes,
    /// or itself for raw-UTF-8 vocabularies.
    fn encoded<'a>(&self, word: &'a str, buf: &'a mut String) -> &'a str {
        if self.pre.raw_bytes {
            return word;
        }
        let chars = byte_to_char();
        buf.clear();
        buf.extend(word.bytes().map(|b| chars[b as usize]));
        buf
    }

    fn add_bigram(&self, syms: &[Sym], queue: &mut BinaryHeap<BpeBigram>, l: usize, r: usize) {
        let (lid, rid) = (syms[l].id, syms[r].id);
        if lid == NONE || rid == NONE {
            return;
        }
        if let Some(&(rank, merged)) = self.merges.get(&pair(lid, rid)) {
            queue.push(std::cmp::Reverse((rank, l, r, lid, rid, merged)));
        }
    }
}
