//! The token trie llguidance masks with, built from our own tokenizer: for
//! the default model's byte-level BPE vocabulary and llama.cpp's
//! SentencePiece test vocabulary, every token's trie bytes are the bytes
//! its text adds to the output, control tokens are special, the
//! end-of-generation set is the trie's EOS set, and tokenized text
//! round-trips through the trie.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

use zinfer_text::{ModelTokenizer, TokenBytes};
use zinfer_worker::constraint::token_env;

const TEXT: &str = "Hello, world! The quick brown fox. Ünïcödé 🎉 {\"a\": [1, 2]}";

fn check(tokenizer: &ModelTokenizer, first_space_dropped: bool) -> usize {
    let tokens = tokenizer.token_bytes().unwrap();
    assert_eq!(tokens.len(), tokenizer.vocab_size());
    let env = token_env(&tokens, tokenizer.eos_token_ids()).unwrap();
    let trie = env.tok_trie();
    assert_eq!(trie.vocab_size(), tokens.len());
    assert_eq!(trie.eos_tokens(), tokenizer.eos_token_ids());
    let mut specials = 0;
    for (id, token) in tokens.iter().enumerate() {
        let id = id as u32;
        match token {
            TokenBytes::Special(name) => {
                specials += 1;
                assert!(trie.is_special_token(id), "{id} {name}");
                assert_eq!(&trie.token(id)[1..], name.as_bytes());
                // Decoding leaves control tokens out of the text.
                assert_eq!(tokenizer.decode(&[id]).unwrap(), "", "{id} {name}");
            }
            TokenBytes::Text(bytes) => {
                assert_eq!(trie.token(id), bytes.as_slice(), "{id}");
                assert!(!trie.is_special_token(id) || bytes.len() <= 1, "{id}");
                // The text a token decodes to alone is its bytes.
                if let Ok(text) = std::str::from_utf8(bytes)
                    && !(first_space_dropped && text.starts_with(' '))
                {
                    assert_eq!(tokenizer.decode(&[id]).unwrap(), text, "{id}");
                }
            }
        }
    }
    // Tokenized text round-trips through the trie.
    let ids = tokenizer.encode(TEXT).unwrap();
    let bytes = trie.decode(&ids);
    let expected = if first_space_dropped {
        format!(" {TEXT}")
    } else {
        TEXT.to_string()
    };
    assert_eq!(String::from_utf8(bytes).unwrap(), expected);
    specials
}

#[test]
fn the_default_models_vocabulary_becomes_a_token_trie() {
    let path = zinfer_fetch::test_model_path().unwrap();
    let tokenizer = ModelTokenizer::from_gguf_file(&path).unwrap();
    let specials = check(&tokenizer, false);
    // SmolLM2: 17 control tokens, <|im_end|> (2) among the EOS set.
    assert_eq!(specials, 17);
    assert!(tokenizer.eos_token_ids().contains(&2));
}

#[test]
fn a_sentencepiece_vocabulary_becomes_a_token_trie() {
    let path = zinfer_fetch::vocab_file("llama-spm").unwrap();
    let tokenizer = ModelTokenizer::from_gguf_file(&path).unwrap();
    let specials = check(&tokenizer, true);
    assert!(specials >= 3, "<unk>, <s>, </s>");
    let tokens = tokenizer.token_bytes().unwrap();
    // `▁` is a space (the prefix space makes "the" one token, "▁the");
    // byte fallback tokens are their byte.
    let the = tokenizer.tokenize("the", false, false).unwrap();
    assert_eq!(the.len(), 1);
    assert_eq!(tokens[the[0] as usize], TokenBytes::Text(b" the".to_vec()));
    let newline = tokenizer.encode("\n").unwrap();
    assert!(
        newline
            .iter()
            .any(|&i| tokens[i as usize] == TokenBytes::Text(vec![b'\n']))
    );
    assert_eq!(tokens[1], TokenBytes::Special("<s>".into()));
    assert_eq!(tokens[2], TokenBytes::Special("</s>".into()));
}
