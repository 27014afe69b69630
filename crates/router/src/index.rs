//! A worker's approximate prefix index: which prompt prefixes the router
//! has sent it, so cache-aware routing can guess where a prompt's prefix
//! is already cached. It is approximate because the worker evicts on its
//! own; the router only needs a good guess.

use zinfer_cache::{CacheConfig, RadixCache};
use zinfer_protocol::GenerateRequest;

/// Prompt bytes sent to one worker: a key-only radix tree, bounded in bytes
/// with LRU eviction of leaves. Cloned when a migration hands a worker's
/// traffic to its replacement, which took over its cache.
#[derive(Clone)]
pub(crate) struct PrefixIndex {
    tree: RadixCache<u8>,
    max_bytes: usize,
}

impl PrefixIndex {
    /// An empty index holding at most `max_bytes` of keys.
    pub(crate) fn new(max_bytes: usize) -> Self {
        PrefixIndex {
            tree: RadixCache::new_index_only(CacheConfig::default()),
            max_bytes,
        }
    }

    /// Length of the longest prefix of `key` held in `namespace`.
    pub(crate) fn match_len(&mut self, namespace: &str, key: &[u8]) -> usize {
        self.tree.match_prefix(namespace, key).len
    }

    /// Records that `key` was sent, evicting least recently used keys
    /// beyond the byte bound.
    pub(crate) fn insert(&mut self, namespace: &str, key: &[u8]) {
        if key.is_empty() || key.len() > self.max_bytes {
            return;
        }
        self.tree.insert(namespace, key, &[]);
        let held = self.tree.total_tokens();
        if held > self.max_bytes {
            self.tree.evict(held - self.max_bytes);
        }
    }

    /// Bytes of keys held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.tree.total_tokens()
    }
}

/// The bytes cache-aware routing matches on: the prompt text, the chat turns
/// with separators, or the token ids as little-endian bytes.
pub(crate) fn prefix_key(request: &GenerateRequest) -> Vec<u8> {
    if let Some(prompt) = &request.prompt {
        return prompt.as_bytes().to_vec();
    }
    if let Some(messages) = &request.messages {
        let mut key = Vec::new();
        for message in messages {
            key.extend_from_slice(message.role.as_bytes());
            key.push(0x1f);
            if let Some(content) = &message.content {
                key.extend_from_slice(content.text().as_bytes());
            }
            key.push(0x1e);
        }
        return key;
    }
    request
        .tokens
        .iter()
        .flatten()
        .flat_map(|token| token.to_le_bytes())
        .collect()
}

/// The index namespace of a request: model and cache namespace together,
/// since a worker may serve several models.
pub(crate) fn index_namespace(model: &str, namespace: Option<&str>) -> String {
    format!("{model}\u{0}{}", namespace.unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_within_namespace() {
        let mut index = PrefixIndex::new(1 << 20);
        index.insert("a", b"system prompt: be brief. question one");
        assert_eq!(index.match_len("a", b"system prompt: be brief. other"), 25);
        assert_eq!(index.match_len("b", b"system prompt: be brief. other"), 0);
        assert_eq!(index.match_len("a", b"unrelated"), 0);
    }

    #[test]
    fn evicts_least_recently_used_beyond_bound() {
        let mut index = PrefixIndex::new(20);
        index.insert("", b"aaaaaaaaaa");
        index.insert("", b"bbbbbbbbbb");
        assert_eq!(index.match_len("", b"aaaa"), 4);
        index.insert("", b"cccccccccc");
        assert!(index.bytes() <= 20);
        assert_eq!(index.match_len("", b"bbbb"), 0, "b was least recently used");
        assert_eq!(index.match_len("", b"aaaa"), 4);
        assert_eq!(index.match_len("", b"cccc"), 4);
    }

    #[test]
    fn keys_distinguish_prompt_kinds() {
        let mut request = GenerateRequest::from_prompt("1", "hi");
        assert_eq!(prefix_key(&request), b"hi");
        request.prompt = None;
        request.tokens = Some(vec![1, 258]);
        assert_eq!(prefix_key(&request), vec![1, 0, 0, 0, 2, 1, 0, 0]);
    }
}
