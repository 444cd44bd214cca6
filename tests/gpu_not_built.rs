//! Without the `cuda` feature the GPU test binaries (`gpu_e2e`, `gpu_dflash`, `gpu_ddtree`,
//! `gpu_eagle3_tree`, `gpu_sampling`, `gpu_deepseek`, `gpu_quant`, `gpu_serve`, `gpu_planted`) compile to nothing; this says so where the run lists
//! its skips (`cargo test --features cuda` on a GPU machine runs them).

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    specc_ir::testing::skip(
        "gpu_e2e, gpu_dflash, gpu_ddtree, gpu_eagle3_tree, gpu_sampling, gpu_deepseek, gpu_quant, gpu_serve, gpu_planted \
         not built: the `cuda` feature is off",
    );
}
