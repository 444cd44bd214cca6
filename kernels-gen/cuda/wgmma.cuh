// Warpgroup MMA (sm_90a `wgmma.mma_async`) helpers: module items of the gemm_wgmma family
// (with cp_async.cuh for smem_addr). The mma instruction itself is generated per N (its
// accumulator operand list is N / 2 registers long).

// The shared-memory matrix descriptor of a K-major operand tile stored as 128-byte rows
// (64 16-bit k per row) in the 128-byte swizzle that TMA writes: rows of 8-row groups
// 1024 bytes apart (stride byte offset 1024), the leading byte offset unused for swizzled
// K-major tiles (1), swizzle mode 1 (128 B) in bits 62-63. `tile` must lie in a
// 1024-byte-aligned swizzle atom, offset only by the k16 step inside the row (32 bytes per
// step): the hardware applies the XOR of the swizzle to the full address.
__device__ __forceinline__ unsigned long long wgmma_desc_k128(const void* tile) {
  const unsigned long long addr = (smem_addr(tile) & 0x3FFFF) >> 4;
  return addr | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// Orders this thread's earlier register and shared-memory accesses before the following
// wgmma operations of the warpgroup (needed before the first mma of each batch).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

// Closes the batch of wgmma operations issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most N committed batches of this warpgroup are still in flight.
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accesses of `r` across this point (an accumulator the
// asynchronous mma writes must not be read before its wait).
__device__ __forceinline__ void wgmma_fence_operand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}

// L2 prefetch of box `{c0, c1}` of the tensor described by the descriptor at `map` (no
// shared memory, no barrier): the weight boxes of the first ring stages, issued before the
// PDL wait while the previous kernel ends.
__device__ __forceinline__ void tma_prefetch_l2_2d(const void* map, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];"
               ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1)
               : "memory");
}
