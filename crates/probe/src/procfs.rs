//! Memory figures read from Linux `/proc`: a process's resident memory
//! (for load reports and the supervisor's budget) and the host's available
//! memory. `None` where there is no `/proc`.

/// Resident memory (VmRSS) of process `pid`, or of this process.
pub fn resident_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    kib_field(&path, "VmRSS:")
}

/// Memory the host can still give out now (MemAvailable).
pub fn available_bytes() -> Option<u64> {
    kib_field("/proc/meminfo", "MemAvailable:")
}

/// The `NAME: N kB` line of a /proc file, in bytes.
fn kib_field(path: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|line| line.starts_with(name))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_on_linux() {
        let own = resident_bytes(None).unwrap();
        assert!(own > 1 << 20, "{own}");
        let by_pid = resident_bytes(Some(std::process::id())).unwrap();
        assert!(by_pid > 1 << 20, "{by_pid}");
        assert!(available_bytes().is_some_and(|bytes| bytes > 0));
        assert_eq!(resident_bytes(Some(u32::MAX)), None);
    }
}
