//! Timing on the device: graph replays and single launches timed with CUDA events, and the
//! device-to-device copy bandwidth that defines the roofline.

use cudarc::driver::sys::CUevent_flags;

use super::{CudaDevice, LoadedGraph, StepGraph};
use crate::RuntimeError;

fn drv(e: cudarc::driver::DriverError, what: &str) -> RuntimeError {
    RuntimeError::Engine(format!("{what}: {e}"))
}

/// Milliseconds of each of `iters` replays (after `warmup` untimed ones), each bracketed by
/// its own pair of events.
pub fn time_replays(
    dev: &CudaDevice,
    g: &StepGraph,
    warmup: usize,
    iters: usize,
) -> Result<Vec<f32>, RuntimeError> {
    for _ in 0..warmup {
        g.replay()?;
    }
    let ctx = dev.context();
    let s = dev.stream();
    let mut events = Vec::with_capacity(iters + 1);
    for _ in 0..=iters {
        events.push(
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| drv(e, "creating an event"))?,
        );
    }
    events[0].record(s).map_err(|e| drv(e, "recording"))?;
    for ev in &events[1..] {
        g.replay()?;
        ev.record(s).map_err(|e| drv(e, "recording"))?;
    }
    dev.synchronize()?;
    events
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map_err(|e| drv(e, "reading an event"))
        })
        .collect()
}

/// Median milliseconds of each launch of `g` issued alone (`reps` times each).
pub fn time_launches(
    dev: &CudaDevice,
    g: &LoadedGraph,
    reps: usize,
) -> Result<Vec<f32>, RuntimeError> {
    let ctx = dev.context();
    let s = dev.stream();
    let mut out = Vec::with_capacity(g.launches.len());
    for l in &g.launches {
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let a = ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| drv(e, "event"))?;
            let b = ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| drv(e, "event"))?;
            a.record(s).map_err(|e| drv(e, "recording"))?;
            super::launch_all(dev, std::slice::from_ref(l))?;
            b.record(s).map_err(|e| drv(e, "recording"))?;
            times.push(a.elapsed_ms(&b).map_err(|e| drv(e, "reading an event"))?);
        }
        out.push(median(&mut times));
    }
    Ok(out)
}

/// Device-to-device copy bandwidth in bytes/s, read + write counted (the roofline's ceiling).
pub fn copy_bandwidth(dev: &CudaDevice, bytes: u64) -> Result<f64, RuntimeError> {
    let a = dev.alloc_zeroed("bandwidth source", bytes)?;
    let b = dev.alloc_zeroed("bandwidth destination", bytes)?;
    let ctx = dev.context();
    let s = dev.stream();
    let copy = || -> Result<(), RuntimeError> {
        // SAFETY: both buffers are live allocations of `bytes` bytes on this context, and the
        // copy is ordered on the stream that owns them.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                b.ptr(),
                a.ptr(),
                bytes as usize,
                s.cu_stream(),
            )
            .map_err(|e| drv(e, "device copy"))
        }
    };
    copy()?;
    let mut times = Vec::new();
    for _ in 0..10 {
        let e0 = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| drv(e, "event"))?;
        let e1 = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| drv(e, "event"))?;
        e0.record(s).map_err(|e| drv(e, "recording"))?;
        copy()?;
        e1.record(s).map_err(|e| drv(e, "recording"))?;
        times.push(e0.elapsed_ms(&e1).map_err(|e| drv(e, "reading an event"))?);
    }
    let ms = median(&mut times) as f64;
    Ok(2.0 * bytes as f64 / (ms * 1e-3))
}

pub fn median(v: &mut [f32]) -> f32 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}
