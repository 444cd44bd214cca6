//! The generic launcher: checked kernel launches issued in order on the device's stream.
//!
//! A [`PreparedLaunch`] is checked once when it is made (geometry against the device and
//! the kernel's limits, shared memory against what the kernel opted in to, and, where the
//! driver reports it, the parameter list against the kernel's signature), so issuing a list
//! of them, eagerly or under capture, does no work beyond `cuLaunchKernel`.
//!
//! Kernel parameters are copied by value into the launch (and into the graph node under
//! capture), so the host-side values need to live only for the call.
//!
//! Programmatic dependent launch (PDL): a launch marked [`PreparedLaunch::with_pdl`] is
//! issued, when the device has PDL on ([`CudaDevice::pdl_enabled`]), through
//! `cuLaunchKernelEx` with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: its blocks
//! may start while the previous kernel in the stream still runs (under capture this becomes a
//! programmatic graph edge). Off unless `SPECC_PDL=1` (measured slower in every step graph:
//! [`super::device::pdl_default`]). Only kernels that execute
//! `griddepcontrol.wait` before touching memory an earlier kernel writes or reads may be
//! marked: every generated kernel does (`pdl_enter` in kernels-gen's `cuda/common.cuh`).
//! The attribute only relaxes an edge from a preceding kernel; after a copy or memset, or as
//! the first node of a graph, the launch depends on its predecessor fully as usual.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{CUfunction_attribute as FnAttr, CUresult};
use cudarc::driver::{result, sys};

use super::module::KernelFunction;

use super::buffer::DeviceBuffer;
use super::device::CudaDevice;
use super::error::{CudaError, DriverResultExt};
use crate::RuntimeError;

/// One kernel parameter, passed by value.
#[derive(Clone, Debug)]
pub enum KernelParam {
    /// The address `buf.ptr() + offset`. The launch holds the buffer, so whatever holds the
    /// launch (a [`StepGraph`](super::StepGraph)) keeps the memory alive.
    Buf {
        buf: Arc<DeviceBuffer>,
        offset: u64,
    },
    /// A raw device address whose memory the caller keeps alive for as long as the launch
    /// (or a graph capturing it) may run.
    Ptr(u64),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    /// A struct passed by value, as its bytes (e.g. the ABI's 16-byte `StepConsts`: see
    /// [`KernelParam::i32s`]).
    Bytes(Vec<u8>),
}

impl KernelParam {
    /// `Buf` at `offset`, checked to lie inside the buffer (an offset equal to the size is
    /// allowed: a zero-length view).
    pub fn buf(buf: &Arc<DeviceBuffer>, offset: u64) -> Result<KernelParam, RuntimeError> {
        buf.addr(offset, 0)?;
        Ok(KernelParam::Buf {
            buf: buf.clone(),
            offset,
        })
    }

    /// A by-value struct of `i32` fields, e.g. `StepConsts { b, t, ctx, m }`.
    pub fn i32s(fields: &[i32]) -> KernelParam {
        KernelParam::Bytes(fields.iter().flat_map(|f| f.to_ne_bytes()).collect())
    }

    /// Size in bytes of the C parameter this is passed as.
    pub fn size(&self) -> usize {
        match self {
            KernelParam::Bytes(b) => b.len(),
            KernelParam::Buf { .. }
            | KernelParam::Ptr(_)
            | KernelParam::I64(_)
            | KernelParam::U64(_) => 8,
            KernelParam::I32(_) | KernelParam::U32(_) | KernelParam::F32(_) => 4,
        }
    }

    /// The parameter's bytes in the host's (= device's, little-endian) order, at the start of
    /// an 8-byte aligned slot of at least 8 bytes, zero-padded.
    fn slot(&self) -> ParamSlot {
        let bytes: Vec<u8> = match self {
            KernelParam::Buf { buf, offset } => (buf.ptr() + offset).to_ne_bytes().to_vec(),
            KernelParam::Ptr(p) | KernelParam::U64(p) => p.to_ne_bytes().to_vec(),
            KernelParam::I64(v) => v.to_ne_bytes().to_vec(),
            KernelParam::I32(v) => v.to_ne_bytes().to_vec(),
            KernelParam::U32(v) => v.to_ne_bytes().to_vec(),
            KernelParam::F32(v) => v.to_ne_bytes().to_vec(),
            KernelParam::Bytes(b) => b.clone(),
        };
        let words = bytes.len().div_ceil(8).max(1);
        let mut slot = vec![0u64; words];
        for (w, chunk) in slot.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_ne_bytes(b);
        }
        ParamSlot(slot)
    }
}

/// Storage for one parameter value, 8-byte aligned; `cuLaunchKernel` reads the parameter's
/// size from its address.
#[derive(Clone, Debug)]
struct ParamSlot(Vec<u64>);

impl ParamSlot {
    #[cfg(test)]
    fn bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }
}

/// A kernel launch ready to issue: function, geometry, dynamic shared memory, parameters.
#[derive(Clone, Debug)]
pub struct PreparedLaunch {
    name: String,
    func: KernelFunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
    params: Vec<KernelParam>,
    slots: Vec<ParamSlot>,
    /// The kernel waits for its predecessor (`griddepcontrol.wait`) before touching memory
    /// earlier kernels use, so it may be launched programmatically.
    pdl_safe: bool,
}

impl PreparedLaunch {
    /// Checks and prepares a launch. `name` is the kernel's name, for errors. `smem` is the
    /// dynamic shared memory; the function must come from
    /// [`KernelModule::function`](super::KernelModule::function) with at least that much.
    pub fn new(
        name: &str,
        func: KernelFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        params: Vec<KernelParam>,
    ) -> Result<PreparedLaunch, RuntimeError> {
        let bad = |reason: String| CudaError::BadLaunch {
            kernel: name.to_string(),
            reason,
        };
        check_geometry(grid, block).map_err(bad)?;
        let max_threads = func
            .attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
            .during(format!("querying the block limit of `{name}`"))?
            .max(0) as u64;
        let threads = u64::from(block.0) * u64::from(block.1) * u64::from(block.2);
        if threads > max_threads {
            return Err(bad(format!(
                "block {block:?} has {threads} threads; the kernel allows {max_threads} (launch bounds / registers)"
            ))
            .into());
        }
        let max_dyn = func
            .attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
            .during(format!(
                "querying the dynamic shared memory limit of `{name}`"
            ))?
            .max(0) as u32;
        if smem > max_dyn {
            return Err(bad(format!(
                "{smem} bytes of dynamic shared memory requested, the function is set up for {max_dyn} \
                 (get it with KernelModule::function(name, {smem}))"
            ))
            .into());
        }
        if let Some(sizes) = param_sizes(&func, params.len()) {
            check_params(&sizes, &params).map_err(bad)?;
        }
        let slots = params.iter().map(KernelParam::slot).collect();
        Ok(PreparedLaunch {
            name: name.to_string(),
            func,
            grid,
            block,
            smem,
            params,
            slots,
            pdl_safe: false,
        })
    }

    /// Marks the kernel as safe to launch with programmatic stream serialization: it executes
    /// `griddepcontrol.wait` (`pdl_enter()` of the generated kernels) before any global
    /// access other than reads of memory no kernel writes (weights, the pointer table).
    /// Marking a kernel that does not is a data race whenever PDL is on.
    pub fn with_pdl(mut self) -> PreparedLaunch {
        self.pdl_safe = true;
        self
    }

    /// Whether the launch is marked PDL-safe ([`PreparedLaunch::with_pdl`]).
    pub fn pdl_safe(&self) -> bool {
        self.pdl_safe
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn grid(&self) -> (u32, u32, u32) {
        self.grid
    }

    pub fn block(&self) -> (u32, u32, u32) {
        self.block
    }

    pub fn smem(&self) -> u32 {
        self.smem
    }

    pub fn params(&self) -> &[KernelParam] {
        &self.params
    }

    /// Buffers this launch's parameters name.
    pub fn buffers(&self) -> impl Iterator<Item = &Arc<DeviceBuffer>> {
        self.params.iter().filter_map(|p| match p {
            KernelParam::Buf { buf, .. } => Some(buf),
            _ => None,
        })
    }

    /// Enqueues the launch on `stream`, programmatically when `pdl` (the device's setting)
    /// and the launch is marked PDL-safe.
    fn issue(&self, stream: sys::CUstream, pdl: bool) -> Result<(), CudaError> {
        let mut ptrs: Vec<*mut c_void> = self
            .slots
            .iter()
            .map(|s| s.0.as_ptr() as *mut c_void)
            .collect();
        let programmatic = pdl && self.pdl_safe;
        // SAFETY: the function, geometry and shared memory were checked in `new`; every
        // parameter points at a slot owned by `self`, alive for this call and at least as
        // large as the parameter (sizes checked against the signature where the driver
        // reports it), which the driver copies by value into the launch; the driver only reads through
        // these pointers. Addresses in `Buf` parameters are kept alive by the `Arc`s in
        // `self.params`. A programmatic launch is only made for kernels marked PDL-safe
        // (see `with_pdl`), which wait for their predecessor before touching its memory.
        let r = unsafe {
            if programmatic {
                launch_programmatic(
                    self.func.cu_function(),
                    self.grid,
                    self.block,
                    self.smem,
                    stream,
                    &mut ptrs,
                )
            } else {
                result::launch_kernel(
                    self.func.cu_function(),
                    self.grid,
                    self.block,
                    self.smem,
                    stream,
                    &mut ptrs,
                )
            }
        };
        r.during(format!(
            "launching `{}` grid {:?} block {:?} smem {}{}",
            self.name,
            self.grid,
            self.block,
            self.smem,
            if programmatic { " (PDL)" } else { "" }
        ))
    }
}

/// `cuLaunchKernelEx` with programmatic stream serialization allowed.
///
/// # Safety
/// As `cuLaunchKernel`: a live function, valid geometry, `params` pointing at one value of
/// the right size per kernel parameter, alive for the call; the kernel must be PDL-safe.
unsafe fn launch_programmatic(
    func: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: an all-zero attribute is a valid `CU_LAUNCH_ATTRIBUTE_IGNORE` with a zeroed
    // value union; both fields are then set.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `config` and `attr` live for the call, which copies them; the caller upholds
    // the kernel-parameter contract; `extra` is null.
    unsafe { sys::cuLaunchKernelEx(&config, func, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
}

/// Issues `launches` in order on the device's stream (eagerly, or into a graph when called
/// inside [`StepGraph::capture`](super::StepGraph::capture)); those marked PDL-safe
/// programmatically when the device has PDL on.
pub fn launch_all(dev: &CudaDevice, launches: &[PreparedLaunch]) -> Result<(), RuntimeError> {
    dev.context()
        .bind_to_thread()
        .during("binding the context to launch")?;
    let stream = dev.stream().cu_stream();
    let pdl = dev.pdl_enabled();
    for l in launches {
        l.issue(stream, pdl)?;
        dev.counters().add_kernel_launches(1);
    }
    Ok(())
}

fn check_geometry(grid: (u32, u32, u32), block: (u32, u32, u32)) -> Result<(), String> {
    let (g, b) = ([grid.0, grid.1, grid.2], [block.0, block.1, block.2]);
    if g.contains(&0) || b.contains(&0) {
        return Err(format!("empty grid {grid:?} or block {block:?}"));
    }
    if grid.0 > i32::MAX as u32 || grid.1 > 65535 || grid.2 > 65535 {
        return Err(format!("grid {grid:?} exceeds (2^31-1, 65535, 65535)"));
    }
    if block.0 > 1024 || block.1 > 1024 || block.2 > 64 || block.0 * block.1 * block.2 > 1024 {
        return Err(format!(
            "block {block:?} exceeds 1024 threads or (1024, 1024, 64)"
        ));
    }
    Ok(())
}

fn check_params(sizes: &[usize], params: &[KernelParam]) -> Result<(), String> {
    if sizes.len() != params.len() {
        return Err(format!(
            "kernel takes {} parameters, {} given",
            sizes.len(),
            params.len()
        ));
    }
    for (i, (&want, p)) in sizes.iter().zip(params).enumerate() {
        if p.size() != want {
            return Err(format!(
                "parameter {i} is {want} bytes in the kernel, but {p:?} is passed as {} bytes",
                p.size()
            ));
        }
    }
    Ok(())
}

/// Sizes of the kernel's parameters from `cuFuncGetParamInfo` (driver 12.4+), or `None` when
/// the driver cannot tell.
/// Sizes of the kernel's first `n` parameters (`n` = what the launch passes), or `None` when
/// the driver cannot say. Only indices below `n` are queried: probing past the last parameter
/// is an API error that compute-sanitizer reports, so a kernel with MORE parameters than
/// passed is not detected here (the ABI fixes three).
fn param_sizes(func: &KernelFunction, n: usize) -> Option<Vec<usize>> {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    // cudarc panics on a call to a symbol the loaded driver lacks, so look it up first.
    // SAFETY: `culib()` returns the already loaded driver library (a device is open); looking
    // up a symbol by name does not call it.
    let available = *AVAILABLE.get_or_init(|| unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(b"cuFuncGetParamInfo\0")
            .is_ok()
    });
    if !available {
        return None;
    }
    let mut sizes = Vec::new();
    for i in 0..n {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `func` is a live function handle (it holds its module); the driver writes
        // two `usize`s through valid pointers.
        let r = unsafe { sys::cuFuncGetParamInfo(func.cu_function(), i, &mut offset, &mut size) };
        match r {
            CUresult::CUDA_SUCCESS => sizes.push(size),
            // Fewer parameters than passed. An answer of "no parameters" is not trusted: a
            // handle the query does not support reads the same.
            CUresult::CUDA_ERROR_INVALID_VALUE => return (!sizes.is_empty()).then_some(sizes),
            _ => return None,
        }
    }
    Some(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_hold_values_in_low_bytes() {
        assert_eq!(
            KernelParam::I32(-2).slot().bytes()[..4],
            (-2i32).to_ne_bytes()
        );
        assert_eq!(
            KernelParam::F32(1.5).slot().bytes()[..4],
            1.5f32.to_ne_bytes()
        );
        assert_eq!(KernelParam::U64(7).slot().bytes(), 7u64.to_ne_bytes());
        let consts = KernelParam::i32s(&[1, 2, 3, 6]);
        assert_eq!(consts.size(), 16);
        let b = consts.slot().bytes();
        assert_eq!(b.len(), 16);
        assert_eq!(b[12..16], 6i32.to_ne_bytes());
        assert_eq!(
            KernelParam::Bytes(vec![9; 3]).slot().bytes(),
            vec![9, 9, 9, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn geometry_limits() {
        assert!(check_geometry((1, 1, 1), (256, 1, 1)).is_ok());
        assert!(check_geometry((0, 1, 1), (256, 1, 1)).is_err());
        assert!(check_geometry((1, 70000, 1), (32, 1, 1)).is_err());
        assert!(check_geometry((1, 1, 1), (64, 32, 1)).is_err());
        assert!(check_geometry((1, 1, 1), (1, 1, 65)).is_err());
    }

    #[test]
    fn params_must_match_signature() {
        let p = [KernelParam::Ptr(0), KernelParam::I32(3)];
        assert!(check_params(&[8, 4], &p).is_ok());
        let e = check_params(&[8, 8], &p).unwrap_err();
        assert!(e.contains("parameter 1 is 8 bytes"), "{e}");
        assert!(check_params(&[8], &p)
            .unwrap_err()
            .contains("takes 1 parameters, 2 given"));
    }
}
