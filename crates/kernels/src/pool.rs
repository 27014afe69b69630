//! The kernels' thread pool: `threads - 1` helper threads that take units
//! of a parallel region beside the calling thread.
//!
//! A barrier pool (candle's, or OpenMP's) makes every region wait for every
//! thread: when another process holds a core, a helper descheduled before it
//! reached the region stalls the caller for a time slice, in each of the
//! ~250 regions of a decode step. Here the caller never waits for a helper
//! that has not started: units are claimed from a shared cursor, a helper
//! may join a region only while it is open, and the caller closes it once
//! every unit is claimed, then waits only for the helpers inside (each
//! finishing the chunk it claimed). Idle helpers spin for a while (the
//! regions of a step follow each other within microseconds, and steps within
//! a millisecond), then park.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle helper spins before it parks.
const SPIN: Duration = Duration::from_millis(1);
/// How long the caller spins on helpers still inside a closed region before
/// it yields its core to them (they may share it).
const CLOSE_SPIN: Duration = Duration::from_micros(50);

/// The state word: generation in the high 32 bits, then the closed flag,
/// then the number of helpers inside the region.
mod state {
    pub(super) const CLOSED: u64 = 1 << 31;
    pub(super) const INSIDE: u64 = CLOSED - 1;

    pub(super) fn open(generation: u32) -> u64 {
        u64::from(generation) << 32
    }

    pub(super) fn generation(state: u64) -> u32 {
        (state >> 32) as u32
    }

    /// The state after one more helper enters, if the region of
    /// `generation` is still open.
    pub(super) fn enter(state: u64, generation: u32) -> Option<u64> {
        (self::generation(state) == generation && state & CLOSED == 0).then_some(state + 1)
    }
}

/// One parallel region, on the caller's stack.
struct Region<'a> {
    run: &'a (dyn Fn(Range<usize>) + Sync),
    units: usize,
    chunk: usize,
    cursor: AtomicUsize,
}

impl Region<'_> {
    /// Claims and runs chunks until none is left.
    fn work(&self) {
        loop {
            let start = self.cursor.fetch_add(self.chunk, Ordering::Relaxed);
            if start >= self.units {
                return;
            }
            (self.run)(start..self.units.min(start + self.chunk));
        }
    }
}

struct Shared {
    state: AtomicU64,
    /// The open region; valid while a helper is counted inside it.
    region: AtomicPtr<Region<'static>>,
    /// Helpers parked or about to park.
    sleepers: AtomicUsize,
    stop: AtomicBool,
    /// A helper's panic, re-raised on the caller.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// A fixed set of helper threads; see the module documentation.
pub(crate) struct RegionPool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Held by the thread running a region; others (tests running in
    /// parallel, a unit that opens a region itself) run theirs inline.
    caller: Mutex<u32>,
}

impl RegionPool {
    /// A pool of `threads` threads in all: the caller and `threads - 1` helpers.
    pub(crate) fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(state::open(0) | state::CLOSED),
            region: AtomicPtr::new(std::ptr::null_mut()),
            sleepers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panic: Mutex::new(None),
        });
        let helpers = (1..threads.max(1))
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("zinfer-kernel-{i}"))
                    .spawn(move || helper(&shared))
                    .expect("spawning a kernel thread")
            })
            .collect();
        Self {
            shared,
            helpers,
            caller: Mutex::new(0),
        }
    }

    /// Threads that run a region: the caller and the helpers.
    pub(crate) fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Runs `f` over `0..units`, in chunks, on the caller and every helper
    /// that joins in time. Returns when every unit has run.
    pub(crate) fn run(&self, units: usize, f: impl Fn(Range<usize>) + Sync) {
        if units == 0 {
            return;
        }
        let mut generation = match self.caller.try_lock() {
            Ok(guard) => guard,
            // A region that panicked poisons the lock; its state is whole.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                f(0..units);
                return;
            }
        };
        if self.helpers.is_empty() || units == 1 {
            f(0..units);
            return;
        }
        *generation = generation.wrapping_add(1);
        let region = Region {
            run: &f,
            units,
            chunk: units.div_ceil(self.threads() * 8),
            cursor: AtomicUsize::new(0),
        };
        let shared = &*self.shared;
        // The pointer outlives its use: helpers read it only while counted
        // inside, and `Close` below waits for that count to reach zero
        // before this frame (and `f`) goes away, also when `f` panics.
        shared.region.store(
            std::ptr::from_ref(&region)
                .cast::<Region<'static>>()
                .cast_mut(),
            Ordering::Relaxed,
        );
        shared
            .state
            .store(state::open(*generation), Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            for helper in &self.helpers {
                helper.thread().unpark();
            }
        }
        let close = Close(shared);
        region.work();
        drop(close);
        if let Some(payload) = shared
            .panic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            std::panic::resume_unwind(payload);
        }
    }
}

/// Closes the open region on drop and waits for the helpers inside it.
struct Close<'a>(&'a Shared);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        let mut inside = self.0.state.fetch_or(state::CLOSED, Ordering::AcqRel) & state::INSIDE;
        let start = Instant::now();
        while inside != 0 {
            if start.elapsed() < CLOSE_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            inside = self.0.state.load(Ordering::Acquire) & state::INSIDE;
        }
    }
}

impl Drop for RegionPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for helper in &self.helpers {
            helper.thread().unpark();
        }
        for helper in self.helpers.drain(..) {
            let _ = helper.join();
        }
    }
}

/// A helper's life: wait for a new generation, join it if still open, work.
fn helper(shared: &Shared) {
    let mut seen = state::generation(shared.state.load(Ordering::Acquire));
    loop {
        let Some(generation) = next_generation(shared, seen) else {
            return;
        };
        seen = generation;
        let mut current = shared.state.load(Ordering::Acquire);
        let entered = loop {
            let Some(next) = state::enter(current, generation) else {
                break false;
            };
            match shared.state.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break true,
                Err(now) => current = now,
            }
        };
        if !entered {
            continue;
        }
        // SAFETY: counted inside an open region, whose caller waits for this
        // helper to leave before the region goes away.
        let region = unsafe { &*shared.region.load(Ordering::Relaxed) };
        if let Err(payload) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| region.work()))
        {
            // The region has failed (the chunk this helper claimed did
            // not finish): the caller re-raises the panic.
            *shared.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(payload);
        }
        shared.state.fetch_sub(1, Ordering::Release);
    }
}

/// Waits for a generation other than `seen`: spins, then parks. `None` when
/// the pool is dropped.
fn next_generation(shared: &Shared, seen: u32) -> Option<u32> {
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if shared.stop.load(Ordering::Relaxed) {
                return None;
            }
            let generation = state::generation(shared.state.load(Ordering::Acquire));
            if generation != seen {
                return Some(generation);
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() >= SPIN {
                break;
            }
            std::hint::spin_loop();
        }
        shared.sleepers.fetch_add(1, Ordering::SeqCst);
        // Checked again after announcing the sleep: a caller that opened a
        // region before it saw the announcement is seen here; one after it
        // unparks this thread (an unpark before park makes park return).
        let generation = state::generation(shared.state.load(Ordering::SeqCst));
        if generation == seen && !shared.stop.load(Ordering::SeqCst) {
            std::thread::park();
        }
        shared.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

static POOL: OnceLock<RegionPool> = OnceLock::new();

/// The process's pool, created on first use with `threads` threads, or, when
/// `None`, as many as `CANDLE_NUM_THREADS` / `RAYON_NUM_THREADS` say (the
/// variables the worker binary sets from `--threads`), else one per core.
pub(crate) fn global(threads: Option<usize>) -> &'static RegionPool {
    POOL.get_or_init(|| {
        let threads = threads.or_else(threads_from_env).unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        RegionPool::new(threads)
    })
}

fn threads_from_env() -> Option<usize> {
    ["CANDLE_NUM_THREADS", "RAYON_NUM_THREADS"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.parse().ok())
        .filter(|&n: &usize| n > 0)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    fn counts(units: usize) -> Vec<AtomicU32> {
        (0..units).map(|_| AtomicU32::new(0)).collect()
    }

    #[test]
    fn every_unit_runs_exactly_once_region_after_region() {
        let pool = RegionPool::new(3);
        for units in [1, 2, 3, 7, 24, 25, 1000] {
            for _ in 0..50 {
                let seen = counts(units);
                pool.run(units, |range| {
                    for u in range {
                        seen[u].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn helpers_take_part_and_park_when_idle() {
        let pool = RegionPool::new(2);
        let helper_ran = AtomicBool::new(false);
        let caller = std::thread::current().id();
        for _ in 0..200 {
            pool.run(64, |_| {
                if std::thread::current().id() != caller {
                    helper_ran.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_micros(20));
            });
        }
        assert!(
            helper_ran.load(Ordering::Relaxed),
            "the helper never took a unit"
        );
        // Idle past the spin time: the helper parks, and the next region wakes it.
        let idle = Instant::now();
        while pool.shared.sleepers.load(Ordering::SeqCst) == 0 {
            assert!(
                idle.elapsed() < Duration::from_secs(10),
                "the idle helper never parked"
            );
            std::thread::sleep(SPIN);
        }
        let seen = counts(100);
        pool.run(100, |range| {
            for u in range {
                seen[u].fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn a_closed_or_stale_region_admits_no_helper() {
        let open = state::open(7);
        assert_eq!(state::enter(open, 7), Some(open + 1));
        assert_eq!(state::enter(open + 2, 7), Some(open + 3));
        assert_eq!(state::enter(open | state::CLOSED, 7), None);
        assert_eq!(state::enter(open, 6), None);
        assert_eq!(state::generation(state::open(u32::MAX) + 5), u32::MAX);
    }

    #[test]
    fn nested_and_concurrent_regions_run_inline() {
        let pool = Arc::new(RegionPool::new(2));
        let total = AtomicU32::new(0);
        pool.run(8, |outer| {
            for _ in outer {
                pool.run(4, |inner| {
                    total.fetch_add(inner.len() as u32, Ordering::Relaxed);
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 32);
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    let sum = AtomicU32::new(0);
                    for _ in 0..200 {
                        pool.run(16, |range| {
                            sum.fetch_add(range.len() as u32, Ordering::Relaxed);
                        });
                    }
                    sum.load(Ordering::Relaxed)
                })
            })
            .collect();
        for caller in callers {
            assert_eq!(caller.join().expect("caller thread"), 16 * 200);
        }
    }

    #[test]
    fn a_panicking_unit_reaches_the_caller_and_the_pool_survives() {
        let pool = RegionPool::new(2);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(64, |range| {
                if range.contains(&40) {
                    panic!("unit 40");
                }
            });
        }));
        assert!(result.is_err());
        let seen = counts(64);
        pool.run(64, |range| {
            for u in range {
                seen[u].fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }
}
