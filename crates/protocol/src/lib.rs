//! zinfer wire protocol v1.
//!
//! Every message is one ZeroMQ frame holding a MessagePack map with string
//! keys and a `"type"` field, so a stock msgpack library in any language can
//! speak it (see `docs/protocol.md`). Each socket direction has its own enum:
//!
//! | direction | enum |
//! |---|---|
//! | client -> router | [`ClientRequest`] |
//! | router -> client | [`ClientReply`] |
//! | router -> worker | [`RouterToWorker`] |
//! | worker -> router | [`WorkerToRouter`] |
//! | admin -> router (control socket) | [`AdminRequest`] |
//! | router -> admin | [`AdminReply`] |
//! | supervisor -> router (control socket) | [`SupervisorToRouter`] |
//! | router -> supervisor | [`RouterToSupervisor`] |
//! | worker -> migration target (import socket) | [`CacheTransfer`] |
//!
//! Decoding goes through [`decode`], which enforces every [`Limits`] check in
//! one place and never panics.

mod chat;
mod codec;
mod constraint;
mod embed;
mod ids;
mod keep_alive;
mod limits;
mod messages;
mod scan;
mod speculative;
mod text;
mod tools;
mod validate;

pub use chat::{ChatMessage, ContentPart, FunctionCall, MessageContent, ToolCall};
pub use codec::{DecodeError, EncodeError, WireMessage, decode, encode, recover_id};
pub use constraint::{Constraint, ConstraintKind, closed_objects};
pub use embed::{EmbedRequest, Pooling};
pub use ids::{RequestId, RouterRequestId};
pub use keep_alive::{DEFAULT_KEEP_ALIVE, KeepAlive, ParseKeepAliveError};
pub use limits::Limits;
pub use messages::*;
pub use speculative::{MAX_SPECULATIVE_DRAFT, MAX_SPECULATIVE_NGRAM, Speculative};
pub use text::*;
pub use tools::{FunctionDef, Tool, ToolChoice, valid_function_name};

/// The protocol version this build speaks. Messages may carry it as `"v"`;
/// a message without `"v"` is taken to be version 1.
pub const PROTOCOL_VERSION: u32 = 1;
