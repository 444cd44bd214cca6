// Tensor-map (TMA) box copies and stage release: module items of the kernels whose operands
// arrive as swizzled 2-D boxes (sm_90 and later; with bulk_copy.cuh, and attn_mma.cuh for
// ldmatrix and the m16n8k16 step).

// Box `{c0, c1}` (element column, row) of the tensor described by the 128-byte descriptor at
// `map` (global memory, written by the host before the launch) into `dst` (1024-byte aligned
// for the 128-byte swizzle), completing on `bar`. Elements past the tensor read as zeros.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, int c0, int c1,
                                            unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
        "r"(smem_addr(bar))
      : "memory");
}

// One plain arrival on `bar` (a consumer releasing a ring stage).
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}"
               ::"r"(smem_addr(bar)) : "memory");
}
