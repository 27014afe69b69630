//! Limits on rendering a chat template, which is code from whoever made the
//! checkpoint: steps (minijinja's fuel), recursion depth, output length,
//! template size, wall time and, where the process installs
//! [`TemplateAlloc`], memory.
//!
//! A render runs on a thread of its own, so a caller (the worker's socket
//! loop, which also sends heartbeats) waits at most [`WALL_TIME`] however
//! long the template would run. A thread that overruns keeps running until
//! its fuel is spent (or, past its memory budget, sleeps for good); while
//! [`MAX_RUNAWAYS`] of them are alive, new renders are refused at once, so
//! a stream of hostile requests cannot keep a caller waiting.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use minijinja::{Environment, ErrorKind, Value};

pub use zinfer_kernels::alloc::BudgetAlloc as TemplateAlloc;
use zinfer_kernels::alloc::{MemoryBudget, budget_overruns};

/// Instructions one render may run (minijinja's fuel): a real template
/// spends a few hundred per message.
pub const FUEL: u64 = 2_000_000;
/// Deepest nesting of macro calls, includes and recursive loops.
pub const RECURSION: usize = 64;
/// Longest rendered prompt, in bytes.
pub const OUTPUT_BYTES: usize = 16 << 20;
/// Largest template source, in bytes (real ones are tens of KiB).
pub const TEMPLATE_BYTES: usize = 512 << 10;
/// Longest a caller waits for a render.
pub const WALL_TIME: Duration = Duration::from_millis(500);
/// Memory one render may hold, where [`TemplateAlloc`] is the process's
/// allocator.
pub const MEMORY_BYTES: u64 = 64 << 20;
/// Renders past their limits that may still be running before new
/// renders are refused without waiting.
pub const MAX_RUNAWAYS: usize = 4;

/// How often the caller looks at a running render.
const POLL: Duration = Duration::from_millis(2);

/// Renders given up on whose threads have not ended.
static RUNAWAYS: AtomicUsize = AtomicUsize::new(0);

/// A render's state, shared by its thread and its caller.
const RUNNING: u8 = 0;
const DONE: u8 = 1;
const ABANDONED: u8 = 2;

/// Why a render stopped at a limit, as the error names it.
pub(crate) fn limit_message(limit: &str) -> String {
    format!("the chat template exceeded its {limit}")
}

/// Whether a render error is one of the limits (not the template's own
/// refusal of a conversation).
pub(crate) fn is_limit(message: &str) -> bool {
    message.starts_with("the chat template exceeded its")
}

/// The limits a template environment enforces itself.
pub(crate) fn configure(env: &mut Environment<'static>) {
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(RECURSION);
}

/// Renders the environment's template `name` with `context` on a thread of
/// its own, within every limit; the error names the limit that stopped it.
pub(crate) fn render(
    env: &Arc<Environment<'static>>,
    name: &'static str,
    context: Value,
    describe: fn(&minijinja::Error) -> String,
) -> Result<String, String> {
    let runaways = RUNAWAYS.load(Ordering::Acquire);
    if runaways >= MAX_RUNAWAYS {
        return Err(limit_message(&format!(
            "limits on {runaways} earlier renders that are still running: refused until they end (one past its memory limit never does; restart the worker then)"
        )));
    }
    let state = Arc::new(AtomicU8::new(RUNNING));
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let env = Arc::clone(env);
    let thread_state = Arc::clone(&state);
    let overruns_before = budget_overruns();
    let spawned = std::thread::Builder::new()
        .name("chat-template".into())
        .spawn(move || {
            let result = {
                let _budget = MemoryBudget::enter(MEMORY_BYTES);
                let mut out = Bounded::default();
                let rendered = env
                    .get_template(name)
                    .and_then(|t| t.render_captured_to(context, &mut out).map(drop));
                match rendered {
                    Ok(()) => String::from_utf8(out.bytes).map_err(|e| e.to_string()),
                    Err(_) if out.overflowed => Err(limit_message(&format!(
                        "output limit of {OUTPUT_BYTES} bytes"
                    ))),
                    Err(e) => Err(match e.kind() {
                        ErrorKind::OutOfFuel => {
                            limit_message(&format!("step limit of {FUEL} instructions"))
                        }
                        _ if e.to_string().contains("recursion limit exceeded") => {
                            limit_message(&format!("recursion limit of {RECURSION}"))
                        }
                        _ => describe(&e),
                    }),
                }
            };
            let _ = tx.send(result);
            if thread_state
                .compare_exchange(RUNNING, DONE, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                RUNAWAYS.fetch_sub(1, Ordering::AcqRel);
            }
        });
    if let Err(e) = spawned {
        return Err(format!(
            "cannot start a thread to render the chat template: {e}"
        ));
    }
    let deadline = Instant::now() + WALL_TIME;
    loop {
        match rx.recv_timeout(POLL) {
            Ok(result) => return result,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err("the chat template's render thread failed".into());
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        let over_memory = budget_overruns() != overruns_before;
        if (over_memory || Instant::now() >= deadline)
            && state
                .compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            RUNAWAYS.fetch_add(1, Ordering::AcqRel);
            return Err(limit_message(&if over_memory {
                format!("memory limit of {} MiB", MEMORY_BYTES >> 20)
            } else {
                format!("time limit of {} ms", WALL_TIME.as_millis())
            }));
        }
    }
}

/// The rendered prompt, refusing to grow past [`OUTPUT_BYTES`].
#[derive(Default)]
struct Bounded {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > OUTPUT_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
