// Thread-block-cluster pieces of `gemm_wgmma`'s split of K over the blocks of a cluster
// (sm_90 and later; with bulk_copy.cuh for `smem_addr`).

// Cluster-wide barrier of every thread of every block that publishes memory: each thread's
// shared-memory writes before it (to its own block or a peer's) are visible to every thread
// of the cluster after it. Not `.aligned`: the producer warp reaches it after only its lane
// 0 ran the ring.
__device__ __forceinline__ void cluster_sync_publish() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

// Stores `v` at `dst`'s block-relative offset in the shared memory of the cluster's block
// `rank`.
__device__ __forceinline__ void st_cluster_f32x4(const void* dst, unsigned rank, float4 v) {
  asm volatile(
      "{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
      " st.shared::cluster.v4.f32 [ra], {%2, %3, %4, %5};\n}"
      ::"r"(smem_addr(dst)), "r"(rank), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
      : "memory");
}
