//! Tokenizer metadata copied from another GGUF and fitted to a vocabulary size.

use std::collections::{HashMap, HashSet};

use candle_core::quantized::gguf_file::Value;

use super::SynthError;

/// llama.cpp's token type for vocabulary slots no text maps to.
const TOKEN_TYPE_UNUSED: i64 = 5;

/// The `tokenizer.*` keys of `src`, fitted to `vocab` tokens.
///
/// llama.cpp requires as many tokens as embedding rows, so the token list is
/// padded or cut. Padding adds `[PAD{id}]` tokens of type "unused", as
/// llama.cpp's converter pads Qwen's 151,665 tokens to 151,936 rows: no
/// merge produces them, so no text maps to them, and neither loader treats
/// them as special. Cutting keeps the first `vocab` tokens and only the
/// merges whose two parts and result survive (BPE builders reject merges
/// over missing tokens), and drops special-token ids past the end. Either
/// way the tokenizer still encodes any text (byte-level BPE falls back to
/// the byte tokens, which come first).
pub fn tokenizer_metadata(
    src: &HashMap<String, Value>,
    vocab: usize,
) -> Result<Vec<(String, Value)>, SynthError> {
    let tokens = match src.get("tokenizer.ggml.tokens") {
        Some(Value::Array(t)) => t,
        _ => {
            return Err(SynthError::Tokenizer(
                "the source has no `tokenizer.ggml.tokens` array".into(),
            ));
        }
    };
    // Only a cut list drops merges; Qwen's 151,936 tokens are not hashed for nothing.
    let kept: HashSet<&str> = if vocab < tokens.len() {
        tokens
            .iter()
            .take(vocab)
            .filter_map(|t| t.to_string().ok().map(String::as_str))
            .collect()
    } else {
        HashSet::new()
    };
    let mut keys: Vec<&String> = src.keys().filter(|k| k.starts_with("tokenizer.")).collect();
    keys.sort();
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let value = &src[key];
        let fitted = match (key.as_str(), value) {
            ("tokenizer.ggml.tokens", Value::Array(a)) => {
                Some(Value::Array(resize(a, vocab, |i| {
                    Value::String(format!("[PAD{i}]"))
                })))
            }
            ("tokenizer.ggml.token_type", Value::Array(a)) => {
                let like = a.first().cloned().unwrap_or(Value::I32(0));
                Some(Value::Array(resize(a, vocab, |_| {
                    int_like(&like, TOKEN_TYPE_UNUSED)
                })))
            }
            ("tokenizer.ggml.scores", Value::Array(a)) => {
                let lowest = a
                    .iter()
                    .filter_map(|v| v.to_f32().ok())
                    .fold(0.0f32, f32::min);
                Some(Value::Array(resize(a, vocab, |_| Value::F32(lowest))))
            }
            ("tokenizer.ggml.merges", Value::Array(a)) if vocab < tokens.len() => {
                let merges = a
                    .iter()
                    .filter(|m| {
                        m.to_string()
                            .ok()
                            .and_then(|m| m.split_once(' '))
                            .is_some_and(|(x, y)| {
                                kept.contains(x)
                                    && kept.contains(y)
                                    && kept.contains(format!("{x}{y}").as_str())
                            })
                    })
                    .cloned()
                    .collect();
                Some(Value::Array(merges))
            }
            (k, v) if k.ends_with("_token_id") => {
                let id = token_id(v).ok_or_else(|| {
                    SynthError::Tokenizer(format!("`{k}` is not a token id: {v:?}"))
                })?;
                (id < vocab as u64).then(|| v.clone())
            }
            (_, v) => Some(v.clone()),
        };
        if let Some(v) = fitted {
            out.push((key.clone(), v));
        }
    }
    Ok(out)
}

/// A non-negative GGUF integer (writers disagree on widths).
fn token_id(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some((*x).into()),
        Value::U16(x) => Some((*x).into()),
        Value::U32(x) => Some((*x).into()),
        Value::U64(x) => Some(*x),
        Value::I8(x) => u64::try_from(*x).ok(),
        Value::I16(x) => u64::try_from(*x).ok(),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

fn resize(a: &[Value], len: usize, pad: impl Fn(usize) -> Value) -> Vec<Value> {
    let mut v: Vec<Value> = a.iter().take(len).cloned().collect();
    v.extend((a.len()..len).map(pad));
    v
}

/// `n` in the same integer type as `like` (GGUF arrays must be homogeneous).
fn int_like(like: &Value, n: i64) -> Value {
    match like {
        Value::U8(_) => Value::U8(n as u8),
        Value::I8(_) => Value::I8(n as i8),
        Value::U16(_) => Value::U16(n as u16),
        Value::I16(_) => Value::I16(n as i16),
        Value::U32(_) => Value::U32(n as u32),
        Value::U64(_) => Value::U64(n as u64),
        Value::I64(_) => Value::I64(n),
        _ => Value::I32(n as i32),
    }
}
