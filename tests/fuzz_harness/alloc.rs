//! Per-thread accounting of heap use, so each fuzz execution can be held to a byte bound.
//!
//! The fuzz binary installs [`Counting`] as its global allocator. Counters are per thread
//! (targets run on the test's own thread, tests run in parallel), so another test's
//! allocations never count against an execution. A block freed on another thread than the
//! one that allocated it only lowers that thread's count, which can hide bytes, never
//! invent them: the bound stays sound for what it reports.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn add(delta: i64) {
    // `try_with`: allocations during thread teardown, after the slots are gone, are not counted.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        add(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

/// Runs `f` and returns the most heap bytes it held at once on this thread, above what the
/// thread held when it started.
pub fn peak_during(f: impl FnOnce()) -> u64 {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    f();
    let peak = PEAK.with(Cell::get);
    (peak - base).max(0) as u64
}
