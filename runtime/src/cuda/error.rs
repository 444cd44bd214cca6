//! Errors of the CUDA backend. Every driver failure names what was being done.

use cudarc::driver::{sys, DriverError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    #[error("no CUDA driver found: {0}")]
    NoDriver(String),
    #[error("CUDA device {ordinal} does not exist ({count} device(s) visible; check CUDA_VISIBLE_DEVICES)")]
    NoDevice { ordinal: usize, count: usize },
    #[error("CUDA driver call failed while {op}: {source}")]
    Driver {
        op: String,
        #[source]
        source: DriverError,
    },
    #[error("out of device memory allocating {what}: requested {requested} bytes ({}), {free} bytes free ({}) of {total}", gib(*requested), gib(*free))]
    OutOfMemory {
        what: String,
        requested: u64,
        free: u64,
        total: u64,
    },
    #[error("out of pinned host memory allocating {what}: requested {requested} bytes: {source}")]
    PinnedAlloc {
        what: String,
        requested: u64,
        #[source]
        source: DriverError,
    },
    #[error("loading CUDA module `{module}` ({kind}): {source}{hint}")]
    ModuleLoad {
        module: String,
        kind: &'static str,
        #[source]
        source: DriverError,
        hint: &'static str,
    },
    #[error("not a kernel image: {0}")]
    BadImage(String),
    #[error("CUDA module `{module}` has no kernel `{kernel}`: {source}")]
    MissingKernel {
        module: String,
        kernel: String,
        #[source]
        source: DriverError,
    },
    #[error("kernel `{kernel}` asks for {requested} bytes of dynamic shared memory; the device allows {max_optin} per block, of which the kernel's static shared memory takes {static_bytes}")]
    SharedMemory {
        kernel: String,
        requested: u32,
        max_optin: u32,
        static_bytes: u32,
    },
    #[error("kernel `{kernel}`: {reason}")]
    BadLaunch { kernel: String, reason: String },
    #[error("{what}: byte range {offset}..{} is outside the {size}-byte buffer", offset + len)]
    OutOfBounds {
        what: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("weight `{name}`: {got} bytes given, but {dtype}{shape:?} needs {want}")]
    WeightSize {
        name: String,
        dtype: String,
        shape: Vec<usize>,
        got: u64,
        want: u64,
    },
    #[error("weight `{0}` is given twice")]
    DuplicateWeight(String),
    #[error("unknown weight `{0}` (not among the uploaded tensors)")]
    UnknownWeight(String),
    #[error("unknown state buffer `{0}`")]
    UnknownState(String),
    #[error("state `{name}` is declared twice with different sizes ({a} and {b} bytes)")]
    StateConflict { name: String, a: u64, b: u64 },
    #[error("state `{name}` of type {ty} has a dimension the bucket bindings leave unbound")]
    UnboundState { name: String, ty: String },
    #[error("pointer table `{table}`, slot {slot}: {reason}")]
    BadTableEntry {
        table: String,
        slot: usize,
        reason: String,
    },
    #[error("stream capture failed: {0}")]
    Capture(String),
    #[error("token ring overflow in lane {lane}: {unread} tokens were emitted since the last read but the ring holds {capacity}; read it more often or enlarge it")]
    RingOverflow {
        lane: usize,
        unread: u64,
        capacity: u64,
    },
    #[error("token ring of {lanes} lanes × {capacity} slots: {reason}")]
    RingShape {
        lanes: usize,
        capacity: usize,
        reason: String,
    },
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Attaches "what was being done" to a driver result.
pub(crate) trait DriverResultExt<T> {
    fn during(self, op: impl Into<String>) -> Result<T, CudaError>;
}

impl<T> DriverResultExt<T> for Result<T, DriverError> {
    fn during(self, op: impl Into<String>) -> Result<T, CudaError> {
        self.map_err(|source| CudaError::Driver {
            op: op.into(),
            source,
        })
    }
}

pub(crate) fn is_oom(e: &DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_message_names_bytes_and_free_memory() {
        let e = CudaError::OutOfMemory {
            what: "weights slab".into(),
            requested: 3 << 30,
            free: 1 << 30,
            total: 4 << 30,
        };
        let s = e.to_string();
        assert!(s.contains("weights slab"), "{s}");
        assert!(s.contains("3221225472 bytes (3.00 GiB)"), "{s}");
        assert!(s.contains("1073741824 bytes free (1.00 GiB)"), "{s}");
    }
}
