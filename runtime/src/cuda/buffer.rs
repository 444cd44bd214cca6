//! Owned device and pinned host allocations.
//!
//! Every device allocation of the backend is a [`DeviceBuffer`] behind an `Arc`: kernels
//! get raw addresses, and whatever captures those addresses into a graph (a
//! [`PreparedLaunch`](super::PreparedLaunch), a [`StepGraph`](super::StepGraph), a pointer
//! table) holds the `Arc`, so memory cannot be freed while a graph may still read it.
//!
//! All copies and memsets go on the device's one stream, in issue order.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaStream};

use super::error::{is_oom, CudaError, DriverResultExt};
use crate::RuntimeError;

/// Every allocation is rounded up to this many bytes (and the driver returns addresses
/// aligned to at least this), so 16-byte vector loads never cross the end of a buffer.
pub const ALLOC_GRANULE: u64 = 256;

/// A device allocation made with `cuMemAlloc`, freed (after the stream drains) on drop.
///
/// Invariant: `ptr..ptr + alloc_bytes` is a live allocation of this context, and
/// `bytes <= alloc_bytes`.
pub struct DeviceBuffer {
    ptr: u64,
    bytes: u64,
    alloc_bytes: u64,
    label: String,
    stream: Arc<CudaStream>,
    /// Buffers whose addresses are stored inside this one (a pointer table names its slab):
    /// they must live at least as long.
    deps: Vec<Arc<DeviceBuffer>>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("label", &self.label)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `bytes` (contents undefined). Out of memory is reported with the bytes
    /// requested and the bytes free.
    pub(crate) fn alloc_uninit(
        stream: &Arc<CudaStream>,
        label: &str,
        bytes: u64,
    ) -> Result<DeviceBuffer, CudaError> {
        let ctx = stream.context();
        ctx.bind_to_thread()
            .during(format!("binding the context to allocate {label}"))?;
        let alloc_bytes = bytes.max(1).next_multiple_of(ALLOC_GRANULE);
        // SAFETY: the context is current on this thread; the memory is left uninitialised and
        // is only handed out as a raw address, never as a typed Rust value.
        let ptr = match unsafe { result::malloc_sync(alloc_bytes as usize) } {
            Ok(p) => p,
            Err(e) if is_oom(&e) => {
                let (free, total) = result::mem_get_info().unwrap_or((0, 0));
                return Err(CudaError::OutOfMemory {
                    what: label.to_string(),
                    requested: alloc_bytes,
                    free: free as u64,
                    total: total as u64,
                });
            }
            Err(e) => return Err(e).during(format!("allocating {alloc_bytes} bytes for {label}")),
        };
        Ok(DeviceBuffer {
            ptr,
            bytes,
            alloc_bytes,
            label: label.to_string(),
            stream: stream.clone(),
            deps: Vec::new(),
        })
    }

    /// Allocates `bytes` and enqueues a memset to zero of the whole allocation.
    pub(crate) fn alloc_zeroed(
        stream: &Arc<CudaStream>,
        label: &str,
        bytes: u64,
    ) -> Result<DeviceBuffer, CudaError> {
        let b = Self::alloc_uninit(stream, label, bytes)?;
        b.memset(0, b.alloc_bytes)?;
        Ok(b)
    }

    pub(crate) fn with_deps(mut self, deps: Vec<Arc<DeviceBuffer>>) -> Self {
        self.deps = deps;
        self
    }

    /// Device address of byte 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes requested (the allocation may be larger, up to [`ALLOC_GRANULE`]).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Device address of `offset`, checked so that `offset..offset + len` lies inside.
    pub fn addr(&self, offset: u64, len: u64) -> Result<u64, RuntimeError> {
        self.check(offset, len)?;
        Ok(self.ptr + offset)
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), CudaError> {
        check_range(&self.label, offset, len, self.bytes)
    }

    /// Enqueues a copy of `data` to `offset`. `data` may be freed as soon as this returns:
    /// the driver stages pageable memory before returning.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), RuntimeError> {
        self.check(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let ctx = self.stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        // SAFETY: the destination range was bounds-checked against this live allocation;
        // the source is a valid host slice for the duration of the call, and pageable
        // sources are staged by the driver before the call returns.
        unsafe { result::memcpy_htod_async(self.ptr + offset, data, self.stream.cu_stream()) }
            .during(format!("copying {} bytes to {}", data.len(), self.label))?;
        Ok(())
    }

    /// Enqueues a device-to-device copy of `len` bytes of `src` at `src_offset` to
    /// `offset`.
    pub fn copy_from(
        &self,
        offset: u64,
        src: &DeviceBuffer,
        src_offset: u64,
        len: u64,
    ) -> Result<(), RuntimeError> {
        self.check(offset, len)?;
        src.check(src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let ctx = self.stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        // SAFETY: both ranges were bounds-checked against live allocations of this context;
        // the copy is ordered on the stream with every other use of them.
        unsafe {
            result::memcpy_dtod_async(
                self.ptr + offset,
                src.ptr + src_offset,
                len as usize,
                self.stream.cu_stream(),
            )
        }
        .during(format!(
            "copying {len} bytes of {} to {}",
            src.label, self.label
        ))?;
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` into `out`, after all work queued before it on
    /// the stream; blocks until the bytes are there.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<(), RuntimeError> {
        self.check(offset, out.len() as u64)?;
        if out.is_empty() {
            return Ok(());
        }
        let ctx = self.stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        let n = out.len();
        let what = || format!("reading {n} bytes of {}", self.label);
        // SAFETY: the source range was bounds-checked; `out` stays borrowed until the stream
        // is synchronised below, so the copy never outlives it.
        unsafe { result::memcpy_dtoh_async(out, self.ptr + offset, self.stream.cu_stream()) }
            .during(what())?;
        self.stream.synchronize().during(what())?;
        Ok(())
    }

    /// [`read_into`](Self::read_into) a new vector.
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, RuntimeError> {
        self.check(offset, len)?;
        let mut out = vec![0u8; len as usize];
        self.read_into(offset, &mut out)?;
        Ok(out)
    }

    /// Enqueues a memset to zero of `offset..offset + len`.
    pub fn zero(&self, offset: u64, len: u64) -> Result<(), RuntimeError> {
        self.check(offset, len)?;
        Ok(self.memset(offset, len)?)
    }

    fn memset(&self, offset: u64, len: u64) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        let ctx = self.stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        // SAFETY: callers pass a range inside the allocation (`check` or `alloc_bytes`).
        unsafe {
            result::memset_d8_async(self.ptr + offset, 0, len as usize, self.stream.cu_stream())
        }
        .during(format!("zeroing {len} bytes of {}", self.label))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let ctx = self.stream.context();
        ctx.record_err(ctx.bind_to_thread());
        // Work already queued (a replay, a copy) may still use the memory.
        ctx.record_err(self.stream.synchronize());
        // SAFETY: `ptr` came from `cuMemAlloc` in this context and is freed exactly once;
        // the stream that uses it has drained, and every holder of the address (graphs,
        // launches, tables) holds this buffer's `Arc`, so none is left.
        ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}

/// Page-locked host memory (`cuMemHostAlloc`), for staging uploads and for mirrors the
/// device copies into asynchronously.
///
/// Invariant: `ptr..ptr + bytes` is a live pinned allocation; the owner never reads or
/// writes a range while a copy into or out of it is in flight on the stream.
pub(crate) struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    stream: Arc<CudaStream>,
}

// SAFETY: the buffer exclusively owns its pinned allocation (like a `Vec`); pinned memory is
// valid in every thread of the process, and `&self` access only reads it.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// `write_combined` suits memory the host only writes and the device only reads
    /// (upload staging); host reads of write-combined memory are very slow.
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        what: &str,
        bytes: usize,
        write_combined: bool,
    ) -> Result<PinnedBuffer, CudaError> {
        let ctx = stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        let flags = if write_combined {
            sys::CU_MEMHOSTALLOC_WRITECOMBINED
        } else {
            0
        };
        let bytes = bytes.max(1);
        // SAFETY: the context is current; the memory is zeroed below before any read.
        let ptr = unsafe { result::malloc_host(bytes, flags) }.map_err(|source| {
            CudaError::PinnedAlloc {
                what: what.to_string(),
                requested: bytes as u64,
                source,
            }
        })? as *mut u8;
        // SAFETY: `ptr` is a fresh host allocation of `bytes` bytes that nothing else uses.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(PinnedBuffer {
            ptr,
            bytes,
            stream: stream.clone(),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes
    }

    /// The bytes. Callers guarantee no device copy into this buffer is in flight (they
    /// waited on the event recorded after the last one).
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: live allocation of `bytes` bytes (invariant); the caller upholds the
        // no-copy-in-flight rule stated above, so nothing writes it while borrowed.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    /// Mutable bytes; same rule as [`as_slice`](Self::as_slice), for copies out of it.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let ctx = self.stream.context();
        ctx.record_err(ctx.bind_to_thread());
        // Copies into or out of the buffer may still be queued.
        ctx.record_err(self.stream.synchronize());
        // SAFETY: `ptr` came from `cuMemHostAlloc` and is freed exactly once, after the only
        // stream that copies with it has drained.
        ctx.record_err(unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) });
    }
}

/// That `offset..offset + len` lies inside `size` bytes of `what` (a buffer, or a named
/// range of one).
pub(super) fn check_range(what: &str, offset: u64, len: u64, size: u64) -> Result<(), CudaError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(CudaError::OutOfBounds {
            what: what.to_string(),
            offset,
            len,
            size,
        }),
    }
}
