//! The engine with a fake model (byte tokens, a K/V pool of prefix hashes)
//! and a fake codec: the event protocol, stops, cancellation, deadlines,
//! overload, shutdown and slot accounting, without loading weights.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use zinfer_model::{KvShape, ModelError, SeqChunk};
use zinfer_protocol::{
    ChatMessage, ChunkBody, DoneBody, GenerateRequest, TokenLogprob, ToolCall, Usage,
};
use zinfer_text::{TextError, TokenBytes};

use super::*;
use crate::scheduler::SchedulerConfig;

mod choices;
mod constraint;
mod tools;
mod transfer;

const EOS: u32 = 256;
const VOCAB: usize = 257;
const SCRIPT: &str = "Hello, wörld! 🎉 STOP here.";

/// Byte-level text: token id = byte; 256 is EOS (skipped on decode).
/// The text thread's tests use it too.
pub(crate) struct Bytes;

impl TextCodec for Bytes {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        let bytes: Vec<u8> = ids.iter().filter_map(|&id| u8::try_from(id).ok()).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
    fn token_piece(&self, id: u32) -> Result<Vec<u8>, TextError> {
        Ok(u8::try_from(id).map(|b| vec![b]).unwrap_or_default())
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TextError> {
        // As a template's `raise_exception` refuses a conversation.
        if messages.iter().any(|m| m.role == "refused") {
            return Err(TextError::ChatTemplate("roles must alternate".into()));
        }
        Ok(messages
            .iter()
            .map(|m| {
                format!(
                    "{}: {}\n",
                    m.role,
                    m.content.as_ref().map(|c| c.text()).unwrap_or_default()
                )
            })
            .collect())
    }
    fn eos_token_ids(&self) -> &[u32] {
        &[EOS]
    }
    fn token_bytes(&self) -> Result<Vec<TokenBytes>, TextError> {
        let mut tokens: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
        tokens.push(TokenBytes::Special("<eos>".into()));
        Ok(tokens)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Greedy output spells SCRIPT after each newline, then EOS.
    Script,
    /// Output is a hash of the whole prefix, so a wrong K/V read shows.
    Hash,
    /// Every forward pass fails.
    Broken,
}

/// Per position: (hash of the prefix, tokens since the last newline).
type State = (u64, usize);

struct FakeModel {
    mode: Mode,
    delay: Duration,
    kv: Vec<Option<State>>,
    max_positions: usize,
}

fn chain(state: Option<State>, token: u32) -> State {
    let (hash, since) = state.unwrap_or((0xcbf2_9ce4_8422_2325, 0));
    let hash = (hash ^ u64::from(token) ^ 0x9e37).wrapping_mul(0x0100_0000_01b3);
    (hash, if token == 10 { 0 } else { since + 1 })
}

fn next_token(mode: Mode, (hash, since): State) -> u32 {
    let script: Vec<u32> = SCRIPT.bytes().map(u32::from).chain([EOS]).collect();
    match mode {
        Mode::Script => script[since % script.len()],
        Mode::Hash | Mode::Broken => (hash >> 20) as u32 % 256,
    }
}

/// The fake model's logits after a position in `state`: noise, and the
/// mode's next token 4 above it.
fn fake_logits(mode: Mode, state: State) -> Vec<f32> {
    let mut row: Vec<f32> = (0..VOCAB)
        .map(|i| ((state.0 >> (i % 40)) & 0xff) as f32 / 128.0)
        .collect();
    row[next_token(mode, state) as usize] += 4.0;
    row
}

impl ForwardModel for FakeModel {
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        std::thread::sleep(self.delay);
        if self.mode == Mode::Broken {
            return Err(ModelError::InvalidBatch("broken on purpose".into()));
        }
        let mut rows = Vec::new();
        let mut written = std::collections::HashSet::new();
        for chunk in batch {
            let bad = |what: &str| Err(ModelError::InvalidBatch(what.to_string()));
            let (all, hidden) = match chunk.output {
                zinfer_model::ChunkOutput::LastLogits => (false, false),
                zinfer_model::ChunkOutput::AllLogits => (true, false),
                zinfer_model::ChunkOutput::AllHidden => (true, true),
            };
            let mut all_rows = Vec::new();
            if chunk.slots.len() != chunk.start_pos + chunk.tokens.len() {
                return bad("slot count");
            }
            let mut state = match chunk.start_pos {
                0 => None,
                p => match self.kv.get(chunk.slots[p - 1] as usize) {
                    Some(Some(state)) => Some(*state),
                    _ => return bad("read of an unwritten slot"),
                },
            };
            for (&token, &slot) in chunk.tokens.iter().zip(&chunk.slots[chunk.start_pos..]) {
                if !written.insert(slot) || slot as usize >= self.kv.len() {
                    return bad("slot written twice or out of range");
                }
                let next = chain(state, token);
                self.kv[slot as usize] = Some(next);
                state = Some(next);
                if hidden {
                    // 8 values from the prefix hash, signed.
                    all_rows.extend((0..8).map(|i| ((next.0 >> (8 * i)) & 0xff) as f32 - 127.5));
                } else if all {
                    all_rows.extend(fake_logits(self.mode, next));
                }
            }
            let state = state.ok_or(ModelError::InvalidBatch("empty chunk".into()))?;
            rows.push(if all {
                all_rows
            } else {
                fake_logits(self.mode, state)
            });
        }
        Ok(rows)
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn hidden_size(&self) -> usize {
        8
    }
    fn kv_capacity(&self) -> usize {
        self.kv.len()
    }
    fn max_positions(&self) -> usize {
        self.max_positions
    }
    /// One layer; a row holds (written, the hash in 16-bit parts, since),
    /// exact in f32. V repeats K.
    fn kv_shape(&self) -> KvShape {
        KvShape {
            layers: 1,
            kv_heads: 1,
            key_dim: 6,
            value_dim: 6,
        }
    }
    fn read_kv(&self, slots: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut k = Vec::new();
        for &slot in slots {
            let state = self
                .kv
                .get(slot as usize)
                .ok_or(ModelError::KvTransfer("slot out of range".into()))?;
            k.extend(match state {
                Some((hash, since)) => {
                    let part = |shift: u32| ((hash >> shift) & 0xffff) as f32;
                    [1.0, part(48), part(32), part(16), part(0), *since as f32]
                }
                None => [0.0; 6],
            });
        }
        let v = k.clone();
        k.extend(v);
        Ok(k)
    }
    fn write_kv(&mut self, slots: &[u32], data: &[f32]) -> Result<(), ModelError> {
        if data.len() != slots.len() * 12 || slots.iter().any(|&s| s as usize >= self.kv.len()) {
            return Err(ModelError::KvTransfer("bad slots or data".into()));
        }
        for (&slot, row) in slots.iter().zip(data.chunks_exact(6)) {
            let part = |i: usize| (row[i] as u64) << (16 * (4 - i));
            self.kv[slot as usize] =
                (row[0] == 1.0).then(|| (part(1) | part(2) | part(3) | part(4), row[5] as usize));
        }
        Ok(())
    }
}

fn engine(mode: Mode, capacity: usize, delay_ms: u64, config: EngineConfig) -> EngineHandle {
    let model = FakeModel {
        mode,
        delay: Duration::from_millis(delay_ms),
        kv: vec![None; capacity],
        max_positions: usize::MAX,
    };
    Engine::start_with("fake".into(), Box::new(model), Arc::new(Bytes), config)
}

fn greedy(prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        temperature: 0.0,
        max_tokens,
        ..GenerateRequest::from_prompt("c", prompt)
    }
}

/// Every event of `rid` until its terminal one.
fn collect(handle: &EngineHandle, rid: u64) -> Vec<EngineEvent> {
    let mut out = Vec::new();
    loop {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(20))
            .expect("engine went quiet");
        assert_eq!(event.rid(), rid);
        let terminal = event.is_terminal();
        out.push(event);
        if terminal {
            return out;
        }
    }
}

fn streamed_text(events: &[EngineEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Chunk {
                body: ChunkBody { text, .. },
                ..
            } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn done(events: &[EngineEvent]) -> (FinishReason, Option<String>, Usage) {
    match events.last() {
        Some(EngineEvent::Done {
            body:
                DoneBody {
                    finish_reason,
                    text,
                    usage,
                    ..
                },
            ..
        }) => (*finish_reason, text.clone(), *usage),
        other => panic!("expected done, got {other:?}"),
    }
}

#[test]
fn a_streamed_request_spells_the_script_in_ordered_chunks() {
    let handle = engine(Mode::Script, 256, 0, EngineConfig::default());
    handle.submit(greedy("hi\n", 100), 1).unwrap();
    let events = collect(&handle, 1);
    assert_eq!(streamed_text(&events), SCRIPT);
    for (expected, event) in events.iter().filter(|e| !e.is_terminal()).enumerate() {
        let EngineEvent::Chunk {
            body: ChunkBody { index, text, .. },
            ..
        } = event
        else {
            unreachable!()
        };
        assert_eq!(*index as usize, expected);
        assert!(!text.contains('\u{FFFD}'), "split character in {text:?}");
    }
    let (reason, text, usage) = done(&events);
    assert_eq!((reason, text), (FinishReason::Stop, None));
    assert_eq!(usage.prompt_tokens, 3);
    assert_eq!(
        usage.completion_tokens as usize,
        SCRIPT.len() + 1,
        "EOS counts"
    );
    let stats = wait_idle(&handle);
    assert_eq!(stats.prefill_tokens, 3);
    assert_eq!(stats.generated_tokens as usize, SCRIPT.len() + 1);
    assert_eq!(stats.steps as usize, SCRIPT.len() + 1);
    assert_eq!(stats.requests_done, [1, 0, 0, 0, 0]);
    assert_eq!(stats.ttft.count, 1);
    assert_eq!(stats.inter_token.count as usize, SCRIPT.len());
}

#[test]
fn a_failing_forward_pass_ends_its_requests_with_internal_errors() {
    let handle = engine(Mode::Broken, 64, 0, EngineConfig::default());
    handle.submit(greedy("a\n", 4), 1).unwrap();
    handle.submit(greedy("b\n", 4), 2).unwrap();
    let mut codes = HashMap::new();
    while codes.len() < 2 {
        match handle
            .events()
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
        {
            EngineEvent::Error { rid, code, message } => {
                // The model's own words stay in the log.
                assert_eq!(message, INTERNAL_MESSAGE);
                assert!(codes.insert(rid, code).is_none());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(codes.values().all(|&code| code == ErrorCode::Internal));
    let stats = wait_idle(&handle);
    assert_eq!((stats.kv_used, stats.requests_failed), (0, 2));
}

#[test]
fn a_non_streamed_request_gets_its_text_in_done_only() {
    let handle = engine(Mode::Script, 256, 0, EngineConfig::default());
    let request = GenerateRequest {
        stream: false,
        ..greedy("hi\n", 5)
    };
    handle.submit(request, 2).unwrap();
    let events = collect(&handle, 2);
    assert_eq!(events.len(), 1);
    let (reason, text, usage) = done(&events);
    assert_eq!(reason, FinishReason::Length);
    assert_eq!(text.as_deref(), Some("Hello"));
    assert_eq!(usage.completion_tokens, 5);
}

#[test]
fn stop_strings_end_the_output_and_never_leak() {
    let handle = engine(Mode::Script, 256, 0, EngineConfig::default());
    let request = GenerateRequest {
        stop: vec!["STOP".into(), "never".into()],
        ..greedy("x\n", 100)
    };
    handle.submit(request, 3).unwrap();
    let events = collect(&handle, 3);
    assert_eq!(streamed_text(&events), "Hello, wörld! 🎉 ");
    for event in &events {
        if let EngineEvent::Chunk {
            body: ChunkBody { text, .. },
            ..
        } = event
        {
            assert!(
                !text.contains('S'),
                "part of the stop string leaked: {text:?}"
            );
        }
    }
    assert_eq!(done(&events).0, FinishReason::Stop);
}

#[test]
fn stop_token_ids_and_chat_messages_work() {
    let handle = engine(Mode::Script, 256, 0, EngineConfig::default());
    let request = GenerateRequest {
        prompt: None,
        messages: Some(vec![ChatMessage::new("user", "hey")]),
        stop_token_ids: vec![u32::from(b'!')],
        ..greedy("", 100)
    };
    handle.submit(request, 4).unwrap();
    let events = collect(&handle, 4);
    assert_eq!(streamed_text(&events), "Hello, wörld");
    let (reason, _, usage) = done(&events);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(usage.prompt_tokens as usize, "user: hey\n".len());
}

#[test]
fn ignore_eos_generates_past_the_end_of_the_script() {
    let handle = engine(Mode::Script, 256, 0, EngineConfig::default());
    let script_tokens = SCRIPT.len() as u32 + 1;
    let request = GenerateRequest {
        ignore_eos: true,
        ..greedy("hi\n", script_tokens + 5)
    };
    handle.submit(request, 5).unwrap();
    let events = collect(&handle, 5);
    assert_eq!(streamed_text(&events), format!("{SCRIPT}Hello"));
    let (reason, _, usage) = done(&events);
    assert_eq!(reason, FinishReason::Length);
    assert_eq!(usage.completion_tokens, script_tokens + 5);
}

/// Bytes with a model's prompt conventions: BOS (0x02) before every
/// prompt, and several end-of-generation tokens, `!` among them, as
/// llama.cpp's set holds EOS, EOT and every end-of-turn token.
struct BytesWithEnds;

impl TextCodec for BytesWithEnds {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        Bytes.encode(text)
    }
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TextError> {
        Ok([2].into_iter().chain(Bytes.encode(text)?).collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        Bytes.decode(ids)
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TextError> {
        Bytes.render_chat(messages)
    }
    fn eos_token_ids(&self) -> &[u32] {
        &[b'!' as u32, EOS]
    }
}

#[test]
fn every_end_of_generation_token_stops_unless_eos_is_ignored() {
    let start = || {
        let model = FakeModel {
            mode: Mode::Script,
            delay: Duration::ZERO,
            kv: vec![None; 256],
            max_positions: usize::MAX,
        };
        Engine::start_with(
            "fake".into(),
            Box::new(model),
            Arc::new(BytesWithEnds),
            EngineConfig::default(),
        )
    };
    let handle = start();
    handle.submit(greedy("hi\n", 100), 1).unwrap();
    let events = collect(&handle, 1);
    assert_eq!(streamed_text(&events), "Hello, wörld");
    let (reason, _, usage) = done(&events);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(usage.prompt_tokens, 4, "BOS and the prompt");

    let handle = start();
    let request = GenerateRequest {
        ignore_eos: true,
        ..greedy("hi\n", SCRIPT.len() as u32 + 3)
    };
    handle.submit(request, 2).unwrap();
    let events = collect(&handle, 2);
    assert_eq!(streamed_text(&events), format!("{SCRIPT}He"));
    assert_eq!(done(&events).0, FinishReason::Length);
}

#[test]
fn the_context_length_ends_a_sequence_with_length_and_bounds_prompts() {
    let model = FakeModel {
        mode: Mode::Hash,
        delay: Duration::ZERO,
        kv: vec![None; 256],
        max_positions: 12,
    };
    let handle = Engine::start_with(
        "fake".into(),
        Box::new(model),
        Arc::new(Bytes),
        EngineConfig::default(),
    );
    let request = GenerateRequest {
        ignore_eos: true,
        ..greedy("0123456789", 100)
    };
    handle.submit(request, 1).unwrap();
    let (reason, _, usage) = done(&collect(&handle, 1));
    assert_eq!(reason, FinishReason::Length);
    assert_eq!(
        usage.completion_tokens, 2,
        "10 prompt + 2 output = 12 positions"
    );
    let refused = handle.submit(greedy(&"a".repeat(12), 1), 2).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PromptTooLong);
    assert!(refused.to_string().contains("context length"), "{refused}");
}

#[test]
fn validation_happens_once_at_the_edge_and_bounds_the_output_by_the_context() {
    let clock = VirtualClock::new(Instant::now());
    let model = FakeModel {
        mode: Mode::Hash,
        delay: Duration::ZERO,
        kv: vec![None; 256],
        max_positions: 12,
    };
    let config = EngineConfig {
        clock: clock.clone().into(),
        ..EngineConfig::default()
    };
    let handle = Engine::start_with("fake".into(), Box::new(model), Arc::new(Bytes), config);
    let valid = handle.validate(greedy("0123", 100)).unwrap();
    assert_eq!(valid.prompt(), b"0123".map(u32::from).as_slice());
    assert_eq!(valid.request().max_tokens, 8, "12 positions - 4 prompt");
    assert_eq!(valid.arrival(), clock.now());
    let both = GenerateRequest {
        tokens: Some(vec![1]),
        ..greedy("a", 4)
    };
    assert_eq!(
        handle.validate(both).map(|_| ()).unwrap_err().code(),
        ErrorCode::BadRequest
    );
    handle.submit_valid(valid.clone(), 1).unwrap();
    assert_eq!(
        handle.submit_valid(valid, 1),
        Err(EngineError::DuplicateRid(1))
    );
    let (reason, _, usage) = done(&collect(&handle, 1));
    assert_eq!((reason, usage.prompt_tokens), (FinishReason::Length, 4));
    assert_eq!(usage.completion_tokens, 8);
}

#[test]
fn refusals_come_from_submit_with_their_codes() {
    let handle = engine(Mode::Script, 16, 0, EngineConfig::default());
    let code = |result: Result<(), EngineError>| result.unwrap_err().code();
    assert_eq!(
        code(handle.submit(greedy(&"a".repeat(16), 4), 1)),
        ErrorCode::PromptTooLong
    );
    let bad_token = GenerateRequest {
        prompt: None,
        tokens: Some(vec![5, 999]),
        ..greedy("", 4)
    };
    assert_eq!(code(handle.submit(bad_token, 1)), ErrorCode::BadRequest);
    assert_eq!(code(handle.submit(greedy("", 4), 1)), ErrorCode::BadRequest);
    let both = GenerateRequest {
        tokens: Some(vec![1]),
        ..greedy("a", 4)
    };
    assert_eq!(code(handle.submit(both, 1)), ErrorCode::BadRequest);
    // A chat template that refuses the conversation: the client's to fix,
    // and told why.
    let refused = GenerateRequest {
        prompt: None,
        messages: Some(vec![ChatMessage::new("refused", "x")]),
        ..greedy("", 4)
    };
    let error = handle.submit(refused, 1).unwrap_err();
    assert_eq!(error.code(), ErrorCode::BadRequest);
    assert!(
        error.to_string().contains("roles must alternate"),
        "{error}"
    );
    assert!(handle.events().is_empty(), "refusals send no events");
}

#[test]
fn clients_see_the_detail_of_their_own_mistakes_and_only_a_code_for_worker_faults() {
    let mine = EngineError::PromptTooLong {
        prompt: 20,
        capacity: 16,
    };
    assert_eq!(mine.client_message(), mine.to_string());
    assert!(mine.client_message().contains("20 tokens"));
    let fault = EngineError::Tokenizer("vocab.json: missing merges".into());
    assert_eq!(fault.code(), ErrorCode::Internal);
    assert_eq!(fault.client_message(), INTERNAL_MESSAGE);
    assert!(
        fault.to_string().contains("missing merges"),
        "the log keeps it"
    );
}

#[test]
fn a_full_queue_answers_overloaded_and_a_busy_rid_is_refused() {
    let config = EngineConfig {
        queue_capacity: 2,
        event_capacity: 1,
        ..EngineConfig::default()
    };
    let handle = engine(Mode::Script, 256, 0, config);
    // Nobody reads events: the engine blocks on the second chunk, so the
    // queue fills up.
    handle.submit(greedy("a\n", 100), 1).unwrap();
    assert_eq!(
        handle.submit(greedy("a\n", 1), 1),
        Err(EngineError::DuplicateRid(1))
    );
    let mut refused = None;
    for rid in 2..50 {
        if let Err(error) = handle.submit(greedy("b\n", 1), rid) {
            refused = Some(error);
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(refused.map(|e| e.code()), Some(ErrorCode::Overloaded));
}

#[test]
fn more_requests_than_max_requests_are_refused_until_one_ends() {
    let config = EngineConfig {
        max_requests: 2,
        ..EngineConfig::default()
    };
    let handle = engine(Mode::Hash, 256, 5, config);
    handle.submit(greedy("a\n", 1_000), 1).unwrap();
    handle.submit(greedy("b\n", 1_000), 2).unwrap();
    let refused = handle.submit(greedy("c\n", 1), 3).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Overloaded);
    handle.cancel(1);
    loop {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        if event.is_terminal() {
            assert_eq!(event.rid(), 1);
            break;
        }
    }
    handle.submit(greedy("c\n", 1), 3).unwrap();
}

/// The next terminal event, skipping chunks.
fn next_terminal(handle: &EngineHandle) -> EngineEvent {
    loop {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(10))
            .expect("engine went quiet");
        if event.is_terminal() {
            return event;
        }
    }
}

/// Waits (on the real clock, only as a guard) until the engine generated
/// `tokens` tokens in all.
fn wait_generated(handle: &EngineHandle, tokens: u64) {
    let start = Instant::now();
    while handle.stats().generated_tokens < tokens {
        assert!(start.elapsed() < Duration::from_secs(10), "no progress");
        std::thread::yield_now();
    }
}

/// An engine on `clock` whose steps take 2 ms of real time, so requests
/// stay running (the pool lasts seconds) while a test moves the clock.
fn virtual_engine(clock: &VirtualClock) -> EngineHandle {
    let config = EngineConfig {
        clock: clock.clone().into(),
        ..EngineConfig::default()
    };
    engine(Mode::Hash, 8192, 2, config)
}

#[test]
fn cancel_and_deadline_end_requests_and_free_their_slots() {
    let clock = VirtualClock::new(Instant::now());
    let handle = virtual_engine(&clock);
    handle.submit(greedy("slow\n", 10_000), 1).unwrap();
    let deadline = GenerateRequest {
        deadline_ms: Some(60),
        ..greedy("late\n", 10_000)
    };
    handle.submit(deadline, 2).unwrap();
    wait_generated(&handle, 40);
    handle.cancel(1);
    handle.cancel(77);
    let event = next_terminal(&handle);
    assert!(
        matches!(
            event,
            EngineEvent::Done {
                rid: 1,
                body: DoneBody {
                    finish_reason: FinishReason::Cancelled,
                    ..
                },
                ..
            }
        ),
        "{event:?}"
    );
    // No time passed: request 2 runs on, then expires once it has.
    let generated = handle.stats().generated_tokens;
    wait_generated(&handle, generated + 20);
    assert!(handle.events().try_iter().all(|e| !e.is_terminal()));
    clock.advance(Duration::from_millis(61));
    let event = next_terminal(&handle);
    assert!(
        matches!(
            event,
            EngineEvent::Done {
                rid: 2,
                body: DoneBody {
                    finish_reason: FinishReason::Deadline,
                    ..
                },
                ..
            }
        ),
        "{event:?}"
    );
    let stats = wait_idle(&handle);
    assert_eq!(stats.kv_used, stats.kv_cached, "nothing held after the end");
    assert_eq!(stats.requests_done[2..4], [1, 1]);
}

#[test]
fn a_deadline_counts_from_arrival_on_the_engine_clock() {
    let clock = VirtualClock::new(Instant::now());
    let handle = virtual_engine(&clock);
    let request = GenerateRequest {
        deadline_ms: Some(1_000),
        ..greedy("timed\n", 10_000)
    };
    handle.submit(request, 1).unwrap();
    wait_generated(&handle, 30);
    clock.advance(Duration::from_millis(999));
    let generated = handle.stats().generated_tokens;
    wait_generated(&handle, generated + 30);
    assert!(handle.events().try_iter().all(|e| !e.is_terminal()));
    clock.advance(Duration::from_millis(1));
    match next_terminal(&handle) {
        EngineEvent::Done {
            rid: 1,
            body:
                DoneBody {
                    finish_reason: FinishReason::Deadline,
                    timings,
                    usage,
                    ..
                },
            ..
        } => {
            // The first token came before the clock moved at all.
            assert_eq!(timings.ttft_s, 0.0);
            assert_eq!(timings.queue_s, 0.0);
            assert!(timings.decode_s >= 0.999, "{timings:?}");
            assert!(usage.completion_tokens >= 60);
        }
        other => panic!("expected a deadline, got {other:?}"),
    }
}

#[test]
fn a_cancelled_request_reports_only_virtual_time() {
    let clock = VirtualClock::new(Instant::now());
    let handle = virtual_engine(&clock);
    handle.submit(greedy("cancel me\n", 10_000), 1).unwrap();
    wait_generated(&handle, 10);
    handle.cancel(1);
    match next_terminal(&handle) {
        EngineEvent::Done {
            rid: 1,
            body:
                DoneBody {
                    finish_reason: FinishReason::Cancelled,
                    timings,
                    ..
                },
            ..
        } => assert_eq!(
            (timings.queue_s, timings.ttft_s, timings.decode_s),
            (0.0, 0.0, 0.0)
        ),
        other => panic!("expected a cancel, got {other:?}"),
    }
    let stats = wait_idle(&handle);
    assert_eq!(stats.ttft.count, 1);
    assert_eq!(stats.inter_token.mean_s(), 0.0);
}

fn wait_idle(handle: &EngineHandle) -> EngineStats {
    let start = Instant::now();
    loop {
        let stats = handle.stats();
        if stats.running == 0 && stats.waiting == 0 {
            return stats;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{stats:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn step_phases_add_up_to_at_most_the_step_time() {
    let handle = engine(Mode::Script, 256, 1, EngineConfig::default());
    for rid in 1..=3 {
        handle.submit(greedy("hi\n", 12), rid).unwrap();
    }
    for _ in 1..=3 {
        assert!(matches!(next_terminal(&handle), EngineEvent::Done { .. }));
    }
    let stats = wait_idle(&handle);
    let phases = [stats.plan_s, stats.forward_s, stats.sample_s, stats.rest_s];
    assert!(phases.iter().all(|&phase| phase > 0.0), "{stats:?}");
    // 12 steps of at least 1 ms in the model.
    assert!(stats.forward_s >= 0.012, "{stats:?}");
    // Up to the rounding of the running sums.
    assert!(
        phases.iter().sum::<f64>() <= stats.step_s + 1e-9,
        "{stats:?}"
    );
}

#[test]
fn seeds_reproduce_and_differ() {
    let handle = engine(Mode::Hash, 1024, 0, EngineConfig::default());
    let sampled = |seed: u64, rid: u64| {
        let request = GenerateRequest {
            temperature: 1.0,
            top_k: 50,
            top_p: 0.9,
            seed: Some(seed),
            ..greedy("seeded\n", 24)
        };
        handle.submit(request, rid).unwrap();
        collect(&handle, rid)
            .iter()
            .flat_map(|e| match e {
                EngineEvent::Chunk {
                    body: ChunkBody { tokens, .. },
                    ..
                } => tokens.clone(),
                _ => Vec::new(),
            })
            .collect::<Vec<u32>>()
    };
    let first = sampled(42, 1);
    assert_eq!(first.len(), 24);
    assert_eq!(first, sampled(42, 2), "same seed, same prompt (now cached)");
    assert_ne!(first, sampled(43, 3));
}

#[test]
fn the_engine_seed_fixes_the_seeds_of_requests_that_name_none() {
    let run = |seed: u64| {
        let config = EngineConfig {
            seed: Some(seed),
            ..EngineConfig::default()
        };
        let handle = engine(Mode::Hash, 1024, 0, config);
        let request = GenerateRequest {
            temperature: 1.0,
            top_k: 50,
            ..greedy("unseeded\n", 24)
        };
        (1..=2)
            .map(|rid| {
                handle.submit(request.clone(), rid).unwrap();
                collect(&handle, rid)
                    .iter()
                    .flat_map(|e| match e {
                        EngineEvent::Chunk {
                            body: ChunkBody { tokens, .. },
                            ..
                        } => tokens.clone(),
                        _ => Vec::new(),
                    })
                    .collect::<Vec<u32>>()
            })
            .collect::<Vec<_>>()
    };
    let first = run(7);
    assert_eq!(first[0].len(), 24);
    assert_eq!(first, run(7), "same engine seed, same outputs");
    assert_ne!(first[0], first[1], "each request draws its own seed");
    assert_ne!(first, run(8));
}

#[test]
fn random_traffic_with_a_small_pool_ends_every_request_once_with_correct_tokens() {
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_batch: 6,
            step_token_budget: 32,
            decode_reserve: 2,
            shared_prefix_hold: 8,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    let handle = engine(Mode::Hash, 160, 0, config);
    let mut rng = StdRng::seed_from_u64(9);
    let stems = ["system prompt one\n", "another shared stem\n", "x\n"];
    let mut prompts = HashMap::new();
    for rid in 0..80u64 {
        let stem = stems[rng.random_range(0..stems.len())];
        let prompt = format!("{stem}{}\n", "q".repeat(rng.random_range(1..30)));
        handle
            .submit(greedy(&prompt, rng.random_range(1..40)), rid)
            .unwrap();
        prompts.insert(rid, prompt);
        if rng.random_bool(0.15) {
            handle.cancel(rng.random_range(0..=rid));
        }
    }
    let mut tokens: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut terminal: HashMap<u64, EngineEvent> = HashMap::new();
    while terminal.len() < prompts.len() {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(30))
            .unwrap();
        let rid = event.rid();
        assert!(!terminal.contains_key(&rid), "event after the terminal one");
        match event {
            EngineEvent::Chunk {
                body: ChunkBody { tokens: t, .. },
                ..
            } => tokens.entry(rid).or_default().extend(t),
            other => {
                terminal.insert(rid, other);
            }
        }
    }
    for (rid, event) in &terminal {
        let EngineEvent::Done {
            body: DoneBody { usage, .. },
            ..
        } = event
        else {
            panic!("request {rid} failed: {event:?}");
        };
        let out = tokens.get(rid).cloned().unwrap_or_default();
        assert_eq!(out.len(), usage.completion_tokens as usize);
        let mut state = None;
        for &t in prompts[rid].as_bytes() {
            state = Some(chain(state, u32::from(t)));
        }
        for &t in &out {
            let expected = next_token(Mode::Hash, state.unwrap());
            assert_eq!(t, expected, "request {rid} diverged: bad K/V reuse");
            state = Some(chain(state, t));
        }
    }
    let stats = wait_idle(&handle);
    assert_eq!(stats.kv_used, stats.kv_cached);
    assert!(
        stats.preemptions > 0,
        "the small pool should force preemption"
    );
    assert!(stats.cache_hit_tokens > 0);
    assert_eq!(stats.requests_accepted, 80);
}

#[test]
fn dropping_the_handle_fails_what_is_still_running() {
    let handle = engine(Mode::Hash, 512, 5, EngineConfig::default());
    let events = handle.events().clone();
    for rid in 0..3 {
        handle.submit(greedy("forever\n", 10_000), rid).unwrap();
    }
    wait_generated(&handle, 3);
    drop(handle);
    let mut terminal = HashMap::new();
    for event in events.try_iter() {
        if let EngineEvent::Error { rid, code, .. } = event {
            assert!(terminal.insert(rid, code).is_none());
        }
    }
    assert_eq!(terminal.len(), 3);
    assert!(terminal.values().all(|&c| c == ErrorCode::Unavailable));
}

/// Tokens and log-probability entries of every chunk, in order.
fn chunk_logprobs(events: &[EngineEvent]) -> Vec<(Vec<u32>, Vec<TokenLogprob>)> {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Chunk {
                body: ChunkBody {
                    tokens, logprobs, ..
                },
                ..
            } => Some((
                tokens.clone(),
                logprobs.clone().expect("logprobs asked for"),
            )),
            _ => None,
        })
        .collect()
}

fn with_logprobs(request: GenerateRequest, top: u32) -> GenerateRequest {
    GenerateRequest {
        logprobs: true,
        top_logprobs: top,
        ..request
    }
}

/// Every output token has one entry: its id, the text of the id alone,
/// logprob <= 0, and (greedy) itself as the most likely; the EOS that ends
/// the script is not reported.
fn assert_script_entries(entries: &[TokenLogprob], top: usize) {
    let script: Vec<u32> = SCRIPT.bytes().map(u32::from).collect();
    let ids: Vec<u32> = entries.iter().map(|e| e.token).collect();
    assert_eq!(ids, script, "one entry per shown token, no EOS");
    for entry in entries {
        assert_eq!(entry.text, Bytes.decode(&[entry.token]).unwrap());
        assert!(
            entry.logprob <= 0.0 && entry.logprob.is_finite(),
            "{entry:?}"
        );
        assert_eq!(entry.top_logprobs.len(), top);
        assert_eq!(
            entry.top_logprobs[0].token, entry.token,
            "greedy: {entry:?}"
        );
        assert_eq!(entry.top_logprobs[0].logprob, entry.logprob);
        let mass: f32 = entry.top_logprobs.iter().map(|t| t.logprob.exp()).sum();
        assert!(mass <= 1.0 + 1e-5, "{mass}");
    }
}

#[test]
fn logprobs_come_one_per_streamed_token_and_whole_when_not_streamed() {
    let handle = engine(Mode::Script, 256, 0, EngineConfig::default());
    handle
        .submit(with_logprobs(greedy("hi\n", 100), 3), 1)
        .unwrap();
    let events = collect(&handle, 1);
    assert_eq!(streamed_text(&events), SCRIPT);
    let chunks = chunk_logprobs(&events);
    for (tokens, entries) in &chunks {
        assert_eq!(entries.len(), tokens.len());
    }
    let entries: Vec<TokenLogprob> = chunks.into_iter().flat_map(|(_, e)| e).collect();
    assert_script_entries(&entries, 3);
    assert!(matches!(
        events.last(),
        Some(EngineEvent::Done {
            body: DoneBody { logprobs: None, .. },
            ..
        })
    ));

    let not_streamed = GenerateRequest {
        stream: false,
        ..with_logprobs(greedy("hi\n", 100), 2)
    };
    handle.submit(not_streamed, 2).unwrap();
    let events = collect(&handle, 2);
    assert_eq!(events.len(), 1, "only done");
    let Some(EngineEvent::Done {
        body:
            DoneBody {
                logprobs: Some(entries),
                usage,
                ..
            },
        ..
    }) = events.last()
    else {
        panic!("{events:?}")
    };
    assert_eq!(entries.len() + 1, usage.completion_tokens as usize);
    assert_script_entries(entries, 2);

    // Not asked: none anywhere.
    handle.submit(greedy("hi\n", 100), 3).unwrap();
    for event in collect(&handle, 3) {
        assert!(matches!(
            event,
            EngineEvent::Chunk {
                body: ChunkBody { logprobs: None, .. },
                ..
            } | EngineEvent::Done {
                body: DoneBody { logprobs: None, .. },
                ..
            }
        ));
    }
}

/// A stop string that matches a prefix of the whole output holds all text
/// back; with logprobs a chunk still goes out every 16 tokens, so no
/// chunk grows without bound.
#[test]
fn held_back_text_still_sends_logprobs_every_16_tokens() {
    let handle = engine(Mode::Script, 256, 0, EngineConfig::default());
    let request = GenerateRequest {
        stop: vec![format!("{SCRIPT}!")],
        ..with_logprobs(greedy("hi\n", 100), 0)
    };
    handle.submit(request, 1).unwrap();
    let events = collect(&handle, 1);
    assert_eq!(streamed_text(&events), SCRIPT);
    let chunks = chunk_logprobs(&events);
    assert!(chunks.len() >= 2, "{chunks:?}");
    assert!(chunks.iter().all(|(tokens, _)| tokens.len() <= 16));
    let entries: Vec<TokenLogprob> = chunks.into_iter().flat_map(|(_, e)| e).collect();
    assert_eq!(entries.len(), SCRIPT.len());
    assert!(entries.iter().all(|e| e.top_logprobs.is_empty()));
}

#[test]
fn events_become_the_protocol_messages_with_the_same_fields() {
    let chunk = EngineEvent::Chunk {
        rid: 3,
        body: ChunkBody {
            index: 1,
            text: "hi".into(),
            tokens: vec![104, 105],
            ..ChunkBody::default()
        },
    };
    assert_eq!(
        WorkerToRouter::from(chunk),
        WorkerToRouter::Chunk {
            rid: 3,
            body: ChunkBody {
                index: 1,
                text: "hi".into(),
                tokens: vec![104, 105],
                ..ChunkBody::default()
            },
        }
    );
    let error = EngineEvent::Error {
        rid: 4,
        code: ErrorCode::Internal,
        message: INTERNAL_MESSAGE.into(),
    };
    assert_eq!(
        WorkerToRouter::from(error),
        WorkerToRouter::Error {
            rid: 4,
            code: ErrorCode::Internal,
            message: INTERNAL_MESSAGE.into(),
        }
    );
}
