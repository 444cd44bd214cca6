// Tensor-core helpers of the attn_tile family (module items of those kernels only).
//
// Fragments of mma.sync.aligned.m16n8k16 (row.col, f32 accumulation), lane = 4·g + t:
//   A (16×16, row-major): a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..), a2 = (row g,
//     k 2t+8..), a3 = (row g+8, k 2t+8..);
//   B (16×8, k-major per column): b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g);
//   C (16×8): c0, c1 = (row g, cols 2t, 2t+1); c2, c3 = (row g+8, cols 2t, 2t+1).
// ldmatrix.x4 gives lane l the pair (row l/4, cols 2(l%4)..) of each of 4 8×8 matrices
// whose row addresses come from lanes 8i..8i+7; `.trans` gives (rows 2(l%4).., col l/4),
// i.e. the B fragment of a row-major [k][n] matrix.

#define SPECC_MMA_16816(NAME, PTX_TYPE)                                                       \
  __device__ __forceinline__ void NAME(float (&d)[4], const unsigned (&a)[4], unsigned b0,  \
                                       unsigned b1) {                                        \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE ".f32 "      \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"           \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));            \
  }
SPECC_MMA_16816(mma16816_bf16, "bf16")
SPECC_MMA_16816(mma16816_f16, "f16")
#undef SPECC_MMA_16816

// Four 8×8 b16 matrices from shared memory; lane l supplies the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// Two f32 rounded to T (bf16 or f16) and packed as one A/B operand register (lo = first).
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<bf16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned pack2<f16>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// Max over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
