//! A small persistent pool of worker threads for the interpreter's heavy ops.
//!
//! [`parts`] runs `f(0)`, ..., `f(n - 1)` with part 0 on the calling thread and the others
//! on workers, and returns when every part has finished. Which thread computes a part never
//! changes what it computes: the ops split their output into parts whose every element is
//! computed in a fixed order, so results are identical for any thread count.
//!
//! The thread count is `SPECC_CPU_THREADS` if set (a positive integer), otherwise the
//! machine's available parallelism capped at [`MAX_DEFAULT_THREADS`]. Workers are started on
//! first use and live for the process.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};
use std::thread;

/// Upper bound of the default thread count (the interpreter's ops are small: more threads
/// cost more in wake-ups than they save).
pub const MAX_DEFAULT_THREADS: usize = 4;

/// The environment variable that sets the thread count.
pub const THREADS_VAR: &str = "SPECC_CPU_THREADS";

/// Threads the interpreter's ops use by default (see the module docs).
pub fn threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var(THREADS_VAR)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .min(MAX_DEFAULT_THREADS)
            })
    })
}

/// A part to run: the erased `f` and its index, and where to say it is done.
struct Job {
    f: &'static (dyn Fn(usize) + Sync),
    part: usize,
    done: Sender<thread::Result<()>>,
}

struct Pool {
    workers: Mutex<Vec<Sender<Job>>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        workers: Mutex::new(Vec::new()),
    })
}

fn spawn_worker() -> Sender<Job> {
    let (tx, rx) = channel::<Job>();
    thread::Builder::new()
        .name("specc-cpu".into())
        .spawn(move || {
            IN_WORKER.with(|w| w.set(true));
            for job in rx {
                let r = catch_unwind(AssertUnwindSafe(|| (job.f)(job.part)));
                // The caller waits for this message; if it is gone there is no one to tell.
                let _ = job.done.send(r);
            }
        })
        .expect("spawning an interpreter worker thread");
    tx
}

thread_local! {
    /// Set on pool workers: a part that itself splits runs its parts in line (waiting on a
    /// busy worker from a worker could deadlock).
    static IN_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f(i)` for every `i < n`, part 0 on this thread and the rest on workers, and
/// returns when all are done (a panic in any part is raised here, after all have ended).
pub(crate) fn parts(n: usize, f: &(dyn Fn(usize) + Sync)) {
    if n <= 1 || IN_WORKER.with(|w| w.get()) {
        (0..n).for_each(f);
        return;
    }
    // SAFETY: the erased reference is used only by the jobs sent below, and this function
    // does not return (nor unwind) before every one of them has reported back on `done`,
    // so `f` outlives every use. Workers catch panics, so each job always reports.
    let f_static: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let (done, results) = channel();
    let mut sent = 0;
    {
        let mut workers = pool().workers.lock().unwrap_or_else(|e| e.into_inner());
        while workers.len() < n - 1 {
            workers.push(spawn_worker());
        }
        for (i, w) in workers.iter().take(n - 1).enumerate() {
            let job = Job {
                f: f_static,
                part: i + 1,
                done: done.clone(),
            };
            if w.send(job).is_ok() {
                sent += 1;
            } else {
                // A dead worker (it cannot die while the pool lives, but be safe):
                // compute its part here.
                let r = catch_unwind(AssertUnwindSafe(|| f(i + 1)));
                done.send(r).expect("the receiver is alive");
                sent += 1;
            }
        }
    }
    let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
    let mut first_panic = mine.err();
    for _ in 0..sent {
        let r = results
            .recv()
            .expect("every sent job reports back before its sender is dropped");
        if let Err(p) = r {
            first_panic.get_or_insert(p);
        }
    }
    if let Some(p) = first_panic {
        resume_unwind(p);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn every_part_runs_once() {
        for n in [0, 1, 2, 3, 7] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            parts(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
    }

    #[test]
    fn a_panicking_part_is_raised_after_all_parts_end() {
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            parts(3, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 2 {
                    panic!("part 2");
                }
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 3);
        // The pool still works afterwards.
        let sum = AtomicUsize::new(0);
        parts(3, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 3);
    }
}
