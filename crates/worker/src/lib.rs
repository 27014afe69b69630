//! zinfer worker: the model, its KV pool and prefix cache, the continuous
//! batching scheduler, and the socket loop that serves the router.
//!
//! Threads: one I/O thread owns the DEALER socket ([`server`]); one engine
//! thread owns the model, the pool and the cache ([`engine`]). They talk over
//! bounded channels, so no lock is ever held during a forward pass.

pub mod detokenize;
pub mod device;
pub mod engine;
pub mod metrics;
pub mod migration;
pub mod model;
pub mod procfs;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod synthetic;

pub use engine::CacheBlock;
pub use model::KvShape;
