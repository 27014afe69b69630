//! The scheduler driven by a fake model whose "K/V" is a hash of the prefix
//! each slot was computed under, so every read of a slot can be checked.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use zinfer_cache::{CacheConfig, RadixCache, TokenPool};

use super::*;

const EOS: u32 = 0;

fn prefix_hash(tokens: &[u32]) -> u64 {
    tokens
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, &token| {
            (hash ^ u64::from(token) ^ 0x9e37).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The fake model's next token: a pure function of the whole prefix, so a
/// sequence's output cannot depend on batching, caching or preemption.
fn next_token(tokens: &[u32], vocab: u32) -> u32 {
    1 + (prefix_hash(tokens) >> 17) as u32 % (vocab - 1)
}

struct Harness {
    sched: Scheduler,
    /// What each slot holds: the hash of the prefix it was computed for.
    kv: HashMap<u32, u64>,
    outputs: HashMap<u64, Vec<u32>>,
    max_new: HashMap<u64, usize>,
    finished: Vec<u64>,
    vocab: u32,
    /// Stop at EOS (off for tests that count tokens).
    eos: bool,
    /// Every step's flat batch, checked against its chunks.
    batch: StepBatch,
    /// Speculation of the sequences submitted from now on.
    speculation: Option<Speculation>,
    /// Draft tokens fed and accepted so far.
    drafted: usize,
    accepted: usize,
}

impl Harness {
    fn new(capacity: usize, config: SchedulerConfig) -> Self {
        Harness {
            sched: Scheduler::new(
                config,
                TokenPool::new(capacity),
                RadixCache::new(CacheConfig::default()),
            ),
            kv: HashMap::new(),
            outputs: HashMap::new(),
            max_new: HashMap::new(),
            finished: Vec::new(),
            vocab: 50,
            eos: false,
            batch: StepBatch::new(),
            speculation: None,
            drafted: 0,
            accepted: 0,
        }
    }

    fn submit(&mut self, id: u64, prompt: Vec<u32>, max_new: usize, priority: i32) {
        self.sched
            .submit(NewSequence {
                id,
                namespace: String::new(),
                prompt,
                max_new_tokens: max_new,
                priority,
                deadline: None,
                prompt_output: zinfer_model::ChunkOutput::LastLogits,
                speculation: self.speculation,
            })
            .unwrap();
        self.outputs.insert(id, Vec::new());
        self.max_new.insert(id, max_new);
    }

    /// One step: plan, "compute" with K/V checks, sample, finish.
    fn step(&mut self) -> StepPlan {
        let plan = self.sched.schedule();
        self.finished.extend(&plan.exhausted);
        self.sched.fill_batch(&plan, &mut self.batch).unwrap();
        assert_flat(&self.sched, &plan, &self.batch);
        let mut written = HashSet::new();
        let mut sampled = Vec::new();
        for item in &plan.items {
            let view = self.sched.chunk(item).unwrap();
            // The sequence as this step computes it: with the draft.
            let mut all = self.sched.tokens(item.id).unwrap().to_vec();
            all.extend_from_slice(&view.tokens[view.tokens.len() - item.draft..]);
            assert_eq!(&all[item.start..item.start + item.len], view.tokens);
            assert_eq!(view.start_pos, item.start);
            assert_eq!(view.slots.len(), item.start + item.len);
            for pos in 0..view.start_pos {
                assert_eq!(
                    self.kv.get(&view.slots[pos]),
                    Some(&prefix_hash(&all[..=pos])),
                    "seq {} reads wrong K/V at position {pos}",
                    item.id
                );
            }
            for pos in view.start_pos..view.slots.len() {
                assert!(
                    written.insert(view.slots[pos]),
                    "slot written twice in a step"
                );
                self.kv.insert(view.slots[pos], prefix_hash(&all[..=pos]));
            }
            // Verification: draw at each row in turn, stop at the first
            // that differs from the draft.
            let mut drawn = Vec::new();
            if item.sample {
                let first = item.start + item.len - item.draft;
                for end in first..=item.start + item.len {
                    let token = next_token(&all[..end], self.vocab);
                    drawn.push(token);
                    if all.get(end) != Some(&token) {
                        break;
                    }
                }
                self.drafted += item.draft;
                self.accepted += drawn.len() - 1;
            }
            sampled.push(drawn);
        }
        self.sched.complete(&plan, &sampled);
        for (item, drawn) in plan.items.iter().zip(&sampled) {
            for &token in drawn {
                let out = self.outputs.get_mut(&item.id).unwrap();
                out.push(token);
                if out.len() >= self.max_new[&item.id] || (self.eos && token == EOS) {
                    self.sched.finish(item.id).unwrap();
                    self.finished.push(item.id);
                    break;
                }
            }
        }
        self.check_accounting();
        plan
    }

    fn check_accounting(&self) {
        let stats = self.sched.stats();
        assert_eq!(
            stats.kv_free + stats.kv_held + stats.kv_cached,
            stats.kv_capacity,
            "{stats:?}"
        );
    }

    fn run_until_idle(&mut self, max_steps: usize) {
        for _ in 0..max_steps {
            if self.sched.is_empty() {
                return;
            }
            let _ = self.step();
        }
        panic!("not idle after {max_steps} steps");
    }
}

/// `batch` holds exactly the chunks of `plan`, in order: each sequence's
/// tokens, their positions, its slots and offsets.
fn assert_flat(sched: &Scheduler, plan: &StepPlan, batch: &StepBatch) {
    assert_eq!(batch.len(), plan.items.len());
    let (mut tokens, mut positions, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    let (mut token_indptr, mut slot_indptr) = (vec![0], vec![0]);
    for (index, item) in plan.items.iter().enumerate() {
        let chunk = sched.chunk(item).unwrap();
        tokens.extend_from_slice(chunk.tokens);
        positions.extend((item.start..item.start + item.len).map(|p| p as u32));
        slots.extend_from_slice(chunk.slots);
        token_indptr.push(tokens.len() as u32);
        slot_indptr.push(slots.len() as u32);
        let view = batch.chunk(index).unwrap();
        assert_eq!(
            (view.tokens, view.slots, view.start_pos, view.output),
            (chunk.tokens, chunk.slots, chunk.start_pos, chunk.output)
        );
    }
    if plan.items.is_empty() {
        (token_indptr, slot_indptr) = (Vec::new(), Vec::new());
    }
    assert_eq!(batch.tokens(), tokens);
    assert_eq!(batch.positions(), positions);
    assert_eq!(batch.slots(), slots);
    assert_eq!(batch.token_indptr(), token_indptr);
    assert_eq!(batch.slot_indptr(), slot_indptr);
}

fn reference_output(prompt: &[u32], max_new: usize, vocab: u32) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    for _ in 0..max_new {
        tokens.push(next_token(&tokens, vocab));
    }
    tokens[prompt.len()..].to_vec()
}

fn config(budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batch: 8,
        step_token_budget: budget,
        decode_reserve: 2,
        shared_prefix_hold: 0,
        ..SchedulerConfig::default()
    }
}

#[test]
fn prefill_is_chunked_and_decodes_run_every_step() {
    let mut h = Harness::new(256, config(8));
    h.submit(1, vec![5, 6, 7], 10, 0);
    h.submit(2, (1..=20).collect(), 10, 0);
    let shape = |plan: &StepPlan| -> Vec<(u64, usize, usize, bool)> {
        plan.items
            .iter()
            .map(|i| (i.id, i.start, i.len, i.sample))
            .collect()
    };
    assert_eq!(shape(&h.step()), [(1, 0, 3, true), (2, 0, 5, false)]);
    assert_eq!(shape(&h.step()), [(1, 3, 1, true), (2, 5, 7, false)]);
    assert_eq!(shape(&h.step()), [(1, 4, 1, true), (2, 12, 7, false)]);
    assert_eq!(shape(&h.step()), [(1, 5, 1, true), (2, 19, 1, true)]);
    assert_eq!(shape(&h.step()), [(1, 6, 1, true), (2, 20, 1, true)]);
}

#[test]
fn outputs_match_a_lone_run_whatever_the_batching() {
    let mut h = Harness::new(512, config(16));
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| (0..(3 + 7 * i)).map(|t| 1 + (t * 7 + i) % 40).collect())
        .collect();
    for (id, prompt) in prompts.iter().enumerate() {
        h.submit(id as u64, prompt.clone(), 12, 0);
    }
    h.run_until_idle(200);
    for (id, prompt) in prompts.iter().enumerate() {
        assert_eq!(h.outputs[&(id as u64)], reference_output(prompt, 12, 50));
    }
    let stats = h.sched.stats();
    assert_eq!(stats.kv_held, 0);
    assert_eq!(stats.kv_free + stats.kv_cached, 512);
}

#[test]
fn a_cached_prefix_is_reused_and_only_the_rest_allocated() {
    let mut h = Harness::new(256, config(64));
    let prompt: Vec<u32> = (1..=30).collect();
    h.submit(1, prompt.clone(), 4, 0);
    h.run_until_idle(50);
    // Prompt (30) and the first 3 outputs have K/V; the 4th was never fed.
    assert_eq!(h.sched.stats().kv_cached, 33);
    let mut turn2 = prompt.clone();
    turn2.extend(&h.outputs[&1][..3]);
    turn2.extend([41, 42]);
    h.submit(2, turn2.clone(), 4, 0);
    let free_before = h.sched.stats().kv_free;
    let plan = h.step();
    assert_eq!(
        plan.admitted,
        [Admission {
            id: 2,
            cached_tokens: 33,
            resumed: false
        }]
    );
    assert_eq!(plan.items[0].start, 33);
    assert_eq!(plan.items[0].len, 2);
    assert_eq!(free_before - h.sched.stats().kv_free, 2);
    h.run_until_idle(50);
    assert_eq!(h.outputs[&2], reference_output(&turn2, 4, 50));
    let stats = h.sched.stats();
    assert_eq!((stats.cache_hit_tokens, stats.cache_query_tokens), (33, 65));
}

/// Without the prefix cache (a model with a recurrent state), a repeated
/// prompt is computed whole, every slot goes back to the pool, and each
/// released sequence's first slot is reported once for its state to go.
#[test]
fn without_the_prefix_cache_prompts_are_computed_whole_and_releases_reported() {
    let mut h = Harness::new(256, config(64));
    h.sched.disable_prefix_cache();
    let prompt: Vec<u32> = (1..=30).collect();
    h.submit(1, prompt.clone(), 4, 0);
    let first_slot = {
        let plan = h.step();
        h.sched.chunk(&plan.items[0]).unwrap().slots[0]
    };
    h.run_until_idle(50);
    assert_eq!(h.sched.take_released(), [first_slot]);
    assert!(h.sched.take_released().is_empty());
    assert_eq!(h.sched.stats().kv_cached, 0);
    h.submit(2, prompt.clone(), 4, 0);
    let plan = h.step();
    assert_eq!(plan.admitted[0].cached_tokens, 0);
    assert_eq!((plan.items[0].start, plan.items[0].len), (0, 30));
    h.run_until_idle(50);
    assert_eq!(h.outputs[&2], h.outputs[&1]);
    let stats = h.sched.stats();
    assert_eq!((stats.kv_free, stats.kv_cached), (256, 0));
    assert_eq!(h.sched.take_released().len(), 1);
}

/// Slots reserved for each running sequence's recurrent state are taken at
/// admission beside its tokens', weigh in admission (two sequences that
/// fit without them run one after the other with them), and go back to
/// the pool at the end; a prompt must fit the pool less them.
#[test]
fn state_slots_are_held_while_a_sequence_runs() {
    let mut h = Harness::new(100, config(64));
    h.sched.disable_prefix_cache();
    h.sched.reserve_state_slots(30);
    let refused = h.sched.submit(one_token_request(vec![1; 70]));
    assert_eq!(
        refused,
        Err(SchedulerError::PromptTooLong {
            prompt: 70,
            capacity: 70
        })
    );
    h.submit(1, (1..=20).collect(), 4, 0);
    h.submit(2, (21..=40).collect(), 4, 0);
    let plan = h.step();
    // 20 prompt + 30 state slots each: the second waits for room.
    assert_eq!(plan.admitted.len(), 1);
    assert_eq!(h.sched.stats().kv_free, 100 - 20 - 30);
    h.run_until_idle(50);
    assert_eq!(
        h.outputs[&2],
        reference_output(&(21..=40).collect::<Vec<u32>>(), 4, 50)
    );
    assert_eq!(h.sched.stats().kv_free, 100);
}

#[test]
fn a_fully_cached_prompt_still_feeds_its_last_token() {
    let mut h = Harness::new(128, config(64));
    let prompt: Vec<u32> = (1..=10).collect();
    h.submit(1, prompt.clone(), 1, 0);
    h.run_until_idle(10);
    h.submit(2, prompt.clone(), 3, 0);
    let plan = h.step();
    assert_eq!(plan.admitted[0].cached_tokens, 9);
    assert_eq!((plan.items[0].start, plan.items[0].len), (9, 1));
    h.run_until_idle(10);
    assert_eq!(h.outputs[&2], reference_output(&prompt, 3, 50));
    // The duplicate slot for position 9 was given back.
    let stats = h.sched.stats();
    assert_eq!(stats.kv_free + stats.kv_cached, 128);
    assert_eq!(stats.kv_cached, 12);
}

#[test]
fn a_prompt_is_cached_as_soon_as_its_prefill_completes() {
    let mut h = Harness::new(256, config(64));
    let prompt: Vec<u32> = (1..=40).collect();
    h.submit(1, prompt.clone(), 50, 0);
    let _ = h.step();
    let _ = h.step();
    assert!(h.sched.contains(1), "still decoding");
    let mut other = prompt.clone();
    other.push(45);
    h.submit(2, other, 2, 0);
    let plan = h.step();
    assert_eq!(plan.admitted[0].cached_tokens, 40);
    let stats = h.sched.stats();
    assert!(
        stats.kv_cached >= 40 && stats.kv_evictable == 0,
        "{stats:?}"
    );
}

#[test]
fn waiting_order_is_priority_then_arrival_and_batch_size_is_capped() {
    let mut h = Harness::new(
        256,
        SchedulerConfig {
            max_batch: 2,
            ..config(64)
        },
    );
    h.submit(1, vec![1, 2], 3, 0);
    h.submit(2, vec![3, 4], 3, 5);
    h.submit(3, vec![5, 6], 3, 0);
    h.submit(4, vec![7, 8], 3, 5);
    let plan = h.step();
    let admitted: Vec<u64> = plan.admitted.iter().map(|a| a.id).collect();
    assert_eq!(admitted, [2, 4]);
    assert_eq!(h.sched.stats().waiting, 2);
    h.run_until_idle(10);
    let plan_order: Vec<u64> = h.finished.clone();
    assert_eq!(plan_order, [2, 4, 1, 3]);
}

#[test]
fn a_higher_priority_request_preempts_the_lowest_running_one() {
    let mut h = Harness::new(
        256,
        SchedulerConfig {
            max_batch: 2,
            ..config(64)
        },
    );
    h.submit(1, vec![1, 2, 3], 20, 0);
    h.submit(2, vec![4, 5, 6], 20, 1);
    let _ = h.step();
    let _ = h.step();
    assert_eq!(h.sched.stats().running, 2);
    // The batch is full; a request that outranks only sequence 1 arrives.
    h.submit(3, vec![7, 8, 9], 2, 5);
    let plan = h.step();
    assert_eq!(plan.preempted, [1], "the lowest priority goes back to wait");
    let plan = h.step();
    let admitted: Vec<u64> = plan.admitted.iter().map(|a| a.id).collect();
    assert_eq!(admitted, [3]);
    // An equal priority never preempts.
    h.submit(4, vec![1, 1], 2, 1);
    let plan = h.step();
    assert!(plan.preempted.is_empty(), "{:?}", plan.preempted);
    // Everything still ends, with the output a run alone gives.
    h.run_until_idle(200);
    let mut finished = h.finished.clone();
    finished.sort_unstable();
    assert_eq!(finished, [1, 2, 3, 4]);
    assert_eq!(h.outputs[&1].len(), 20);
}

#[test]
fn a_dry_pool_preempts_the_newest_which_resumes_with_the_same_output() {
    let mut h = Harness::new(
        40,
        SchedulerConfig {
            decode_reserve: 0,
            ..config(64)
        },
    );
    let a: Vec<u32> = (1..=10).collect();
    let b: Vec<u32> = (11..=20).collect();
    h.submit(1, a.clone(), 16, 0);
    h.submit(2, b.clone(), 16, 0);
    let mut preempted = Vec::new();
    for _ in 0..100 {
        if h.sched.is_empty() {
            break;
        }
        preempted.extend(h.step().preempted);
    }
    assert!(h.sched.is_empty());
    assert_eq!(preempted.first(), Some(&2), "the newest goes first");
    assert!(h.sched.stats().preemptions >= 1);
    assert_eq!(h.outputs[&1], reference_output(&a, 16, 50));
    assert_eq!(h.outputs[&2], reference_output(&b, 16, 50));
}

#[test]
fn a_sequence_that_alone_fills_the_pool_ends_and_frees_it() {
    let mut h = Harness::new(16, config(64));
    h.submit(1, (1..=10).collect(), 100, 0);
    let mut exhausted = Vec::new();
    for _ in 0..20 {
        exhausted.extend(h.step().exhausted);
    }
    assert_eq!(exhausted, [1]);
    assert_eq!(h.outputs[&1].len(), 7, "10 prompt + 6 fed outputs fill 16");
    assert!(h.sched.is_empty());
}

/// Sequence 9: `prompt`, one new token.
fn one_token_request(prompt: Vec<u32>) -> NewSequence {
    NewSequence {
        id: 9,
        namespace: String::new(),
        prompt,
        max_new_tokens: 1,
        priority: 0,
        deadline: None,
        prompt_output: zinfer_model::ChunkOutput::LastLogits,
        speculation: None,
    }
}

#[test]
fn prompts_that_cannot_fit_are_refused_at_submit() {
    let mut h = Harness::new(16, config(64));
    let new = one_token_request;
    assert_eq!(
        h.sched.submit(new((0..16).collect())),
        Err(SchedulerError::PromptTooLong {
            prompt: 16,
            capacity: 16
        })
    );
    assert_eq!(
        h.sched.submit(new(vec![])),
        Err(SchedulerError::EmptyPrompt)
    );
    h.sched.submit(new((0..15).collect())).unwrap();
    assert_eq!(
        h.sched.submit(new(vec![1])),
        Err(SchedulerError::DuplicateId(9))
    );
}

#[test]
fn cancel_and_deadline_free_slots_at_once() {
    let mut h = Harness::new(128, config(64));
    let now = Instant::now();
    h.submit(1, (1..=20).collect(), 50, 0);
    h.sched
        .submit(NewSequence {
            id: 2,
            namespace: "other".into(),
            prompt: (30..=45).collect(),
            max_new_tokens: 50,
            priority: 0,
            deadline: Some(now + Duration::from_millis(10)),
            prompt_output: zinfer_model::ChunkOutput::LastLogits,
            speculation: None,
        })
        .unwrap();
    h.outputs.insert(2, Vec::new());
    h.max_new.insert(2, 50);
    let _ = h.step();
    let _ = h.step();
    assert!(h.sched.stats().kv_held > 0);
    assert_eq!(
        h.sched.next_deadline(),
        Some(now + Duration::from_millis(10))
    );
    assert!(h.sched.expire(now).is_empty());
    assert_eq!(h.sched.expire(now + Duration::from_millis(10)), [2]);
    h.sched.finish(1).unwrap();
    let stats = h.sched.stats();
    assert_eq!(
        (stats.running, stats.kv_held, stats.kv_evictable),
        (0, 0, stats.kv_cached)
    );
    assert_eq!(h.sched.finish(1), Err(SchedulerError::Unknown(1)));
    assert_eq!(h.sched.flush_cache(Some("other")), 17);
    assert_eq!(h.sched.flush_cache(None), 21);
    assert_eq!(h.sched.stats().kv_free, 128);
}

#[test]
fn requests_sharing_an_uncached_prefix_wait_for_the_first_prefill() {
    let mut h = Harness::new(
        1024,
        SchedulerConfig {
            shared_prefix_hold: 16,
            ..config(64)
        },
    );
    let system: Vec<u32> = (1..=100).map(|t| t % 45 + 1).collect();
    for id in 0..3u64 {
        let mut prompt = system.clone();
        prompt.push(46 + id as u32);
        h.submit(id, prompt, 2, 0);
    }
    let first = h.step();
    assert_eq!(first.admitted.len(), 1, "the others are held");
    let _ = h.step();
    let third = h.step();
    let cached: Vec<usize> = third.admitted.iter().map(|a| a.cached_tokens).collect();
    assert_eq!(cached, [100, 100]);
    h.run_until_idle(20);
    assert_eq!(h.sched.stats().cache_hit_tokens, 200);
}

/// What a random trace did, summed over its seeds.
#[derive(Default)]
struct Trace {
    preemptions: u64,
    hits: u64,
    drafted: usize,
    accepted: usize,
}

#[test]
fn random_traffic_keeps_every_slot_accounted_for() {
    let trace = random_traffic(None, 50);
    assert!(trace.preemptions > 0, "the trace should force preemption");
    assert!(trace.hits > 0, "the trace should hit the cache");
}

/// Speculation on a small vocabulary, where suffixes recur and drafts are
/// partly right: the same outputs, every K/V read checked, every rejected
/// draft slot back in the pool.
#[test]
fn speculating_traffic_gives_the_same_outputs_and_frees_rejected_drafts() {
    let speculation = Speculation {
        ngram: 3,
        max_draft: 4,
    };
    let trace = random_traffic(Some(speculation), 4);
    assert!(trace.preemptions > 0, "the trace should force preemption");
    assert!(trace.drafted > 100, "{} drafted", trace.drafted);
    assert!(
        trace.accepted > 0 && trace.accepted < trace.drafted,
        "{} of {} accepted",
        trace.accepted,
        trace.drafted
    );
}

/// Requests arrive, get cancelled and finish at random over a small pool;
/// checks each one's output against a lone run and the pool's accounting.
fn random_traffic(speculation: Option<Speculation>, vocab: u32) -> Trace {
    let mut trace = Trace::default();
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut h = Harness::new(
            96,
            SchedulerConfig {
                max_batch: 6,
                step_token_budget: 24,
                decode_reserve: 2,
                shared_prefix_hold: if seed % 2 == 0 { 8 } else { 0 },
                prefill_order: if seed % 3 == 0 {
                    PrefillOrder::Fifo
                } else {
                    PrefillOrder::ShortestFirst
                },
                ..SchedulerConfig::default()
            },
        );
        h.eos = true;
        h.vocab = vocab;
        h.speculation = speculation;
        let stems: Vec<Vec<u32>> = (0..4)
            .map(|_| {
                (0..rng.random_range(5..40))
                    .map(|_| rng.random_range(1..vocab))
                    .collect()
            })
            .collect();
        let mut prompts = HashMap::new();
        let mut cancelled = HashSet::new();
        let mut next_id = 0u64;
        for _ in 0..400 {
            if next_id < 60 && rng.random_bool(0.3) {
                let mut prompt = stems[rng.random_range(0..stems.len())].clone();
                prompt.extend((0..rng.random_range(1..20)).map(|_| rng.random_range(1..vocab)));
                h.submit(
                    next_id,
                    prompt.clone(),
                    rng.random_range(1..24),
                    rng.random_range(0..3),
                );
                prompts.insert(next_id, prompt);
                next_id += 1;
            }
            if next_id > 0 && rng.random_bool(0.05) {
                let id = rng.random_range(0..next_id);
                if h.sched.contains(id) {
                    h.sched.finish(id).unwrap();
                    cancelled.insert(id);
                }
            }
            let _ = h.step();
        }
        h.run_until_idle(2_000);
        let stats = h.sched.stats();
        assert_eq!(stats.kv_held, 0);
        assert_eq!(stats.kv_evictable, stats.kv_cached, "a lock leaked");
        assert_eq!(stats.kv_free + stats.kv_cached, 96);
        let done: HashSet<u64> = h.finished.iter().copied().collect();
        assert_eq!(done.len(), h.finished.len(), "finished twice");
        for (id, prompt) in &prompts {
            if cancelled.contains(id) {
                assert!(!done.contains(id));
                continue;
            }
            assert!(
                done.contains(id),
                "seed {seed}: request {id} never finished"
            );
            let out = &h.outputs[id];
            let reference = reference_output(prompt, out.len(), vocab);
            assert_eq!(out, &reference, "seed {seed}: request {id} diverged");
            assert!(
                out.len() <= h.max_new[id],
                "seed {seed}: request {id} ran over"
            );
        }
        trace.preemptions += stats.preemptions;
        trace.hits += stats.cache_hit_tokens;
        trace.drafted += h.drafted;
        trace.accepted += h.accepted;
    }
    trace
}

#[test]
fn a_sampling_chunk_without_a_token_is_planned_again() {
    let mut h = Harness::new(64, config(64));
    h.submit(1, vec![1, 2, 3], 2, 0);
    let plan = h.sched.schedule();
    h.sched.complete(&plan, &[vec![]]);
    let again = h.sched.schedule();
    assert_eq!(again.items, plan.items);
    h.sched.complete(&again, &[vec![7]]);
    assert_eq!(h.sched.tokens(1), Some(&[1, 2, 3, 7][..]));
    let stats = h.sched.stats();
    assert_eq!(stats.kv_free + stats.kv_held + stats.kv_cached, 64);
}

/// Steps until `id` samples its first token, submitting `each_step` before
/// every step; None if it has not within `max_steps`.
fn steps_to_first_token(
    h: &mut Harness,
    id: u64,
    max_steps: usize,
    mut each_step: impl FnMut(&mut Harness, usize),
) -> Option<usize> {
    for step in 1..=max_steps {
        each_step(h, step);
        let _ = h.step();
        if !h.outputs[&id].is_empty() {
            return Some(step);
        }
    }
    None
}

fn ordered(order: PrefillOrder, budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        prefill_order: order,
        ..config(budget)
    }
}

#[test]
fn a_short_prompt_behind_a_long_one_gets_its_first_token_at_once() {
    let first_token = |order| {
        let mut h = Harness::new(512, ordered(order, 16));
        h.submit(1, (1..=200).map(|t| t % 45 + 1).collect(), 4, 0);
        let _ = h.step();
        h.submit(2, vec![7, 8, 9], 4, 0);
        steps_to_first_token(&mut h, 2, 100, |_, _| {})
    };
    assert_eq!(first_token(PrefillOrder::ShortestFirst), Some(1));
    // FIFO: it waits for the other 184 prompt tokens, 16 a step.
    assert_eq!(first_token(PrefillOrder::Fifo), Some(12));
}

#[test]
fn a_long_prompt_is_not_starved_by_a_stream_of_short_ones() {
    let first_token = |aging| {
        let mut h = Harness::new(
            1024,
            SchedulerConfig {
                prefill_aging: aging,
                ..ordered(PrefillOrder::ShortestFirst, 16)
            },
        );
        h.submit(1, (1..=100).map(|t| t % 45 + 1).collect(), 2, 0);
        // Two 8-token prompts a step fill the budget; each ends on its
        // first token, so none decodes.
        steps_to_first_token(&mut h, 1, 200, |h, step| {
            for k in 0..2u64 {
                let id = 10 + 2 * step as u64 + k;
                h.submit(id, (0..8).map(|t| 100 + 8 * id as u32 + t).collect(), 1, 0);
            }
        })
    };
    // Aged 8 tokens a step, it ties with fresh short prompts (and wins by
    // arrival) after 100 / 8 steps, then takes the budget for 7 steps.
    let aged = first_token(8).expect("the long prompt starved");
    assert!(aged <= 22, "first token after {aged} steps");
    assert_eq!(first_token(0), None);
}

#[test]
fn decodes_run_every_step_and_cap_prefill_beside_them() {
    let mut h = Harness::new(
        1024,
        SchedulerConfig {
            decode_prefill_budget: 8,
            ..ordered(PrefillOrder::ShortestFirst, 64)
        },
    );
    h.submit(1, vec![1, 2, 3], 40, 0);
    h.submit(2, vec![4, 5, 6, 7], 40, 0);
    let _ = h.step();
    let mut full_steps = 0;
    for step in 0..30u64 {
        h.submit(
            100 + step,
            (0..(5 + step as u32 * 7) % 60 + 1)
                .map(|t| 100 + 64 * step as u32 + t)
                .collect(),
            1,
            0,
        );
        let plan = h.step();
        let decodes: Vec<u64> = plan
            .items
            .iter()
            .filter(|i| !i.prefill)
            .map(|i| i.id)
            .collect();
        assert_eq!(decodes, [1, 2], "step {step}: {plan:?}");
        let prefill: usize = plan.items.iter().filter(|i| i.prefill).map(|i| i.len).sum();
        assert!(
            prefill <= 8,
            "step {step}: {prefill} prefill tokens beside decodes"
        );
        full_steps += usize::from(prefill == 8);
    }
    assert!(full_steps > 10, "the cap was reached {full_steps} times");
    // Without decodes a prompt takes the whole budget.
    let mut h = Harness::new(1024, ordered(PrefillOrder::ShortestFirst, 64));
    h.submit(200, (1..=100).map(|t| t % 45 + 1).collect(), 1, 0);
    assert_eq!(h.step().items[0].len, 64);
}

#[test]
fn priority_still_wins_over_a_shorter_prompt() {
    let mut h = Harness::new(512, ordered(PrefillOrder::ShortestFirst, 16));
    h.submit(1, vec![1, 2, 3], 4, 0);
    h.submit(2, (1..=40).collect(), 4, 5);
    let plan = h.step();
    assert_eq!(plan.items.len(), 1);
    assert_eq!((plan.items[0].id, plan.items[0].len), (2, 16));
}

#[test]
fn a_prefix_that_many_requests_wait_for_is_computed_first() {
    let mut h = Harness::new(
        1024,
        SchedulerConfig {
            shared_prefix_hold: 8,
            ..ordered(PrefillOrder::ShortestFirst, 64)
        },
    );
    h.submit(1, (200..240).collect(), 2, 0);
    let system: Vec<u32> = (300..340).collect();
    for id in 2..5u64 {
        let mut prompt = system.clone();
        prompt.extend((0..4).map(|t| 400 + 4 * id as u32 + t));
        h.submit(id, prompt, 2, 0);
    }
    // Shorter alone, the lone 40-token prompt goes after one of three
    // 44-token prompts sharing 40 tokens; the other two wait for the prefix.
    let plan = h.step();
    let ids: Vec<u64> = plan.items.iter().map(|item| item.id).collect();
    assert_eq!(ids, [2, 1]);
    assert_eq!(plan.items[0].len, 44);
    assert_eq!(plan.items[1].len, 20);
}

#[test]
fn a_mixed_step_is_laid_out_flat_as_its_chunks() {
    let mut h = Harness::new(256, config(8));
    h.submit(1, vec![5, 6, 7], 10, 0);
    let prompt: Vec<u32> = (1..=20).collect();
    h.submit(2, prompt.clone(), 10, 0);
    let _ = h.step();
    // One decode beside a prefill chunk.
    let plan = h.sched.schedule();
    assert_eq!(plan.items.len(), 2);
    assert!(!plan.items[0].prefill && plan.items[1].prefill);
    let mut batch = StepBatch::new();
    h.sched.fill_batch(&plan, &mut batch).unwrap();
    let sampled = h.sched.tokens(1).unwrap()[3];
    assert_eq!(batch.tokens()[0], sampled);
    assert_eq!(&batch.tokens()[1..], &prompt[5..12]);
    assert_eq!(batch.positions(), [3, 5, 6, 7, 8, 9, 10, 11]);
    assert_eq!(batch.token_indptr(), [0, 1, 8]);
    assert_eq!(batch.slot_indptr(), [0, 4, 16]);
    let chunk = |i: usize| h.sched.chunk(&plan.items[i]).unwrap();
    assert_eq!(&batch.slots()[..4], chunk(0).slots);
    assert_eq!(&batch.slots()[4..], chunk(1).slots);
    assert_flat(&h.sched, &plan, &batch);
}

#[test]
fn the_flat_batch_keeps_its_buffers_across_identical_steps() {
    let mut h = Harness::new(1024, config(64));
    for id in 0..6u64 {
        h.submit(
            id,
            (0..30).map(|t| 1 + (t + id as u32) % 40).collect(),
            20,
            0,
        );
    }
    let _ = h.step();
    let _ = h.step();
    let plan = h.sched.schedule();
    let mut batch = StepBatch::new();
    h.sched.fill_batch(&plan, &mut batch).unwrap();
    let capacity = batch.capacity();
    let empty = StepPlan::default();
    for _ in 0..10 {
        h.sched.fill_batch(&empty, &mut batch).unwrap();
        assert!(batch.is_empty());
        h.sched.fill_batch(&plan, &mut batch).unwrap();
        assert_eq!(batch.capacity(), capacity);
    }
    assert_flat(&h.sched, &plan, &batch);
}

/// Drafts take only the slots left once every decode has its own: a
/// speculating sequence never costs another its next token (here the pool
/// has 4 free slots for two decodes and a draft of 3).
#[test]
fn drafts_never_preempt_a_decoding_sequence() {
    let mut h = Harness::new(24, config(64));
    h.vocab = 4;
    h.speculation = Some(Speculation {
        ngram: 2,
        max_draft: 4,
    });
    h.submit(1, vec![1, 2, 3, 1, 2, 3, 1, 2, 3, 1], 6, 0);
    h.speculation = None;
    h.submit(2, vec![3, 2, 1, 3, 2, 1, 3, 2, 1, 3], 2, 0);
    let first = h.step();
    assert_eq!(first.admitted.len(), 2, "{first:?} {:?}", h.sched.stats());
    let second = h.step();
    assert!(second.preempted.is_empty(), "{second:?}");
    assert_eq!(second.items.len(), 2, "both decode");
    assert!(second.items[0].draft > 0, "the first drafts: {second:?}");
    h.run_until_idle(50);
    assert_eq!(h.sched.stats().preemptions, 0);
    assert!(h.drafted > 0);
}
