//! Carrying hot prefix-cache K/V from one engine to another, for live
//! migration: the replacement worker starts with the old one's hottest
//! prefixes cached, so the hit rate does not collapse when routing switches.
//!
//! The export runs on the engine thread between scheduling steps, a bounded
//! number of tokens per step, so requests keep being served while it runs;
//! an idle engine copies everything at once. Each span is re-checked just
//! before its copy (eviction may have taken it since the selection) and is
//! copied within one step, when nothing else can touch the cache. Imports
//! go into free slots only and never evict or preempt.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use crossbeam_channel::{SendTimeoutError, Sender, TrySendError};
use zinfer_cache::CachedSpan;
use zinfer_model::{ForwardModel, KvShape};

use super::EngineStats;
use crate::scheduler::{ImportError, Scheduler};

/// Longest span an export sends in one block, in tokens. Bounds one copy
/// (and one message: 256 tokens of the default model's K/V are 11 MiB).
pub(super) const SPAN_TOKENS: usize = 256;

/// Most tokens an export copies per engine step while requests run, so a
/// step is delayed by one bounded copy at most.
pub(super) const EXPORT_TOKENS_PER_STEP: usize = 512;

/// How long an idle engine waits on a full sink before looking at its
/// command queue again.
const SINK_POLL: Duration = Duration::from_millis(50);

/// One message of a cache export, in order: spans parent before child,
/// then `End`. A receiver that sees the channel close without `End` knows
/// the export was cut short (the engine stopped).
#[derive(Clone, Debug, PartialEq)]
pub enum CacheBlock {
    /// The K/V of one cached span.
    Span {
        /// Prefix-cache namespace.
        namespace: String,
        /// The full key from the namespace root to the end of the span.
        tokens: Vec<u32>,
        /// Leading `tokens` whose K/V came in earlier blocks.
        prefix_len: usize,
        /// K/V of `tokens[prefix_len..]`, laid out as [`KvShape`] says:
        /// `[layer][k|v][token][kv_dim]`, f32.
        kv: Vec<f32>,
    },
    /// The export is complete.
    End {
        /// Spans sent.
        spans: usize,
        /// Tokens of K/V sent (each span's own, prefixes not repeated).
        tokens: usize,
    },
}

/// Whether an export has more to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// More spans, or a block the sink had no room for yet.
    Pending,
    /// `End` sent, or the receiver is gone: drop the export.
    Finished,
}

/// An export in progress.
pub(super) struct Export {
    spans: VecDeque<CachedSpan<u32>>,
    sink: Sender<CacheBlock>,
    /// A block waiting for room in the sink, with its token count.
    pending: Option<(CacheBlock, usize)>,
    /// Keys (per namespace) of spans not sent, so their descendants are
    /// not sent either: the receiver could not attach them.
    dropped: HashSet<(String, Vec<u32>)>,
    sent_spans: usize,
    sent_tokens: usize,
    ended: bool,
}

impl Export {
    /// An export of `spans` (from `hottest_spans`, parent before child).
    pub(super) fn new(spans: Vec<CachedSpan<u32>>, sink: Sender<CacheBlock>) -> Self {
        Self {
            spans: spans.into(),
            sink,
            pending: None,
            dropped: HashSet::new(),
            sent_spans: 0,
            sent_tokens: 0,
            ended: false,
        }
    }

    /// Copies and sends spans while the tokens copied stay within `budget`
    /// (one span always goes), until the sink is full or all are sent.
    /// With `wait`, a full sink is waited on for a short while (the engine
    /// is idle); otherwise the block waits for the next step, so a slow
    /// receiver never stalls serving.
    pub(super) fn pump(
        &mut self,
        model: &dyn ForwardModel,
        scheduler: &Scheduler,
        budget: usize,
        wait: bool,
        stats: &mut EngineStats,
    ) -> Progress {
        let mut copied = 0;
        loop {
            if let Some((block, tokens)) = self.pending.take() {
                match self.offer(block, wait) {
                    Offer::Sent => {
                        stats.cache_exported_tokens += tokens as u64;
                    }
                    Offer::Full(block) => {
                        self.pending = Some((block, tokens));
                        return Progress::Pending;
                    }
                    Offer::Gone => {
                        tracing::info!(
                            spans = self.sent_spans,
                            tokens = self.sent_tokens,
                            "cache export receiver gone; export ended"
                        );
                        return Progress::Finished;
                    }
                }
            }
            if self.ended {
                return Progress::Finished;
            }
            // At least one span per step, so an export always progresses.
            let next = self.spans.front().map_or(0, CachedSpan::len);
            if copied > 0 && copied + next > budget {
                return Progress::Pending;
            }
            let Some(span) = self.spans.pop_front() else {
                let end = CacheBlock::End {
                    spans: self.sent_spans,
                    tokens: self.sent_tokens,
                };
                self.pending = Some((end, 0));
                self.ended = true;
                continue;
            };
            match self.copy(model, scheduler, span) {
                Some((block, tokens)) => {
                    copied += tokens;
                    self.sent_spans += 1;
                    self.sent_tokens += tokens;
                    self.pending = Some((block, tokens));
                }
                None => continue,
            }
        }
    }

    /// Re-checks a span against the cache now and copies its K/V from the
    /// slots it has now (an evicted and re-inserted prefix has new slots).
    fn copy(
        &mut self,
        model: &dyn ForwardModel,
        scheduler: &Scheduler,
        span: CachedSpan<u32>,
    ) -> Option<(CacheBlock, usize)> {
        let CachedSpan {
            namespace,
            key,
            prefix_len,
            ..
        } = span;
        let parent_dropped = prefix_len > 0
            && self
                .dropped
                .contains(&(namespace.clone(), key[..prefix_len].to_vec()));
        let (cached, slots) = scheduler.cache().cached_prefix(&namespace, &key);
        let kv = if parent_dropped || cached < key.len() {
            None
        } else {
            model
                .read_kv(slots.get(prefix_len..).unwrap_or_default())
                .map_err(|error| tracing::warn!(%error, "reading K/V for a cache export failed"))
                .ok()
        };
        let Some(kv) = kv else {
            self.dropped.insert((namespace, key));
            return None;
        };
        let tokens = key.len() - prefix_len;
        let block = CacheBlock::Span {
            namespace,
            tokens: key,
            prefix_len,
            kv,
        };
        Some((block, tokens))
    }

    fn offer(&self, block: CacheBlock, wait: bool) -> Offer {
        match self.sink.try_send(block) {
            Ok(()) => Offer::Sent,
            Err(TrySendError::Disconnected(_)) => Offer::Gone,
            Err(TrySendError::Full(block)) if wait => {
                match self.sink.send_timeout(block, SINK_POLL) {
                    Ok(()) => Offer::Sent,
                    Err(SendTimeoutError::Timeout(block)) => Offer::Full(block),
                    Err(SendTimeoutError::Disconnected(_)) => Offer::Gone,
                }
            }
            Err(TrySendError::Full(block)) => Offer::Full(block),
        }
    }
}

enum Offer {
    Sent,
    Full(CacheBlock),
    Gone,
}

/// Puts one imported block into the cache: checks its shape and prefix,
/// writes its K/V into free slots and inserts it. Whatever cannot be
/// imported is counted as skipped and logged, never a panic: a migration
/// that carries less cache is slower, not wrong.
pub(super) fn import(
    model: &mut dyn ForwardModel,
    scheduler: &mut Scheduler,
    block: CacheBlock,
    stats: &mut EngineStats,
) {
    let CacheBlock::Span {
        namespace,
        tokens,
        prefix_len,
        kv,
    } = block
    else {
        return;
    };
    stats.cache_import_spans += 1;
    let span_len = tokens.len().saturating_sub(prefix_len);
    match import_span(model, scheduler, &namespace, &tokens, prefix_len, &kv) {
        Ok(kept) => stats.cache_imported_tokens += kept as u64,
        Err(why) => {
            stats.cache_import_skipped_tokens += span_len as u64;
            tracing::warn!(namespace, span_len, prefix_len, %why, "cache import skipped");
        }
    }
}

/// Why an imported span was skipped; logged, and the import goes on.
#[derive(Debug, thiserror::Error)]
enum SkipReason {
    /// The K/V is not this model's size.
    #[error(
        "{values} K/V values for {span_len} tokens do not fit this model's shape \
         ({} layers x K,V x {}): another model?",
        shape.layers,
        shape.kv_dim()
    )]
    Shape {
        /// Values received.
        values: usize,
        /// Tokens of the span.
        span_len: usize,
        /// This model's shape.
        shape: KvShape,
    },
    /// The prefix the span extends is not cached here.
    #[error(
        "only {cached} of its {prefix_len} prefix tokens are cached here \
         (an earlier span was skipped or evicted)"
    )]
    Prefix {
        /// Prefix tokens cached here.
        cached: usize,
        /// Prefix tokens the span extends.
        prefix_len: usize,
    },
    /// Too few free slots.
    #[error("{needed} free KV slots needed, {free} free")]
    NoRoom {
        /// Slots the span needs.
        needed: usize,
        /// Slots free.
        free: usize,
    },
    /// Writing the K/V failed.
    #[error("writing K/V failed: {0}")]
    Fill(zinfer_model::ModelError),
}

/// [`import`] of one span; the error says why it was skipped.
fn import_span(
    model: &mut dyn ForwardModel,
    scheduler: &mut Scheduler,
    namespace: &str,
    tokens: &[u32],
    prefix_len: usize,
    kv: &[f32],
) -> Result<usize, SkipReason> {
    let shape = model.kv_shape();
    let span_len = tokens.len().saturating_sub(prefix_len);
    if span_len == 0 {
        return Ok(0);
    }
    if shape.floats_per_slot() == 0 || shape.floats_for(span_len) != Some(kv.len()) {
        return Err(SkipReason::Shape {
            values: kv.len(),
            span_len,
            shape,
        });
    }
    let (cached, _) = scheduler.cache().cached_prefix(namespace, tokens);
    if cached < prefix_len {
        return Err(SkipReason::Prefix { cached, prefix_len });
    }
    if cached >= tokens.len() {
        return Ok(0);
    }
    // Rows of the span already cached here (a shared prefix) are not copied.
    let rows = tail_rows(kv, shape, span_len, cached - prefix_len);
    scheduler
        .import_prefix(namespace, tokens, cached, |slots| {
            model.write_kv(slots, &rows)
        })
        .map_err(|error| match error {
            ImportError::NoRoom { needed, free } => SkipReason::NoRoom { needed, free },
            ImportError::Fill(error) => SkipReason::Fill(error),
        })
}

/// The rows of tokens `skip..len` of layer-major K/V for `len` tokens.
fn tail_rows(kv: &[f32], shape: KvShape, len: usize, skip: usize) -> Vec<f32> {
    if skip == 0 {
        return kv.to_vec();
    }
    let d = shape.kv_dim();
    let mut out = Vec::with_capacity((len - skip) * shape.floats_per_slot());
    for block in kv.chunks_exact(len * d) {
        out.extend_from_slice(&block[skip * d..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_rows_keeps_the_last_tokens_of_every_layer_and_pool() {
        let shape = KvShape {
            layers: 2,
            kv_heads: 1,
            key_dim: 2,
            value_dim: 2,
        };
        // 2 layers x (k, v) x 3 tokens x 2 wide.
        let kv: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let tail = tail_rows(&kv, shape, 3, 2);
        assert_eq!(tail, vec![4., 5., 10., 11., 16., 17., 22., 23.]);
        assert_eq!(tail_rows(&kv, shape, 3, 0), kv);
    }
}
