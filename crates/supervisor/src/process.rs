//! One worker process: started, watched, asked to stop, killed if it must.
//!
//! Its stderr is echoed with the worker id in front and its last lines are
//! kept, so a worker that dies while loading is reported with its reason.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{EXIT_WITH_PARENT, SPAWNED_WORKER, SpawnError, WorkerConfig};

/// Log lines kept per worker for failure reports.
const TAIL_LINES: usize = 12;

/// A running worker process.
pub(crate) struct WorkerProcess {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) device: String,
    /// Bytes reserved for it at spawn (its model's estimate).
    pub(crate) reserved: u64,
    /// Highest resident memory seen.
    pub(crate) peak_rss: u64,
    /// The metrics port slot it was given, to reuse once it exits.
    pub(crate) slot: Option<u16>,
    /// When to SIGKILL it, once asked to stop.
    pub(crate) kill_at: Option<Instant>,
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl WorkerProcess {
    /// Starts `exe` as a worker ([`SPAWNED_WORKER`]) with `envs` added and
    /// [`EXIT_WITH_PARENT`] set to this process, and writes `config` to its
    /// stdin.
    pub(crate) fn spawn(
        exe: &Path,
        config: &WorkerConfig,
        envs: &[(String, String)],
        id: &str,
    ) -> Result<Child, SpawnError> {
        let json = config.to_json()?;
        let mut child = Command::new(exe)
            .arg(SPAWNED_WORKER)
            .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(EXIT_WITH_PARENT, std::process::id().to_string())
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| SpawnError::Start {
                exe: exe.to_path_buf(),
                source,
            })?;
        tracing::info!(worker = id, pid = child.id(), "worker process started");
        // About 1 KiB, far under a pipe's buffer: the write does not wait
        // on the worker, and dropping the pipe then ends its input.
        if let Some(mut stdin) = child.stdin.take()
            && let Err(error) = stdin.write_all(json.as_bytes())
        {
            // It already exited; `watch` reports that with its last lines.
            tracing::warn!(worker = id, %error, "cannot hand the worker its configuration");
        }
        Ok(child)
    }

    /// Wraps a started child; its stderr is read on a thread of its own.
    pub(crate) fn watch(
        mut child: Child,
        id: String,
        model: String,
        device: String,
        reserved: u64,
        slot: Option<u16>,
    ) -> Self {
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        if let Some(stderr) = child.stderr.take() {
            let (tail, prefix) = (Arc::clone(&tail), id.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("log-{id}"))
                .spawn(move || {
                    for line in BufReader::new(stderr).lines() {
                        let Ok(line) = line else { break };
                        eprintln!("[{prefix}] {line}");
                        let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                        if tail.len() == TAIL_LINES {
                            tail.pop_front();
                        }
                        tail.push_back(line);
                    }
                });
            if let Err(error) = spawned {
                tracing::warn!(%error, worker = %id, "cannot read the worker's log");
            }
        }
        WorkerProcess {
            id,
            model,
            device,
            reserved,
            peak_rss: 0,
            slot,
            kill_at: None,
            child,
            tail,
        }
    }

    /// The exit status, once it exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Resident memory now (and the peak is updated).
    pub(crate) fn resident(&mut self) -> u64 {
        let rss = zinfer_probe::procfs::resident_bytes(Some(self.child.id())).unwrap_or(0);
        self.peak_rss = self.peak_rss.max(rss);
        rss
    }

    /// SIGTERM: the worker finishes its requests within its grace and exits.
    pub(crate) fn terminate(&self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }

    /// SIGKILL, and reap it.
    pub(crate) fn kill(&mut self) {
        tracing::warn!(worker = %self.id, "worker did not exit in time; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its last log lines, joined, for a failure report.
    pub(crate) fn log_tail(&self) -> String {
        let tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
        tail.iter().cloned().collect::<Vec<_>>().join(" | ")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A "worker" that writes what it was started with to a file: the
    /// variable that makes a real worker exit with its supervisor is set to
    /// this process, and the configuration arrives on stdin.
    #[test]
    fn a_worker_is_told_its_parent_and_handed_its_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("seen");
        let exe = dir.path().join("fake-zinfer");
        std::fs::write(
            &exe,
            format!(
                "#!/bin/sh\n{{ echo \"$1 $ZINFER_EXIT_WITH_PARENT\"; cat; }} > '{}'\n",
                seen.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = crate::config::tests::config();
        let mut child = WorkerProcess::spawn(&exe, &config, &[], "w1").unwrap();
        assert!(child.wait().unwrap().success());
        let seen = std::fs::read_to_string(&seen).unwrap();
        let (first, json) = seen.split_once('\n').unwrap();
        assert_eq!(first, format!("{SPAWNED_WORKER} {}", std::process::id()));
        assert_eq!(WorkerConfig::read(json.as_bytes()).unwrap(), config);
    }
}
