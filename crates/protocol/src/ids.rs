//! The two names of a request: the client's and the router's.

/// A client's name for one of its requests. Unique per client connection
/// while the request is in flight; the router keys its table on
/// (client identity, id).
pub type RequestId = String;

/// The router's own id for a request it forwarded to a worker.
pub type RouterRequestId = u64;
