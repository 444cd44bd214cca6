//! Loading compiled kernels (cubin, fatbin or PTX) and getting their functions.

use std::sync::Arc;

use std::ffi::CString;

use cudarc::driver::sys::{self, CUfunction_attribute as FnAttr, CUresult};
use cudarc::driver::{result, CudaContext, DriverError};

use super::device::CudaDevice;
use super::error::{CudaError, DriverResultExt};
use crate::RuntimeError;

/// A compiled module image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelImage {
    /// ELF cubin or fatbin, as NVRTC's `nvrtcGetCUBIN` or `nvcc -cubin/-fatbin` writes it.
    Binary(Vec<u8>),
    /// PTX text; the driver JIT-compiles it (it must not be newer than the driver's ISA).
    Ptx(String),
}

impl KernelImage {
    /// Classifies raw bytes: ELF or fatbin magic → binary, otherwise PTX text (a trailing NUL
    /// is dropped).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<KernelImage, RuntimeError> {
        const ELF: &[u8] = b"\x7fELF";
        const FATBIN: &[u8] = &0xBA55_ED50u32.to_le_bytes();
        if bytes.starts_with(ELF) || bytes.starts_with(FATBIN) {
            return Ok(KernelImage::Binary(bytes));
        }
        let mut bytes = bytes;
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        match String::from_utf8(bytes) {
            Ok(s) if !s.contains('\0') => Ok(KernelImage::Ptx(s)),
            _ => Err(CudaError::BadImage("neither an ELF/fatbin image nor PTX text".into()).into()),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            KernelImage::Binary(_) => "cubin",
            KernelImage::Ptx(_) => "ptx",
        }
    }
}

/// A `CUmodule` loaded into a context; unloaded when the last function taken from it is
/// dropped.
struct RawModule {
    module: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUmodule handle may be used from any thread once its context is bound there;
// every use binds the context first.
unsafe impl Send for RawModule {}
// SAFETY: as above; the handle is never mutated after loading.
unsafe impl Sync for RawModule {}

impl Drop for RawModule {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded by `cuModuleLoadData` and is unloaded once, here;
            // no function of it outlives this (functions hold the module's `Arc`).
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

/// A kernel of a loaded module; keeps the module loaded.
#[derive(Clone)]
pub struct KernelFunction {
    raw: sys::CUfunction,
    module: Arc<RawModule>,
}

// SAFETY: a CUfunction is an immutable handle into its module, which `module` keeps alive.
unsafe impl Send for KernelFunction {}
// SAFETY: as above.
unsafe impl Sync for KernelFunction {}

impl std::fmt::Debug for KernelFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KernelFunction({:?})", self.raw)
    }
}

impl KernelFunction {
    pub fn cu_function(&self) -> sys::CUfunction {
        self.raw
    }

    pub fn attribute(&self, a: FnAttr) -> Result<i32, DriverError> {
        self.module.ctx.bind_to_thread()?;
        let mut v = 0i32;
        // SAFETY: `raw` is a live function (its module is held) and `v` a valid out pointer.
        unsafe { sys::cuFuncGetAttribute(&mut v, a, self.raw) }.result()?;
        Ok(v)
    }

    fn set_attribute(&self, a: FnAttr, v: i32) -> Result<(), DriverError> {
        self.module.ctx.bind_to_thread()?;
        // SAFETY: `raw` is a live function (its module is held).
        unsafe { sys::cuFuncSetAttribute(self.raw, a, v) }.result()
    }
}

/// A loaded module. Functions taken from it keep it loaded.
pub struct KernelModule {
    name: String,
    raw: Arc<RawModule>,
    max_smem_optin: u32,
}

impl KernelModule {
    /// Loads `image` into the device's context (`cuModuleLoadData`). `name` is for errors.
    pub fn load(
        dev: &CudaDevice,
        name: &str,
        image: KernelImage,
    ) -> Result<KernelModule, RuntimeError> {
        let kind = image.kind();
        let fail = |source: DriverError| CudaError::ModuleLoad {
            module: name.to_string(),
            kind,
            hint: load_hint(source.0, kind),
            source,
        };
        dev.context().bind_to_thread().map_err(fail)?;
        let module = match image {
            // cuModuleLoadData reads an ELF/fatbin header for the image's size.
            // SAFETY: `b` is a whole ELF/fatbin image (checked by `KernelImage::from_bytes` or
            // produced by NVRTC) alive for the call.
            KernelImage::Binary(b) => unsafe { result::module::load_data(b.as_ptr().cast()) },
            KernelImage::Ptx(s) => {
                let c = CString::new(s)
                    .map_err(|_| CudaError::BadImage("PTX text holds a NUL byte".into()))?;
                // SAFETY: `c` is NUL-terminated PTX text alive for the call.
                unsafe { result::module::load_data(c.as_ptr().cast()) }
            }
        }
        .map_err(fail)?;
        Ok(KernelModule {
            name: name.to_string(),
            raw: Arc::new(RawModule {
                module,
                ctx: dev.context().clone(),
            }),
            max_smem_optin: dev.info().max_smem_per_block_optin,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Kernel `kernel`, prepared to launch with `dynamic_smem` bytes of dynamic shared
    /// memory: above the kernel's current limit (by default 48 KiB minus its static shared
    /// memory) it opts in (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, never lowered),
    /// after checking static + dynamic fits the device.
    pub fn function(
        &self,
        kernel: &str,
        dynamic_smem: u32,
    ) -> Result<KernelFunction, RuntimeError> {
        let missing = |source: DriverError| CudaError::MissingKernel {
            module: self.name.clone(),
            kernel: kernel.to_string(),
            source,
        };
        self.raw.ctx.bind_to_thread().map_err(missing)?;
        let c = CString::new(kernel)
            .map_err(|_| CudaError::BadImage(format!("kernel name `{kernel}` holds a NUL byte")))?;
        // SAFETY: the module is loaded (held by `self.raw`) and `c` is NUL-terminated.
        let raw = unsafe { result::module::get_function(self.raw.module, c) }.map_err(missing)?;
        let f = KernelFunction {
            raw,
            module: self.raw.clone(),
        };
        let static_bytes = f
            .attribute(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            .during(format!("querying the static shared memory of `{kernel}`"))?
            .max(0) as u32;
        if u64::from(static_bytes) + u64::from(dynamic_smem) > u64::from(self.max_smem_optin) {
            return Err(CudaError::SharedMemory {
                kernel: kernel.to_string(),
                requested: dynamic_smem,
                max_optin: self.max_smem_optin,
                static_bytes,
            }
            .into());
        }
        // The attribute belongs to the kernel, shared by every handle to it: only ever raise
        // it, so launches prepared for a larger amount stay valid.
        let current = f
            .attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
            .during(format!(
                "querying the dynamic shared memory limit of `{kernel}`"
            ))?
            .max(0) as u32;
        // The default limit is 48 KiB minus the kernel's static shared memory, so a kernel
        // with static arrays opts in below 48 KiB of dynamic memory too.
        if dynamic_smem > current {
            f.set_attribute(
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic_smem as i32,
            )
            .during(format!(
                "raising the dynamic shared memory of `{kernel}` to {dynamic_smem} bytes"
            ))?;
        }
        Ok(f)
    }
}

fn load_hint(code: CUresult, kind: &str) -> &'static str {
    match (code, kind) {
        (CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION, _) => {
            " (the PTX is newer than this driver can JIT: ship a cubin for this arch, or compile \
             with the device's own NVRTC)"
        }
        (CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU, _) | (CUresult::CUDA_ERROR_INVALID_IMAGE, "cubin") => {
            " (the image was not built for this GPU's arch: compile for the arch the device reports)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_images() {
        let elf = b"\x7fELF\x02\x01rest".to_vec();
        assert!(matches!(
            KernelImage::from_bytes(elf),
            Ok(KernelImage::Binary(_))
        ));
        let fat = [0x50, 0xED, 0x55, 0xBA, 1, 0].to_vec();
        assert!(matches!(
            KernelImage::from_bytes(fat),
            Ok(KernelImage::Binary(_))
        ));
        let ptx = b".version 9.0\n.target sm_90a\n\0".to_vec();
        match KernelImage::from_bytes(ptx) {
            Ok(KernelImage::Ptx(s)) => assert!(s.ends_with("sm_90a\n")),
            other => panic!("want PTX, got {other:?}"),
        }
        assert!(KernelImage::from_bytes(vec![0xff, 0xfe, 0]).is_err());
    }
}
