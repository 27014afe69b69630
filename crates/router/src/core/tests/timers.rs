//! `poll_timeout`: an idle core sleeps until its next timer, and a loop
//! that ticks only when `poll_timeout` says so misses no timer.

use super::*;

impl Harness {
    /// Jumps the clock to the core's next timer and ticks, as the I/O loop
    /// does when nothing arrives; returns how far the clock moved.
    fn sleep_until_timer(&mut self) -> Duration {
        let wake = self.core.poll_timeout();
        assert!(wake > self.now, "poll_timeout must lie in the future");
        let slept = wake - self.now;
        self.now = wake;
        self.core.tick(self.now);
        slept
    }
}

#[test]
fn idle_core_sleeps_until_its_heartbeat() {
    let mut h = Harness::new(config(Policy::RoundRobin));
    // No workers, no requests: only the heartbeat timer.
    assert_eq!(h.sleep_until_timer(), Duration::from_secs(1));
    assert_eq!(h.sleep_until_timer(), Duration::from_secs(1));
    h.ready("w1", &["m"], 8);
    h.sent();
    // A worker that keeps heartbeating: the core wakes once per heartbeat.
    for _ in 0..5 {
        h.worker("w1", &WorkerToRouter::Heartbeat {});
        let slept = h.sleep_until_timer();
        assert!(slept >= Duration::from_millis(900), "woke after {slept:?}");
    }
}

#[test]
fn ticking_only_at_poll_timeout_still_fires_deadlines_and_expiry() {
    let mut h = Harness::new(RouterConfig {
        max_inflight_per_worker: Some(1),
        ..config(Policy::RoundRobin)
    });
    let start = h.now;
    h.ready("w1", &["m"], 8);
    h.generate("c", prompt("1", "a"));
    let mut late = prompt("2", "b");
    late.deadline_ms = Some(250);
    h.generate("c", late);
    h.sent();
    // The queued request's deadline is the first timer.
    assert_eq!(h.sleep_until_timer(), Duration::from_millis(250));
    let replies = h.client_replies();
    assert_eq!(error_code(&replies[0]), (Some("2"), ErrorCode::Deadline));
    // The silent worker is lost right after its 3 s expiry, not a
    // heartbeat interval later.
    while h.core.worker_infos(h.now)[0].state != WorkerState::Lost {
        h.sleep_until_timer();
        assert!(h.now - start < Duration::from_secs(4), "expiry missed");
    }
    let lost_after = h.now - start;
    assert!(
        lost_after > Duration::from_secs(3) && lost_after < Duration::from_millis(3_010),
        "lost after {lost_after:?}"
    );
    let replies = h.client_replies();
    assert_eq!(error_code(&replies[0]), (Some("1"), ErrorCode::WorkerLost));
}
