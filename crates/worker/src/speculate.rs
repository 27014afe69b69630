//! Prompt-lookup drafting for speculative decoding: guesses the next
//! tokens of a sequence by finding its last few tokens earlier in it (the
//! prompt, or the output so far) and proposing what followed them there.
//! Answers that quote their input (code edits, RAG citations, rewrites)
//! are mostly such runs. The model checks the guesses in one pass with
//! the next token (see the engine), so a wrong guess costs compute, never
//! output.

use crate::sampling::{Logprobs, Sampler, SamplingError};

/// A token drawn in a step, with its log probabilities when asked for.
pub type Drawn = (u32, Option<Logprobs>);

/// Shortest suffix looked up: a single token matches too often to be worth
/// the extra rows.
pub const MIN_NGRAM: usize = 2;

/// Appends to `draft` up to `max` tokens that followed the latest earlier
/// occurrence of the longest suffix of `tokens` that occurs earlier,
/// trying suffixes of `ngram` tokens down to [`MIN_NGRAM`]. Appends
/// nothing when no suffix recurs.
pub fn lookup(tokens: &[u32], ngram: usize, max: usize, draft: &mut Vec<u32>) {
    if max == 0 {
        return;
    }
    let len = tokens.len();
    for n in (MIN_NGRAM..=ngram).rev() {
        if len <= n {
            continue;
        }
        let suffix = &tokens[len - n..];
        // Latest first: the nearest context is the likeliest to continue
        // the same way. `start + n < len` keeps at least one token after.
        let found = (0..len - n)
            .rev()
            .find(|&start| &tokens[start..start + n] == suffix);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + max).min(len);
            draft.extend_from_slice(&tokens[from..to]);
            return;
        }
    }
}

/// How many draft tokens a sequence gets next, from how its last drafts
/// fared: a fully accepted draft doubles the length (up to the request's
/// maximum), one rejected outright halves it (down to 1), so text that does
/// not quote its context costs little more than plain decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftLength {
    max: usize,
    next: usize,
}

impl DraftLength {
    /// Starts at `max`.
    pub fn new(max: usize) -> Self {
        DraftLength { max, next: max }
    }

    /// The length to draft now.
    pub fn next(&self) -> usize {
        self.next
    }

    /// Records that `accepted` of `drafted` tokens were right.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if accepted >= drafted {
            self.next = (self.next * 2).clamp(1, self.max);
        } else if accepted == 0 {
            self.next = (self.next / 2).max(1);
        }
    }
}

/// Checks a draft against the model: `rows` holds `draft.len() + 1` rows
/// of `vocab` logits, the row after the newest token and after each draft
/// token. Draws at each row in turn with the request's sampler, exactly as
/// plain decoding would (bias and penalties see the tokens drawn before),
/// and stops after the first token that differs from the draft or ends
/// the output. So `drawn` gets what decoding one token at a time would
/// have drawn: greedy output is unchanged, and so is a seeded sampler's
/// (it draws once per token either way). For a draft that is one fixed
/// guess, drawing from the model and comparing is exactly speculative
/// rejection sampling: the guess is kept with its probability under the
/// model, and a rejected guess is replaced by a draw from the rest.
pub fn verify(
    sampler: &mut Sampler,
    rows: &mut [f32],
    vocab: usize,
    draft: &[u32],
    ends_output: impl Fn(u32) -> bool,
    drawn: &mut Vec<Drawn>,
) -> Result<(), SamplingError> {
    if vocab == 0 {
        return Err(SamplingError::EmptyLogits);
    }
    if rows.len() != (draft.len() + 1) * vocab {
        return Err(SamplingError::Rows {
            values: rows.len(),
            rows: draft.len() + 1,
            vocab,
        });
    }
    let guesses = draft.iter().map(Some).chain([None]);
    for (row, guess) in rows.chunks_exact_mut(vocab).zip(guesses) {
        let token = sampler.sample(row)?;
        drawn.push((token, sampler.take_logprobs()));
        if guess != Some(&token) || ends_output(token) {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;
    use rand::{Rng, SeedableRng};

    fn draft(tokens: &[u32], ngram: usize, max: usize) -> Vec<u32> {
        let mut out = vec![99];
        lookup(tokens, ngram, max, &mut out);
        assert_eq!(out.first(), Some(&99), "appended after what was there");
        out.split_off(1)
    }

    #[test]
    fn the_longest_recurring_suffix_proposes_what_followed_it() {
        // "1 2 3" recurs at 0: propose "4 5".
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 3, 2), [4, 5]);
        // Capped by what there is: the match ends at the sequence's end.
        assert_eq!(draft(&[1, 2, 3, 4, 1, 2, 3], 3, 8), [4, 1, 2, 3]);
    }

    #[test]
    fn longer_suffixes_win_over_later_shorter_matches() {
        // "7 8" occurs late (followed by 5) but "6 7 8" occurs earlier
        // (followed by 4): the 3-gram decides.
        let tokens = [6, 7, 8, 4, 0, 7, 8, 5, 0, 6, 7, 8];
        assert_eq!(draft(&tokens, 3, 1), [4]);
        assert_eq!(draft(&tokens, 2, 1), [5]);
    }

    #[test]
    fn the_latest_occurrence_is_taken() {
        let tokens = [1, 2, 3, 0, 1, 2, 4, 0, 1, 2];
        assert_eq!(draft(&tokens, 2, 1), [4]);
    }

    #[test]
    fn nothing_recurring_or_too_short_drafts_nothing() {
        assert!(draft(&[1, 2, 3, 4, 5], 3, 4).is_empty());
        assert!(draft(&[1, 2], 3, 4).is_empty());
        // Single tokens do not count as a match.
        assert!(draft(&[1, 2, 3, 1], 3, 4).is_empty());
        assert!(draft(&[1, 2, 1, 2], 3, 0).is_empty());
    }

    fn sampler(seed: u64) -> Sampler {
        let params = SamplingParams {
            temperature: 0.8,
            presence_penalty: 0.5,
            logit_bias: vec![(3, 0.7)],
            seed,
            ..SamplingParams::greedy()
        };
        Sampler::new(params, &[1, 2])
    }

    /// Plain decoding of fixed rows: one draw per row, in order.
    fn plain(seed: u64, rows: &[f32], vocab: usize) -> Vec<u32> {
        let mut sampler = sampler(seed);
        rows.chunks_exact(vocab)
            .map(|row| sampler.sample(&mut row.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn verification_draws_what_plain_decoding_draws() {
        let vocab = 5;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for seed in 0..300 {
            let rows: Vec<f32> = (0..4 * vocab)
                .map(|_| rng.random_range(-2.0..2.0))
                .collect();
            let want = plain(seed, &rows, vocab);
            // A draft right up to position `right`, then wrong.
            for right in 0..=3 {
                let mut draft: Vec<u32> = want[..3].to_vec();
                if right < 3 {
                    draft[right] = (draft[right] + 1) % vocab as u32;
                }
                let mut drawn = Vec::new();
                let mut sampler = sampler(seed);
                verify(
                    &mut sampler,
                    &mut rows.clone(),
                    vocab,
                    &draft,
                    |_| false,
                    &mut drawn,
                )
                .unwrap();
                let tokens: Vec<u32> = drawn.iter().map(|&(token, _)| token).collect();
                assert_eq!(tokens, want[..=right.min(3)], "seed {seed}, right {right}");
            }
        }
    }

    #[test]
    fn verification_stops_at_a_token_that_ends_the_output() {
        let rows = [
            0.0, 9.0, 0.0, /* */ 9.0, 0.0, 0.0, /* */ 0.0, 0.0, 9.0,
        ];
        let mut drawn = Vec::new();
        let params = SamplingParams::greedy();
        let mut sampler = Sampler::new(params, &[]);
        verify(
            &mut sampler,
            &mut rows.clone(),
            3,
            &[1, 0],
            |token| token == 0,
            &mut drawn,
        )
        .unwrap();
        assert_eq!(drawn.iter().map(|d| d.0).collect::<Vec<_>>(), [1, 0]);
        let wrong = verify(&mut sampler, &mut [0.0; 5], 3, &[1], |_| false, &mut drawn);
        assert!(
            matches!(
                wrong,
                Err(SamplingError::Rows {
                    values: 5,
                    rows: 2,
                    vocab: 3
                })
            ),
            "{wrong:?}"
        );
    }

    /// Pearson's chi-square statistic of `counts` against probabilities.
    fn chi_square(counts: &[u32], probs: &[f64]) -> f64 {
        let total: u32 = counts.iter().sum();
        counts
            .iter()
            .zip(probs)
            .map(|(&count, &p)| {
                let expected = f64::from(total) * p;
                (f64::from(count) - expected).powi(2) / expected
            })
            .sum()
    }

    fn softmax(logits: &[f32]) -> Vec<f64> {
        let weights: Vec<f64> = logits.iter().map(|&x| f64::from(x).exp()).collect();
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| w / total).collect()
    }

    /// Sampled tokens under speculation follow the model: the first token
    /// drawn has the first row's distribution whatever the draft proposes,
    /// the draft token is kept as often as the model gives it, and the
    /// token after an accepted one has the second row's distribution.
    #[test]
    fn sampled_tokens_follow_the_target_distribution() {
        let first = [2.0, 1.0, 0.5, 0.0];
        let second = [0.0, 0.3, 1.5, -1.0];
        let rows: Vec<f32> = first.iter().chain(&second).copied().collect();
        let trials = 20_000;
        let (mut at_first, mut at_second) = ([0u32; 4], [0u32; 4]);
        for seed in 0..trials {
            let params = SamplingParams {
                temperature: 1.0,
                seed,
                ..SamplingParams::greedy()
            };
            let mut sampler = Sampler::new(params, &[]);
            let mut drawn = Vec::new();
            verify(
                &mut sampler,
                &mut rows.clone(),
                4,
                &[0],
                |_| false,
                &mut drawn,
            )
            .unwrap();
            at_first[drawn[0].0 as usize] += 1;
            if let Some(&(token, _)) = drawn.get(1) {
                assert_eq!(drawn[0].0, 0, "a rejected draft ends the step");
                at_second[token as usize] += 1;
            }
        }
        // 3 degrees of freedom: 16.27 is the 0.1% critical value.
        let (p_first, p_second) = (softmax(&first), softmax(&second));
        assert!(chi_square(&at_first, &p_first) < 16.27, "{at_first:?}");
        assert!(chi_square(&at_second, &p_second) < 16.27, "{at_second:?}");
        let accepted = f64::from(at_second.iter().sum::<u32>()) / trials as f64;
        assert!((accepted - p_first[0]).abs() < 0.02, "accepted {accepted}");
    }

    #[test]
    fn draft_length_doubles_on_full_acceptance_and_halves_on_none() {
        let mut length = DraftLength::new(8);
        assert_eq!(length.next(), 8);
        length.record(8, 0);
        assert_eq!(length.next(), 4);
        length.record(4, 2);
        assert_eq!(length.next(), 4);
        length.record(4, 0);
        length.record(2, 0);
        length.record(1, 0);
        assert_eq!(length.next(), 1);
        length.record(1, 1);
        length.record(2, 2);
        length.record(4, 4);
        length.record(8, 8);
        assert_eq!(length.next(), 8);
        length.record(0, 0);
        assert_eq!(length.next(), 8);
    }
}
