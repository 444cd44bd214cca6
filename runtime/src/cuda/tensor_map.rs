//! TMA descriptors of tensor-map operands ([`specc_ir::engine::abi::TensorMap`]), encoded at
//! load time from the tensor's device address and the launch's bucket.

use specc_ir::engine::abi::{Bucket, Dtype, TensorMap, DESCRIPTOR_BYTES};

/// The descriptor of the tensor at device address `addr` for `bucket` (the driver's
/// `cuTensorMapEncodeTiled`; needs the CUDA driver library, not a context).
pub fn encode_tensor_map(
    map: &TensorMap,
    addr: u64,
    bucket: &Bucket,
) -> Result<[u8; DESCRIPTOR_BYTES as usize], String> {
    use cudarc::driver::sys;
    map.check()?;
    if !addr.is_multiple_of(16) {
        return Err(format!("tensor address {addr:#x} is not 16-byte aligned"));
    }
    let size = map.dtype.size();
    let dtype = match map.dtype {
        Dtype::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    };
    let dims = [map.cols as u64, map.rows_at(bucket) as u64];
    let strides = [map.row_stride * size];
    let boxes = [map.box_cols(), map.box_rows];
    let elem_strides = [1u32, 1];
    let mut out_map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer names a live local array of the rank the call reads (rank 2:
    // 2 dims, 1 stride, 2 box dims, 2 element strides); the map is written in place.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut out_map,
            dtype,
            2,
            addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuTensorMapEncodeTiled({map:?}) failed: {r:?}"));
    }
    let mut out = [0u8; DESCRIPTOR_BYTES as usize];
    for (i, w) in out_map.opaque.iter().enumerate() {
        out[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    Ok(out)
}
