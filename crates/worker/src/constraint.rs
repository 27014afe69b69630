//! Constrained decoding with llguidance: a request's `constraint` is
//! compiled once (cached by its text) into a [`Matcher`] over the model's
//! vocabulary; each step its token mask is computed on a thread of its own
//! while the forward pass runs ([`MaskThread`]), applied to the logits
//! before anything else touches them ([`apply_mask`]), and the sampled
//! token is fed back to the matcher.
//!
//! Nothing here writes a grammar engine: llguidance's `ParserFactory`
//! compiles JSON schemas, regexes and Lark grammars, and its `Matcher`
//! tracks a sequence's state.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use zinfer_protocol::{Constraint, ConstraintKind};
use zinfer_text::{TextError, TokenBytes};

/// Compiled constraints kept for reuse; a repeated schema costs a clone.
const CACHE_ENTRIES: usize = 64;

/// Why a constraint cannot be used, or stopped working.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConstraintError {
    /// The model's vocabulary could not be turned into a token trie.
    #[error("this model's vocabulary cannot drive constrained decoding: {0}")]
    Vocabulary(String),
    /// The schema, regex or grammar does not compile.
    #[error("the constraint does not compile: {0}")]
    Compile(String),
    /// The constraint is not one llguidance can take (see the protocol).
    #[error("{0}")]
    Invalid(String),
    /// The matcher failed while generating.
    #[error("the constraint failed while generating: {0}")]
    Matcher(String),
}

/// The token trie of a vocabulary, llguidance's convention: each token's
/// bytes, special tokens as 0xFF followed by their name. `eos` must hold
/// at least one id below the vocabulary's size.
pub fn token_env(tokens: &[TokenBytes], eos: &[u32]) -> Result<TokEnv, ConstraintError> {
    let vocabulary = |why: String| ConstraintError::Vocabulary(why);
    let size = u32::try_from(tokens.len()).map_err(|_| vocabulary("too many tokens".into()))?;
    let eos: Vec<u32> = eos.iter().copied().filter(|&id| id < size).collect();
    let Some(&first_eos) = eos.first() else {
        return Err(vocabulary("no end-of-sequence token".into()));
    };
    let words: Vec<Vec<u8>> = tokens
        .iter()
        .map(|token| match token {
            TokenBytes::Text(bytes) => bytes.clone(),
            TokenBytes::Special(name) => {
                let mut bytes = Vec::with_capacity(name.len() + 1);
                bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
                bytes.extend_from_slice(name.as_bytes());
                bytes
            }
        })
        .collect();
    let info = TokRxInfo::new(size, first_eos);
    // TokTrie asserts on what it cannot hold; none of it is reachable from a
    // request, but a model file is input too, so a panic becomes an error.
    let trie = std::panic::catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(&eos))
        .map_err(|_| vocabulary("the token trie refused the vocabulary".into()))?;
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
}

/// Compiles constraints for one model and keeps the latest ones.
pub struct Grammars {
    factory: Result<ParserFactory, ConstraintError>,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    compiled: HashMap<String, Matcher>,
    order: VecDeque<String>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("ready", &self.factory.is_ok())
            .finish()
    }
}

impl Grammars {
    /// Grammars over `tokens`; when the vocabulary cannot be used, every
    /// constrained request is refused with the reason.
    pub fn new(tokens: Result<Vec<TokenBytes>, TextError>, eos: &[u32]) -> Self {
        let factory = tokens
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))
            .and_then(|tokens| token_env(&tokens, eos))
            .and_then(|env| {
                let mut factory = ParserFactory::new_simple(&env)
                    .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
                // Errors reach the client; llguidance's own log stays quiet.
                factory.quiet();
                Ok(factory)
            });
        if let Err(error) = &factory {
            tracing::warn!(%error, "constrained decoding is off for this model");
        }
        Grammars {
            factory,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// A matcher at the start of `constraint`: from the cache, or compiled
    /// (on the caller's thread, which is never the engine's step loop).
    pub fn compile(&self, constraint: &Constraint) -> Result<Matcher, ConstraintError> {
        let factory = self.factory.as_ref().map_err(Clone::clone)?;
        let kind = constraint
            .kind()
            .map_err(|e| ConstraintError::Invalid(e.to_string()))?;
        let key = cache_key(kind);
        if let Some(matcher) = self.cache().compiled.get(&key) {
            return Ok(matcher.clone());
        }
        let grammar = match kind {
            ConstraintKind::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(compact(schema))
            }
            ConstraintKind::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(&serde_json::json!({"type": "object"})))
            }
            ConstraintKind::Regex(regex) => TopLevelGrammar::from_regex(regex),
            ConstraintKind::Lark(lark) => TopLevelGrammar::from_lark(lark.to_string()),
        };
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(ConstraintError::Compile(error));
        }
        let mut cache = self.cache();
        if cache.order.len() >= CACHE_ENTRIES
            && let Some(oldest) = cache.order.pop_front()
        {
            cache.compiled.remove(&oldest);
        }
        cache.order.push_back(key.clone());
        cache.compiled.insert(key, matcher.clone());
        Ok(matcher)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The cache key: the kind and its exact text.
fn cache_key(kind: ConstraintKind<'_>) -> String {
    match kind {
        ConstraintKind::JsonSchema(schema) => format!("json_schema:{schema}"),
        ConstraintKind::JsonObject => "json_object".to_string(),
        ConstraintKind::Regex(regex) => format!("regex:{regex}"),
        ConstraintKind::Lark(lark) => format!("lark:{lark}"),
    }
}

/// JSON without optional whitespace, unless the schema sets llguidance's
/// own `x-guidance` options: small models otherwise fill `length` with
/// blank lines that the JSON grammar allows.
fn compact(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    if let Some(map) = schema.as_object_mut()
        && !map.contains_key("x-guidance")
    {
        map.insert(
            "x-guidance".to_string(),
            serde_json::json!({"whitespace_flexible": false}),
        );
    }
    schema
}

/// A request's compiled constraint, carried by its `ValidRequest`.
#[derive(Clone)]
pub struct CompiledConstraint(pub(crate) Matcher);

impl std::fmt::Debug for CompiledConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompiledConstraint")
    }
}

impl PartialEq for CompiledConstraint {
    /// Matchers have no equality; two compiled constraints are never equal.
    fn eq(&self, _: &Self) -> bool {
        false
    }
}

/// Sets the logits of the tokens `mask` does not allow to -inf, ids past
/// the mask's end included.
pub fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (index, chunk) in logits.chunks_mut(32).enumerate() {
        let word = words.get(index).copied().unwrap_or(0);
        if word == u32::MAX {
            continue;
        }
        for (bit, logit) in chunk.iter_mut().enumerate() {
            if (word >> bit) & 1 == 0 {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
}

/// One mask to compute: the matcher travels to the mask thread and back,
/// so no lock is held around it.
struct Job {
    slot: usize,
    matcher: Box<Matcher>,
}

/// A computed mask and the matcher it came from.
pub(crate) struct Done {
    pub(crate) slot: usize,
    pub(crate) matcher: Box<Matcher>,
    pub(crate) mask: Result<SimpleVob, ConstraintError>,
}

/// A thread that computes token masks while the engine thread runs the
/// forward pass. One is enough: a mask of the default model's vocabulary
/// takes well under a millisecond, a forward pass tens of them.
pub(crate) struct MaskThread {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    /// Time spent computing masks, seconds.
    busy: Arc<Mutex<Duration>>,
}

impl MaskThread {
    pub(crate) fn start() -> Option<Self> {
        let (jobs, job_rx) = crossbeam_channel::unbounded::<Job>();
        let (done_tx, done) = crossbeam_channel::unbounded::<Done>();
        let busy = Arc::new(Mutex::new(Duration::ZERO));
        let busy_in = Arc::clone(&busy);
        let thread = std::thread::Builder::new()
            .name("zinfer-mask".into())
            .spawn(move || {
                for Job { slot, mut matcher } in job_rx {
                    let started = Instant::now();
                    let mask = matcher
                        .compute_mask()
                        .map_err(|e| ConstraintError::Matcher(e.to_string()));
                    *busy_in.lock().unwrap_or_else(PoisonError::into_inner) += started.elapsed();
                    if done_tx
                        .send(Done {
                            slot,
                            matcher,
                            mask,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            })
            .map_err(|error| tracing::error!(%error, "cannot start the mask thread"))
            .ok()?;
        Some(MaskThread {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            busy,
        })
    }

    /// Queues a mask; gives the matcher back when the thread is gone.
    pub(crate) fn submit(&self, slot: usize, matcher: Box<Matcher>) -> Result<(), Box<Matcher>> {
        match &self.jobs {
            Some(jobs) => jobs
                .send(Job { slot, matcher })
                .map_err(|error| error.into_inner().matcher),
            None => Err(matcher),
        }
    }

    /// The next finished mask; `None` when the thread is gone.
    pub(crate) fn next(&self) -> Option<Done> {
        self.done.recv().ok()
    }

    /// Seconds spent computing masks since start.
    pub(crate) fn busy_s(&self) -> f64 {
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_secs_f64()
    }
}

impl Drop for MaskThread {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zinfer_text::TokenizerError;

    fn bytes_vocab() -> Vec<TokenBytes> {
        let mut tokens: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
        tokens.push(TokenBytes::Special("<eos>".into()));
        tokens
    }

    #[test]
    fn mask_allows_only_what_the_regex_can_continue_with() {
        let grammars = Grammars::new(Ok(bytes_vocab()), &[256]);
        let mut matcher = grammars.compile(&Constraint::regex("ab[0-9]")).unwrap();
        let mask = matcher.compute_mask().unwrap();
        assert_eq!(mask.to_list(), [u32::from(b'a')]);
        matcher.consume_token(u32::from(b'a')).unwrap();
        matcher.consume_token(u32::from(b'b')).unwrap();
        let mask = matcher.compute_mask().unwrap();
        assert_eq!(
            mask.to_list(),
            (b'0'..=b'9').map(u32::from).collect::<Vec<_>>()
        );
        matcher.consume_token(u32::from(b'7')).unwrap();
        assert!(matcher.is_stopped(), "nothing can follow");
        let mut logits = vec![1.0; 300];
        apply_mask(&mask, &mut logits);
        assert!(logits[usize::from(b'5')].is_finite());
        assert_eq!(logits[usize::from(b'a')], f32::NEG_INFINITY);
        assert_eq!(logits[299], f32::NEG_INFINITY, "ids past the mask");
    }

    #[test]
    fn json_is_compact_unless_the_schema_says_otherwise() {
        let grammars = Grammars::new(Ok(bytes_vocab()), &[256]);
        let allows_space = |constraint: Constraint| {
            let mut matcher = grammars.compile(&constraint).unwrap();
            matcher.consume_token(u32::from(b'{')).unwrap();
            matcher.compute_mask().unwrap().is_allowed(u32::from(b' '))
        };
        assert!(!allows_space(Constraint::json_object()));
        let flexible = serde_json::json!({"type": "object",
            "x-guidance": {"whitespace_flexible": true}});
        assert!(allows_space(Constraint::json_schema(flexible)));
    }

    #[test]
    fn compile_errors_and_bad_vocabularies_are_errors() {
        let grammars = Grammars::new(Ok(bytes_vocab()), &[256]);
        let Err(error) = grammars.compile(&Constraint::lark("start: foo")) else {
            panic!("an undefined rule compiled");
        };
        assert!(matches!(error, ConstraintError::Compile(_)), "{error}");
        let schema = serde_json::json!({"type": "no-such-type"});
        assert!(grammars.compile(&Constraint::json_schema(schema)).is_err());
        let none = Grammars::new(Err(TokenizerError::Unsupported("no bytes").into()), &[256]);
        assert!(matches!(
            none.compile(&Constraint::json_object()),
            Err(ConstraintError::Vocabulary(_))
        ));
        assert!(token_env(&bytes_vocab(), &[]).is_err(), "no EOS");
    }
}
