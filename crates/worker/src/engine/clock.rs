//! Where the engine reads the time: the system clock when serving, a
//! virtual one that tests move by hand, so deadline and latency logic is
//! tested without sleeping.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The engine's source of `now` (request arrival, deadlines, timings).
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// [`Instant::now`].
    #[default]
    System,
    /// Time that moves only when told to.
    Virtual(VirtualClock),
}

impl Clock {
    /// The current time of this clock.
    pub fn now(&self) -> Instant {
        match self {
            Clock::System => Instant::now(),
            Clock::Virtual(clock) => clock.now(),
        }
    }
}

impl From<VirtualClock> for Clock {
    fn from(clock: VirtualClock) -> Self {
        Clock::Virtual(clock)
    }
}

/// A clock for tests: starts at a given instant and moves only by
/// [`VirtualClock::advance`]; clones share the same time.
#[derive(Debug, Clone)]
pub struct VirtualClock(Arc<Mutex<Instant>>);

impl VirtualClock {
    /// A clock standing at `start`.
    pub fn new(start: Instant) -> Self {
        VirtualClock(Arc::new(Mutex::new(start)))
    }

    /// The clock's time.
    pub fn now(&self) -> Instant {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}
