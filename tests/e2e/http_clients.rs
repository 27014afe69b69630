//! What real OpenAI clients do to the HTTP front, through a real router
//! and the default model: lm-evaluation-harness's scoring (token-id prompt
//! lists, `echo`, logprobs ending in the EOS token), instructor-style tool
//! and JSON schemas without `additionalProperties`, forced calls cut
//! short; and the client libraries themselves (the official SDKs,
//! langchain-openai, instructor, litellm).

use serde_json::{Value, json};

use crate::harness::{Cluster, http_front, http_post};

fn post(addr: &str, path: &str, body: &Value) -> Value {
    let (status, text) = http_post(addr, path, &body.to_string());
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// lm-eval's `local-completions` loglikelihood: a batch of token-id
/// prompts, `echo`, `logprobs: 1`, `max_tokens: 1`, reading
/// `token_logprobs[ctxlen:-1]`. When the token drawn is EOS, it is still
/// the last entry, so the slice still ends on the prompt's last token.
#[test]
fn lm_eval_scoring_with_token_prompts_echo_and_eos() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = http_front(&cluster);
    let addr = front.addr.as_str();
    let tokenize = |content: &str, special: bool| -> Vec<u64> {
        let reply = post(
            addr,
            "/tokenize",
            &json!({"content": content, "parse_special": special}),
        );
        reply["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let eos = tokenize("<|im_end|>", true);
    assert_eq!(
        eos.len(),
        1,
        "the default model's EOS is one token: {eos:?}"
    );
    let prompts = [
        tokenize("The capital of France is Paris", false),
        tokenize("One, two, three", false),
    ];
    // The EOS token made certain, as a scorer's continuation may be.
    let bias = json!({ eos[0].to_string(): 100 });
    let body = json!({"model": "smol", "prompt": prompts, "echo": true, "logprobs": 1,
        "max_tokens": 1, "temperature": 0, "logit_bias": bias});
    let reply = post(addr, "/v1/completions", &body);
    let choices = reply["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{reply}");
    let scored = post(
        addr,
        "/v1/completions",
        &json!({"model": "smol", "prompt": [prompts[0].clone()], "echo": true,
            "logprobs": 0, "max_tokens": 0}),
    );
    for (index, (choice, prompt)) in choices.iter().zip(&prompts).enumerate() {
        assert_eq!(choice["index"], index, "{reply}");
        assert_eq!(choice["finish_reason"], "stop", "EOS ended it: {choice}");
        let logprobs = &choice["logprobs"];
        let tokens = logprobs["token_logprobs"].as_array().unwrap();
        assert_eq!(tokens.len(), prompt.len() + 1, "prompt and EOS: {logprobs}");
        assert!(tokens[0].is_null());
        assert!(tokens[1..].iter().all(Value::is_f64), "{logprobs}");
        let last = logprobs["top_logprobs"].as_array().unwrap().last().unwrap();
        assert!(
            last.is_object(),
            "the EOS entry has its alternatives: {logprobs}"
        );
        // The echoed text is the prompt's own, decoded from its ids.
        let text = choice["text"].as_str().unwrap();
        let expected = ["The capital of France is Paris", "One, two, three"][index];
        assert!(text.starts_with(expected), "{text:?}");
        if index == 0 {
            // The same prompt scored alone gives the same prompt logprobs.
            let alone = &scored["choices"][0]["logprobs"]["token_logprobs"];
            assert_eq!(alone.as_array().unwrap().len(), prompt.len(), "{scored}");
            for (a, b) in alone.as_array().unwrap().iter().zip(tokens).skip(1) {
                let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
                assert!((a - b).abs() < 1e-3, "{a} vs {b}");
            }
        }
    }
}

/// instructor's tools mode: a pydantic schema without
/// `additionalProperties`, a named `tool_choice`, `parallel_tool_calls`
/// left on. One call, arguments with only the schema's keys; and
/// `response_format` json_schema likewise. A forced call cut by
/// `max_tokens` is `length` with no markup in `content`.
#[test]
fn tool_and_json_schemas_are_strict_and_a_cut_call_does_not_leak() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = http_front(&cluster);
    let addr = front.addr.as_str();
    let user = json!([{"role": "user", "content": "Extract: Ada Lovelace is 36 years old."}]);
    let schema = json!({"title": "User", "type": "object",
        "properties": {"name": {"title": "Name", "type": "string", "maxLength": 40},
                       "age": {"title": "Age", "type": "integer"}},
        "required": ["name", "age"]});
    let tools = json!([{"type": "function", "function": {"name": "User",
        "description": "Correctly extracted `User` with all the required parameters",
        "parameters": schema}}]);
    let choice = json!({"type": "function", "function": {"name": "User"}});
    let keys = |value: &Value| -> Vec<String> {
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    for temperature in [0.0, 1.0] {
        let reply = post(
            addr,
            "/v1/chat/completions",
            &json!({"model": "smol", "messages": user, "tools": tools, "tool_choice": choice,
                "temperature": temperature, "seed": 3, "max_tokens": 200}),
        );
        let choice0 = &reply["choices"][0];
        assert_eq!(choice0["finish_reason"], "tool_calls", "{reply}");
        let calls = choice0["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "a named choice is one call: {reply}");
        let arguments: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(keys(&arguments), ["age", "name"], "{arguments}");
    }
    let format = json!({"type": "json_schema", "json_schema": {"name": "User", "schema": schema}});
    let reply = post(
        addr,
        "/v1/chat/completions",
        &json!({"model": "smol", "messages": user, "response_format": format,
            "temperature": 0, "max_tokens": 200}),
    );
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert_eq!(keys(&value), ["age", "name"], "{content}");

    for stream in [false, true] {
        let body = json!({"model": "smol", "messages": user, "tools": tools,
            "tool_choice": choice, "temperature": 0, "max_tokens": 6, "stream": stream});
        let (status, text) = http_post(addr, "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 200, "{text}");
        assert!(!text.contains("tool_call>"), "markup leaked: {text}");
        assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
        assert!(
            !text.contains("\"tool_calls\":[{"),
            "no call was finished: {text}"
        );
    }
}

#[path = "../../crates/http/tests/event_grammars/mod.rs"]
mod event_grammars;

/// The SSE events of a streamed `POST path`, checked against Anthropic's
/// grammar: the blocks and the `message_delta`.
fn messages_stream(addr: &str, body: &Value) -> (Vec<(String, String)>, Value) {
    let (status, text) = http_post(addr, "/v1/messages", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let events = event_grammars::named_events(&event_grammars::dechunk(&text));
    event_grammars::check_message_stream(&events)
}

/// Anthropic's Messages API through the default model: text whole and
/// streamed (the same greedy answer), a forced tool call, a stop
/// sequence, `count_tokens`.
#[test]
fn anthropic_messages_through_the_default_model() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = http_front(&cluster);
    let addr = front.addr.as_str();
    let user = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let request = json!({"model": "smol", "max_tokens": 12, "temperature": 0,
        "system": "Answer in one short sentence.", "messages": user});
    // Warm the prefix cache first: a cold prefill rounds differently.
    let mut warm = request.clone();
    warm["max_tokens"] = json!(1);
    post(addr, "/v1/messages", &warm);
    let whole = post(addr, "/v1/messages", &request);
    assert_eq!(whole["type"], "message", "{whole}");
    let text = whole["content"][0]["text"].as_str().unwrap();
    assert!(!text.is_empty(), "{whole}");
    assert!(
        ["end_turn", "max_tokens"].contains(&whole["stop_reason"].as_str().unwrap()),
        "{whole}"
    );
    let output = whole["usage"]["output_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&output), "{whole}");
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (blocks, delta) = messages_stream(addr, &streamed);
    assert_eq!(blocks, [("text".to_string(), text.to_string())]);
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], output);

    let counted = post(
        addr,
        "/v1/messages/count_tokens",
        &json!({"messages": user,
        "system": "Answer in one short sentence."}),
    );
    let prompt = whole["usage"]["input_tokens"].as_u64().unwrap()
        + whole["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(counted["input_tokens"], prompt, "{counted}");

    let tools = json!([{"name": "get_weather", "description": "Current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                         "required": ["city"]}}]);
    let forced = json!({"model": "smol", "max_tokens": 60, "temperature": 0, "tools": tools,
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let mut warm = forced.clone();
    warm["max_tokens"] = json!(1);
    post(addr, "/v1/messages", &warm);
    let whole = post(addr, "/v1/messages", &forced);
    assert_eq!(whole["stop_reason"], "tool_use", "{whole}");
    let call = whole["content"].as_array().unwrap().last().unwrap();
    assert_eq!(call["type"], "tool_use", "{whole}");
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["city"].is_string(), "{whole}");
    let mut streamed = forced.clone();
    streamed["stream"] = json!(true);
    let (blocks, delta) = messages_stream(addr, &streamed);
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    let (kind, input) = blocks.last().unwrap();
    assert_eq!(kind, "tool_use");
    assert_eq!(serde_json::from_str::<Value>(input).unwrap(), call["input"]);

    // The greedy answer's first word, as a stop sequence, ends it there.
    let word = text.split_whitespace().nth(1).unwrap_or("the");
    let mut stopped = request.clone();
    stopped["stop_sequences"] = json!([format!(" {word}")]);
    let reply = post(addr, "/v1/messages", &stopped);
    assert_eq!(reply["stop_reason"], "stop_sequence", "{reply}");
    assert_eq!(reply["stop_sequence"], format!(" {word}"));
}

/// Runs `tests/e2e/SCRIPT` from `scripts/test-venv.sh VENV` against a
/// front on one worker with the default model, served as `smol`.
fn client_script(venv: &str, script: &str, passed: &str) {
    let cluster = Cluster::start("cache_aware", 1);
    let front = http_front(&cluster);
    let root = format!("http://{}", front.addr);
    crate::harness::venv_script(venv, script, &[&root, "smol"], passed);
}

/// The official `anthropic` and `openai` packages, unchanged, against the
/// front and the default model (`tests/e2e/sdk_clients.py`).
#[test]
fn anthropic_and_openai_sdks() {
    client_script("openai", "sdk_clients.py", "sdk checks passed");
}

/// `langchain-openai`, `instructor` and `litellm`, unchanged, against the
/// front and the default model (`tests/e2e/agent_clients.py`).
#[test]
fn langchain_instructor_and_litellm() {
    client_script("agents", "agent_clients.py", "agent client checks passed");
}

/// OpenAI's Responses API through the default model, streamed: text, and
/// a forced function call, each event sequence checked against the
/// documented grammar and against the whole response.
#[test]
fn openai_responses_stream_through_the_default_model() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = http_front(&cluster);
    let addr = front.addr.as_str();
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"]}}]);
    for request in [
        json!({"model": "smol", "input": "What is the capital of France?", "temperature": 0,
            "max_output_tokens": 12}),
        json!({"model": "smol", "input": "Weather in Paris?", "temperature": 0,
            "max_output_tokens": 60, "tools": tools,
            "tool_choice": {"type": "function", "name": "get_weather"}}),
    ] {
        // Warm the prefix cache first: a cold prefill rounds differently.
        let mut warm = request.clone();
        warm["max_output_tokens"] = json!(1);
        post(addr, "/v1/responses", &warm);
        let whole = post(addr, "/v1/responses", &request);
        let mut streamed = request.clone();
        streamed["stream"] = json!(true);
        let (status, text) = http_post(addr, "/v1/responses", &streamed.to_string());
        assert_eq!(status, 200, "{text}");
        let events = event_grammars::named_events(&event_grammars::dechunk(&text));
        let (items, response) = event_grammars::check_response_stream(&events);
        assert_eq!(response["status"], whole["status"], "{response}");
        for count in ["input_tokens", "output_tokens"] {
            assert_eq!(
                response["usage"][count], whole["usage"][count],
                "{response}"
            );
        }
        let whole_items: Vec<&Value> = whole["output"].as_array().unwrap().iter().collect();
        assert_eq!(items.len(), whole_items.len(), "{items:?} vs {whole}");
        for ((kind, joined), item) in items.iter().zip(whole_items) {
            assert_eq!(item["type"], kind.as_str());
            match kind.as_str() {
                "message" => assert_eq!(item["content"][0]["text"], joined.as_str()),
                "function_call" => assert_eq!(item["arguments"], joined.as_str()),
                _ => {}
            }
        }
    }
}
