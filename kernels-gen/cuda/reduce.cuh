// specc device prelude, part 3: warp and block reductions. Every lane of a warp (every
// thread of a block) receives the result, so callers need no broadcast.

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Argmax over the lanes of a warp; ties go to the lower index.
__device__ __forceinline__ ArgmaxPair warp_argmax(ArgmaxPair p) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, p.v, o);
    const int i = __shfl_xor_sync(0xffffffffu, p.i, o);
    if (argmax_better(v, i, p.v, p.i)) {
      p.v = v;
      p.i = i;
    }
  }
  return p;
}

// Sum over the block. `scratch` holds at least blockDim.x / 32 floats; blockDim.x is a
// multiple of 32. Contains __syncthreads: every thread of the block must call it.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < nw; ++w) t += scratch[w];
  return t;
}

// Argmax over the block; same calling rules as block_sum.
__device__ __forceinline__ ArgmaxPair block_argmax(ArgmaxPair p, ArgmaxPair* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  p = warp_argmax(p);
  __syncthreads();
  if (lane == 0) scratch[warp] = p;
  __syncthreads();
  ArgmaxPair best = scratch[0];
  for (int w = 1; w < nw; ++w)
    if (argmax_better(scratch[w].v, scratch[w].i, best.v, best.i)) best = scratch[w];
  return best;
}
