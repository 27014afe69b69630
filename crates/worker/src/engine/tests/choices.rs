//! `n` > 1 on the fake model: every choice streams and ends with its own
//! `done`, the prompt is computed once (the other choices hit the prefix
//! cache), seeds repeat, and a cancel or an early end covers every choice.

use super::*;

/// Every event of `rid` until its `n` dones.
fn collect_choices(handle: &EngineHandle, rid: u64, n: u32) -> Vec<EngineEvent> {
    let mut out = Vec::new();
    let mut dones = 0;
    while dones < n {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(20))
            .expect("engine went quiet");
        assert_eq!(event.rid(), rid);
        match &event {
            EngineEvent::Done { .. } => dones += 1,
            EngineEvent::Error { message, .. } => panic!("error: {message}"),
            EngineEvent::Chunk { .. } => {}
        }
        out.push(event);
    }
    out
}

/// Per choice: (text, finish reason, usage).
fn by_choice(events: &[EngineEvent], n: u32) -> Vec<(String, FinishReason, Usage)> {
    (0..n)
        .map(|wanted| {
            let text = events
                .iter()
                .filter_map(|e| match e {
                    EngineEvent::Chunk {
                        body: ChunkBody { text, choice, .. },
                        ..
                    } if *choice == wanted => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            let (reason, usage) = events
                .iter()
                .find_map(|e| match e {
                    EngineEvent::Done {
                        body:
                            DoneBody {
                                finish_reason,
                                usage,
                                choice,
                                ..
                            },
                        ..
                    } if *choice == wanted => Some((*finish_reason, *usage)),
                    _ => None,
                })
                .expect("a done per choice");
            (text, reason, usage)
        })
        .collect()
}

fn sampled(n: u32, seed: u64) -> GenerateRequest {
    GenerateRequest {
        n,
        seed: Some(seed),
        temperature: 1.0,
        max_tokens: 12,
        ..GenerateRequest::from_prompt("c", "the same long prompt for every choice\n")
    }
}

#[test]
fn choices_share_the_prompt_and_repeat_under_a_seed() {
    let handle = engine(Mode::Hash, 1024, 0, EngineConfig::default());
    handle.submit(sampled(3, 7), 1).unwrap();
    let first = by_choice(&collect_choices(&handle, 1, 3), 3);
    let prompt_len = "the same long prompt for every choice\n".len() as u32;
    for (text, reason, usage) in &first {
        assert_eq!(*reason, FinishReason::Length, "{text:?}");
        assert_eq!(usage.prompt_tokens, prompt_len);
        assert_eq!(usage.completion_tokens, 12);
    }
    // Choices 1 and 2 found the prompt in the cache, all but the token
    // that gives their first logits.
    assert_eq!(first[0].2.cached_tokens, 0);
    assert!(
        first[1].2.cached_tokens >= prompt_len - 1,
        "{:?}",
        first[1].2
    );
    assert!(
        first[2].2.cached_tokens >= prompt_len - 1,
        "{:?}",
        first[2].2
    );
    let texts: std::collections::HashSet<&str> = first.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(texts.len(), 3, "three different samples: {first:?}");

    // The same seed again: the same three choices; choice 0 is what n=1
    // with that seed gives.
    handle.submit(sampled(3, 7), 2).unwrap();
    let again = by_choice(&collect_choices(&handle, 2, 3), 3);
    let texts = |c: &[(String, FinishReason, Usage)]| -> Vec<String> {
        c.iter().map(|(text, ..)| text.clone()).collect()
    };
    assert_eq!(texts(&again), texts(&first));
    handle.submit(sampled(1, 7), 3).unwrap();
    assert_eq!(streamed_text(&collect(&handle, 3)), first[0].0);
    let stats = wait_idle(&handle);
    assert_eq!(stats.requests_done[1], 7, "seven choices ended with length");
}

#[test]
fn a_cancel_or_an_early_end_covers_every_choice() {
    let handle = engine(Mode::Hash, 1024, 20, EngineConfig::default());
    // Cancelled before the prompt was computed: the choices that never
    // started end too, each with its own done.
    handle.submit(sampled(3, 1), 1).unwrap();
    handle.cancel(1);
    let events = collect_choices(&handle, 1, 3);
    for (_, reason, _) in by_choice(&events, 3) {
        assert_eq!(reason, FinishReason::Cancelled);
    }
    // Cancelled while the choices run.
    let long = GenerateRequest {
        max_tokens: 500,
        ignore_eos: true,
        ..sampled(2, 1)
    };
    handle.submit(long, 2).unwrap();
    wait_generated(&handle, 4);
    handle.cancel(2);
    let events = collect_choices(&handle, 2, 2);
    for (_, reason, _) in by_choice(&events, 2) {
        assert_eq!(reason, FinishReason::Cancelled);
    }
    // Greedy choices are all the same; max_tokens 1 ends choice 0 at the
    // token that starts the others.
    let greedy_n = GenerateRequest {
        n: 4,
        ..greedy("x\n", 1)
    };
    handle.submit(greedy_n, 3).unwrap();
    let choices = by_choice(&collect_choices(&handle, 3, 4), 4);
    assert!(
        choices
            .iter()
            .all(|c| c.0 == choices[0].0 && c.1 == FinishReason::Length)
    );
    let stats = wait_idle(&handle);
    assert_eq!(stats.running + stats.waiting, 0);
    assert_eq!(
        stats.kv_used, stats.kv_cached,
        "every slot back in the pool or the cache"
    );
}

#[test]
fn prompt_logprobs_cover_every_prompt_token_once() {
    let handle = engine(Mode::Script, 1024, 0, EngineConfig::default());
    // The script's model predicts "Hello, ..." after a newline, so the
    // prompt's own "Hello" is likely and its "x" is not.
    let prompt = "x\nHello";
    let asking = GenerateRequest {
        prompt_logprobs: Some(2),
        ..greedy(prompt, 3)
    };
    // Twice: the second time the prompt is cached, and must still be
    // computed in full for its rows.
    for rid in [1, 2] {
        handle.submit(asking.clone(), rid).unwrap();
        let events = collect(&handle, rid);
        assert_eq!(streamed_text(&events), ", w", "sampling is unchanged");
        let Some(EngineEvent::Done {
            body:
                DoneBody {
                    prompt_logprobs: Some(entries),
                    usage,
                    ..
                },
            ..
        }) = events.last()
        else {
            panic!("expected done with prompt logprobs: {events:?}");
        };
        assert_eq!(usage.cached_tokens, 0, "no prefix taken from the cache");
        let tokens: Vec<u32> = entries.iter().map(|e| e.token).collect();
        assert_eq!(tokens, Bytes.encode(prompt).unwrap());
        assert_eq!(entries[0].logprob, None);
        assert!(
            entries[1..]
                .iter()
                .all(|e| e.logprob.is_some_and(|l| l <= 0.0))
        );
        assert!(entries[1..].iter().all(|e| e.top_logprobs.len() == 2));
        // After "\n" the script says "H": likely, and the top alternative.
        let h = &entries[2];
        assert_eq!(h.text, "H");
        assert_eq!(h.top_logprobs[0].token, u32::from(b'H'));
        assert!(h.logprob.unwrap() > entries[1].logprob.unwrap());
    }
    // `max_tokens` 0 scores the prompt and generates nothing.
    let scoring = GenerateRequest {
        prompt_logprobs: Some(0),
        ..greedy(prompt, 0)
    };
    handle.submit(scoring, 4).unwrap();
    let events = collect(&handle, 4);
    assert_eq!(streamed_text(&events), "");
    let Some(EngineEvent::Done {
        body:
            DoneBody {
                prompt_logprobs: Some(entries),
                usage,
                finish_reason,
                ..
            },
        ..
    }) = events.last()
    else {
        panic!("expected done with prompt logprobs: {events:?}");
    };
    assert_eq!(entries.len(), prompt.len());
    assert_eq!(usage.completion_tokens, 0);
    assert_eq!(*finish_reason, FinishReason::Length);
    // Prompts split into chunks of any size, one token included, still
    // give every entry once.
    let small_steps = EngineConfig {
        scheduler: crate::scheduler::SchedulerConfig {
            step_token_budget: 3,
            ..crate::scheduler::SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    let chunked = engine(Mode::Script, 1024, 0, small_steps);
    let long = "x\nHello, w";
    chunked
        .submit(
            GenerateRequest {
                prompt_logprobs: Some(0),
                ..greedy(long, 2)
            },
            9,
        )
        .unwrap();
    let Some(EngineEvent::Done {
        body:
            DoneBody {
                prompt_logprobs: Some(chunked_entries),
                ..
            },
        ..
    }) = collect(&chunked, 9).pop()
    else {
        panic!("expected done with prompt logprobs");
    };
    let positions: Vec<u32> = chunked_entries.iter().map(|e| e.token).collect();
    assert_eq!(positions, Bytes.encode(long).unwrap());
    // A request that does not ask gets none, and takes the cached prefix.
    handle.submit(greedy(prompt, 3), 3).unwrap();
    let events = collect(&handle, 3);
    let Some(EngineEvent::Done {
        body: DoneBody {
            prompt_logprobs,
            usage,
            ..
        },
        ..
    }) = events.last()
    else {
        panic!("expected done");
    };
    assert!(prompt_logprobs.is_none());
    assert!(usage.cached_tokens > 0);
}

#[test]
fn an_embedding_pools_every_prompt_row_and_generates_nothing() {
    let handle = engine(Mode::Hash, 1024, 0, EngineConfig::default());
    let embed = |text: &str, pooling| {
        zinfer_protocol::EmbedRequest {
            pooling: Some(pooling),
            ..zinfer_protocol::EmbedRequest::text("e", text)
        }
        .to_generate()
    };
    let vector = |rid: u64, request: GenerateRequest| -> Vec<f32> {
        handle.submit(request, rid).unwrap();
        let events = collect(&handle, rid);
        assert_eq!(events.len(), 1, "no chunks: {events:?}");
        let Some(EngineEvent::Done {
            body:
                DoneBody {
                    embedding: Some(vector),
                    usage,
                    ..
                },
            ..
        }) = events.last()
        else {
            panic!("expected done with an embedding: {events:?}");
        };
        assert_eq!(usage.completion_tokens, 0);
        assert_eq!(usage.cached_tokens, 0, "every row computed");
        vector.clone()
    };
    let mean = vector(
        1,
        embed("a sentence to embed", zinfer_protocol::Pooling::Mean),
    );
    assert_eq!(mean.len(), 8);
    let norm: f32 = mean.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    // The same text again, now cached: the same vector.
    assert_eq!(
        vector(
            2,
            embed("a sentence to embed", zinfer_protocol::Pooling::Mean)
        ),
        mean
    );
    let last = vector(
        3,
        embed("a sentence to embed", zinfer_protocol::Pooling::Last),
    );
    assert_ne!(last, mean);
    assert_ne!(
        vector(4, embed("another one", zinfer_protocol::Pooling::Mean)),
        mean
    );
    let stats = wait_idle(&handle);
    assert_eq!(stats.generated_tokens, 0);
}

#[test]
fn a_higher_priority_request_starts_before_the_batch_it_outranks_ends() {
    let handle = engine(Mode::Hash, 8192, 1, EngineConfig::default());
    for rid in 1..=40 {
        let low = GenerateRequest {
            ignore_eos: true,
            ..greedy(&format!("low {rid}\n"), 200)
        };
        handle.submit(low, rid).unwrap();
    }
    wait_generated(&handle, 10);
    let urgent = GenerateRequest {
        priority: 5,
        ..greedy("urgent\n", 1)
    };
    handle.submit(urgent, 100).unwrap();
    // The urgent request ends while both low ones still run.
    loop {
        let event = handle
            .events()
            .recv_timeout(Duration::from_secs(20))
            .expect("engine went quiet");
        match event {
            EngineEvent::Done { rid: 100, .. } => break,
            EngineEvent::Done { rid, .. } => panic!("low request {rid} ended first"),
            _ => {}
        }
    }
    for rid in 1..=40 {
        handle.cancel(rid);
    }
}
