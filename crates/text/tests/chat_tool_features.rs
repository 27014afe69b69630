//! Chat template features (tool-call syntax, tools shown, `<think>`) read
//! from the real templates of llama.cpp's reference set, and the Hermes
//! fallback rendering tool conversations with templates that do not show
//! tools.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (team rules)

use std::path::PathBuf;

use serde_json::json;
use zinfer_protocol::{ChatMessage, FunctionCall, ToolCall};
use zinfer_text::{ChatFeatures, ChatTemplate, TemplateInput, ToolFormat};

fn templates_dir() -> PathBuf {
    zinfer_fetch::chat_templates_dir().unwrap()
}

fn template(name: &str) -> ChatTemplate {
    let path = templates_dir().join(format!("{name}.jinja"));
    let source = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    ChatTemplate::new(Some(source), "<bos>".into(), "<eos>".into())
}

fn features(name: &str) -> ChatFeatures {
    template(name).features()
}

#[test]
fn reference_templates_have_their_features() {
    use ToolFormat::{Harmony, Hermes, Llama3Json, Mistral};
    // (template, tool format, renders tools, thinks)
    let expected = [
        ("Qwen-Qwen2.5-7B-Instruct", Hermes, true, false),
        ("Qwen-Qwen3-0.6B", Hermes, true, true),
        ("meta-llama-Llama-3.1-8B-Instruct", Llama3Json, true, false),
        ("meta-llama-Llama-3.2-3B-Instruct", Llama3Json, true, false),
        ("meta-llama-Llama-3.3-70B-Instruct", Llama3Json, true, false),
        ("mistralai-Mistral-Nemo-Instruct-2407", Mistral, true, false),
        ("Mistral-Small-3.2-24B-Instruct-2506", Mistral, true, false),
        (
            "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
            Hermes,
            true,
            false,
        ),
        ("google-gemma-2-2b-it", Hermes, false, false),
        ("microsoft-Phi-3.5-mini-instruct", Hermes, false, false),
        // Harmony's reasoning is a channel, not a `<think>` block.
        ("openai-gpt-oss-120b", Harmony, true, false),
    ];
    for (name, tool_format, renders_tools, thinks) in expected {
        assert_eq!(
            features(name),
            ChatFeatures {
                tool_format,
                renders_tools,
                thinks
            },
            "{name}"
        );
    }
    for name in ["Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"] {
        assert!(features(name).thinks, "{name}");
    }
}

#[test]
fn chatml_shows_no_tools_and_does_not_think() {
    let chatml = ChatTemplate::new(None, String::new(), String::new());
    assert_eq!(
        chatml.features(),
        ChatFeatures {
            tool_format: ToolFormat::Hermes,
            renders_tools: false,
            thinks: false,
        }
    );
}

#[test]
fn every_reference_template_is_read() {
    let mut read = 0;
    for entry in std::fs::read_dir(templates_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jinja") {
            let source = std::fs::read_to_string(&path).unwrap();
            let _ = ChatTemplate::new(Some(source), String::new(), String::new()).features();
            read += 1;
        }
    }
    assert!(read >= 60, "only {read} templates");
}

fn tools() -> Vec<serde_json::Value> {
    vec![json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})]
}

/// user, assistant call, two tool results: alternates once the results
/// are merged into one user turn.
fn tool_conversation() -> Vec<ChatMessage> {
    let call = |id: &str, city: &str| ToolCall {
        id: Some(id.into()),
        kind: Some("function".into()),
        function: FunctionCall {
            name: "get_weather".into(),
            arguments: json!(format!("{{\"city\": \"{city}\"}}")),
        },
    };
    let result = |id: &str, text: &str| ChatMessage {
        tool_call_id: Some(id.into()),
        ..ChatMessage::new("tool", text)
    };
    vec![
        ChatMessage::new("user", "Weather in Paris and Rome?"),
        ChatMessage {
            role: "assistant".into(),
            tool_calls: Some(vec![call("a", "Paris"), call("b", "Rome")]),
            ..ChatMessage::default()
        },
        result("a", "18C"),
        result("b", "24C"),
    ]
}

#[test]
fn gemma2_renders_tool_conversations_through_the_fallback() {
    let t = template("google-gemma-2-2b-it");
    let tools = tools();
    let messages = tool_conversation();
    let input = TemplateInput {
        tools: Some(&tools),
        ..TemplateInput::new(&messages)
    };
    let prompt = t.render_request(&input).unwrap();
    assert!(
        prompt.starts_with("<bos><start_of_turn>user\n# Tools\n"),
        "{prompt}"
    );
    assert!(prompt.contains("<tool_call>"), "{prompt}");
    assert!(prompt.contains("<tool_response>"), "{prompt}");
    assert!(prompt.ends_with("<start_of_turn>model\n"), "{prompt}");
}

#[test]
fn qwen25_renders_tools_itself() {
    let t = template("Qwen-Qwen2.5-7B-Instruct");
    let tools = tools();
    let messages = tool_conversation();
    let input = TemplateInput {
        tools: Some(&tools),
        ..TemplateInput::new(&messages)
    };
    let rendered = t.render(&input).unwrap();
    assert_eq!(t.render_request(&input).unwrap(), rendered);
    assert!(rendered.contains("<tools>"), "{rendered}");
}

/// What the worker reads to know where the output starts: Qwen3 with
/// `enable_thinking: false` closes an empty block in the prompt itself;
/// the R1 distills and QwQ with thinking on leave one open, so their
/// output starts as reasoning.
#[test]
fn thinking_prompts_end_as_the_worker_expects() {
    let messages = [ChatMessage::new("user", "Hi")];
    let qwen3 = template("Qwen-Qwen3-0.6B");
    let mut off = serde_json::Map::new();
    off.insert("enable_thinking".into(), json!(false));
    let quiet = qwen3
        .render_request(&TemplateInput {
            variables: Some(&off),
            ..TemplateInput::new(&messages)
        })
        .unwrap();
    assert!(quiet.ends_with("<think>\n\n</think>\n\n"), "{quiet:?}");
    let thinking = qwen3
        .render_request(&TemplateInput::new(&messages))
        .unwrap();
    assert!(
        thinking.ends_with("<|im_start|>assistant\n"),
        "{thinking:?}"
    );
    // llama.cpp's copies of the R1 and QwQ templates open the block and
    // close it at once unless `enable_thinking` is set.
    let mut on = serde_json::Map::new();
    on.insert("enable_thinking".into(), json!(true));
    for name in ["deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "Qwen-QwQ-32B"] {
        let open = template(name)
            .render_request(&TemplateInput {
                variables: Some(&on),
                ..TemplateInput::new(&messages)
            })
            .unwrap();
        assert!(open.trim_end().ends_with("<think>"), "{name}: {open:?}");
        let closed = template(name)
            .render_request(&TemplateInput::new(&messages))
            .unwrap();
        assert!(
            closed.trim_end().ends_with("</think>"),
            "{name}: {closed:?}"
        );
    }
}

/// gpt-oss reads an assistant turn's reasoning from `thinking`: a turn's
/// `reasoning_content` reaches it there, and the turn's content is left
/// out when it has calls (the template refuses both), as llama.cpp passes
/// them, so the analysis before a call is shown again with it.
#[test]
fn gpt_oss_sees_the_reasoning_before_its_call() {
    let messages = vec![
        ChatMessage::new("user", "Weather in Paris?"),
        ChatMessage {
            role: "assistant".into(),
            reasoning_content: Some("Need the forecast.".into()),
            tool_calls: Some(vec![ToolCall {
                id: Some("a".into()),
                kind: Some("function".into()),
                function: FunctionCall {
                    name: "get_weather".into(),
                    arguments: json!({"city": "Paris"}),
                },
            }]),
            ..ChatMessage::new("assistant", "Let me check.")
        },
        ChatMessage {
            tool_call_id: Some("a".into()),
            ..ChatMessage::new("tool", "18C")
        },
    ];
    let tools = tools();
    let prompt = template("openai-gpt-oss-120b")
        .render_request(&TemplateInput {
            tools: Some(&tools),
            ..TemplateInput::new(&messages)
        })
        .unwrap();
    let call = "<|start|>assistant<|channel|>analysis<|message|>Need the forecast.<|end|>\
                <|start|>assistant to=functions.get_weather<|channel|>commentary json\
                <|message|>{\"city\": \"Paris\"}<|call|>\
                <|start|>functions.get_weather to=assistant<|channel|>commentary\
                <|message|>\"18C\"<|end|><|start|>assistant";
    assert!(prompt.ends_with(call), "{prompt:?}");
    assert!(!prompt.contains("Let me check."), "{prompt:?}");
}
