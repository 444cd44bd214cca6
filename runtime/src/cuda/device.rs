//! The device: one context, one stream, what the hardware is, and launch counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaStream};

use super::buffer::DeviceBuffer;
use super::error::{CudaError, DriverResultExt};
use crate::RuntimeError;

/// What the opened device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor), e.g. (9, 0) on H100/H200.
    pub compute_capability: (u32, u32),
    /// The arch to compile for, with the arch-specific `a` suffix where it exists
    /// (`sm_90a`, `sm_100a`, `sm_120a`): see [`arch_for`].
    pub arch: String,
    pub sm_count: u32,
    /// Largest dynamic + static shared memory one block may opt in to.
    pub max_smem_per_block_optin: u32,
    pub total_mem: u64,
    /// Free memory when the device was opened.
    pub free_mem: u64,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "cuda:{} {} ({}, {} SMs, {:.1} GiB, {:.1} GiB free, driver {}.{})",
            self.ordinal,
            self.name,
            self.arch,
            self.sm_count,
            gib(self.total_mem),
            gib(self.free_mem),
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

/// Arch string for a compute capability. Hopper and later have arch-specific feature sets
/// (wgmma, TMA multicast, tcgen05) reached only through the `a` target, and a cubin built for
/// `sm_XYa` runs exactly on compute capability X.Y, which is what an engine built for this
/// device wants.
pub fn arch_for(major: u32, minor: u32) -> String {
    if major >= 9 {
        format!("sm_{major}{minor}a")
    } else {
        format!("sm_{major}{minor}")
    }
}

/// Picks, among archs an engine was compiled for, the one this device runs: the exact arch
/// (`sm_90a`) first, then the plain one (`sm_90`).
pub fn pick_arch<'a>(device_arch: &str, available: &[&'a str]) -> Option<&'a str> {
    let plain = device_arch.trim_end_matches('a');
    available
        .iter()
        .find(|a| **a == device_arch)
        .or_else(|| available.iter().find(|a| **a == plain))
        .copied()
}

/// The environment variable that switches programmatic dependent launch on (`1`, `on`,
/// `true` or `yes`) for A/B measurements.
pub const PDL_ENV: &str = "SPECC_PDL";

/// Whether launches use programmatic dependent launch (PDL): off unless `env` (the value of
/// [`PDL_ENV`]) switches it on, and then only on a device of compute capability 9.0 or later
/// (where `griddepcontrol` exists) with a driver of CUDA 12.3 or later (programmatic edges
/// in captured graphs). Off by default because it was measured slower in every step graph
/// (H200, Llama-3.1-8B shape; the figures are in `bench/NOTES.md`).
pub fn pdl_default(compute_capability: (u32, u32), driver_version: i32, env: Option<&str>) -> bool {
    let on = env.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "on" | "true" | "yes"
        )
    });
    pdl_supported(compute_capability, driver_version) && on
}

fn pdl_supported(compute_capability: (u32, u32), driver_version: i32) -> bool {
    compute_capability.0 >= 9 && driver_version >= 12030
}

/// Counts what the host enqueued, so a test or `bench` can show one graph launch per step
/// and no eager kernel launches in the decode loop.
#[derive(Debug, Default)]
pub struct LaunchCounters {
    graph_launches: AtomicU64,
    kernel_launches: AtomicU64,
}

impl LaunchCounters {
    /// Graph replays (`cuGraphLaunch`) so far.
    pub fn graph_launches(&self) -> u64 {
        self.graph_launches.load(Ordering::Relaxed)
    }

    /// Kernels enqueued by [`launch_all`](super::launch_all), captured or eager.
    pub fn kernel_launches(&self) -> u64 {
        self.kernel_launches.load(Ordering::Relaxed)
    }

    pub(crate) fn add_graph_launch(&self) {
        self.graph_launches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_kernel_launches(&self, n: u64) {
        self.kernel_launches.fetch_add(n, Ordering::Relaxed);
    }
}

/// One CUDA device with its primary context and the one stream everything runs on.
///
/// Invariant: event tracking is off for every allocation made through this device, so
/// cudarc records no per-buffer events that would break stream capture; ordering comes
/// from the single stream.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    counters: Arc<LaunchCounters>,
    /// Whether launches marked PDL-safe are issued with programmatic stream serialization.
    pdl: AtomicBool,
}

/// Whether a CUDA driver library can be loaded. `CudaContext::new` panics without one, so
/// everything checks this first.
pub fn driver_present() -> bool {
    // SAFETY: this only tries to dlopen the driver library by its known names and drops the
    // handle; it has no preconditions.
    unsafe { sys::is_culib_present() }
}

impl CudaDevice {
    /// Opens device `ordinal`: retains its primary context, turns event tracking off and
    /// creates the stream.
    pub fn open(ordinal: usize) -> Result<CudaDevice, RuntimeError> {
        if !driver_present() {
            return Err(CudaError::NoDriver(
                "libcuda.so could not be loaded (install the NVIDIA driver, or add its folder to \
                 LD_LIBRARY_PATH); use --backend cpu on machines without a GPU"
                    .into(),
            )
            .into());
        }
        let count = match CudaContext::device_count() {
            Ok(n) => n,
            // cuInit reports a driver without a visible GPU this way.
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => 0,
            Err(e) => {
                return Err(CudaError::Driver {
                    op: "counting CUDA devices".into(),
                    source: e,
                }
                .into())
            }
        };
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::NoDevice {
                ordinal,
                count: count.max(0) as usize,
            }
            .into());
        }
        let ctx =
            CudaContext::new(ordinal).during(format!("creating a context on device {ordinal}"))?;
        // SAFETY: called before this context allocates anything. Without tracking, cudarc no
        // longer orders uses of a buffer across streams; every allocation, copy, launch and
        // graph replay of this backend goes on `stream` below, which orders them, and
        // `DeviceBuffer` frees only after that stream drains.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().during("creating the stream")?;
        let info = query_info(&ctx, ordinal)?;
        let env = std::env::var(PDL_ENV).ok();
        let pdl = pdl_default(info.compute_capability, info.driver_version, env.as_deref());
        Ok(CudaDevice {
            ctx,
            stream,
            info,
            counters: Arc::new(LaunchCounters::default()),
            pdl: AtomicBool::new(pdl),
        })
    }

    /// Whether launches marked PDL-safe ([`PreparedLaunch::with_pdl`]) are issued with
    /// programmatic stream serialization: off by default, on with `SPECC_PDL=1` from
    /// compute capability 9.0 ([`pdl_default`]).
    ///
    /// [`PreparedLaunch::with_pdl`]: super::PreparedLaunch::with_pdl
    pub fn pdl_enabled(&self) -> bool {
        self.pdl.load(Ordering::Relaxed)
    }

    /// Turns PDL on or off for launches issued from now on (graphs already captured keep
    /// their edges). Returns whether it is on: a device without PDL support stays off.
    pub fn set_pdl(&self, on: bool) -> bool {
        let on = on && pdl_supported(self.info.compute_capability, self.info.driver_version);
        self.pdl.store(on, Ordering::Relaxed);
        on
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The one stream of this device.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn counters(&self) -> &Arc<LaunchCounters> {
        &self.counters
    }

    /// Blocks until everything queued on the stream has run; surfaces asynchronous errors.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.stream
            .synchronize()
            .during("synchronising the stream")?;
        Ok(())
    }

    /// (free, total) device memory in bytes, now.
    pub fn mem_info(&self) -> Result<(u64, u64), RuntimeError> {
        let (free, total) = self.ctx.mem_get_info().during("querying free memory")?;
        Ok((free as u64, total as u64))
    }

    /// A device buffer of `bytes`, contents undefined.
    pub fn alloc(&self, label: &str, bytes: u64) -> Result<Arc<DeviceBuffer>, RuntimeError> {
        Ok(Arc::new(DeviceBuffer::alloc_uninit(
            &self.stream,
            label,
            bytes,
        )?))
    }

    /// A device buffer of `bytes`, zeroed (the memset is queued on the stream).
    pub fn alloc_zeroed(&self, label: &str, bytes: u64) -> Result<Arc<DeviceBuffer>, RuntimeError> {
        Ok(Arc::new(DeviceBuffer::alloc_zeroed(
            &self.stream,
            label,
            bytes,
        )?))
    }
}

fn query_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceInfo, CudaError> {
    use sys::CUdevice_attribute as A;
    let attr = |a: A, what: &str| {
        ctx.attribute(a)
            .during(format!("querying {what}"))
            .map(|v| v.max(0) as u32)
    };
    let name = ctx.name().during("querying the device name")?;
    let (major, minor) = ctx
        .compute_capability()
        .during("querying the compute capability")?;
    let (major, minor) = (major.max(0) as u32, minor.max(0) as u32);
    let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "the SM count")?;
    let max_smem_per_block_optin = attr(
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        "the shared memory limit",
    )?;
    let (free, total) = ctx.mem_get_info().during("querying free memory")?;
    let mut driver_version = 0i32;
    // SAFETY: writes one i32 through a valid pointer; the driver is loaded (a context exists).
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .during("querying the driver version")?;
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        arch: arch_for(major, minor),
        sm_count,
        max_smem_per_block_optin,
        total_mem: total as u64,
        free_mem: free as u64,
        driver_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_strings() {
        assert_eq!(arch_for(9, 0), "sm_90a");
        assert_eq!(arch_for(10, 0), "sm_100a");
        assert_eq!(arch_for(12, 0), "sm_120a");
        assert_eq!(arch_for(8, 9), "sm_89");
    }

    #[test]
    fn picks_exact_arch_then_plain() {
        assert_eq!(pick_arch("sm_90a", &["sm_100a", "sm_90a"]), Some("sm_90a"));
        assert_eq!(pick_arch("sm_120a", &["sm_90a", "sm_120"]), Some("sm_120"));
        assert_eq!(pick_arch("sm_90a", &["sm_100a"]), None);
    }

    #[test]
    fn pdl_defaults_off_and_switches_on_by_env_from_sm90() {
        assert!(!pdl_default((9, 0), 13000, None), "off unless asked for");
        assert!(pdl_default((12, 0), 12030, Some("1")));
        for on in ["1", "on", "TRUE", " yes "] {
            assert!(pdl_default((9, 0), 13000, Some(on)), "{on}");
        }
        assert!(
            !pdl_default((8, 9), 13000, Some("1")),
            "no griddepcontrol before sm_90"
        );
        assert!(
            !pdl_default((9, 0), 12020, Some("1")),
            "driver too old for PDL graph edges"
        );
        for off in ["0", "off", "FALSE", " no ", ""] {
            assert!(!pdl_default((9, 0), 13000, Some(off)), "{off:?}");
        }
    }

    #[test]
    fn open_without_driver_is_a_clear_error() {
        if driver_present() {
            specc_ir::testing::skip("a CUDA driver is present");
            return;
        }
        let e = CudaDevice::open(0).err().expect("no driver, no device");
        assert!(e.to_string().starts_with("no CUDA driver found"), "{e}");
    }
}
