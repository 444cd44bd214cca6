//! Loading compiled kernels (cubin, fatbin or PTX) and getting their functions.

use std::sync::Arc;

use cudarc::driver::sys::{CUfunction_attribute as FnAttr, CUresult};
use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

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

/// A loaded module. Functions taken from it keep it loaded (a `CudaFunction` holds the
/// module's `Arc`).
pub struct KernelModule {
    name: String,
    module: Arc<CudaModule>,
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
        let ptx = match image {
            // `load_module` passes the bytes straight to cuModuleLoadData, which reads an
            // ELF/fatbin header for its size.
            KernelImage::Binary(b) => Ptx::from_binary(b),
            // `load_module` NUL-terminates source text.
            KernelImage::Ptx(s) => Ptx::from_src(s),
        };
        let module = dev
            .context()
            .load_module(ptx)
            .map_err(|source| CudaError::ModuleLoad {
                module: name.to_string(),
                kind,
                hint: load_hint(source.0, kind),
                source,
            })?;
        Ok(KernelModule {
            name: name.to_string(),
            module,
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
    pub fn function(&self, kernel: &str, dynamic_smem: u32) -> Result<CudaFunction, RuntimeError> {
        let f = self
            .module
            .load_function(kernel)
            .map_err(|source| CudaError::MissingKernel {
                module: self.name.clone(),
                kernel: kernel.to_string(),
                source,
            })?;
        let static_bytes = f
            .get_attribute(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
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
            .get_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
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
