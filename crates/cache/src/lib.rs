//! Prefix reuse for zinfer: the RadixAttention tree and the KV slot pool.
//!
//! [`TokenPool`] hands out KV slot ids; [`RadixCache`] remembers which token
//! prefixes already have their keys and values in which slots, so a request
//! that shares a system prompt, a chat history or a few-shot template with
//! earlier traffic only computes its new tokens. The tree is generic over
//! the key element, so the router reuses it over bytes as its approximate
//! per-worker index ([`RadixCache::new_index_only`]).
//!
//! Pure Rust and deterministic (a logical clock, no wall time), so the
//! property tests in `tests/state_machine.rs` can drive it exhaustively.
//! `docs/cache.md` states the guarantees and the measured speed.

mod config;
mod pool;
mod radix;

pub use config::{CacheConfig, EvictionPolicy, ParsePolicyError};
pub use pool::{PoolError, TokenPool};
pub use radix::{
    CacheError, CacheStats, CachedSpan, InsertOutcome, NodeHandle, PrefixMatch, RadixCache,
};
