//! The memory budget: whether one more worker fits on this host.
//!
//! Pure arithmetic over byte counts, so every refusal can be tested and
//! says exactly how much is needed and how much is free.

/// Memory set aside for a supervisor's workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes all workers together may hold.
    pub total: u64,
}

/// Why a spawn does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot start a worker of {model}: it needs about {} but the memory budget has {} free \
     (budget {}, {} held by {workers} worker(s)); raise --memory-budget, lower --kv-tokens \
     or stop a worker",
    gib(*.need), gib(*.free), gib(*.total), gib(*.held)
)]
pub struct OverBudget {
    /// The model to start.
    pub model: String,
    /// Bytes the new worker is expected to need.
    pub need: u64,
    /// Bytes left in the budget.
    pub free: u64,
    /// The budget.
    pub total: u64,
    /// Bytes the running workers hold or reserved.
    pub held: u64,
    /// Running workers.
    pub workers: usize,
}

impl MemoryBudget {
    /// Bytes held: each running worker counts the larger of what it holds
    /// now and what was reserved for it at spawn (a fresh worker has not
    /// touched its KV pool yet).
    pub fn held(&self, workers: &[(u64, u64)]) -> u64 {
        workers
            .iter()
            .map(|&(resident, reserved)| resident.max(reserved))
            .sum()
    }

    /// Admits a worker needing `need` bytes next to `workers` (resident,
    /// reserved), or says why not.
    pub fn admit(&self, model: &str, need: u64, workers: &[(u64, u64)]) -> Result<(), OverBudget> {
        let held = self.held(workers);
        let free = self.total.saturating_sub(held);
        if need <= free {
            return Ok(());
        }
        Err(OverBudget {
            model: model.to_string(),
            need,
            free,
            total: self.total,
            held,
            workers: workers.len(),
        })
    }
}

/// Expected bytes of one worker of a model: its measured peak resident
/// memory once a worker of it ran, else model file + KV pool + overhead.
pub fn worker_bytes(file_bytes: u64, kv_pool_bytes: u64, measured_peak: Option<u64>) -> u64 {
    const OVERHEAD: u64 = 128 << 20;
    match measured_peak {
        Some(peak) => peak.max(file_bytes + OVERHEAD),
        None => file_bytes + kv_pool_bytes + OVERHEAD,
    }
}

/// A byte count as `1.6 GiB` or `300 MiB`.
pub fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// Why a text is not a byte count (`--memory-budget`'s parser says so).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSize {
    /// No number in front.
    #[error("{0:?} is not a size; write e.g. 8GiB, 512MiB or 2000000000")]
    NotANumber(String),
    /// A unit this parser does not know.
    #[error("unknown size unit {0:?}; use B, KiB, MiB, GiB or TiB")]
    UnknownUnit(String),
}

/// Parses `8GiB`, `512MiB`, `2G`, `1500000000` (bytes).
pub fn parse_bytes(text: &str) -> Result<u64, BadSize> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| BadSize::NotANumber(text.to_string()))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(BadSize::UnknownUnit(other.to_string())),
    };
    Ok((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_worker_fits_while_the_budget_has_room() {
        let budget = MemoryBudget { total: 4 * GIB };
        assert!(budget.admit("m", GIB, &[]).is_ok());
        assert!(
            budget
                .admit("m", GIB, &[(GIB, GIB), (GIB, 2 * GIB)])
                .is_ok()
        );
        let err = budget
            .admit("m", 2 * GIB, &[(GIB, GIB), (GIB / 2, 2 * GIB)])
            .unwrap_err();
        assert_eq!((err.need, err.free, err.held), (2 * GIB, GIB, 3 * GIB));
        let text = err.to_string();
        assert!(text.contains("needs about 2.0 GiB"), "{text}");
        assert!(text.contains("1.0 GiB free"), "{text}");
        assert!(text.contains("held by 2 worker(s)"), "{text}");
        assert!(text.contains("--memory-budget"), "{text}");
    }

    #[test]
    fn estimates_prefer_what_was_measured() {
        assert_eq!(worker_bytes(100 << 20, GIB, None), GIB + (228 << 20));
        assert_eq!(worker_bytes(100 << 20, GIB, Some(600 << 20)), 600 << 20);
        assert_eq!(worker_bytes(100 << 20, GIB, Some(1 << 20)), 228 << 20);
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("8GiB"), Ok(8 * GIB));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5G"), Ok(3 * GIB / 2));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("lots").is_err());
        let err = parse_bytes("3 parsecs").unwrap_err().to_string();
        assert!(err.contains("unit \"parsecs\""), "{err}");
    }
}
