//! Size limits every decoder enforces, so a peer cannot make a process
//! allocate or recurse without bound.

/// Limits on one incoming message. The defaults suit a public gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame in bytes (also set as ZMQ_MAXMSGSIZE on sockets).
    pub max_frame_bytes: usize,
    /// Most frames in one ZeroMQ message, routing envelope included.
    pub max_frames: usize,
    /// Deepest nesting of maps and arrays; the message's own map is level 1.
    pub max_depth: usize,
    /// Largest `prompt`, or all `messages` roles and contents together, in bytes.
    pub max_prompt_bytes: usize,
    /// Most entries in `tokens` or `messages`.
    pub max_prompt_items: usize,
    /// Most `stop` strings.
    pub max_stop: usize,
    /// Longest `stop` string in bytes.
    pub max_stop_bytes: usize,
    /// Most `stop_token_ids`.
    pub max_stop_token_ids: usize,
    /// Highest `max_tokens` accepted.
    pub max_tokens_cap: u32,
    /// Longest id, model name or namespace in bytes.
    pub max_name_bytes: usize,
    /// Highest `top_logprobs` accepted.
    pub max_top_logprobs: u32,
    /// Most log-probability entries one non-streamed `done` may have to
    /// carry: `max_tokens` x (1 + `top_logprobs`). Keeps that frame well
    /// under `max_frame_bytes`; streamed requests send them chunk by chunk.
    pub max_logprob_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 1 << 20,
            max_frames: 4,
            max_depth: 16,
            max_prompt_bytes: 512 * 1024,
            max_prompt_items: 131_072,
            max_stop: 16,
            max_stop_bytes: 256,
            max_stop_token_ids: 64,
            max_tokens_cap: 32_768,
            max_name_bytes: 256,
            max_top_logprobs: 20,
            max_logprob_entries: 4096,
        }
    }
}
