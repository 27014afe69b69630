//! The engine thread's loop: commands in, one scheduled step and forward
//! pass at a time, events out.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, SendTimeoutError, Sender};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use toktrie::SimpleVob;
use zinfer_cache::{RadixCache, TokenPool};
use zinfer_model::{ChunkOutput, Classifier, ForwardModel, StepBatch};
use zinfer_protocol::{
    ChunkBody, DoneBody, ErrorCode, FinishReason, GenerateRequest, Pooling, PromptLogprob,
    Speculative, Timings, TokenLogprob, ToolCall, TopLogprob, Usage,
};

use super::choices::{Choices, Pending, choice_seed};
use super::draft::{DraftModel, DraftWant};
use super::handle::{Command, Shared, Submission};
use super::reply::{Delta, ReplyText};
use super::transfer::{self, EXPORT_TOKENS_PER_STEP, Export, Progress, SPAN_TOKENS};
use super::valid::OutputPlan;
use super::{
    Clock, EngineConfig, EngineEvent, EngineStats, INTERNAL_MESSAGE, InternalError, TextCodec,
};
use crate::constraint::{CompiledConstraint, ConstraintError, MaskThread, apply_mask};
use crate::sampling::{Logprobs, Sampler, SamplingParams, StopTokens, model_logprobs};
use crate::scheduler::{NewSequence, PlanItem, Scheduler, Speculation, StepPlan};
use crate::speculate::{self, Drawn};
use zinfer_text::detokenize::Detokenizer;

/// How long an engine with work it cannot schedule waits before retrying;
/// only reached if admission is stuck, which is a bug.
/// Why a request asking for speculation on a recurrent model is refused.
const RECURRENT_SPECULATION: &str = "speculative decoding is not supported for this model: \
its Gated DeltaNet layers keep a recurrent state that rejected draft tokens cannot be rolled back from; \
send the request without `speculative`";

const STUCK_WAIT: Duration = Duration::from_millis(20);

/// How often a send blocked on a full event channel checks the stop flag.
const SEND_POLL: Duration = Duration::from_millis(50);

/// A streamed request with log probabilities gets a chunk at least every
/// this many tokens, even when its text is held back, so no chunk grows
/// past a few tens of KiB (16 tokens x 21 entries).
const LOGPROB_CHUNK_TOKENS: usize = 16;

/// Engine-side state of one request.
struct Request {
    rid: u64,
    /// Which of the request's choices this sequence is (0 unless `n` > 1).
    choice: u32,
    /// The client's request id, for the log.
    id: String,
    stream: bool,
    prompt_tokens: usize,
    sampler: Sampler,
    stop: StopTokens,
    detok: Detokenizer,
    /// Splits the text into content, reasoning and tool calls.
    reply: ReplyText,
    /// Full output text (for non-streamed requests).
    text: String,
    /// Full reasoning (for non-streamed requests).
    reasoning: String,
    /// Every tool call (for non-streamed requests).
    tool_calls: Vec<ToolCall>,
    /// Tokens not yet sent in a chunk.
    unsent: Vec<u32>,
    /// Whether the request asked for log probabilities.
    logprobs: bool,
    /// Log-probability entries of `unsent` (streamed) or of the whole
    /// output (not streamed).
    logprob_entries: Vec<TokenLogprob>,
    generated: usize,
    chunks: u32,
    cached_tokens: usize,
    arrival: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// The prompt tokens' log probabilities so far, position by position,
    /// with the alternatives asked for, when the request wants them.
    prompt_logprobs: Option<(usize, Vec<PromptLogprob>)>,
    /// With `logprobs`, the entry of the stop token that ended the output.
    stop_logprob: Option<TokenLogprob>,
    /// `max_tokens` 0 with `prompt_logprobs` or `embed`: the prompt is
    /// computed for its rows, and nothing is generated.
    score_only: bool,
    /// An embedding: how to pool, and the pooled prompt rows so far.
    embed: Option<Embedding>,
    /// Whether the request has a constraint: its `matcher` is then always
    /// here, except while the mask thread holds it during a step.
    constrained: bool,
    /// The constraint's state after the tokens generated so far.
    matcher: Option<Box<llguidance::Matcher>>,
}

/// An embedding being pooled from its prompt's hidden rows.
#[derive(Debug)]
struct Embedding {
    pooling: Pooling,
    /// The sum of the rows so far (mean), or the last row (last).
    sum: Vec<f32>,
    /// Rows taken, from position 0.
    rows: usize,
}

impl Embedding {
    fn add(&mut self, row: &[f32], last: bool) {
        match self.pooling {
            Pooling::Mean => {
                if self.sum.is_empty() {
                    self.sum = vec![0.0; row.len()];
                }
                for (total, value) in self.sum.iter_mut().zip(row) {
                    *total += value;
                }
            }
            Pooling::Last | Pooling::Rank if last => self.sum = row.to_vec(),
            Pooling::Last | Pooling::Rank => {}
        }
        self.rows += 1;
    }

    /// The pooled, L2-normalised vector once every prompt row is in (the
    /// mean's division cancels in the normalisation); for `rank`, the
    /// head's outputs on the last row.
    fn vector(self, prompt_len: usize, head: Option<&Classifier>) -> Option<Vec<f32>> {
        if self.rows != prompt_len || self.sum.is_empty() {
            return None;
        }
        if self.pooling == Pooling::Rank {
            return head.and_then(|h| h.scores(&self.sum).ok());
        }
        let mut vector = self.sum;
        let norm = vector
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            for x in &mut vector {
                *x = (f64::from(*x) / norm) as f32;
            }
        }
        Some(vector)
    }
}

/// One choice about to start.
struct Choice {
    /// Its sequence id.
    id: u64,
    rid: u64,
    index: u32,
    seed: u64,
    constraint: Option<CompiledConstraint>,
    output: OutputPlan,
}

/// The engine thread's state.
pub(super) struct EngineLoop {
    model: Box<dyn ForwardModel + Send>,
    text: Arc<dyn TextCodec>,
    scheduler: Scheduler,
    requests: HashMap<u64, Request>,
    commands: Receiver<Command>,
    events: Sender<EngineEvent>,
    shared: Arc<Shared>,
    stats: EngineStats,
    /// Cache exports in progress, oldest first; one runs at a time.
    exports: VecDeque<Export>,
    shutting_down: bool,
    clock: Clock,
    /// Draws the sampling seed of each request that names none.
    seeds: StdRng,
    /// Computes constrained requests' token masks during forward passes;
    /// started with the first constrained request.
    mask_thread: Option<MaskThread>,
    /// The choices of requests with `n` > 1.
    choices: Choices,
    /// The step's batch as the model takes it; refilled every step, its
    /// buffers kept.
    batch: StepBatch,
    /// Speculation of requests that do not say.
    speculative: Speculative,
    /// The model keeps a recurrent state per sequence (hybrid models): no
    /// prefix cache, no speculation.
    recurrent: bool,
    /// The reranker head `rank` pooling applies, if the model has one.
    classifier: Option<Arc<Classifier>>,
    /// Drafts tokens for speculating sequences, when the worker has one.
    draft: Option<DraftModel>,
}

/// Splits a step's time between its phases: [`Lap::charge`] adds the time
/// since the previous charge to one phase, so every moment goes to exactly
/// one and the phases add up to the step.
struct Lap(Instant);

impl Lap {
    fn charge(&mut self, clock: &Clock, phase: &mut f64) {
        let now = clock.now();
        *phase += seconds_since(self.0, now);
        self.0 = now;
    }
}

impl EngineLoop {
    pub(super) fn new(
        model: Box<dyn ForwardModel + Send>,
        draft: Option<Box<dyn ForwardModel + Send>>,
        text: Arc<dyn TextCodec>,
        config: &EngineConfig,
        commands: Receiver<Command>,
        events: Sender<EngineEvent>,
        shared: Arc<Shared>,
    ) -> Self {
        let kv_capacity = model.kv_capacity();
        let mut scheduler = Scheduler::new(
            config.scheduler.clone(),
            TokenPool::new(kv_capacity),
            RadixCache::new(config.cache.clone()),
        );
        // A recurrent state cannot be resumed from cached K/V, nor rolled
        // back past rejected draft tokens: such a model computes every
        // prompt whole and never speculates.
        let recurrent = model.recurrent();
        let mut speculative = config.speculative;
        if recurrent {
            scheduler.disable_prefix_cache();
            scheduler.reserve_state_slots(model.state_slots());
            if speculative.is_on() {
                tracing::warn!(
                    "speculative decoding is off: this model keeps a recurrent state per sequence"
                );
                speculative = Speculative::OFF;
            }
        }
        EngineLoop {
            model,
            text,
            scheduler,
            requests: HashMap::new(),
            commands,
            events,
            shared,
            stats: EngineStats {
                kv_capacity,
                ..EngineStats::default()
            },
            exports: VecDeque::new(),
            shutting_down: false,
            clock: config.clock.clone(),
            seeds: StdRng::seed_from_u64(config.seed.unwrap_or_else(rand::random)),
            mask_thread: None,
            choices: Choices::default(),
            batch: StepBatch::new(),
            speculative,
            recurrent,
            classifier: config.classifier.clone(),
            draft: draft.map(DraftModel::new),
        }
    }

    pub(super) fn run(mut self) {
        tracing::info!(kv_capacity = self.stats.kv_capacity, "engine started");
        while !self.shutting_down && !self.shared.stopping() {
            if !self.wait_for_work() {
                break;
            }
            while let Ok(command) = self.commands.try_recv() {
                self.handle(command);
            }
            if self.shutting_down || self.shared.stopping() {
                break;
            }
            for rid in self.scheduler.expire(self.clock.now()) {
                self.finish(rid, FinishReason::Deadline);
            }
            let started = self.clock.now();
            self.step();
            self.release_states();
            self.stats.step_s += seconds_since(started, self.clock.now());
            self.export_step();
            self.publish();
        }
        self.fail_all(
            ErrorCode::Unavailable,
            "the engine shut down; retry the request",
        );
        self.publish();
        tracing::info!("engine stopped");
    }

    /// Blocks while there is nothing to do; false when every handle is gone.
    fn wait_for_work(&mut self) -> bool {
        if !self.scheduler.is_empty() || !self.exports.is_empty() {
            return true;
        }
        match self.commands.recv() {
            Ok(command) => {
                self.handle(command);
                true
            }
            Err(_) => false,
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(submission) => self.admit(*submission),
            Command::Cancel(rid) => {
                for id in self.choices.ids(rid) {
                    if self.requests.contains_key(&id) {
                        self.finish(id, FinishReason::Cancelled);
                    }
                }
            }
            Command::FlushCache(namespace) => {
                let freed = self.scheduler.flush_cache(namespace.as_deref());
                tracing::info!(?namespace, freed, "prefix cache flushed");
            }
            Command::ExportCache { max_tokens, sink } => {
                let spans = self
                    .scheduler
                    .cache()
                    .hottest_spans(max_tokens, SPAN_TOKENS);
                tracing::info!(spans = spans.len(), max_tokens, "cache export started");
                self.exports.push_back(Export::new(spans, sink));
            }
            Command::ImportCache(block) => {
                self.shared.release_import();
                transfer::import(
                    self.model.as_mut(),
                    &mut self.scheduler,
                    block,
                    &mut self.stats,
                );
            }
            Command::Shutdown => self.shutting_down = true,
        }
    }

    /// Advances the oldest cache export: a bounded copy while requests
    /// run, all of it when the engine is idle. Runs between steps, so the
    /// spans it copies cannot be evicted mid-copy.
    fn export_step(&mut self) {
        let idle = self.scheduler.is_empty();
        let budget = if idle {
            usize::MAX
        } else {
            EXPORT_TOKENS_PER_STEP
        };
        let Some(export) = self.exports.front_mut() else {
            return;
        };
        let progress = export.pump(
            self.model.as_ref(),
            &self.scheduler,
            budget,
            idle,
            &mut self.stats,
        );
        if progress == Progress::Finished {
            self.exports.pop_front();
        }
    }

    fn admit(&mut self, submission: Submission) {
        let Submission { rid, request } = submission;
        let (request, prompt, arrival, constraints, output) = request.into_parts();
        self.stats.requests_accepted += 1;
        let seed = request.seed.unwrap_or_else(|| self.seeds.random());
        let mut constraints = constraints.into_iter();
        let first = constraints.next();
        if request.n > 1 {
            let pending = Pending {
                request: request.clone(),
                prompt: prompt.clone(),
                arrival,
                output: output.clone(),
                constraints: constraints.collect(),
                seed,
            };
            self.choices.add(rid, request.n, pending);
        }
        let choice = Choice {
            id: rid,
            rid,
            index: 0,
            seed,
            constraint: first,
            output,
        };
        self.start_choice(choice, request, prompt, arrival);
    }

    /// Starts choices 1 to n-1 of `rid`, now that choice 0's prompt is in
    /// the prefix cache.
    fn start_other_choices(&mut self, rid: u64) {
        let Some(pending) = self.choices.take_pending(rid) else {
            return;
        };
        let Pending {
            request,
            prompt,
            arrival,
            output,
            constraints,
            seed,
        } = *pending;
        let mut constraints = constraints.into_iter();
        for index in 1..request.n {
            let requests = &self.requests;
            let id = self.choices.new_id(rid, |id| requests.contains_key(&id));
            let choice = Choice {
                id,
                rid,
                index,
                seed: choice_seed(seed, index),
                constraint: constraints.next(),
                output: output.clone(),
            };
            self.start_choice(choice, request.clone(), prompt.clone(), arrival);
        }
    }

    /// Starts one choice's sequence.
    fn start_choice(
        &mut self,
        choice: Choice,
        request: GenerateRequest,
        prompt: Vec<u32>,
        arrival: Instant,
    ) {
        let mut params = SamplingParams::from_request(&request, choice.seed);
        params.seed = choice.seed;
        let call_id_seed = self.seeds.random();
        let id = choice.id;
        // Only choice 0 computes the prompt; the others find it cached.
        let prompt_logprobs = match request.prompt_logprobs {
            Some(top) if choice.index == 0 => {
                let first = self.text.token_piece(prompt[0]).map(|piece| PromptLogprob {
                    token: prompt[0],
                    text: String::from_utf8_lossy(&piece).into_owned(),
                    logprob: None,
                    top_logprobs: Vec::new(),
                });
                Some((top as usize, first.into_iter().collect()))
            }
            _ => None,
        };
        let embed = request.embed.map(|pooling| Embedding {
            pooling,
            sum: Vec::new(),
            rows: 0,
        });
        // Prompt rows asked for and nothing to generate: the prompt is
        // computed for them alone.
        let score_only = request.max_tokens == 0 && (prompt_logprobs.is_some() || embed.is_some());
        let prompt_output = if embed.is_some() {
            ChunkOutput::AllHidden
        } else if prompt_logprobs.is_some() {
            ChunkOutput::AllLogits
        } else {
            ChunkOutput::LastLogits
        };
        let request_state = Request {
            rid: choice.rid,
            choice: choice.index,
            id: request.id.clone(),
            stream: request.stream,
            prompt_tokens: prompt.len(),
            sampler: Sampler::new(params, &prompt),
            stop: StopTokens::new(
                if request.ignore_eos {
                    &[]
                } else {
                    self.text.eos_token_ids()
                },
                &request.stop_token_ids,
                request.max_tokens as usize,
            ),
            detok: Detokenizer::new(&request.stop),
            reply: ReplyText::new(choice.output, call_id_seed),
            text: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            unsent: Vec::new(),
            logprobs: request.logprobs,
            logprob_entries: Vec::new(),
            generated: 0,
            chunks: 0,
            cached_tokens: 0,
            arrival,
            admitted: None,
            first_token: None,
            last_token: None,
            prompt_logprobs,
            stop_logprob: None,
            score_only,
            embed,
            constrained: choice.constraint.is_some(),
            matcher: choice.constraint.map(|compiled| Box::new(compiled.0)),
        };
        let constrained = request_state.constrained;
        self.requests.insert(id, request_state);
        if request.max_tokens == 0 && !score_only {
            self.finish(id, FinishReason::Length);
            return;
        }
        let deadline = request
            .deadline_ms
            .map(|ms| arrival + Duration::from_millis(ms));
        // A constraint's mask at a drafted position would depend on the
        // draft: constrained requests decode one token at a time.
        if self.recurrent && request.speculative.is_some_and(|s| s.is_on()) {
            self.fail(id, ErrorCode::BadRequest, RECURRENT_SPECULATION);
            return;
        }
        let speculative = request.speculative.unwrap_or(self.speculative);
        let speculation = (speculative.is_on() && !constrained).then_some(Speculation {
            ngram: speculative.ngram as usize,
            max_draft: speculative.max_draft as usize,
        });
        let new = NewSequence {
            id,
            namespace: request.namespace.unwrap_or_default(),
            prompt,
            max_new_tokens: (request.max_tokens as usize).max(usize::from(score_only)),
            priority: request.priority,
            deadline,
            prompt_output,
            speculation,
        };
        // A valid request fits, and the handle refuses a rid in flight:
        // a refusal here is a bug.
        if let Err(error) = self.scheduler.submit(new) {
            self.fail_internal(id, &error.into());
        }
    }

    /// One scheduling step and forward pass, its time charged to the
    /// phases of [`EngineStats`].
    fn step(&mut self) {
        let mut lap = Lap(self.clock.now());
        self.propose_drafts();
        lap.charge(&self.clock, &mut self.stats.draft_s);
        let plan = self.scheduler.schedule();
        lap.charge(&self.clock, &mut self.stats.plan_s);
        let now = self.clock.now();
        for &rid in &plan.exhausted {
            self.finish(rid, FinishReason::Length);
        }
        for admission in &plan.admitted {
            if let Some(request) = self.requests.get_mut(&admission.id)
                && request.admitted.is_none()
            {
                request.admitted = Some(now);
                request.cached_tokens = admission.cached_tokens;
                self.stats
                    .queue_time
                    .record((now - request.arrival).as_secs_f64());
            }
        }
        if plan.is_idle() {
            if !self.scheduler.is_empty() {
                self.wait_a_little();
            }
            lap.charge(&self.clock, &mut self.stats.rest_s);
            return;
        }
        lap.charge(&self.clock, &mut self.stats.rest_s);
        // Masks are computed on the mask thread while the forward pass runs.
        self.start_masks(&plan);
        lap.charge(&self.clock, &mut self.stats.sample_s);
        let logits = self.forward(&plan, &mut lap);
        let mut masks = self.finish_masks(&plan);
        lap.charge(&self.clock, &mut self.stats.sample_s);
        let logits = match logits {
            Ok(logits) => logits,
            Err(error) => {
                for item in &plan.items {
                    self.fail_internal(item.id, &error);
                }
                lap.charge(&self.clock, &mut self.stats.rest_s);
                return;
            }
        };
        let mut sampled: Vec<Vec<Drawn>> = vec![Vec::new(); plan.items.len()];
        let mut embedded = Vec::new();
        for (index, (((item, mut row), slot), mask)) in plan
            .items
            .iter()
            .zip(logits)
            .zip(&mut sampled)
            .zip(&mut masks)
            .enumerate()
        {
            if item.prefill {
                self.stats.prefill_tokens += item.len as u64;
            }
            if item.draft > 0 {
                self.verify_draft(index, item, &mut row, slot, &mut lap);
                continue;
            }
            // What the chunk asked the model for, as the batch says.
            match self.batch.outputs().get(index).copied().unwrap_or_default() {
                ChunkOutput::LastLogits => {}
                ChunkOutput::AllLogits => {
                    row = match self.take_prompt_rows(item, row) {
                        Ok(last) => last,
                        Err(error) => {
                            self.fail_internal(item.id, &error);
                            continue;
                        }
                    };
                }
                // Hidden rows, no logits: pooled, and the embedding ends
                // once its prompt is in.
                ChunkOutput::AllHidden => {
                    if let Err(error) = self.pool_hidden_rows(item, &row) {
                        self.fail_internal(item.id, &error);
                    } else if item.sample {
                        embedded.push(item.id);
                    }
                    continue;
                }
            }
            let Some(request) = self.requests.get_mut(&item.id).filter(|_| item.sample) else {
                continue;
            };
            lap.charge(&self.clock, &mut self.stats.rest_s);
            // The mask comes first: penalty, temperature, the cuts and the
            // draw (or argmax) all see the masked row.
            match mask.take() {
                Some(Ok(mask)) => apply_mask(&mask, &mut row),
                Some(Err(error)) => {
                    self.fail_constraint(item.id, &error);
                    continue;
                }
                None if request.constrained => {
                    let error = ConstraintError::Matcher("the mask thread stopped".into());
                    self.fail_constraint(item.id, &error);
                    continue;
                }
                None => {}
            }
            let drawn = request.sampler.sample(&mut row);
            let logprobs = request.sampler.take_logprobs();
            lap.charge(&self.clock, &mut self.stats.sample_s);
            match drawn {
                Ok(token) => slot.push((token, logprobs)),
                Err(error) => self.fail_internal(item.id, &error.into()),
            }
        }
        lap.charge(&self.clock, &mut self.stats.rest_s);
        let tokens: Vec<Vec<u32>> = sampled
            .iter()
            .map(|drawn| drawn.iter().map(|&(token, _)| token).collect())
            .collect();
        self.scheduler.complete(&plan, &tokens);
        lap.charge(&self.clock, &mut self.stats.plan_s);
        for id in embedded {
            self.finish(id, FinishReason::Stop);
        }
        let now = self.clock.now();
        for (item, drawn) in plan.items.iter().zip(sampled) {
            for (token, logprobs) in drawn {
                // A token that ends the request drops the rest.
                if !self.requests.contains_key(&item.id) {
                    break;
                }
                self.on_token(item.id, token, logprobs, now);
            }
        }
        lap.charge(&self.clock, &mut self.stats.rest_s);
    }

    /// Has the draft model, if any, propose the next tokens of every
    /// sequence that will speculate this step. A failing draft model costs
    /// only the speed-up: the step goes on with prompt lookup.
    fn propose_drafts(&mut self) {
        let Some(draft) = self.draft.as_mut() else {
            return;
        };
        let wants: Vec<DraftWant<'_>> = self
            .scheduler
            .draft_wants()
            .into_iter()
            .map(|(id, tokens, max)| DraftWant { id, tokens, max })
            .collect();
        if wants.is_empty() {
            return;
        }
        let proposed = draft.propose(&wants);
        let ids: Vec<u64> = wants.iter().map(|want| want.id).collect();
        match proposed {
            Ok(drafts) => {
                for (id, tokens) in ids.into_iter().zip(drafts) {
                    self.scheduler.offer_draft(id, tokens);
                }
            }
            Err(error) => {
                tracing::warn!(%error, "the draft model failed; drafting by prompt lookup")
            }
        }
    }

    /// Verifies the draft of a decode chunk ([`speculate::verify`]): the
    /// rows are the logits after the newest token and after each draft
    /// token, the draft the chunk's tokens after the first.
    fn verify_draft(
        &mut self,
        index: usize,
        item: &PlanItem,
        rows: &mut [f32],
        drawn: &mut Vec<Drawn>,
        lap: &mut Lap,
    ) {
        let vocab = self.model.vocab_size();
        let Some((_, draft)) = self
            .batch
            .chunk(index)
            .and_then(|chunk| chunk.tokens.split_first())
        else {
            self.fail_internal(item.id, &InternalError::MissingChunk);
            return;
        };
        let Some(request) = self.requests.get_mut(&item.id) else {
            return;
        };
        let result = speculate::verify(
            &mut request.sampler,
            rows,
            vocab,
            draft,
            |token| request.stop.is_stop_token(token),
            drawn,
        );
        self.stats.draft_tokens += item.draft as u64;
        self.stats.accepted_draft_tokens += drawn.len().saturating_sub(1) as u64;
        lap.charge(&self.clock, &mut self.stats.sample_s);
        if let Err(error) = result {
            drawn.clear();
            self.fail_internal(item.id, &error.into());
        }
    }

    /// Adds the hidden rows of an embedding's prompt chunk to its pool,
    /// each position once, in order.
    fn pool_hidden_rows(&mut self, item: &PlanItem, rows: &[f32]) -> Result<(), InternalError> {
        let hidden = self.model.hidden_size();
        if hidden == 0 || rows.len() != item.len * hidden {
            return Err(InternalError::LogitRows {
                rows: rows.len() / hidden.max(1),
                chunks: item.len,
            });
        }
        let Some(request) = self.requests.get_mut(&item.id) else {
            return Ok(());
        };
        let prompt_len = request.prompt_tokens;
        let Some(embed) = request.embed.as_mut() else {
            return Ok(());
        };
        for (r, row) in rows.chunks_exact(hidden).enumerate() {
            let position = item.start + r;
            if position != embed.rows || position >= prompt_len {
                continue;
            }
            embed.add(row, position + 1 == prompt_len);
        }
        Ok(())
    }

    /// A prompt chunk that asked for every row's logits (prompt logprobs):
    /// the row after position `p` gives the distribution of the token at
    /// `p + 1`; those that are prompt tokens are recorded, each once.
    /// Returns the last row, to sample from.
    fn take_prompt_rows(
        &mut self,
        item: &PlanItem,
        rows: Vec<f32>,
    ) -> Result<Vec<f32>, InternalError> {
        let vocab = self.model.vocab_size();
        if item.len == 0 || rows.len() != item.len * vocab {
            return Err(InternalError::LogitRows {
                rows: rows.len() / vocab.max(1),
                chunks: item.len,
            });
        }
        let tokens = self.scheduler.tokens(item.id).unwrap_or_default();
        if let Some(request) = self.requests.get_mut(&item.id)
            && let Some((top, entries)) = request.prompt_logprobs.as_mut()
        {
            for (r, row) in rows.chunks_exact(vocab).enumerate() {
                let position = item.start + r + 1;
                // In order, each position once (a recomputed chunk adds
                // nothing), prompt tokens only.
                if position != entries.len() || position >= request.prompt_tokens {
                    continue;
                }
                let Some(&token) = tokens.get(position) else {
                    break;
                };
                let logprobs = model_logprobs(row, token, *top);
                let entry = entry(self.text.as_ref(), token, logprobs)?;
                entries.push(PromptLogprob {
                    token,
                    text: entry.text,
                    logprob: Some(entry.logprob),
                    top_logprobs: entry.top_logprobs,
                });
            }
        }
        Ok(rows[(item.len - 1) * vocab..].to_vec())
    }

    /// Hands the matcher of every constrained sequence that samples this
    /// step to the mask thread (started on first use).
    fn start_masks(&mut self, plan: &StepPlan) {
        for (slot, item) in plan.items.iter().enumerate() {
            let Some(request) = self.requests.get_mut(&item.id).filter(|_| item.sample) else {
                continue;
            };
            let Some(matcher) = request.matcher.take() else {
                continue;
            };
            if self.mask_thread.is_none() {
                self.mask_thread = MaskThread::start();
            }
            let Some(thread) = &self.mask_thread else {
                // No thread: `finish_masks` computes it here.
                request.matcher = Some(matcher);
                continue;
            };
            if let Err(matcher) = thread.submit(slot, matcher) {
                request.matcher = Some(matcher);
            }
        }
    }

    /// Each plan item's mask, for the constrained ones that sample: waits
    /// for the mask thread, gives the matchers back to their requests,
    /// and computes here any mask the thread could not take.
    fn finish_masks(&mut self, plan: &StepPlan) -> Vec<Option<Result<SimpleVob, ConstraintError>>> {
        let mut masks: Vec<Option<Result<SimpleVob, ConstraintError>>> =
            (0..plan.items.len()).map(|_| None).collect();
        let away: Vec<usize> = plan
            .items
            .iter()
            .enumerate()
            .filter(|(_, item)| {
                item.sample
                    && self
                        .requests
                        .get(&item.id)
                        .is_some_and(|r| r.constrained && r.matcher.is_none())
            })
            .map(|(slot, _)| slot)
            .collect();
        let started = self.clock.now();
        if let Some(thread) = &self.mask_thread {
            for _ in 0..away.len() {
                let Some(done) = thread.next() else {
                    break;
                };
                if let Some(request) = plan
                    .items
                    .get(done.slot)
                    .and_then(|item| self.requests.get_mut(&item.id))
                {
                    request.matcher = Some(done.matcher);
                }
                if let Some(mask) = masks.get_mut(done.slot) {
                    *mask = Some(done.mask);
                }
            }
            self.stats.mask_s = thread.busy_s();
        }
        self.stats.mask_wait_s += seconds_since(started, self.clock.now());
        for (item, mask) in plan.items.iter().zip(&mut masks) {
            if mask.is_none()
                && item.sample
                && let Some(matcher) = self
                    .requests
                    .get_mut(&item.id)
                    .and_then(|r| r.matcher.as_mut())
            {
                *mask = Some(
                    matcher
                        .compute_mask()
                        .map_err(|e| ConstraintError::Matcher(e.to_string())),
                );
            }
        }
        masks
    }

    /// Lets the model drop the recurrent states of the sequences the
    /// scheduler released (a no-op for other models).
    fn release_states(&mut self) {
        let released = self.scheduler.take_released();
        if !released.is_empty() {
            self.model.release_states(&released);
        }
    }

    /// Lays out the step's batch (planning) and runs the model on it
    /// (forward).
    fn forward(&mut self, plan: &StepPlan, lap: &mut Lap) -> Result<Vec<Vec<f32>>, InternalError> {
        self.release_states();
        self.scheduler
            .fill_batch(plan, &mut self.batch)
            .ok_or(InternalError::MissingChunk)?;
        lap.charge(&self.clock, &mut self.stats.plan_s);
        let logits = self.model.forward_batch(&self.batch);
        lap.charge(&self.clock, &mut self.stats.forward_s);
        let logits = logits?;
        self.stats.steps += 1;
        if logits.len() != self.batch.len() {
            return Err(InternalError::LogitRows {
                rows: logits.len(),
                chunks: self.batch.len(),
            });
        }
        Ok(logits)
    }

    /// Handles one generated token (with its log probabilities when the
    /// request asked for them): timing, stop checks, text, events.
    fn on_token(&mut self, id: u64, token: u32, logprobs: Option<Logprobs>, now: Instant) {
        let Some(request) = self.requests.get_mut(&id) else {
            return;
        };
        if request.score_only {
            // The prompt's rows are in; the token drawn is not wanted.
            self.finish(id, FinishReason::Length);
            return;
        }
        request.generated += 1;
        self.stats.generated_tokens += 1;
        match request.last_token {
            None => {
                request.first_token = Some(now);
                self.stats
                    .ttft
                    .record((now - request.arrival).as_secs_f64());
                if let Some(admitted) = request.admitted {
                    self.stats
                        .prefill_time
                        .record((now - admitted).as_secs_f64());
                }
            }
            Some(last) => self.stats.inter_token.record((now - last).as_secs_f64()),
        }
        request.last_token = Some(now);
        if request.choice == 0 && request.generated == 1 {
            // `id` is the request's rid too: choice 0 runs under it.
            self.start_other_choices(id);
        }
        let Some(request) = self.requests.get_mut(&id) else {
            return;
        };
        let mut reason = request.stop.check(token, request.generated);
        if let Some(matcher) = request.matcher.as_mut()
            && !request.stop.is_stop_token(token)
        {
            if let Err(error) = matcher.consume_token(token) {
                let error = ConstraintError::Matcher(error.to_string());
                self.fail_constraint(id, &error);
                return;
            }
            // Complete, and nothing may follow: only EOS is left.
            if matcher.is_stopped() {
                reason = Some(FinishReason::Stop);
            }
        }
        if !request.stop.is_stop_token(token) {
            request.unsent.push(token);
            if request.logprobs {
                match logprobs.map(|lp| entry(self.text.as_ref(), token, lp)) {
                    Some(Ok(entry)) => request.logprob_entries.push(entry),
                    Some(Err(error)) => {
                        self.fail_internal(id, &error);
                        return;
                    }
                    None => {
                        self.fail_internal(id, &InternalError::NoLogprobs);
                        return;
                    }
                }
            }
            match request.detok.push(self.text.as_ref(), token) {
                Ok(decoded) => {
                    if decoded.stopped {
                        reason = Some(FinishReason::Stop);
                    }
                    let delta = request.reply.push(token, decoded.text);
                    // The last token's text goes out too: `finish` only sends
                    // what the detokenizer still holds back.
                    let flush = request.logprobs && request.unsent.len() >= LOGPROB_CHUNK_TOKENS;
                    if request.stream {
                        if !delta.is_empty() || flush {
                            let event = chunk_event(request, delta);
                            self.send(event);
                        }
                    } else {
                        keep(request, delta);
                    }
                }
                Err(error) => {
                    self.fail_internal(id, &error.into());
                    return;
                }
            }
        } else if request.logprobs
            && let Some(logprobs) = logprobs
        {
            match entry(self.text.as_ref(), token, logprobs) {
                Ok(entry) => request.stop_logprob = Some(entry),
                Err(error) => {
                    self.fail_internal(id, &error);
                    return;
                }
            }
        }
        if let Some(reason) = reason {
            self.finish(id, reason);
        }
    }

    /// Ends sequence `id` with `done`, flushing its held-back text; frees
    /// its sequence if still scheduled. The request ends with its last
    /// choice.
    fn finish(&mut self, id: u64, reason: FinishReason) {
        if self.scheduler.contains(id) {
            let _ = self.scheduler.finish(id);
        }
        if let Some(draft) = self.draft.as_mut() {
            draft.forget(id);
        }
        let Some(mut request) = self.requests.remove(&id) else {
            return;
        };
        let rid = request.rid;
        let tail = match request.detok.finish(self.text.as_ref()) {
            Ok(delta) => delta.text,
            Err(error) => {
                tracing::warn!(rid, %error, "final detokenization failed");
                String::new()
            }
        };
        let cut = matches!(reason, FinishReason::Length | FinishReason::Deadline);
        let tail = request.reply.finish(tail, cut);
        if request.stream {
            if !tail.is_empty() || !request.unsent.is_empty() {
                let event = chunk_event(&mut request, tail);
                self.send(event);
            }
        } else {
            keep(&mut request, tail);
        }
        // OpenAI's reason for an output that ends in calls.
        let reason = if reason == FinishReason::Stop && request.reply.called_tools() {
            FinishReason::ToolCalls
        } else {
            reason
        };
        let usage = Usage {
            prompt_tokens: request.prompt_tokens as u32,
            cached_tokens: request.cached_tokens as u32,
            completion_tokens: request.generated as u32,
        };
        let timings = timings(&request, self.clock.now());
        self.stats.requests_done[reason_index(reason)] += 1;
        self.stats.prompt_tokens += request.prompt_tokens as u64;
        self.stats.cached_tokens += request.cached_tokens as u64;
        tracing::debug!(
            rid,
            choice = request.choice,
            ?reason,
            generated = request.generated,
            "choice done"
        );
        let logprobs = (request.logprobs && !request.stream).then_some(request.logprob_entries);
        let whole = !request.stream;
        self.send(EngineEvent::Done {
            rid,
            body: DoneBody {
                text: whole.then_some(request.text),
                logprobs,
                reasoning: (whole && !request.reasoning.is_empty()).then_some(request.reasoning),
                tool_calls: (whole && !request.tool_calls.is_empty()).then_some(request.tool_calls),
                choice: request.choice,
                prompt_logprobs: request.prompt_logprobs.map(|(_, entries)| entries),
                stop_logprob: request.stop_logprob,
                embedding: request.embed.and_then(|embed| {
                    embed.vector(request.prompt_tokens, self.classifier.as_deref())
                }),
                ..DoneBody::new(reason, usage, timings)
            },
        });
        let (unstarted, over) = self.choices.ended(rid, id);
        // Choice 0 ended before its prompt was computed: the choices that
        // never started end the same way, with nothing generated.
        if let Some(pending) = unstarted {
            let prompt_only = Usage {
                prompt_tokens: usage.prompt_tokens,
                ..Usage::default()
            };
            for choice in 1..pending.request.n {
                self.stats.requests_done[reason_index(reason)] += 1;
                self.send(EngineEvent::Done {
                    rid,
                    body: DoneBody {
                        text: whole.then(String::new),
                        logprobs: (pending.request.logprobs && whole).then(Vec::new),
                        choice,
                        ..DoneBody::new(reason, prompt_only, timings)
                    },
                });
            }
        }
        if over {
            self.shared.inflight().remove(&rid);
        }
    }

    /// Ends the request of sequence `id`, every choice of it, with
    /// `error`, freeing its sequences without caching them (the last step
    /// may not have written valid K/V).
    fn fail(&mut self, id: u64, code: ErrorCode, message: &str) {
        let Some(rid) = self.requests.get(&id).map(|request| request.rid) else {
            return;
        };
        for id in self.choices.remove(rid) {
            if self.scheduler.contains(id) {
                let _ = self.scheduler.abort(id);
            }
            if let Some(draft) = self.draft.as_mut() {
                draft.forget(id);
            }
            self.requests.remove(&id);
        }
        self.stats.requests_failed += 1;
        tracing::warn!(rid, %code, message, "request failed");
        self.shared.inflight().remove(&rid);
        self.send(EngineEvent::Error {
            rid,
            code,
            message: message.to_string(),
        });
    }

    /// Ends a request whose constraint failed while generating, with the
    /// matcher's reason (it is the constraint's, not a secret of ours).
    fn fail_constraint(&mut self, id: u64, error: &ConstraintError) {
        self.fail(id, ErrorCode::Internal, &error.to_string());
    }

    /// Ends a request on a fault of the worker: the detail goes to the
    /// log with the request's ids, the client gets a generic `internal`.
    fn fail_internal(&mut self, id: u64, error: &InternalError) {
        let request = self.requests.get(&id);
        let rid = request.map(|request| request.rid);
        let client_id = request.map(|request| request.id.as_str());
        tracing::error!(rid, id = client_id, %error, "request failed inside the worker");
        self.fail(id, ErrorCode::Internal, INTERNAL_MESSAGE);
    }

    fn fail_all(&mut self, code: ErrorCode, message: &str) {
        while let Ok(command) = self.commands.try_recv() {
            if let Command::Submit(submission) = command {
                self.shared.inflight().remove(&submission.rid);
                self.send(EngineEvent::Error {
                    rid: submission.rid,
                    code,
                    message: message.to_string(),
                });
            }
        }
        let ids: Vec<u64> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail(id, code, message);
        }
    }

    /// Sends an event; a full channel pauses the engine until the socket
    /// loop catches up, except once the handle asked it to stop (nobody
    /// may be reading then).
    fn send(&self, mut event: EngineEvent) {
        loop {
            if self.shutting_down || self.shared.stopping() {
                if self.events.try_send(event).is_err() {
                    tracing::debug!("engine event dropped while stopping");
                }
                return;
            }
            match self.events.send_timeout(event, SEND_POLL) {
                Ok(()) => return,
                Err(SendTimeoutError::Timeout(back)) => event = back,
                Err(SendTimeoutError::Disconnected(_)) => {
                    tracing::debug!("engine event dropped: no reader");
                    return;
                }
            }
        }
    }

    fn wait_a_little(&mut self) {
        match self.commands.recv_timeout(STUCK_WAIT) {
            Ok(command) => self.handle(command),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => self.shutting_down = true,
        }
    }

    fn publish(&mut self) {
        let sched = self.scheduler.stats();
        self.stats.running = sched.running;
        self.stats.waiting = sched.waiting;
        self.stats.kv_capacity = sched.kv_capacity;
        self.stats.kv_free = sched.kv_free;
        self.stats.kv_used = sched.kv_capacity - sched.kv_free;
        self.stats.kv_cached = sched.kv_cached;
        self.stats.cache_hit_tokens = sched.cache_hit_tokens;
        self.stats.cache_query_tokens = sched.cache_query_tokens;
        self.stats.preemptions = sched.preemptions;
        *self.shared.stats() = self.stats;
    }
}

fn chunk_event(request: &mut Request, delta: Delta) -> EngineEvent {
    let index = request.chunks;
    request.chunks += 1;
    EngineEvent::Chunk {
        rid: request.rid,
        body: ChunkBody {
            index,
            text: delta.content,
            tokens: std::mem::take(&mut request.unsent),
            logprobs: request
                .logprobs
                .then(|| std::mem::take(&mut request.logprob_entries)),
            reasoning: delta.reasoning,
            tool_calls: delta.tool_calls,
            choice: request.choice,
        },
    }
}

/// Adds output to a non-streamed request's whole reply.
fn keep(request: &mut Request, delta: Delta) {
    request.text.push_str(&delta.content);
    request.reasoning.push_str(&delta.reasoning);
    request.tool_calls.extend(delta.tool_calls);
}

/// The protocol entry for a generated token, with each token's text
/// decoded alone.
fn entry(
    text: &dyn TextCodec,
    token: u32,
    logprobs: Logprobs,
) -> Result<TokenLogprob, InternalError> {
    let decode = |id: u32| {
        text.decode(&[id])
            .map_err(|source| InternalError::LogprobText { token: id, source })
    };
    let top_logprobs = logprobs
        .top
        .into_iter()
        .map(|(id, logprob)| {
            Ok(TopLogprob {
                token: id,
                text: decode(id)?,
                logprob,
            })
        })
        .collect::<Result<Vec<_>, InternalError>>()?;
    Ok(TokenLogprob {
        token,
        text: decode(token)?,
        logprob: logprobs.chosen,
        top_logprobs,
    })
}

fn timings(request: &Request, now: Instant) -> Timings {
    let secs = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64();
    let admitted = request.admitted.unwrap_or(now);
    Timings {
        queue_s: secs(request.arrival, admitted),
        prefill_s: request.first_token.map_or(0.0, |t| secs(admitted, t)),
        ttft_s: request
            .first_token
            .map_or(0.0, |t| secs(request.arrival, t)),
        decode_s: match (request.first_token, request.last_token) {
            (Some(first), Some(last)) => secs(first, last),
            _ => 0.0,
        },
    }
}

fn seconds_since(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

fn reason_index(reason: FinishReason) -> usize {
    match reason {
        FinishReason::Stop => 0,
        FinishReason::Length => 1,
        FinishReason::Cancelled => 2,
        FinishReason::Deadline => 3,
        FinishReason::ToolCalls => 4,
    }
}
