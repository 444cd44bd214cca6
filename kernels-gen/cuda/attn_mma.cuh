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

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

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

// 16 bytes global -> shared, asynchronously (L2 only: the tile is read once per block);
// zero-filled without reading memory when `ok` is false (`src` must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(ok ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
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
