//! One sample of every message of every direction, shared by the round-trip,
//! golden and property tests. Floats are exact in f32 so other languages can
//! compare them with `==`.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use zinfer_protocol::{
    AdminReply, AdminRequest, ApplyTemplateRequest, CacheTransfer, ChatMessage, ChunkBody,
    ClientReply, ClientRequest, ControlOp, DecodeError, DetokenizeRequest, DoneBody, ErrorCode,
    FinishReason, GenerateRequest, Limits, LoadReport, ModelInfo, ModelOffer, Piece, ReadyBody,
    RouterToSupervisor, RouterToWorker, SupervisorToRouter, Timings, TokenLogprob, TokenizeRequest,
    TopLogprob, Usage, WireMessage, WorkerInfo, WorkerState, WorkerToRouter, decode, encode,
};

/// A sample message with its golden name, `<direction>.<case>`.
pub struct Sample<T> {
    pub name: &'static str,
    pub message: T,
}

fn sample<T>(name: &'static str, message: T) -> Sample<T> {
    Sample { name, message }
}

/// A generate with every field of v1 as first shipped set away from its
/// default; the later optional fields are in [`logprobs_generate`], so this
/// frame shows that older encoders are still understood byte for byte.
pub fn full_generate() -> GenerateRequest {
    GenerateRequest {
        id: "req-1".into(),
        prompt: Some("Once upon a time".into()),
        messages: None,
        tokens: None,
        model: Some("smollm2-135m".into()),
        namespace: Some("tenant-a".into()),
        max_tokens: 64,
        temperature: 0.5,
        top_p: 0.75,
        top_k: 40,
        min_p: 0.125,
        repetition_penalty: 1.25,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        logit_bias: Default::default(),
        seed: Some(42),
        stop: vec!["\n\n".into(), "END".into()],
        stop_token_ids: vec![2, 7],
        ignore_eos: true,
        stream: false,
        priority: -3,
        deadline_ms: Some(30_000),
        logprobs: false,
        top_logprobs: 0,
        constraint: None,
        tools: Vec::new(),
        tool_choice: zinfer_protocol::ToolChoice::Auto,
        parallel_tool_calls: true,
        chat_template_kwargs: None,
        n: 1,
        prompt_logprobs: None,
        embed: None,
        document: None,
        speculative: None,
        keep_alive: None,
    }
}

/// A generate for a model loaded on demand, kept ten minutes after it,
/// with prompt-lookup speculation.
pub fn keep_alive_generate() -> GenerateRequest {
    let mut request = GenerateRequest::from_prompt("req-8", "Repeat: the cat sat");
    request.model = Some("qwen2.5-1.5b-instruct-q4_k_m".into());
    request.keep_alive = Some(zinfer_protocol::KeepAlive::For(
        std::time::Duration::from_secs(600),
    ));
    request.speculative = Some(zinfer_protocol::Speculative {
        ngram: 3,
        max_draft: 8,
    });
    request
}

/// A generate asking for log probabilities and two alternatives per token.
pub fn logprobs_generate() -> GenerateRequest {
    let mut request = GenerateRequest::from_prompt("req-4", "Once upon a time");
    request.temperature = 0.0;
    request.max_tokens = 16;
    request.logprobs = true;
    request.top_logprobs = 2;
    request
}

/// A generate whose output must match a regex.
pub fn constraint_generate() -> GenerateRequest {
    let mut request = GenerateRequest::from_prompt("req-5", "The year:");
    request.max_tokens = 8;
    request.constraint = Some(Box::new(zinfer_protocol::Constraint::regex("[0-9]{4}")));
    request
}

/// Entries for tokens 7042 (" Paris") and 2208; logprobs exact in f32.
pub fn token_logprobs() -> Vec<TokenLogprob> {
    let top = |token: u32, text: &str, logprob: f32| TopLogprob {
        token,
        text: text.into(),
        logprob,
    };
    vec![
        TokenLogprob {
            token: 7042,
            text: " Paris".into(),
            logprob: -0.125,
            top_logprobs: vec![top(7042, " Paris", -0.125), top(4220, " Lyon", -2.5)],
        },
        TokenLogprob {
            token: 2208,
            text: "\u{fffd}".into(),
            logprob: -1.5,
            top_logprobs: vec![top(2208, "\u{fffd}", -1.5), top(30, "!", -1.75)],
        },
    ]
}

/// A generate with OpenAI's penalties and a logit bias.
pub fn penalties_generate() -> GenerateRequest {
    let mut request = GenerateRequest::from_prompt("req-7", "Once upon a time");
    request.presence_penalty = 0.5;
    request.frequency_penalty = -0.25;
    request.logit_bias.insert("15339".into(), -100.0);
    request.logit_bias.insert("2".into(), 5.5);
    request.priority = 3;
    request.n = 2;
    request.prompt_logprobs = Some(1);
    request
}

/// A chat generate with a tool it must call, and a template variable.
pub fn tools_generate() -> GenerateRequest {
    let mut request = chat_generate();
    request.id = "req-6".into();
    request.messages = Some(vec![ChatMessage::new("user", "Weather in Paris?")]);
    let mut tool = zinfer_protocol::Tool::function(
        "get_weather",
        serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    );
    tool.function.description = Some("Current weather".into());
    request.tools = vec![tool];
    request.tool_choice = zinfer_protocol::ToolChoice::Function("get_weather".into());
    request.parallel_tool_calls = false;
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("enable_thinking".into(), serde_json::Value::Bool(false));
    request.chat_template_kwargs = Some(Box::new(kwargs));
    request
}

/// The call a tools request gets back.
pub fn tool_call() -> zinfer_protocol::ToolCall {
    zinfer_protocol::ToolCall {
        id: Some("a1B2c3D4e".into()),
        kind: Some("function".into()),
        function: zinfer_protocol::FunctionCall {
            name: "get_weather".into(),
            arguments: serde_json::Value::String("{\"city\":\"Paris\"}".into()),
        },
    }
}

pub fn chat_generate() -> GenerateRequest {
    let mut request = GenerateRequest::from_prompt("req-2", "");
    request.prompt = None;
    request.messages = Some(vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "What is the capital of France?"),
    ]);
    request.temperature = 0.0;
    request
}

pub fn tokens_generate() -> GenerateRequest {
    let mut request = GenerateRequest::from_prompt("req-3", "");
    request.prompt = None;
    request.tokens = Some(vec![1, 19556, 28, 905, 2]);
    request
}

fn usage() -> Usage {
    Usage {
        prompt_tokens: 12,
        cached_tokens: 8,
        completion_tokens: 3,
    }
}

fn timings() -> Timings {
    Timings {
        queue_s: 0.001,
        prefill_s: 0.25,
        ttft_s: 0.3,
        decode_s: 0.0625,
    }
}

fn load() -> LoadReport {
    LoadReport {
        running: 3,
        waiting: 1,
        kv_used: 4096,
        kv_free: 61440,
        cache_hit_tokens: 900,
        cache_query_tokens: 1200,
        rss_bytes: 536_870_912,
    }
}

/// A tokenize with every field away from its default.
pub fn tokenize_request() -> TokenizeRequest {
    TokenizeRequest {
        id: "t1".into(),
        model: Some("smollm2-135m".into()),
        content: "<s>\u{e3}\u{84}".into(),
        add_special: false,
        parse_special: false,
        with_pieces: true,
    }
}

pub fn detokenize_request() -> DetokenizeRequest {
    DetokenizeRequest {
        id: "d1".into(),
        model: None,
        tokens: vec![1, 15043, 3186],
    }
}

pub fn apply_template_request() -> ApplyTemplateRequest {
    ApplyTemplateRequest {
        id: "a1".into(),
        model: Some("smollm2-135m".into()),
        messages: vec![ChatMessage::new("user", "Hi")],
        add_generation_prompt: false,
    }
}

/// Pieces of a BOS, a space and the two bytes of a character split
/// between byte tokens (not UTF-8 on their own).
pub fn pieces() -> Vec<Piece> {
    vec![
        Piece::Text("<s>".into()),
        Piece::Text(" ".into()),
        Piece::Bytes(vec![0xe3]),
        Piece::Bytes(vec![0x84]),
    ]
}

pub fn client_requests() -> Vec<Sample<ClientRequest>> {
    vec![
        sample(
            "client_request.generate",
            ClientRequest::Generate(full_generate()),
        ),
        sample(
            "client_request.generate_minimal",
            ClientRequest::Generate(GenerateRequest::from_prompt("r", "Hi")),
        ),
        sample(
            "client_request.generate_messages",
            ClientRequest::Generate(chat_generate()),
        ),
        sample(
            "client_request.generate_tokens",
            ClientRequest::Generate(tokens_generate()),
        ),
        sample(
            "client_request.generate_logprobs",
            ClientRequest::Generate(logprobs_generate()),
        ),
        sample(
            "client_request.generate_constraint",
            ClientRequest::Generate(constraint_generate()),
        ),
        sample(
            "client_request.generate_penalties",
            ClientRequest::Generate(penalties_generate()),
        ),
        sample(
            "client_request.generate_tools",
            ClientRequest::Generate(tools_generate()),
        ),
        sample(
            "client_request.generate_keep_alive",
            ClientRequest::Generate(keep_alive_generate()),
        ),
        sample(
            "client_request.cancel",
            ClientRequest::Cancel { id: "req-1".into() },
        ),
        sample(
            "client_request.models",
            ClientRequest::Models {
                id: Some("m1".into()),
            },
        ),
        sample("client_request.ping", ClientRequest::Ping { id: None }),
        sample(
            "client_request.tokenize",
            ClientRequest::Tokenize(tokenize_request()),
        ),
        sample(
            "client_request.tokenize_minimal",
            ClientRequest::Tokenize(TokenizeRequest {
                id: "t2".into(),
                model: None,
                content: "Hi".into(),
                add_special: true,
                parse_special: true,
                with_pieces: false,
            }),
        ),
        sample(
            "client_request.detokenize",
            ClientRequest::Detokenize(detokenize_request()),
        ),
        sample(
            "client_request.apply_template",
            ClientRequest::ApplyTemplate(apply_template_request()),
        ),
        sample(
            "client_request.embed",
            ClientRequest::Embed(zinfer_protocol::EmbedRequest {
                pooling: Some(zinfer_protocol::Pooling::Last),
                namespace: Some("tenant-a".into()),
                priority: Some(1),
                deadline_ms: Some(5_000),
                ..zinfer_protocol::EmbedRequest::text("e1", "The cat sat on the mat.")
            }),
        ),
    ]
}

pub fn client_replies() -> Vec<Sample<ClientReply>> {
    vec![
        sample(
            "client_reply.chunk",
            ClientReply::Chunk {
                id: "req-1".into(),
                body: ChunkBody {
                    text: "Paris é".into(),
                    tokens: vec![7042, 2208],
                    ..ChunkBody::default()
                },
            },
        ),
        sample(
            "client_reply.chunk_logprobs",
            ClientReply::Chunk {
                id: "req-4".into(),
                body: ChunkBody {
                    text: " Paris".into(),
                    tokens: vec![7042, 2208],
                    logprobs: Some(token_logprobs()),
                    ..ChunkBody::default()
                },
            },
        ),
        sample(
            "client_reply.chunk_tool_calls",
            ClientReply::Chunk {
                id: "req-6".into(),
                body: ChunkBody {
                    index: 1,
                    tokens: vec![27, 14506],
                    reasoning: "Paris, so".into(),
                    tool_calls: vec![tool_call()],
                    choice: 1,
                    ..ChunkBody::default()
                },
            },
        ),
        sample(
            "client_reply.done_tool_calls",
            ClientReply::Done {
                id: "req-6".into(),
                body: DoneBody {
                    text: Some(String::new()),
                    worker: Some("w-cpu-0".into()),
                    reasoning: Some("The user wants Paris.".into()),
                    tool_calls: Some(vec![tool_call()]),
                    prompt_logprobs: Some(vec![
                        zinfer_protocol::PromptLogprob {
                            token: 785,
                            text: "The".into(),
                            logprob: None,
                            top_logprobs: Vec::new(),
                        },
                        zinfer_protocol::PromptLogprob {
                            token: 6722,
                            text: " weather".into(),
                            logprob: Some(-2.5),
                            top_logprobs: vec![TopLogprob {
                                token: 6722,
                                text: " weather".into(),
                                logprob: -2.5,
                            }],
                        },
                    ]),
                    ..DoneBody::new(FinishReason::ToolCalls, usage(), timings())
                },
            },
        ),
        sample(
            "client_reply.done",
            ClientReply::Done {
                id: "req-1".into(),
                body: DoneBody {
                    text: Some("The capital of France is Paris.".into()),
                    worker: Some("w-cpu-0".into()),
                    ..DoneBody::new(FinishReason::Stop, usage(), timings())
                },
            },
        ),
        sample(
            "client_reply.done_logprobs",
            ClientReply::Done {
                id: "req-4".into(),
                body: DoneBody {
                    text: Some(" Paris\u{fffd}".into()),
                    worker: Some("w-cpu-0".into()),
                    logprobs: Some(token_logprobs()),
                    ..DoneBody::new(FinishReason::Length, usage(), timings())
                },
            },
        ),
        sample(
            "client_reply.done_streamed",
            ClientReply::Done {
                id: "req-2".into(),
                body: DoneBody {
                    worker: Some("w-cpu-0".into()),
                    ..DoneBody::new(FinishReason::Length, usage(), timings())
                },
            },
        ),
        sample(
            "client_reply.error",
            ClientReply::Error {
                id: Some("req-1".into()),
                code: ErrorCode::Overloaded,
                message: "queue full; retry with backoff".into(),
                retryable: true,
            },
        ),
        sample(
            "client_reply.error_no_id",
            ClientReply::Error {
                id: None,
                code: ErrorCode::BadRequest,
                message: "frame is not one MessagePack map".into(),
                retryable: false,
            },
        ),
        sample(
            "client_reply.models",
            ClientReply::Models {
                id: Some("m1".into()),
                models: vec![ModelInfo {
                    name: "smollm2-135m".into(),
                    workers: 2,
                    context_length: None,
                    vocab_size: None,
                    state: None,
                }],
            },
        ),
        sample(
            "client_reply.models_with_limits",
            ClientReply::Models {
                id: Some("m1".into()),
                models: vec![ModelInfo {
                    name: "smollm2-135m".into(),
                    workers: 2,
                    context_length: Some(8192),
                    vocab_size: Some(49152),
                    state: None,
                }],
            },
        ),
        sample(
            "client_reply.models_with_state",
            ClientReply::Models {
                id: Some("m2".into()),
                models: vec![
                    ModelInfo {
                        name: "smollm2-135m".into(),
                        workers: 1,
                        context_length: Some(8192),
                        vocab_size: Some(49152),
                        state: Some(zinfer_protocol::ModelState::Loaded),
                    },
                    ModelInfo {
                        name: "qwen2.5-1.5b-instruct-q4_k_m".into(),
                        workers: 0,
                        context_length: None,
                        vocab_size: None,
                        state: Some(zinfer_protocol::ModelState::Unloaded),
                    },
                ],
            },
        ),
        sample(
            "client_reply.pong",
            ClientReply::Pong {
                id: Some("p".into()),
            },
        ),
        sample(
            "client_reply.tokenized",
            ClientReply::Tokenized {
                id: "t1".into(),
                tokens: vec![1, 28705, 227, 132],
                pieces: None,
            },
        ),
        sample(
            "client_reply.tokenized_pieces",
            ClientReply::Tokenized {
                id: "t1".into(),
                tokens: vec![1, 28705, 227, 132],
                pieces: Some(pieces()),
            },
        ),
        sample(
            "client_reply.detokenized",
            ClientReply::Detokenized {
                id: "d1".into(),
                content: "<s> Hello world".into(),
            },
        ),
        sample(
            "client_reply.applied_template",
            ClientReply::AppliedTemplate {
                id: "a1".into(),
                prompt: "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n".into(),
            },
        ),
        sample(
            "client_reply.embedding",
            ClientReply::Embedding {
                id: "e1".into(),
                embedding: vec![0.5, -0.5, 0.5, -0.5],
                usage: usage(),
                worker: "w-cpu-0".into(),
            },
        ),
    ]
}

pub fn router_to_worker() -> Vec<Sample<RouterToWorker>> {
    vec![
        sample(
            "router_to_worker.generate",
            RouterToWorker::Generate {
                rid: 7,
                request: chat_generate(),
            },
        ),
        sample("router_to_worker.cancel", RouterToWorker::Cancel { rid: 7 }),
        sample("router_to_worker.heartbeat", RouterToWorker::Heartbeat {}),
        sample(
            "router_to_worker.disconnect",
            RouterToWorker::Disconnect {
                reason: "unknown worker".into(),
            },
        ),
        sample(
            "router_to_worker.tokenize",
            RouterToWorker::Tokenize {
                rid: 9,
                request: tokenize_request(),
            },
        ),
        sample(
            "router_to_worker.detokenize",
            RouterToWorker::Detokenize {
                rid: 10,
                request: detokenize_request(),
            },
        ),
        sample(
            "router_to_worker.apply_template",
            RouterToWorker::ApplyTemplate {
                rid: 11,
                request: apply_template_request(),
            },
        ),
        sample("router_to_worker.drain", RouterToWorker::Drain {}),
        sample("router_to_worker.resume", RouterToWorker::Resume {}),
        sample(
            "router_to_worker.export_cache",
            RouterToWorker::ExportCache {
                endpoint: "tcp://10.0.0.7:41234".into(),
                max_tokens: 16384,
                key: None,
            },
        ),
        sample(
            "router_to_worker.shutdown",
            RouterToWorker::Shutdown { grace_ms: 5000 },
        ),
        sample(
            "router_to_worker.flush_cache",
            RouterToWorker::FlushCache {
                namespace: Some("tenant-a".into()),
            },
        ),
    ]
}

pub fn worker_to_router() -> Vec<Sample<WorkerToRouter>> {
    vec![
        sample(
            "worker_to_router.ready",
            WorkerToRouter::Ready(ReadyBody {
                worker_id: "w-cpu-0".into(),
                protocol: 1,
                models: vec!["smollm2-135m".into()],
                device: "cpu".into(),
                kv_capacity: 65536,
                max_batch: 32,
                context_length: None,
                vocab_size: None,
                import_endpoint: None,
                import_key: None,
            }),
        ),
        sample(
            "worker_to_router.ready_with_limits",
            WorkerToRouter::Ready(ReadyBody {
                worker_id: "w-cpu-0".into(),
                protocol: 1,
                models: vec!["smollm2-135m".into()],
                device: "cpu".into(),
                kv_capacity: 65536,
                max_batch: 32,
                context_length: Some(8192),
                vocab_size: Some(49152),
                import_endpoint: Some("tcp://10.0.0.7:41234".into()),
                import_key: None,
            }),
        ),
        sample("worker_to_router.heartbeat", WorkerToRouter::Heartbeat {}),
        sample("worker_to_router.load", WorkerToRouter::Load(load())),
        sample(
            "worker_to_router.chunk",
            WorkerToRouter::Chunk {
                rid: 7,
                body: ChunkBody {
                    index: 2,
                    text: " Paris".into(),
                    tokens: vec![7042],
                    ..ChunkBody::default()
                },
            },
        ),
        sample(
            "worker_to_router.chunk_logprobs",
            WorkerToRouter::Chunk {
                rid: 8,
                body: ChunkBody {
                    text: " Paris".into(),
                    tokens: vec![7042, 2208],
                    logprobs: Some(token_logprobs()),
                    ..ChunkBody::default()
                },
            },
        ),
        sample(
            "worker_to_router.done",
            WorkerToRouter::Done {
                rid: 7,
                body: DoneBody::new(FinishReason::Cancelled, usage(), timings()),
            },
        ),
        sample(
            "worker_to_router.done_logprobs",
            WorkerToRouter::Done {
                rid: 8,
                body: DoneBody {
                    text: Some(" Paris\u{fffd}".into()),
                    logprobs: Some(token_logprobs()),
                    ..DoneBody::new(FinishReason::Length, usage(), timings())
                },
            },
        ),
        sample(
            "worker_to_router.error",
            WorkerToRouter::Error {
                rid: 7,
                code: ErrorCode::PromptTooLong,
                message: "prompt of 70000 tokens exceeds the KV pool of 65536".into(),
            },
        ),
        sample(
            "worker_to_router.cache_imported",
            WorkerToRouter::CacheImported {
                tokens: 4096,
                skipped_tokens: 64,
                bytes: 188_743_680,
                seconds: 0.25,
            },
        ),
        sample(
            "worker_to_router.control_reply",
            WorkerToRouter::ControlReply {
                op: ControlOp::FlushCache,
                ok: true,
                message: "dropped 4096 cached tokens".into(),
            },
        ),
        sample(
            "worker_to_router.tokenized",
            WorkerToRouter::Tokenized {
                rid: 9,
                tokens: vec![1, 28705, 227, 132],
                pieces: Some(pieces()),
            },
        ),
        sample(
            "worker_to_router.detokenized",
            WorkerToRouter::Detokenized {
                rid: 10,
                content: "<s> Hello world".into(),
            },
        ),
        sample(
            "worker_to_router.applied_template",
            WorkerToRouter::AppliedTemplate {
                rid: 11,
                prompt: "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n".into(),
            },
        ),
    ]
}

pub fn admin_requests() -> Vec<Sample<AdminRequest>> {
    vec![
        sample("admin_request.workers", AdminRequest::Workers {}),
        sample(
            "admin_request.drain",
            AdminRequest::Drain {
                worker: "w-cpu-0".into(),
                park: true,
            },
        ),
        sample(
            "admin_request.resume",
            AdminRequest::Resume {
                worker: "w-cpu-0".into(),
            },
        ),
        sample(
            "admin_request.migrate",
            AdminRequest::Migrate {
                worker: "w-cpu-0".into(),
                device: "cuda:0".into(),
                carry_tokens: Some(8192),
            },
        ),
        sample(
            "admin_request.reload",
            AdminRequest::Reload {
                worker: "w-cpu-0".into(),
                model_path: Some("/models/smollm2-135m-v2.gguf".into()),
            },
        ),
        sample(
            "admin_request.scale",
            AdminRequest::Scale {
                model: "smollm2-135m".into(),
                workers: 3,
                device: Some("cpu:1".into()),
            },
        ),
    ]
}

pub fn supervisor_to_router() -> Vec<Sample<SupervisorToRouter>> {
    vec![
        sample(
            "supervisor_to_router.supervisor_status",
            SupervisorToRouter::SupervisorStatus {
                supervisor_id: "sup-host1".into(),
                host: "host1".into(),
                models: vec![ModelOffer {
                    name: "smollm2-135m".into(),
                    path: "/models/smollm2-135m.gguf".into(),
                    worker_bytes: 1_700_000_000,
                    keep_alive: None,
                }],
                devices: vec!["cpu:0".into(), "cpu:1".into()],
                memory_budget_bytes: 8_000_000_000,
                memory_used_bytes: 1_700_000_000,
                workers: vec!["smollm2-135m-1".into()],
            },
        ),
        sample(
            "supervisor_to_router.supervisor_status_keep_alive",
            SupervisorToRouter::SupervisorStatus {
                supervisor_id: "sup-host1".into(),
                host: "host1".into(),
                models: vec![ModelOffer {
                    name: "smollm2-135m".into(),
                    path: "/models/smollm2-135m.gguf".into(),
                    worker_bytes: 1_700_000_000,
                    keep_alive: Some(zinfer_protocol::KeepAlive::Forever),
                }],
                devices: vec!["cpu:0".into(), "cpu:1".into()],
                memory_budget_bytes: 8_000_000_000,
                memory_used_bytes: 1_700_000_000,
                workers: vec!["smollm2-135m-1".into()],
            },
        ),
        sample(
            "supervisor_to_router.spawn_failed",
            SupervisorToRouter::SpawnFailed {
                worker_id: "smollm2-135m-2".into(),
                reason: "the worker exited during load".into(),
            },
        ),
        sample(
            "supervisor_to_router.worker_exited",
            SupervisorToRouter::WorkerExited {
                worker_id: "smollm2-135m-1".into(),
                status: "exit status: 0".into(),
            },
        ),
    ]
}

pub fn router_to_supervisor() -> Vec<Sample<RouterToSupervisor>> {
    vec![
        sample(
            "router_to_supervisor.spawn",
            RouterToSupervisor::Spawn {
                worker_id: "smollm2-135m-2".into(),
                model: "smollm2-135m".into(),
                model_path: None,
                device: Some("cpu:1".into()),
                import_cache: true,
                exporter_key: None,
            },
        ),
        sample(
            "router_to_supervisor.spawn_curve",
            RouterToSupervisor::Spawn {
                worker_id: "smollm2-135m-3".into(),
                model: "smollm2-135m".into(),
                model_path: None,
                device: Some("cpu:0".into()),
                import_cache: true,
                exporter_key: Some("rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7".into()),
            },
        ),
        sample(
            "router_to_supervisor.stop",
            RouterToSupervisor::Stop {
                worker_id: "smollm2-135m-1".into(),
                grace_ms: 5000,
            },
        ),
    ]
}

pub fn cache_transfers() -> Vec<Sample<CacheTransfer>> {
    vec![
        sample(
            "cache_transfer.cache_span",
            CacheTransfer::CacheSpan {
                namespace: "tenant-a".into(),
                tokens: vec![1, 2, 3, 4],
                prefix_len: 2,
                layers: 1,
                kv_dim: 1,
                kv: vec![0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64],
            },
        ),
        sample(
            "cache_transfer.cache_end",
            CacheTransfer::CacheEnd {
                spans: 1,
                tokens: 2,
            },
        ),
    ]
}

pub fn admin_replies() -> Vec<Sample<AdminReply>> {
    vec![
        sample(
            "admin_reply.workers",
            AdminReply::Workers {
                workers: vec![WorkerInfo {
                    id: "w-cpu-0".into(),
                    device: "cpu".into(),
                    models: vec!["smollm2-135m".into()],
                    state: WorkerState::Draining,
                    inflight: 2,
                    kv_capacity: 65536,
                    load: load(),
                    last_seen_s: 0.5,
                }],
            },
        ),
        sample(
            "admin_reply.ack",
            AdminReply::Ack {
                ok: true,
                message: "draining w-cpu-0".into(),
            },
        ),
        sample(
            "admin_reply.error",
            AdminReply::Error {
                code: ErrorCode::UnknownModel,
                message: "no model named tiny".into(),
            },
        ),
    ]
}

/// Every sample, encoded: (golden name, frame).
pub fn all_frames() -> Vec<(&'static str, Vec<u8>)> {
    fn frames<T: WireMessage>(samples: Vec<Sample<T>>) -> Vec<(&'static str, Vec<u8>)> {
        samples
            .into_iter()
            .map(|s| (s.name, encode(&s.message).unwrap()))
            .collect()
    }
    let mut all = frames(client_requests());
    all.extend(frames(client_replies()));
    all.extend(frames(router_to_worker()));
    all.extend(frames(worker_to_router()));
    all.extend(frames(admin_requests()));
    all.extend(frames(admin_replies()));
    all.extend(frames(supervisor_to_router()));
    all.extend(frames(router_to_supervisor()));
    all.extend(frames(cache_transfers()));
    all
}

/// Decodes `frame` as every direction's enum; for a proptest that wants no
/// panic whatever the bytes.
pub fn decode_as_every_direction(frame: &[u8], limits: &Limits) -> Vec<Result<(), DecodeError>> {
    fn one<T: WireMessage>(frame: &[u8], limits: &Limits) -> Result<(), DecodeError> {
        let message = decode::<T>(frame, limits)?;
        let again = encode(&message).unwrap();
        let unbounded = Limits {
            max_frame_bytes: usize::MAX,
            ..limits.clone()
        };
        let reread = decode::<T>(&again, &unbounded)
            .unwrap_or_else(|e| panic!("re-encoded message failed to decode: {e}"));
        assert_eq!(encode(&reread).unwrap(), again, "re-encoding is not stable");
        Ok(())
    }
    vec![
        one::<ClientRequest>(frame, limits),
        one::<ClientReply>(frame, limits),
        one::<RouterToWorker>(frame, limits),
        one::<WorkerToRouter>(frame, limits),
        one::<AdminRequest>(frame, limits),
        one::<AdminReply>(frame, limits),
        one::<SupervisorToRouter>(frame, limits),
        one::<RouterToSupervisor>(frame, limits),
        one::<CacheTransfer>(frame, limits),
    ]
}
