//! Tokenizer and chat template of the default model, rebuilt from GGUF metadata.

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use zinfer_fetch::test_model_path;
use zinfer_protocol::ChatMessage;
use zinfer_text::ModelTokenizer;

fn tokenizer() -> ModelTokenizer {
    ModelTokenizer::open(&test_model_path().unwrap()).unwrap()
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role.to_string(), content.to_string())
}

#[test]
fn tokenizer_matches_reference_ids_and_round_trips() {
    let tok = &tokenizer();
    let text = "Hello, world! The quick brown fox.";
    let ids = tok.encode(text).unwrap();
    assert_eq!(ids, [19556, 28, 905, 17, 378, 2365, 6354, 16438, 30]);
    assert_eq!(tok.decode(&ids).unwrap(), text);

    // SmolLM splits digits one by one; whitespace and unicode survive a round trip.
    let digits = tok.encode("12345").unwrap();
    assert_eq!(digits.len(), 5);
    let odd = "  tabs\tand\nnewlines, émigré 東京 🚀";
    assert_eq!(tok.decode(&tok.encode(odd).unwrap()).unwrap(), odd);
}

#[test]
fn control_tokens_are_special() {
    let tok = &tokenizer();
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>").unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tok.decode(&ids).unwrap(), "user\nHi");
    assert!(tok.eos_token_ids().contains(&2));
    assert!(!tok.eos_token_ids().contains(&1));
}

#[test]
fn chat_template_renders_chatml() {
    let tok = &tokenizer();
    let with_system = tok
        .apply_chat_template(&[
            msg("system", "You are terse."),
            msg("user", "Hi"),
            msg("assistant", "Hello."),
            msg("user", "Bye"),
        ])
        .unwrap();
    assert_eq!(
        with_system,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
    // SmolLM2's template adds its default system prompt when none is given.
    let user_only = tok.apply_chat_template(&[msg("user", "Hi")]).unwrap();
    assert!(user_only.starts_with("<|im_start|>system\n"), "{user_only}");
    assert!(
        user_only.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
        "{user_only}"
    );
}
