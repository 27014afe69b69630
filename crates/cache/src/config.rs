//! How a radix cache picks what to evict and how it cuts keys.

use std::fmt;
use std::str::FromStr;

/// Which unlocked leaf the cache gives up first when it must free space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EvictionPolicy {
    /// Least recently matched or inserted first: keeps what traffic uses now.
    #[default]
    Lru,
    /// Least often used first (ties: least recent): keeps long-lived hot
    /// prompts through bursts of one-off traffic.
    Lfu,
    /// Oldest insertion first, whatever its use: cheap and predictable.
    Fifo,
}

impl EvictionPolicy {
    /// The lowercase name used in configuration files and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Lfu => "lfu",
            Self::Fifo => "fifo",
        }
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not `lru`, `lfu` or `fifo`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy {0:?}; use lru, lfu or fifo")]
pub struct ParsePolicyError(pub String);

impl FromStr for EvictionPolicy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "lru" => Ok(Self::Lru),
            "lfu" => Ok(Self::Lfu),
            "fifo" => Ok(Self::Fifo),
            _ => Err(ParsePolicyError(s.to_owned())),
        }
    }
}

/// Settings fixed when a [`crate::RadixCache`] is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// What to evict first.
    pub policy: EvictionPolicy,
    /// Keys are matched and stored in whole pages of this many elements, for
    /// KV backends that allocate blocks rather than single tokens. 0 counts
    /// as 1.
    pub page_size: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            policy: EvictionPolicy::Lru,
            page_size: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        for policy in [
            EvictionPolicy::Lru,
            EvictionPolicy::Lfu,
            EvictionPolicy::Fifo,
        ] {
            assert_eq!(policy.to_string().parse::<EvictionPolicy>(), Ok(policy));
        }
        assert_eq!("LFU".parse::<EvictionPolicy>(), Ok(EvictionPolicy::Lfu));
        assert!("mru".parse::<EvictionPolicy>().is_err());
    }
}
