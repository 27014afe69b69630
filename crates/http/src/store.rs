//! The bounded in-memory store of `/v1/responses` results, for
//! `previous_response_id` and `GET`/`DELETE /v1/responses/{id}`. Entries
//! expire after a time to live, and the oldest go first when the count or
//! the bytes held pass their limits; the caller supplies the time.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Limits of a [`ResponseStore`].
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    /// Most responses held.
    pub responses: usize,
    /// Most bytes held (the JSON of conversations and responses).
    pub bytes: usize,
    /// How long a response is kept.
    pub ttl: Duration,
}

impl Default for StoreLimits {
    /// 1,024 responses, 64 MiB, one hour.
    fn default() -> Self {
        StoreLimits {
            responses: 1024,
            bytes: 64 << 20,
            ttl: Duration::from_secs(3600),
        }
    }
}

/// One stored response.
#[derive(Debug, Clone)]
struct Entry {
    /// The conversation up to and including the response's output, as
    /// chat turns (the request's `instructions` left out, as OpenAI does).
    turns: Vec<Value>,
    /// The response object, for `GET`.
    response: Value,
    stored: Instant,
    bytes: usize,
}

/// Responses by id, oldest first.
#[derive(Debug, Default)]
pub struct ResponseStore {
    limits: StoreLimits,
    entries: HashMap<String, Entry>,
    order: VecDeque<String>,
    bytes: usize,
}

impl ResponseStore {
    /// An empty store with `limits`.
    pub fn new(limits: StoreLimits) -> Self {
        ResponseStore {
            limits,
            ..ResponseStore::default()
        }
    }

    /// Stores response `id`: its conversation and object. One bigger than
    /// the byte limit is not stored.
    pub fn put(&mut self, id: String, turns: Vec<Value>, response: Value, now: Instant) {
        let bytes =
            turns.iter().map(|t| t.to_string().len()).sum::<usize>() + response.to_string().len();
        if bytes > self.limits.bytes || self.limits.responses == 0 {
            return;
        }
        self.remove(&id);
        self.expire(now);
        while self.entries.len() >= self.limits.responses || self.bytes + bytes > self.limits.bytes
        {
            let Some(oldest) = self.order.front().cloned() else {
                break;
            };
            self.remove(&oldest);
        }
        self.bytes += bytes;
        self.order.push_back(id.clone());
        self.entries.insert(
            id,
            Entry {
                turns,
                response,
                stored: now,
                bytes,
            },
        );
    }

    /// The conversation of response `id`, if held and not expired.
    pub fn turns(&mut self, id: &str, now: Instant) -> Option<Vec<Value>> {
        self.expire(now);
        self.entries.get(id).map(|entry| entry.turns.clone())
    }

    /// The response object of `id`, if held and not expired.
    pub fn response(&mut self, id: &str, now: Instant) -> Option<Value> {
        self.expire(now);
        self.entries.get(id).map(|entry| entry.response.clone())
    }

    /// Forgets `id`; whether it was held.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some(entry) = self.entries.remove(id) else {
            return false;
        };
        self.bytes -= entry.bytes;
        self.order.retain(|held| held != id);
        true
    }

    /// Drops what has outlived the time to live (oldest first, so the
    /// expired ones are at the front).
    fn expire(&mut self, now: Instant) {
        while let Some(oldest) = self.order.front() {
            let expired = self
                .entries
                .get(oldest)
                .is_none_or(|entry| now.saturating_duration_since(entry.stored) >= self.limits.ttl);
            if !expired {
                break;
            }
            let oldest = oldest.clone();
            if !self.remove(&oldest) {
                self.order.pop_front();
            }
        }
    }

    /// Responses held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits(responses: usize, bytes: usize) -> StoreLimits {
        StoreLimits {
            responses,
            bytes,
            ttl: Duration::from_secs(10),
        }
    }

    #[test]
    fn responses_expire_and_the_oldest_go_first() {
        let start = Instant::now();
        let mut store = ResponseStore::new(limits(2, 1 << 20));
        let turn = |text: &str| vec![json!({"role": "user", "content": text})];
        store.put("a".into(), turn("1"), json!({"id": "a"}), start);
        store.put("b".into(), turn("2"), json!({"id": "b"}), start);
        store.put("c".into(), turn("3"), json!({"id": "c"}), start);
        assert_eq!(store.len(), 2, "the count limit evicts the oldest");
        assert!(store.turns("a", start).is_none());
        assert_eq!(store.turns("b", start), Some(turn("2")));
        assert_eq!(store.response("c", start), Some(json!({"id": "c"})));
        let later = start + Duration::from_secs(10);
        assert!(store.response("c", later).is_none(), "expired");
        assert!(store.is_empty());
        assert_eq!(store.bytes, 0);
    }

    #[test]
    fn the_byte_limit_holds_and_remove_frees() {
        let now = Instant::now();
        let big = json!({"role": "user", "content": "x".repeat(400)});
        let mut store = ResponseStore::new(limits(100, 1000));
        store.put("a".into(), vec![big.clone()], json!({}), now);
        store.put("b".into(), vec![big.clone()], json!({}), now);
        store.put("c".into(), vec![big.clone()], json!({}), now);
        assert!(store.bytes <= 1000, "{}", store.bytes);
        assert_eq!(store.len(), 2);
        assert!(store.turns("a", now).is_none());
        store.put("huge".into(), vec![json!("y".repeat(2000))], json!({}), now);
        assert!(store.turns("huge", now).is_none(), "over the limit alone");
        assert!(store.remove("b"));
        assert!(!store.remove("b"));
        assert_eq!(store.len(), 1);
        store.put("c".into(), vec![], json!({"again": true}), now);
        assert_eq!(store.len(), 1, "a new put replaces");
        assert_eq!(store.response("c", now), Some(json!({"again": true})));
    }
}
