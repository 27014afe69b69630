//! A global allocator that holds threads to a memory budget: the system
//! allocator, plus a per-thread count of live bytes for threads that enter
//! a [`MemoryBudget`] (a chat template's render). Untrusted code can grow a
//! string without bound in very few steps (`s ~ s` in a loop); a thread
//! past its budget is put to sleep for good instead of being given the
//! memory, and its caller, which watches [`budget_overruns`], gives up on
//! it. Threads outside a budget pay one thread-local read per call.
//!
//! It lives here because it needs `unsafe` (a `GlobalAlloc`), which only
//! this crate may use; it takes effect only in a binary that installs it
//! with `#[global_allocator]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// No budget: the thread allocates freely.
const UNLIMITED: u64 = u64::MAX;

thread_local! {
    /// Bytes the thread may still allocate, or [`UNLIMITED`].
    static LEFT: Cell<u64> = const { Cell::new(UNLIMITED) };
    /// The budget entered, to cap what frees give back.
    static CAP: Cell<u64> = const { Cell::new(UNLIMITED) };
}

/// Threads put to sleep for going past their budget, ever.
static OVERRUNS: AtomicU64 = AtomicU64::new(0);

/// How many threads have gone past their budget since the process started.
pub fn budget_overruns() -> u64 {
    OVERRUNS.load(Ordering::Acquire)
}

/// The system allocator, with per-thread budgets (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct BudgetAlloc;

/// A budget on the current thread's live allocations while it is held.
#[derive(Debug)]
pub struct MemoryBudget(());

impl MemoryBudget {
    /// Holds the current thread to `bytes` more live bytes than it has now
    /// (frees of memory it had before count as nothing).
    pub fn enter(bytes: u64) -> Self {
        let bytes = bytes.min(UNLIMITED - 1);
        LEFT.with(|l| l.set(bytes));
        CAP.with(|c| c.set(bytes));
        Self(())
    }
}

impl Drop for MemoryBudget {
    fn drop(&mut self) {
        LEFT.with(|l| l.set(UNLIMITED));
        CAP.with(|c| c.set(UNLIMITED));
    }
}

/// Counts `size` more bytes against the thread's budget; a thread past it
/// never returns.
fn charge(size: usize) {
    let left = LEFT.with(Cell::get);
    if left == UNLIMITED {
        return;
    }
    match left.checked_sub(size as u64) {
        Some(rest) => LEFT.with(|l| l.set(rest)),
        None => {
            OVERRUNS.fetch_add(1, Ordering::AcqRel);
            // Sleeping allocates nothing; the thread's memory so far (at
            // most its budget) stays with it.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
}

/// Gives `size` bytes back to the thread's budget, up to what it entered.
fn credit(size: usize) {
    let left = LEFT.with(Cell::get);
    if left == UNLIMITED {
        return;
    }
    let cap = CAP.with(Cell::get);
    LEFT.with(|l| l.set(left.saturating_add(size as u64).min(cap)));
}

// SAFETY: every call is passed to `System` unchanged; the budget only
// counts sizes, and a thread past it sleeps before allocating.
unsafe impl GlobalAlloc for BudgetAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        credit(layout.size());
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            charge(new_size - layout.size());
        } else {
            credit(layout.size() - new_size);
        }
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
