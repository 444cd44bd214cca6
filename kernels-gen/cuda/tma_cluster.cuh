// Thread-block-cluster pieces of the TMA rings whose boxes are shared by the blocks of a
// cluster (sm_90 and later; with bulk_copy.cuh and tma.cuh).

// Cluster-wide barrier of every thread of every block of the cluster, ordering no memory
// (the mbarriers' initialisation is published by `fence.mbarrier_init` in `mbar_init`): a
// `.release` arrival would fence every earlier access at GPU scope. Not `.aligned`: the
// producer warp reaches it after only its lane 0 ran the ring.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.relaxed;\n\tbarrier.cluster.wait;" ::: "memory");
}

// Box `{c0, c1}` into `dst` of every block of the cluster whose rank is set in `mask` (the
// same block-relative offset in each), each copy completing on the mbarrier at `bar`'s
// block-relative offset in its destination block.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const void* map, int c0, int c1,
                                                      unsigned long long* bar,
                                                      unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
        "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}

// One arrival on the mbarrier at `bar`'s block-relative offset in the cluster's block
// `rank` (this block's own included). Default semantics (release at CTA scope): what it
// orders is this block's wgmma reads of a stage, already complete at the `wgmma_wait`
// before it; `.release.cluster` would add a GPU-scope memory barrier to every arrival.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned long long* bar, unsigned rank) {
  asm volatile(
      "{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
      " mbarrier.arrive.shared::cluster.b64 _, [ra];\n}"
      ::"r"(smem_addr(bar)), "r"(rank)
      : "memory");
}
