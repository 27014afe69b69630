//! zinfer worker: the KV pool and prefix cache around a model, the
//! continuous batching scheduler, and the socket loop that serves the router.
//! The model itself (loading, forward pass) is `zinfer_model`'s; its
//! tokenizer, chat template and output formats are `zinfer_text`'s.
//!
//! Threads: one I/O thread owns the DEALER socket ([`server`]); one engine
//! thread owns the model, the pool and the cache ([`engine`]). They talk over
//! bounded channels, so no lock is ever held during a forward pass. A third
//! thread computes the token masks of constrained requests ([`constraint`])
//! while the forward pass runs.

pub mod constraint;
pub mod engine;
pub mod metrics;
pub mod migration;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod speculate;
pub mod text;

pub use engine::CacheBlock;
pub use zinfer_model::KvShape;
