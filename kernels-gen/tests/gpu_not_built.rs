//! Without the `cuda` feature the device test binaries (`gpu_*`, `runtime_*`) compile to
//! nothing; this says so where the run lists its skips (`cargo test -p specc-kernels-gen
//! --features cuda` on a GPU machine runs them).

#[cfg(not(feature = "cuda"))]
#[test]
fn device_tests_need_the_cuda_feature() {
    specc_ir::testing::skip(
        "gpu_gemm, gpu_generic, gpu_parity, gpu_parity_attn, gpu_parity_mla, gpu_parity_mma, gpu_parity_qkv_rope, gpu_quant_gemv, gpu_quant_moe, runtime_pdl, runtime_smoke not built: the `cuda` feature is off",
    );
}
