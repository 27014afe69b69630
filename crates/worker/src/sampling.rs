//! Token sampling: turns one step's logits into the next token id.
//!
//! A constrained request's row arrives already masked (forbidden tokens at
//! -inf, see `crate::constraint`), so everything below, logprobs included,
//! sees only the tokens its constraint allows.
//!
//! The row is changed in this order: `logit_bias` added, the repetition
//! penalty, then OpenAI's presence and frequency penalties (over generated
//! tokens). Then greedy takes the argmax when the temperature is 0;
//! otherwise temperature, top-k, min-p, top-p, then one draw from a
//! per-request RNG seeded from the request's seed, so the same seed,
//! parameters and prompt give the same tokens. Top-k and top-p use partial
//! selection, so a 49k vocabulary is never fully sorted.
//!
//! For a request that asks for log probabilities, the sampler also
//! computes the log-softmax of the row it drew from (after the bias, the
//! penalties and the temperature) for the chosen token and the
//! `top_logprobs` best; a request that does not ask pays nothing for it.

use rand::{Rng, SeedableRng, rngs::StdRng};
use zinfer_protocol::{FinishReason, GenerateRequest};

/// Top-p starts by ordering this many candidates and widens only when
/// their mass falls short.
const TOP_P_FIRST_WINDOW: usize = 64;

/// Why no token could be drawn; a bug in the model, never the request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// The model returned an empty logits row.
    #[error("the model returned no logits; check its vocab_size")]
    EmptyLogits,
    /// Every logit was NaN or -inf.
    #[error("every logit is NaN or -inf; the forward pass is broken")]
    NoFiniteLogit,
    /// A drafted chunk's logits are not one row per fed token.
    #[error(
        "{values} logits for {rows} rows of {vocab}; the forward pass returned the wrong shape"
    )]
    Rows {
        /// Logits returned.
        values: usize,
        /// Rows expected: the newest token and each draft token.
        rows: usize,
        /// Logits per row.
        vocab: usize,
    },
}

/// The sampling part of a request, in engine units.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 is off.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches this mass; 1 is off.
    pub top_p: f32,
    /// Drop tokens below `min_p` times the top probability; 0 is off.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens already
    /// seen in the prompt or output; 1 is off.
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty: subtracted once from every generated
    /// token's logit; 0 is off.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted once per generation of a
    /// token; 0 is off.
    pub frequency_penalty: f32,
    /// Added to these tokens' logits, by id (ids within the vocabulary).
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the request's RNG.
    pub seed: u64,
    /// Report log probabilities: `Some(k)` with the k most likely tokens
    /// (k may be 0); `None` is off.
    pub logprobs: Option<usize>,
}

impl SamplingParams {
    /// Takes the request's parameters; `fallback_seed` is used when the
    /// request names no seed.
    pub fn from_request(request: &GenerateRequest, fallback_seed: u64) -> Self {
        SamplingParams {
            temperature: request.temperature,
            top_k: request.top_k as usize,
            top_p: request.top_p,
            min_p: request.min_p,
            repetition_penalty: request.repetition_penalty,
            presence_penalty: request.presence_penalty,
            frequency_penalty: request.frequency_penalty,
            logit_bias: request.logit_bias_ids(),
            seed: request.seed.unwrap_or(fallback_seed),
            logprobs: request.logprobs.then_some(request.top_logprobs as usize),
        }
    }

    /// Greedy decoding with no penalty: the deterministic reference.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
            logprobs: None,
        }
    }
}

/// Log probabilities of one sampled position, ids only (the engine adds
/// the texts).
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// The chosen token's log probability.
    pub chosen: f32,
    /// The most likely tokens and their log probabilities, most likely
    /// first, ties by lower id.
    pub top: Vec<(u32, f32)>,
}

/// Samples the tokens of one request; owns its RNG and the set of tokens
/// seen so far (for the repetition penalty).
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    seen: SeenTokens,
    /// How often each generated token came out, for the presence and
    /// frequency penalties (empty when both are off).
    generated: std::collections::HashMap<u32, u32>,
    candidates: Vec<(u32, f32)>,
    /// Log probabilities of the last draw, when the request asks for them.
    last_logprobs: Option<Logprobs>,
}

impl Sampler {
    /// A sampler for a request whose prompt is `prompt`.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let mut seen = SeenTokens::default();
        if params.repetition_penalty != 1.0 {
            prompt.iter().for_each(|&token| seen.insert(token));
        }
        Sampler {
            rng: StdRng::seed_from_u64(params.seed),
            params,
            seen,
            generated: std::collections::HashMap::new(),
            candidates: Vec::new(),
            last_logprobs: None,
        }
    }

    /// The log probabilities of the last sampled token (`None` when the
    /// request did not ask, or already taken).
    pub fn take_logprobs(&mut self) -> Option<Logprobs> {
        self.last_logprobs.take()
    }

    /// Draws the next token from `logits` (modified in place by the
    /// penalty) and remembers it for the repetition penalty.
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<u32, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        for &(id, bias) in &self.params.logit_bias {
            if let Some(logit) = logits.get_mut(id as usize) {
                *logit += bias;
            }
        }
        self.apply_repetition_penalty(logits);
        self.apply_openai_penalties(logits);
        let token = if self.params.temperature <= 0.0 {
            argmax(logits).ok_or(SamplingError::NoFiniteLogit)?
        } else {
            self.draw(logits)?
        };
        if let Some(top) = self.params.logprobs {
            self.last_logprobs = Some(logprobs(
                logits,
                self.params.temperature,
                token,
                top,
                &mut self.candidates,
            ));
        }
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token);
        }
        if self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0 {
            *self.generated.entry(token).or_insert(0) += 1;
        }
        Ok(token)
    }

    /// OpenAI's definition: `logit - count * frequency - (count > 0) *
    /// presence`, over the tokens generated so far.
    fn apply_openai_penalties(&self, logits: &mut [f32]) {
        let (presence, frequency) = (self.params.presence_penalty, self.params.frequency_penalty);
        for (&token, &count) in &self.generated {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit -= count as f32 * frequency + presence;
            }
        }
    }

    fn apply_repetition_penalty(&self, logits: &mut [f32]) {
        let penalty = self.params.repetition_penalty;
        if penalty == 1.0 {
            return;
        }
        for token in self.seen.iter() {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit = if *logit > 0.0 {
                    *logit / penalty
                } else {
                    *logit * penalty
                };
            }
        }
    }

    fn draw(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        let params = &self.params;
        let candidates = &mut self.candidates;
        candidates.clear();
        candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, logit)| logit.is_finite())
                .map(|(id, &logit)| (id as u32, logit)),
        );
        if candidates.is_empty() {
            return Err(SamplingError::NoFiniteLogit);
        }
        if params.top_k > 0 && params.top_k < candidates.len() {
            candidates.select_nth_unstable_by(params.top_k - 1, by_weight_desc);
            candidates.truncate(params.top_k);
        }
        // Weights relative to the best token: the best has weight 1, so
        // min-p compares weights directly.
        let max = candidates
            .iter()
            .map(|&(_, logit)| logit)
            .fold(f32::NEG_INFINITY, f32::max);
        let inv_t = 1.0 / params.temperature;
        for (_, value) in candidates.iter_mut() {
            *value = ((*value - max) * inv_t).exp();
        }
        if params.min_p > 0.0 {
            candidates.retain(|&(_, weight)| weight >= params.min_p);
        }
        if params.top_p < 1.0 {
            keep_top_p(candidates, params.top_p);
        }
        let total: f32 = candidates.iter().map(|&(_, weight)| weight).sum();
        let mut target = self.rng.random::<f32>() * total;
        for &(id, weight) in candidates.iter() {
            if target < weight {
                return Ok(id);
            }
            target -= weight;
        }
        // Rounding left a sliver past the last candidate.
        candidates
            .last()
            .map(|&(id, _)| id)
            .ok_or(SamplingError::NoFiniteLogit)
    }
}

/// The model's own log probabilities (temperature 1, no penalty) of
/// `token` and the `top` most likely tokens in `row`, as for prompt tokens.
pub fn model_logprobs(row: &[f32], token: u32, top: usize) -> Logprobs {
    logprobs(row, 1.0, token, top, &mut Vec::new())
}

/// Log-softmax of `logits / temperature` (temperature 1 when it is 0, for
/// greedy) for `chosen` and the `top` most likely tokens. NaN logits count
/// as impossible. One pass for the normalizer, one partial selection for
/// the top; `scratch` is reused between calls.
fn logprobs(
    logits: &[f32],
    temperature: f32,
    chosen: u32,
    top: usize,
    scratch: &mut Vec<(u32, f32)>,
) -> Logprobs {
    let inv_t = if temperature > 0.0 {
        1.0 / temperature
    } else {
        1.0
    };
    let max = logits
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| f64::from((x - max) * inv_t).exp())
        .sum();
    // log of the normalizer, relative to the best logit.
    let log_z = sum.ln() as f32;
    let logprob = |x: f32| {
        if x.is_nan() {
            f32::NEG_INFINITY
        } else {
            ((x - max) * inv_t - log_z).min(0.0)
        }
    };
    let chosen_logprob = logits
        .get(chosen as usize)
        .map_or(f32::NEG_INFINITY, |&x| logprob(x));
    scratch.clear();
    if top > 0 {
        scratch.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, x)| !x.is_nan())
                .map(|(id, &x)| (id as u32, x)),
        );
        if top < scratch.len() {
            scratch.select_nth_unstable_by(top - 1, by_weight_desc);
            scratch.truncate(top);
        }
        scratch.sort_unstable_by(by_weight_desc);
    }
    Logprobs {
        chosen: chosen_logprob,
        top: scratch.iter().map(|&(id, x)| (id, logprob(x))).collect(),
    }
}

/// Orders by weight, highest first, then by id, so equal weights sort the
/// same way on every run.
fn by_weight_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keeps the smallest highest-weight prefix whose mass reaches `top_p` of
/// the total, ordering only as many candidates as needed.
fn keep_top_p(candidates: &mut Vec<(u32, f32)>, top_p: f32) {
    let total: f32 = candidates.iter().map(|&(_, weight)| weight).sum();
    let target = top_p * total;
    let len = candidates.len();
    let mut window = TOP_P_FIRST_WINDOW.min(len);
    loop {
        if window < len {
            candidates.select_nth_unstable_by(window - 1, by_weight_desc);
        }
        candidates[..window].sort_unstable_by(by_weight_desc);
        let mut mass = 0.0;
        for (index, &(_, weight)) in candidates[..window].iter().enumerate() {
            mass += weight;
            if mass >= target {
                candidates.truncate(index + 1);
                return;
            }
        }
        if window == len {
            return;
        }
        window = (window * 4).min(len);
    }
}

/// Index of the largest logit that is not NaN or -inf; the lowest index
/// wins ties.
///
/// Two branch-free passes (the maximum in 16 lanes, then its first
/// position) vectorize: 9 us instead of 51 for one branchy pass over a 49k
/// row on the 2-core dev machine, which matters when a GPU step samples 64
/// rows on the host.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            // f32::max ignores a NaN operand.
            *lane = lane.max(x);
        }
    }
    let top = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if top == f32::NEG_INFINITY {
        return None;
    }
    logits
        .iter()
        .position(|&x| x == top)
        .map(|index| index as u32)
}

/// A set of token ids as a bitset plus the list of members, so the
/// penalty visits only seen tokens.
#[derive(Debug, Default)]
struct SeenTokens {
    bits: Vec<u64>,
    members: Vec<u32>,
}

impl SeenTokens {
    fn insert(&mut self, token: u32) {
        let (word, bit) = (token as usize / 64, token % 64);
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        if self.bits[word] & (1 << bit) == 0 {
            self.bits[word] |= 1 << bit;
            self.members.push(token);
        }
    }

    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.iter().copied()
    }
}

/// When generation ends on a token: EOS, a stop token id, or `max_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopTokens {
    ids: Vec<u32>,
    max_tokens: usize,
}

impl StopTokens {
    /// Stops on any of `eos` or `stop_token_ids`, or after `max_tokens`.
    pub fn new(eos: &[u32], stop_token_ids: &[u32], max_tokens: usize) -> Self {
        let mut ids: Vec<u32> = eos.iter().chain(stop_token_ids).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        StopTokens { ids, max_tokens }
    }

    /// Whether `token` ends generation by itself (its text is not shown).
    pub fn is_stop_token(&self, token: u32) -> bool {
        self.ids.binary_search(&token).is_ok()
    }

    /// Why generation ends after `token`, the `generated`-th output token.
    pub fn check(&self, token: u32, generated: usize) -> Option<FinishReason> {
        if self.is_stop_token(token) {
            Some(FinishReason::Stop)
        } else if generated >= self.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            seed,
            ..SamplingParams::greedy()
        }
    }

    /// A 49k-vocab row with a few clear winners and noise elsewhere.
    fn logits() -> Vec<f32> {
        (0..49_152u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 16) % 1000) as f32 / 250.0)
            .collect()
    }

    #[test]
    fn greedy_takes_the_largest_and_the_lowest_index_on_ties() {
        let mut sampler = Sampler::new(SamplingParams::greedy(), &[]);
        assert_eq!(sampler.sample(&mut [0.1, 3.0, -1.0, 3.0]).unwrap(), 1);
        assert_eq!(sampler.sample(&mut [f32::NAN, -2.0, -1.0]).unwrap(), 2);
    }

    /// The vectorized argmax against the plain definition on long rows with
    /// NaN, -inf, +inf and ties at every position relative to the lanes.
    #[test]
    fn argmax_matches_the_plain_definition() {
        let plain = |v: &[f32]| {
            let mut best: Option<(usize, f32)> = None;
            for (i, &x) in v.iter().enumerate() {
                if x.is_nan() || x == f32::NEG_INFINITY {
                    continue;
                }
                if best.is_none_or(|(_, top)| x > top) {
                    best = Some((i, x));
                }
            }
            best.map(|(i, _)| i as u32)
        };
        let mut rng = StdRng::seed_from_u64(11);
        for len in [1usize, 15, 16, 17, 33, 100, 49_152] {
            for _ in 0..20 {
                let mut v: Vec<f32> = (0..len)
                    .map(|_| (rng.random_range(0..40u32) as f32) / 4.0 - 5.0)
                    .collect();
                for _ in 0..len / 8 + 1 {
                    let at = rng.random_range(0..len);
                    v[at] = match rng.random_range(0..4u32) {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => f32::INFINITY,
                        _ => v[at],
                    };
                }
                assert_eq!(argmax(&v), plain(&v), "len {len}: {v:?}");
            }
            let all_bad = vec![f32::NAN; len];
            assert_eq!(argmax(&all_bad), None);
        }
    }

    #[test]
    fn empty_or_non_finite_logits_are_errors_not_panics() {
        let mut sampler = Sampler::new(params(1.0, 1), &[]);
        assert_eq!(sampler.sample(&mut []), Err(SamplingError::EmptyLogits));
        assert_eq!(
            sampler.sample(&mut [f32::NAN, f32::NEG_INFINITY]),
            Err(SamplingError::NoFiniteLogit)
        );
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let run = |seed| {
            let mut sampler = Sampler::new(params(1.5, seed), &[]);
            (0..32)
                .map(|_| sampler.sample(&mut logits()).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_keeps_only_the_k_best() {
        let row = logits();
        let mut order: Vec<u32> = (0..row.len() as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        let best: std::collections::HashSet<u32> = order[..5].iter().copied().collect();
        let mut sampler = Sampler::new(
            SamplingParams {
                top_k: 5,
                ..params(5.0, 3)
            },
            &[],
        );
        let drawn: std::collections::HashSet<u32> = (0..400)
            .map(|_| sampler.sample(&mut row.clone()).unwrap())
            .collect();
        assert!(drawn.is_subset(&best), "{drawn:?} not within {best:?}");
        assert!(drawn.len() > 1, "a hot top-5 draw should vary");
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
        let probs = [0.05f32, 0.5, 0.15, 0.3];
        let row: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let mut sampler = Sampler::new(
            SamplingParams {
                top_p: 0.75,
                ..params(1.0, 11)
            },
            &[],
        );
        let drawn: std::collections::HashSet<u32> = (0..500)
            .map(|_| sampler.sample(&mut row.clone()).unwrap())
            .collect();
        assert_eq!(drawn, [1, 3].into_iter().collect());
    }

    #[test]
    fn top_p_widens_its_window_over_a_flat_vocabulary() {
        let mut candidates: Vec<(u32, f32)> = (0..10_000).map(|i| (i, 1.0)).collect();
        keep_top_p(&mut candidates, 0.5);
        assert_eq!(candidates.len(), 5_000);
        let mut ids: Vec<u32> = candidates.iter().map(|&(id, _)| id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..5_000).collect::<Vec<_>>(), "ties go to low ids");
    }

    #[test]
    fn min_p_drops_tokens_far_below_the_best() {
        let row = [0.0f32, -0.1, -5.0, -6.0];
        let mut sampler = Sampler::new(
            SamplingParams {
                min_p: 0.1,
                ..params(1.0, 5)
            },
            &[],
        );
        for _ in 0..300 {
            assert!(sampler.sample(&mut row.clone()).unwrap() < 2);
        }
    }

    #[test]
    fn repetition_penalty_pushes_seen_tokens_down() {
        let penalized = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        // Token 0 was in the prompt: 3.0 / 2 = 1.5 < 2.0.
        let mut sampler = Sampler::new(penalized.clone(), &[0]);
        assert_eq!(sampler.sample(&mut [3.0, 2.0, -1.0]).unwrap(), 1);
        // Now token 1 is seen as output too: 2.0 / 2 = 1.0 < 1.5.
        assert_eq!(sampler.sample(&mut [3.0, 2.0, -1.0]).unwrap(), 0);
        // Negative logits are multiplied, so they sink further.
        let mut sampler = Sampler::new(penalized, &[0]);
        assert_eq!(sampler.sample(&mut [-1.0, -1.5, -9.0]).unwrap(), 1);
    }

    #[test]
    fn presence_and_frequency_penalties_follow_openai() {
        let penalized = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::greedy()
        };
        // Prompt tokens are not penalized: only generated ones.
        let mut sampler = Sampler::new(penalized, &[0, 0, 0]);
        let row = [2.0, 1.5, 0.0];
        let mut first = row;
        assert_eq!(sampler.sample(&mut first).unwrap(), 0);
        assert_eq!(first, row, "nothing generated yet");
        // Token 0 once: 2.0 - 0.25 - 0.5 = 1.25 < 1.5.
        let mut second = row;
        assert_eq!(sampler.sample(&mut second).unwrap(), 1);
        assert_eq!(second[0], 1.25);
        // Token 0 once, token 1 once: both down by 0.75.
        let mut third = row;
        assert_eq!(sampler.sample(&mut third).unwrap(), 0);
        assert_eq!((third[0], third[1]), (1.25, 0.75));
        // Token 0 twice now: 2.0 - 2 * 0.25 - 0.5 = 1.0.
        let mut fourth = row;
        sampler.sample(&mut fourth).unwrap();
        assert_eq!(fourth[0], 1.0);
        // Negative penalties encourage repeats.
        let eager = SamplingParams {
            presence_penalty: -1.0,
            ..SamplingParams::greedy()
        };
        let mut sampler = Sampler::new(eager, &[]);
        assert_eq!(sampler.sample(&mut [1.0, 1.5]).unwrap(), 1);
        assert_eq!(sampler.sample(&mut [1.0, 0.9]).unwrap(), 1);
    }

    #[test]
    fn logit_bias_adds_before_everything_and_a_mask_still_wins() {
        let biased = SamplingParams {
            logit_bias: vec![(2, 100.0), (0, -100.0)],
            ..SamplingParams::greedy()
        };
        let mut sampler = Sampler::new(biased.clone(), &[]);
        let mut row = [5.0, 1.0, -3.0];
        assert_eq!(sampler.sample(&mut row).unwrap(), 2);
        assert_eq!(row, [-95.0, 1.0, 97.0]);
        // A token the constraint masked stays masked.
        let mut sampler = Sampler::new(biased, &[]);
        assert_eq!(
            sampler.sample(&mut [5.0, 1.0, f32::NEG_INFINITY]).unwrap(),
            1
        );
    }

    fn with_logprobs(params: SamplingParams, top: usize) -> SamplingParams {
        SamplingParams {
            logprobs: Some(top),
            ..params
        }
    }

    /// The plain definition: log(softmax(row / t)) in f64.
    fn reference_logprobs(row: &[f32], temperature: f32) -> Vec<f64> {
        let t = if temperature > 0.0 { temperature } else { 1.0 };
        let scaled: Vec<f64> = row.iter().map(|&x| f64::from(x) / f64::from(t)).collect();
        let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let log_z = max + scaled.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        scaled.iter().map(|x| x - log_z).collect()
    }

    #[test]
    fn greedy_logprobs_are_a_distribution_whose_best_is_the_chosen_token() {
        let row = logits();
        let mut sampler = Sampler::new(with_logprobs(SamplingParams::greedy(), 20), &[]);
        let token = sampler.sample(&mut row.clone()).unwrap();
        let got = sampler.take_logprobs().unwrap();
        assert_eq!(got.top.len(), 20);
        assert!(got.chosen <= 0.0, "{}", got.chosen);
        assert!(got.top.iter().all(|&(_, lp)| lp <= 0.0), "{:?}", got.top);
        let best = got.top.iter().map(|&(_, lp)| lp).fold(f32::MIN, f32::max);
        assert_eq!(got.chosen, best, "greedy takes the most likely token");
        assert_eq!(got.top[0], (token, got.chosen));
        let mass: f32 = got.top.iter().map(|&(_, lp)| lp.exp()).sum();
        assert!(mass <= 1.0 + 1e-5 && mass > 0.0, "{mass}");
        assert!(
            got.top.windows(2).all(|w| w[0].1 >= w[1].1),
            "most likely first: {:?}",
            got.top
        );
        // Taken once; the next draw computes them again.
        assert_eq!(sampler.take_logprobs(), None);
        sampler.sample(&mut row.clone()).unwrap();
        assert!(sampler.take_logprobs().is_some());
    }

    #[test]
    fn logprobs_match_the_plain_definition_after_temperature() {
        let row = [2.0f32, 1.0, 0.5, -1.0, f32::NEG_INFINITY, f32::NAN];
        for temperature in [0.0f32, 0.5, 2.0] {
            let mut sampler = Sampler::new(with_logprobs(params(temperature, 3), 10), &[]);
            let token = sampler.sample(&mut row.to_vec()).unwrap();
            let got = sampler.take_logprobs().unwrap();
            let finite: Vec<f32> = row[..5].to_vec();
            let want = reference_logprobs(&finite, temperature);
            assert!(
                (f64::from(got.chosen) - want[token as usize]).abs() < 1e-5,
                "t={temperature}: {} vs {}",
                got.chosen,
                want[token as usize]
            );
            // NaN is left out; -inf is listed last with -inf.
            assert_eq!(got.top.len(), 5);
            assert_eq!(
                got.top.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
                vec![0, 1, 2, 3, 4]
            );
            for &(id, lp) in &got.top[..4] {
                assert!(
                    (f64::from(lp) - want[id as usize]).abs() < 1e-5,
                    "t={temperature}"
                );
            }
            assert_eq!(got.top[4].1, f32::NEG_INFINITY);
            let mass: f64 = got.top.iter().map(|&(_, lp)| f64::from(lp).exp()).sum();
            assert!(
                (mass - 1.0).abs() < 1e-5,
                "the whole vocabulary sums to 1: {mass}"
            );
        }
    }

    #[test]
    fn logprobs_follow_the_repetition_penalty_and_cost_nothing_unasked() {
        let penalized = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        // Token 0 was in the prompt: its logit 3.0 counts as 1.5.
        let mut sampler = Sampler::new(with_logprobs(penalized.clone(), 0), &[0]);
        assert_eq!(sampler.sample(&mut [3.0, 2.0, -1.0]).unwrap(), 1);
        let got = sampler.take_logprobs().unwrap();
        let want = reference_logprobs(&[1.5, 2.0, -1.0], 0.0);
        assert!((f64::from(got.chosen) - want[1]).abs() < 1e-6);
        assert!(got.top.is_empty(), "top_logprobs 0 lists none");
        let mut plain = Sampler::new(penalized, &[0]);
        plain.sample(&mut [3.0, 2.0, -1.0]).unwrap();
        assert_eq!(plain.take_logprobs(), None);
    }

    #[test]
    fn stop_tokens_and_max_tokens_end_generation() {
        let stop = StopTokens::new(&[2], &[7, 2], 3);
        assert_eq!(stop.check(2, 1), Some(FinishReason::Stop));
        assert_eq!(stop.check(7, 1), Some(FinishReason::Stop));
        assert_eq!(stop.check(5, 2), None);
        assert_eq!(stop.check(5, 3), Some(FinishReason::Length));
        assert!(!stop.is_stop_token(5));
    }
}
