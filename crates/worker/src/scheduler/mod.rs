//! Continuous batching scheduler (sans-IO).
//!
//! The scheduler decides what the model computes each step and who owns
//! every KV slot. It owns the [`TokenPool`] and the [`RadixCache`]; the
//! engine feeds it events (submit, cancel, deadlines via [`Scheduler::expire`],
//! step results via [`Scheduler::complete`]) and asks it for the next batch
//! with [`Scheduler::schedule`]. It never touches the model, so it is tested
//! with a fake one.
//!
//! A sequence's tokens are its prompt followed by its output; all but the
//! newest have K/V in the pool. Each step feeds a sequence the tokens that
//! still lack K/V: a chunk of the prompt while prefilling, then one token per
//! step while decoding. Decodes go in every step; prefill chunks fill the
//! rest of a token budget, so a long prompt never stalls running streams.
//!
//! Which prompts get that budget is the [`PrefillOrder`]. The default,
//! shortest first, ranks running prefills and waiting requests together by
//! priority, then remaining uncached prompt tokens (of waiting requests, the
//! first 64 in priority and arrival order compete) less `prefill_aging` per
//! step waited and divided by one plus the number of other prompts that
//! share at least half of it (one prefill of a shared system prompt serves
//! them all), then arrival: a short prompt no longer waits for every chunk
//! of a long one ahead of it (head-of-line blocking), and a long one
//! overtakes fresh short ones after at most `len / prefill_aging` steps, so
//! it is never starved. In a step that also decodes, prefill takes at most
//! `decode_prefill_budget` tokens, which bounds the inter-token latency a
//! chunk adds to every stream. `sim.rs` measures both against FIFO on
//! shared-prefix chat loads in virtual time.
//!
//! Slot ownership: the first `cache_len` slots of a running sequence belong
//! to the radix cache (kept from eviction by a lock on the cache node), the
//! rest to the sequence itself. When a prompt's prefill completes it goes
//! into the cache at once, so later requests with the same prefix hit while
//! the first still decodes; on finish the whole sequence goes in and the
//! lock is released.

mod kv;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
mod transfer;

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use zinfer_cache::{NodeHandle, RadixCache, TokenPool};
use zinfer_model::{ChunkOutput, SeqChunk, StepBatch};

use kv::Kv;
pub use transfer::ImportError;

use crate::speculate::{self, DraftLength};

/// Tuning of the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// Most tokens computed per step; decodes count one each, prefill
    /// chunks share the rest.
    pub step_token_budget: usize,
    /// Slots each running sequence is expected to need soon; admission
    /// leaves this much room per sequence to avoid preempting right away.
    pub decode_reserve: usize,
    /// A waiting request that shares at least this many uncached prompt
    /// tokens with a prompt being prefilled waits for that prompt to reach
    /// the cache, so the shared prefix is computed once; 0 turns it off.
    pub shared_prefix_hold: usize,
    /// Which prompts get the prefill budget first.
    pub prefill_order: PrefillOrder,
    /// With [`PrefillOrder::ShortestFirst`], a prompt counts as this many
    /// tokens shorter for every step it has waited, so a long prompt
    /// overtakes fresh short ones after a bounded wait and is never starved.
    pub prefill_aging: usize,
    /// Most prefill tokens in a step that also decodes, so one chunk cannot
    /// stretch every stream's inter-token latency; 0 leaves the whole
    /// `step_token_budget`.
    pub decode_prefill_budget: usize,
    /// Sequences that asked for speculation draft only while at most this
    /// many sequences decode in the step: past it, a batch already reads
    /// each weight for several rows, and verifying drafts costs more than
    /// it saves. 0 turns speculation off for everyone.
    pub speculate_max_decodes: usize,
}

/// The order in which prompts (running prefills and waiting requests) share
/// the prefill budget of a step. Priority always comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillOrder {
    /// By arrival: a long prompt admitted first takes the budget until its
    /// prefill completes and every prompt behind it waits.
    Fifo,
    /// Fewest remaining prompt tokens first, aged by
    /// [`SchedulerConfig::prefill_aging`]: short prompts do not queue behind
    /// long ones.
    ShortestFirst,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch: 32,
            step_token_budget: 512,
            decode_reserve: 16,
            shared_prefix_hold: 32,
            prefill_order: PrefillOrder::ShortestFirst,
            prefill_aging: AGING,
            decode_prefill_budget: DECODE_PREFILL,
            speculate_max_decodes: SPECULATE_MAX_DECODES,
        }
    }
}

/// Why a sequence was refused or an operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    /// The prompt and one generated token do not fit the whole pool.
    #[error(
        "prompt of {prompt} tokens does not fit the KV pool of {capacity} tokens; \
         shorten it below {capacity} tokens"
    )]
    PromptTooLong {
        /// Prompt length in tokens.
        prompt: usize,
        /// Pool capacity in tokens.
        capacity: usize,
    },
    /// A request must give at least one prompt token.
    #[error("the prompt is empty; give at least one token")]
    EmptyPrompt,
    /// The id is already in use.
    #[error("sequence {0} is already scheduled; use a fresh id")]
    DuplicateId(u64),
    /// No sequence has this id (finished or never submitted).
    #[error("no sequence with id {0}")]
    Unknown(u64),
}

/// A request ready to be scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSequence {
    /// Engine-wide id (the router's rid).
    pub id: u64,
    /// Prefix-cache namespace.
    pub namespace: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_new_tokens: usize,
    /// Higher is admitted first.
    pub priority: i32,
    /// When to give up.
    pub deadline: Option<Instant>,
    /// What the prompt's chunks return besides the last logits: every
    /// row's logits (prompt logprobs) or hidden state (embeddings). Such a
    /// sequence takes nothing from the prefix cache until its prompt has
    /// been computed once, so every row is computed.
    pub prompt_output: ChunkOutput,
    /// Prompt-lookup speculation for this sequence's decode steps.
    pub speculation: Option<Speculation>,
}

/// How a sequence drafts tokens for speculative decoding (see
/// [`crate::speculate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Longest suffix looked up.
    pub ngram: usize,
    /// Most tokens drafted per step.
    pub max_draft: usize,
}

/// One sequence's part of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanItem {
    /// Sequence id.
    pub id: u64,
    /// First position fed this step (positions before it have K/V).
    pub start: usize,
    /// Number of tokens fed.
    pub len: usize,
    /// The chunk ends at the newest token: sample the next one.
    pub sample: bool,
    /// Part of a prompt (or of a resumed sequence) rather than a decode.
    pub prefill: bool,
    /// Draft tokens fed after the newest token (speculative decoding): the
    /// last `draft` of the `len`; the chunk returns every row's logits.
    pub draft: usize,
}

/// A sequence admitted to the running batch this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Sequence id.
    pub id: u64,
    /// Tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Whether this is a re-admission after preemption.
    pub resumed: bool,
}

/// What to compute in one step, and what changed while planning it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct StepPlan {
    /// Chunks to run, in batch order.
    pub items: Vec<PlanItem>,
    /// Sequences that entered the running batch.
    pub admitted: Vec<Admission>,
    /// Sequences sent back to the waiting queue for lack of slots.
    pub preempted: Vec<u64>,
    /// Sequences that alone fill the pool and cannot grow: finished
    /// already; the engine reports them with finish reason `length`.
    pub exhausted: Vec<u64>,
}

impl StepPlan {
    /// Whether there is nothing to compute.
    pub fn is_idle(&self) -> bool {
        self.items.is_empty()
    }
}

/// Counts for load reports and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Sequences in the running batch.
    pub running: usize,
    /// Sequences waiting for admission.
    pub waiting: usize,
    /// Pool capacity in slots.
    pub kv_capacity: usize,
    /// Free slots.
    pub kv_free: usize,
    /// Slots owned by running sequences (not in the cache), those held for
    /// their recurrent states included.
    pub kv_held: usize,
    /// Slots owned by the radix cache (locked or not).
    pub kv_cached: usize,
    /// Cached slots that may be evicted.
    pub kv_evictable: usize,
    /// Prompt tokens served from the cache since start.
    pub cache_hit_tokens: u64,
    /// Prompt tokens looked up in the cache since start.
    pub cache_query_tokens: u64,
    /// Sequences preempted since start.
    pub preemptions: u64,
}

/// One sequence, waiting or running.
#[derive(Debug)]
struct Seq {
    id: u64,
    /// Pool slots held for the model's recurrent state of the sequence
    /// while it runs ([`Scheduler::reserve_state_slots`]); never written.
    state: Vec<u32>,
    namespace: String,
    /// Prompt, then output.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_new_tokens: usize,
    priority: i32,
    /// Arrival order; kept across preemption.
    order: u64,
    /// The scheduler step it arrived in, for aging; kept across preemption.
    arrived_step: u64,
    deadline: Option<Instant>,
    /// Slot of each position that has (or is about to get) K/V.
    slots: Vec<u32>,
    /// Positions whose K/V is written.
    kv_len: usize,
    /// Leading slots owned by the cache through `node`.
    cache_len: usize,
    /// Locked cache node covering at least `cache_len` tokens.
    node: Option<NodeHandle>,
    /// All tokens but the newest have K/V: decoding.
    prefilled: bool,
    /// Admitted at least once (for hit accounting and `resumed`).
    admitted_before: bool,
    /// What prefill chunks return until the prompt's rows are out.
    prompt_output: ChunkOutput,
    /// Every prompt row went out once (or none was asked for).
    prompt_rows_out: bool,
    /// Its speculation settings and next draft length, when it speculates.
    speculation: Option<(Speculation, DraftLength)>,
    /// The newest token then this step's draft, while a draft is planned:
    /// what the step feeds.
    fed: Vec<u32>,
    /// A draft model's proposal and the token count it was made at; used
    /// instead of prompt lookup while the sequence has not moved on.
    offered: Option<(usize, Vec<u32>)>,
}

impl Seq {
    fn key(&self) -> WaitKey {
        (Reverse(self.priority), self.order, self.id)
    }

    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Slots this sequence may still ask for, capped by `reserve`.
    fn reserve(&self, reserve: usize) -> usize {
        self.max_new_tokens
            .saturating_sub(self.generated())
            .min(reserve)
    }

    /// Draft tokens this decoding sequence may have checked next step,
    /// with `free` slots in the pool: every one may be accepted and one
    /// more is drawn, so it stays within `max_new_tokens`; 0 when it does
    /// not speculate.
    fn draft_room(&self, free: usize) -> usize {
        let Some((_, length)) = self.speculation else {
            return 0;
        };
        self.max_new_tokens
            .saturating_sub(self.generated() + 1)
            .min(length.next())
            .min(free)
    }
}

/// Waiting order: priority high first, then arrival.
type WaitKey = (Reverse<i32>, u64, u64);

/// Shortest-first prefill order: priority high first, then aged remaining
/// prompt tokens, then arrival, then id.
type PrefillKey = (Reverse<i32>, usize, u64, u64);

/// The continuous batching scheduler.
pub struct Scheduler {
    config: SchedulerConfig,
    kv: Kv,
    seqs: HashMap<u64, Seq>,
    waiting: BTreeSet<WaitKey>,
    /// Running ids, oldest (highest priority, earliest) first.
    running: Vec<u64>,
    next_order: u64,
    /// Steps planned so far.
    steps: u64,
    cache_hit_tokens: u64,
    cache_query_tokens: u64,
    preemptions: u64,
    /// Pool slots each running sequence holds for its recurrent state.
    state_slots: usize,
}

impl Scheduler {
    /// A scheduler over `pool` and `cache`, which it owns from now on.
    pub fn new(config: SchedulerConfig, pool: TokenPool, cache: RadixCache<u32>) -> Self {
        Scheduler {
            config,
            kv: Kv {
                pool,
                cache,
                keep_prefixes: true,
                released: Vec::new(),
            },
            seqs: HashMap::new(),
            waiting: BTreeSet::new(),
            running: Vec::new(),
            next_order: 0,
            steps: 0,
            cache_hit_tokens: 0,
            cache_query_tokens: 0,
            preemptions: 0,
            state_slots: 0,
        }
    }

    /// Caches no prefix from now on (nothing computed goes into the radix
    /// cache, so every prompt is computed whole) and holds no request for
    /// another's prefix: for models with a recurrent state per sequence,
    /// which a prefix's K/V alone cannot resume.
    pub fn disable_prefix_cache(&mut self) {
        self.kv.keep_prefixes = false;
        self.config.shared_prefix_hold = 0;
    }

    /// Makes every running sequence hold `per_sequence` pool slots besides
    /// its tokens', from admission to release: the memory of its recurrent
    /// state (a hybrid model's), counted in the pool's slots so admission
    /// and preemption weigh it as they weigh K/V. A prompt must fit the
    /// pool less those slots.
    pub fn reserve_state_slots(&mut self, per_sequence: usize) {
        self.state_slots = per_sequence;
    }

    /// The first slots of the sequences released since the last call, when
    /// the prefix cache is off ([`Self::disable_prefix_cache`]): the model
    /// drops their recurrent states before any of those slots is used again.
    pub fn take_released(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.kv.released)
    }

    /// KV pool capacity in tokens (one slot per token).
    pub fn kv_capacity(&self) -> usize {
        self.kv.pool.capacity()
    }

    /// Queues a sequence; refuses one that could never fit the pool.
    pub fn submit(&mut self, new: NewSequence) -> Result<(), SchedulerError> {
        if new.prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        let capacity = self.kv_capacity().saturating_sub(self.state_slots);
        if new.prompt.len() + 1 > capacity {
            return Err(SchedulerError::PromptTooLong {
                prompt: new.prompt.len(),
                capacity,
            });
        }
        if self.seqs.contains_key(&new.id) {
            return Err(SchedulerError::DuplicateId(new.id));
        }
        let seq = Seq {
            id: new.id,
            state: Vec::new(),
            namespace: new.namespace,
            prompt_len: new.prompt.len(),
            tokens: new.prompt,
            max_new_tokens: new.max_new_tokens,
            priority: new.priority,
            order: self.next_order,
            arrived_step: self.steps,
            deadline: new.deadline,
            slots: Vec::new(),
            kv_len: 0,
            cache_len: 0,
            node: None,
            prefilled: false,
            admitted_before: false,
            prompt_rows_out: new.prompt_output == ChunkOutput::LastLogits,
            prompt_output: new.prompt_output,
            speculation: new
                .speculation
                .filter(|spec| spec.max_draft > 0)
                .map(|spec| (spec, DraftLength::new(spec.max_draft))),
            fed: Vec::new(),
            offered: None,
        };
        self.next_order += 1;
        self.waiting.insert(seq.key());
        self.seqs.insert(seq.id, seq);
        Ok(())
    }

    /// Ends a sequence (finished, cancelled or past its deadline): its
    /// computed tokens go into the cache, its lock and spare slots are
    /// released at once.
    pub fn finish(&mut self, id: u64) -> Result<(), SchedulerError> {
        let mut seq = self.remove(id)?;
        self.kv.release(&mut seq, true);
        Ok(())
    }

    /// Ends a sequence whose last step failed: its slots are freed without
    /// caching anything.
    pub fn abort(&mut self, id: u64) -> Result<(), SchedulerError> {
        let mut seq = self.remove(id)?;
        self.kv.release(&mut seq, false);
        Ok(())
    }

    /// Finishes every sequence whose deadline is at or before `now`;
    /// returns their ids.
    pub fn expire(&mut self, now: Instant) -> Vec<u64> {
        let mut expired: Vec<u64> = self
            .seqs
            .values()
            .filter(|seq| seq.deadline.is_some_and(|deadline| deadline <= now))
            .map(|seq| seq.id)
            .collect();
        expired.sort_unstable();
        for &id in &expired {
            // Present: just listed.
            let _ = self.finish(id);
        }
        expired
    }

    /// The earliest deadline of any sequence, for the engine's idle wait.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.seqs.values().filter_map(|seq| seq.deadline).min()
    }

    /// Whether the sequence is still scheduled (waiting or running).
    pub fn contains(&self, id: u64) -> bool {
        self.seqs.contains_key(&id)
    }

    /// Whether nothing is waiting or running.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Plans the next step: decodes first, then prefill chunks and
    /// admissions from the waiting queue in [`PrefillOrder`] while budget,
    /// batch size and pool room allow.
    pub fn schedule(&mut self) -> StepPlan {
        self.steps += 1;
        let mut plan = StepPlan::default();
        self.preempt_for_priority(&mut plan);
        self.plan_decodes(&mut plan);
        // Decodes count one token each: drafts are bounded on their own
        // (`speculate_max_decodes` times a request's `max_draft`), and
        // must not starve prompts.
        let mut budget = self
            .config
            .step_token_budget
            .saturating_sub(plan.items.len());
        if !plan.items.is_empty() && self.config.decode_prefill_budget > 0 {
            budget = budget.min(self.config.decode_prefill_budget);
        }
        // Admitting right after a preemption would only preempt again.
        let admit = plan.preempted.is_empty() && plan.exhausted.is_empty();
        match self.config.prefill_order {
            PrefillOrder::Fifo => self.plan_fifo(&mut plan, budget, admit),
            PrefillOrder::ShortestFirst => self.plan_shortest_first(&mut plan, budget, admit),
        }
        plan
    }

    /// Running prefills oldest first, then admissions in waiting order.
    fn plan_fifo(&mut self, plan: &mut StepPlan, mut budget: usize, admit: bool) {
        for &id in &self.running {
            if budget == 0 {
                break;
            }
            let Some(seq) = self.seqs.get(&id) else {
                continue;
            };
            if !seq.prefilled {
                self.push_chunk(id, plan, &mut budget);
            }
        }
        if admit {
            self.admit(plan, budget);
        }
    }

    /// Running prefills and waiting requests together, by priority, then
    /// aged remaining prompt length (what the cache does not hold) shared
    /// out over the prompts it serves, then arrival. As in [`Self::admit`], a request
    /// that does not fit stops admissions behind it.
    fn plan_shortest_first(&mut self, plan: &mut StepPlan, mut budget: usize, admit: bool) {
        let mut queue: Vec<(PrefillKey, Option<WaitKey>)> = self
            .running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|seq| !seq.prefilled)
            .map(|seq| {
                let remaining = seq.tokens.len().saturating_sub(seq.kv_len);
                (self.prefill_key(seq, remaining), None)
            })
            .collect();
        if admit {
            let waiting: Vec<WaitKey> = self.waiting.iter().take(PEEKED_WAITING).copied().collect();
            for wait in waiting {
                let cached = self.cached_len(wait.2);
                if let Some(seq) = self.seqs.get(&wait.2) {
                    let remaining = seq.tokens.len().saturating_sub(cached);
                    queue.push((self.prefill_key(seq, remaining), Some(wait)));
                }
            }
        }
        let ids: Vec<u64> = queue.iter().map(|(key, _)| key.3).collect();
        for (key, sharers) in queue.iter_mut().map(|(key, _)| key).zip(self.sharers(&ids)) {
            key.1 /= 1 + sharers;
        }
        queue.sort_unstable();
        let mut admitting = admit;
        for ((.., id), wait) in queue {
            if budget == 0 {
                break;
            }
            if let Some(wait) = wait {
                if !admitting || self.running.len() >= self.config.max_batch {
                    continue;
                }
                match self.admit_waiting(wait, plan) {
                    Admit::Admitted(_) => {}
                    Admit::NoRoom => {
                        admitting = false;
                        continue;
                    }
                    Admit::Held | Admit::Never => continue,
                }
            }
            self.push_chunk(id, plan, &mut budget);
        }
    }

    /// Makes room for the first waiting request when it outranks running
    /// work and cannot start (the batch is full, or the pool cannot hold
    /// its prompt): the lowest-priority running sequences, newest first,
    /// go back to wait, their computed tokens kept in the cache. Never
    /// preempts a sequence of equal or higher priority, so equal-priority
    /// traffic keeps today's behaviour. The waiting request starts next
    /// step (admitting right after a preemption is skipped).
    fn preempt_for_priority(&mut self, plan: &mut StepPlan) {
        let Some(&(Reverse(priority), _, id)) = self.waiting.first() else {
            return;
        };
        // Runs every step: the common case (nothing outranked) costs two
        // lookups, no prefix match.
        let lowest = self.running.last().and_then(|id| self.seqs.get(id));
        if lowest.is_none_or(|seq| seq.priority >= priority) {
            return;
        }
        let Some((prompt, own_reserve)) = self
            .seqs
            .get(&id)
            .map(|seq| (seq.tokens.len(), seq.reserve(self.config.decode_reserve)))
        else {
            return;
        };
        let uncached = prompt.saturating_sub(self.cached_len(id));
        while let Some(&victim) = self.running.last() {
            if self
                .seqs
                .get(&victim)
                .is_none_or(|seq| seq.priority >= priority)
            {
                return;
            }
            // What admission will ask for: its uncached prompt, its own
            // reserve and every running sequence's (as `try_admit`).
            if self.running.len() < self.config.max_batch
                && self.kv.room() >= uncached + own_reserve + self.running_reserve()
            {
                return;
            }
            tracing::debug!(
                victim,
                for_id = id,
                priority,
                "preempted for a higher priority"
            );
            self.preempt(victim);
            plan.preempted.push(victim);
        }
    }

    /// Gives every decoding sequence its next slot, preempting the newest
    /// sequences while the pool is dry, and a draft to check where it
    /// speculates.
    fn plan_decodes(&mut self, plan: &mut StepPlan) {
        let speculate = self.speculates_now();
        let mut index = 0;
        while index < self.running.len() {
            let id = self.running[index];
            let Some(seq) = self.seqs.get(&id) else {
                self.running.remove(index);
                continue;
            };
            if !seq.prefilled {
                index += 1;
                continue;
            }
            if seq.slots.len() <= seq.kv_len {
                if let Some(slots) = self.kv.alloc(1) {
                    if let Some(seq) = self.seqs.get_mut(&id) {
                        seq.slots.extend(slots);
                    }
                } else {
                    let newest = self.running.len() - 1;
                    if newest == 0 {
                        // Alone and the pool is full: it cannot grow.
                        let _ = self.finish(id);
                        plan.exhausted.push(id);
                    } else {
                        let victim = self.running[newest];
                        self.preempt(victim);
                        plan.preempted.push(victim);
                    }
                    continue;
                }
            }
            if let Some(seq) = self.seqs.get(&id) {
                plan.items.push(chunk_item(seq, 1));
            }
            index += 1;
        }
        // Drafts only once every decode has its slot: they take what is
        // left free, so they never cost another sequence its next token.
        if speculate {
            for item in &mut plan.items {
                let draft = self.draft(item.id);
                item.len += draft;
                item.draft = draft;
            }
        }
    }

    /// The decoding sequences that would speculate next step, with their
    /// tokens and how many tokens each may draft: what a draft model is
    /// asked for before [`Self::schedule`] (see [`Self::offer_draft`]).
    pub fn draft_wants(&self) -> Vec<(u64, &[u32], usize)> {
        if !self.speculates_now() {
            return Vec::new();
        }
        let free = self.kv.pool.available();
        self.running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|seq| seq.prefilled)
            .filter_map(|seq| {
                let room = seq.draft_room(free);
                (room > 0).then_some((seq.id, seq.tokens.as_slice(), room))
            })
            .collect()
    }

    /// Whether this step's decodes may draft: some sequence decodes, and
    /// no more than `speculate_max_decodes` do.
    fn speculates_now(&self) -> bool {
        let decoding = self
            .running
            .iter()
            .filter(|id| self.seqs.get(id).is_some_and(|seq| seq.prefilled))
            .count();
        decoding > 0 && decoding <= self.config.speculate_max_decodes
    }

    /// A draft for sequence `id`'s next decode step, proposed by a draft
    /// model; it replaces prompt lookup for that step if the sequence has
    /// not moved on by then.
    pub fn offer_draft(&mut self, id: u64, draft: Vec<u32>) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.offered = Some((seq.tokens.len(), draft)).filter(|(_, draft)| !draft.is_empty());
        }
    }

    /// Drafts the next tokens of decoding sequence `id` if it speculates,
    /// and gives it a slot for each from the free pool (a draft never
    /// evicts the cache or preempts anyone); returns the draft's length.
    fn draft(&mut self, id: u64) -> usize {
        let free = self.kv.pool.available();
        let Some(seq) = self.seqs.get_mut(&id) else {
            return 0;
        };
        let room = seq.draft_room(free);
        let offered = seq.offered.take();
        seq.fed.clear();
        let Some((spec, _)) = seq.speculation.filter(|_| room > 0) else {
            return 0;
        };
        // What the step feeds: the newest token, then the draft.
        seq.fed.extend_from_slice(&seq.tokens[seq.kv_len..]);
        match offered {
            Some((at, offered)) if at == seq.tokens.len() => {
                seq.fed.extend(offered.into_iter().take(room));
            }
            _ => speculate::lookup(&seq.tokens, spec.ngram, room, &mut seq.fed),
        }
        let len = seq.fed.len() - 1;
        if len > 0
            && let Ok(slots) = self.kv.pool.alloc(len)
        {
            seq.slots.extend(slots);
            return len;
        }
        seq.fed.clear();
        0
    }

    /// Admits waiting sequences in priority order while they fit.
    fn admit(&mut self, plan: &mut StepPlan, mut budget: usize) {
        let candidates: Vec<WaitKey> = self.waiting.iter().copied().collect();
        for key in candidates {
            if budget == 0 || self.running.len() >= self.config.max_batch {
                break;
            }
            match self.admit_waiting(key, plan) {
                Admit::Admitted(_) => self.push_chunk(key.2, plan, &mut budget),
                Admit::NoRoom => break,
                Admit::Held | Admit::Never => continue,
            }
        }
    }

    /// Tries to admit the waiting request `wait` and records the outcome
    /// in `plan`: an admission, or a request that can never fit (finished,
    /// reported as exhausted).
    fn admit_waiting(&mut self, wait: WaitKey, plan: &mut StepPlan) -> Admit {
        let id = wait.2;
        let outcome = self.try_admit(id);
        match outcome {
            Admit::Admitted(admission) => {
                self.waiting.remove(&wait);
                self.insert_running(id);
                plan.admitted.push(admission);
            }
            Admit::Never => {
                let _ = self.finish(id);
                plan.exhausted.push(id);
            }
            Admit::Held | Admit::NoRoom => {}
        }
        outcome
    }

    /// Plans the next chunk of `id`'s prompt, as much of it as `budget` allows.
    fn push_chunk(&self, id: u64, plan: &mut StepPlan, budget: &mut usize) {
        if let Some(seq) = self.seqs.get(&id) {
            let len = (seq.tokens.len() - seq.kv_len).min(*budget);
            plan.items.push(chunk_item(seq, len));
            *budget -= len;
        }
    }

    /// For each of `ids`, how many of the others (same namespace) share at
    /// least half its prompt and `shared_prefix_hold` tokens: the requests
    /// one prefill of that prefix serves. Sorted prompts put sharers next to
    /// each other, so each count walks only its neighbours.
    fn sharers(&self, ids: &[u64]) -> Vec<usize> {
        let seq = |index: usize| {
            self.seqs.get(&ids[index]).map_or(("", &[][..]), |seq| {
                (seq.namespace.as_str(), seq.tokens.as_slice())
            })
        };
        let mut sorted: Vec<usize> = (0..ids.len()).collect();
        sorted.sort_by(|&a, &b| seq(a).cmp(&seq(b)));
        let lcp: Vec<usize> = sorted
            .windows(2)
            .map(|pair| {
                let ((ns_a, a), (ns_b, b)) = (seq(pair[0]), seq(pair[1]));
                if ns_a == ns_b { common_prefix(a, b) } else { 0 }
            })
            .collect();
        let mut counts = vec![0; ids.len()];
        for (pos, &index) in sorted.iter().enumerate() {
            let need = (seq(index).1.len() / 2).max(self.config.shared_prefix_hold.max(1));
            let reach = |lcps: &mut dyn Iterator<Item = &usize>| {
                lcps.scan(usize::MAX, |run, &lcp| {
                    *run = (*run).min(lcp);
                    (*run >= need).then_some(())
                })
                .count()
            };
            counts[index] = reach(&mut lcp[..pos].iter().rev()) + reach(&mut lcp[pos..].iter());
        }
        counts
    }

    /// Where `seq`, with `remaining` prompt tokens to compute, stands in the
    /// shortest-first order.
    fn prefill_key(&self, seq: &Seq, remaining: usize) -> PrefillKey {
        let waited = usize::try_from(self.steps - seq.arrived_step).unwrap_or(usize::MAX);
        let aged = remaining.saturating_sub(waited.saturating_mul(self.config.prefill_aging));
        (Reverse(seq.priority), aged, seq.order, seq.id)
    }

    /// Prompt tokens of a waiting sequence the cache would serve now (as
    /// [`Self::try_admit`] counts them).
    fn cached_len(&mut self, id: u64) -> usize {
        let Some(seq) = self.seqs.get(&id) else {
            return 0;
        };
        let matched = self.kv.cache.match_prefix(&seq.namespace, &seq.tokens);
        matched
            .len
            .min(matched.slots.len())
            .min(seq.tokens.len() - 1)
    }

    /// Matches the cached prefix, checks room, locks and allocates.
    fn try_admit(&mut self, id: u64) -> Admit {
        let running_reserve = self.running_reserve();
        let Some(seq) = self.seqs.get(&id) else {
            return Admit::NoRoom;
        };
        let matched = self.kv.cache.match_prefix(&seq.namespace, &seq.tokens);
        // The newest token is always fed, so it never counts as cached; a
        // sequence that needs its prompt's rows computes all of them.
        let usable = if seq.prompt_rows_out {
            matched
                .len
                .min(matched.slots.len())
                .min(seq.tokens.len() - 1)
        } else {
            0
        };
        if self.should_hold(seq, usable) {
            return Admit::Held;
        }
        let uncached = seq.tokens.len() - usable;
        // Alone, a sequence may use the whole pool; next to others it
        // leaves room for everyone's next few tokens.
        let alone = self.running.is_empty();
        let reserve = if alone {
            0
        } else {
            seq.reserve(self.config.decode_reserve) + running_reserve
        };
        self.kv.cache.lock(matched.node);
        if self.kv.room() < uncached + self.state_slots + reserve {
            self.kv.unlock(matched.node);
            // Alone with the pool to itself and still no room: only a
            // resumed sequence as long as the pool can get here.
            return if alone { Admit::Never } else { Admit::NoRoom };
        }
        let Some(mut fresh) = self.kv.alloc(uncached + self.state_slots) else {
            self.kv.unlock(matched.node);
            return Admit::NoRoom;
        };
        let state = fresh.split_off(uncached);
        let Some(seq) = self.seqs.get_mut(&id) else {
            self.kv.free(&fresh);
            self.kv.free(&state);
            self.kv.unlock(matched.node);
            return Admit::NoRoom;
        };
        let resumed = seq.admitted_before;
        if !resumed {
            self.cache_query_tokens += seq.tokens.len() as u64;
            self.cache_hit_tokens += usable as u64;
        }
        seq.admitted_before = true;
        seq.state = state;
        seq.slots.clear();
        seq.slots.extend_from_slice(&matched.slots[..usable]);
        seq.slots.extend(fresh);
        seq.kv_len = usable;
        seq.cache_len = usable;
        seq.node = Some(matched.node);
        seq.prefilled = false;
        Admit::Admitted(Admission {
            id,
            cached_tokens: usable,
            resumed,
        })
    }

    /// Slots the running sequences are expected to need soon, together.
    fn running_reserve(&self) -> usize {
        self.running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .map(|seq| seq.reserve(self.config.decode_reserve))
            .sum()
    }

    /// Whether `seq` should wait for a running prefill of the same prefix.
    fn should_hold(&self, seq: &Seq, cached: usize) -> bool {
        let hold = self.config.shared_prefix_hold;
        hold > 0
            && self
                .running
                .iter()
                .filter_map(|id| self.seqs.get(id))
                .filter(|other| !other.prefilled && other.namespace == seq.namespace)
                .any(|other| common_prefix(&other.tokens, &seq.tokens) >= cached + hold)
    }

    /// Sends a running sequence back to wait; its computed tokens go into
    /// the cache (unlocked), so they are evicted only if needed.
    fn preempt(&mut self, id: u64) {
        self.running.retain(|&running| running != id);
        if let Some(seq) = self.seqs.get_mut(&id) {
            self.kv.release(seq, true);
            self.waiting.insert(seq.key());
            self.preemptions += 1;
            tracing::debug!(id, tokens = seq.tokens.len(), "preempted");
        }
    }

    fn insert_running(&mut self, id: u64) {
        let Some(key) = self.seqs.get(&id).map(Seq::key) else {
            return;
        };
        let at = self
            .running
            .partition_point(|other| self.seqs.get(other).is_some_and(|s| s.key() < key));
        self.running.insert(at, id);
    }

    fn remove(&mut self, id: u64) -> Result<Seq, SchedulerError> {
        let seq = self.seqs.remove(&id).ok_or(SchedulerError::Unknown(id))?;
        self.waiting.remove(&seq.key());
        self.running.retain(|&running| running != id);
        Ok(seq)
    }

    /// The tokens and slots of a planned chunk.
    pub fn chunk(&self, item: &PlanItem) -> Option<SeqChunk<'_>> {
        let seq = self.seqs.get(&item.id)?;
        let end = item.start + item.len;
        let output = if item.draft > 0 {
            ChunkOutput::AllLogits
        } else if seq.prompt_rows_out {
            ChunkOutput::LastLogits
        } else {
            seq.prompt_output
        };
        let tokens = if item.draft > 0 {
            (seq.fed.len() == item.len).then_some(seq.fed.as_slice())?
        } else {
            seq.tokens.get(item.start..end)?
        };
        Some(SeqChunk {
            tokens,
            slots: seq.slots.get(..end)?,
            start_pos: item.start,
            output,
        })
    }

    /// Lays out the chunks of `plan` in `batch`, in batch order, replacing
    /// what it held and reusing its buffers: the step as the model takes
    /// it. None if an item names no running sequence (a bug).
    pub fn fill_batch(&self, plan: &StepPlan, batch: &mut StepBatch) -> Option<()> {
        batch.clear();
        for item in &plan.items {
            batch.push(&self.chunk(item)?);
        }
        Some(())
    }

    /// Records a computed step: K/V of every item is written, and each
    /// sampling item got the tokens `sampled[i]`: one, or for an item with
    /// a draft the accepted draft tokens then one more (the engine drew
    /// them in order and stopped at the first that differed from the
    /// draft). Empty when the engine drew nothing: that chunk is planned
    /// again. Rejected draft positions give their slots back; their K/V
    /// is never read. A prompt whose prefill just completed goes into the
    /// cache.
    pub fn complete(&mut self, plan: &StepPlan, sampled: &[Vec<u32>]) {
        for (index, item) in plan.items.iter().enumerate() {
            let Some(seq) = self.seqs.get_mut(&item.id) else {
                continue;
            };
            let tokens = sampled.get(index).map_or(&[][..], Vec::as_slice);
            if item.draft > 0 {
                Self::complete_draft(&mut self.kv, seq, item, tokens);
                continue;
            }
            // A sampling chunk without a token is recomputed next step.
            if seq.kv_len != item.start || seq.node.is_none() || (item.sample && tokens.is_empty())
            {
                continue;
            }
            seq.kv_len = item.start + item.len;
            if item.sample && !seq.prefilled {
                seq.prefilled = true;
                seq.prompt_rows_out = true;
                self.kv.cache_prefix(seq);
            }
            seq.tokens.extend(tokens.first());
        }
    }

    /// Completes a decode with a draft: the newest token and the accepted
    /// draft tokens have K/V now, the rest of the draft's slots are freed,
    /// and the sequence's draft length follows how this one fared.
    fn complete_draft(kv: &mut Kv, seq: &mut Seq, item: &PlanItem, tokens: &[u32]) {
        let fed = std::mem::take(&mut seq.fed);
        if seq.kv_len != item.start || seq.node.is_none() {
            return;
        }
        // Accepted: the drawn tokens before the last, each equal to the
        // draft token at its place (the engine's contract; checked, so a
        // slip cannot put a wrong token's K/V in the cache).
        let accepted = tokens.len().saturating_sub(1);
        let agrees = fed.get(1..1 + accepted) == tokens.get(..accepted);
        let computed = if tokens.is_empty() || !agrees {
            item.start
        } else {
            item.start + 1 + accepted
        };
        let keep = (computed + 1).min(seq.slots.len());
        let rejected = seq.slots.split_off(keep);
        kv.free(&rejected);
        if tokens.is_empty() || !agrees {
            if !agrees {
                tracing::error!(id = seq.id, "drawn tokens disagree with the draft");
            }
            return;
        }
        seq.kv_len = computed;
        seq.tokens.extend_from_slice(tokens);
        if let Some((_, length)) = seq.speculation.as_mut() {
            length.record(item.draft, accepted);
        }
    }

    /// The tokens of a sequence so far (prompt, then output).
    pub fn tokens(&self, id: u64) -> Option<&[u32]> {
        self.seqs.get(&id).map(|seq| seq.tokens.as_slice())
    }

    /// Drops unlocked cache entries of one namespace, or all; returns the
    /// number of slots freed.
    pub fn flush_cache(&mut self, namespace: Option<&str>) -> usize {
        let freed = match namespace {
            Some(namespace) => self.kv.cache.clear(namespace),
            None => self.kv.cache.clear_all(),
        };
        self.kv.free(&freed);
        freed.len()
    }

    /// Current counts.
    pub fn stats(&self) -> SchedulerStats {
        let kv_held = self
            .running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .map(|seq| seq.slots.len().saturating_sub(seq.cache_len) + seq.state.len())
            .sum();
        SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_capacity: self.kv_capacity(),
            kv_free: self.kv.pool.available(),
            kv_held,
            kv_cached: self.kv.cache.total_tokens(),
            kv_evictable: self.kv.cache.evictable_tokens(),
            cache_hit_tokens: self.cache_hit_tokens,
            cache_query_tokens: self.cache_query_tokens,
            preemptions: self.preemptions,
        }
    }
}

enum Admit {
    Admitted(Admission),
    /// Waits for a shared prefix being prefilled; others may go first.
    Held,
    /// Does not fit now; nothing behind it goes first.
    NoRoom,
    /// Can never fit (it fills the pool by itself): ends as exhausted.
    Never,
}

/// Waiting requests, in waiting order, that compete for the prefill budget
/// of a step (later ones wait their turn), so ranking a long queue costs no
/// more than this many cache lookups and prompt comparisons a step.
const PEEKED_WAITING: usize = 64;

/// Default [`SchedulerConfig::prefill_aging`].
const AGING: usize = 8;

/// Default [`SchedulerConfig::decode_prefill_budget`].
const DECODE_PREFILL: usize = 256;

/// Default [`SchedulerConfig::speculate_max_decodes`].
const SPECULATE_MAX_DECODES: usize = 4;

fn chunk_item(seq: &Seq, len: usize) -> PlanItem {
    PlanItem {
        id: seq.id,
        start: seq.kv_len,
        len,
        sample: seq.kv_len + len >= seq.tokens.len(),
        prefill: !seq.prefilled,
        draft: 0,
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
