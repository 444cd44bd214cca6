// Helpers of the gemm_mma family (module items of those kernels only).

// Argmax over the 4 lanes of a quad: in the m16n8 accumulator layout they hold the columns
// of one row (lane 4g + t: columns 2t, 2t + 1 of rows g and g + 8). Ties go to the lower
// column, as everywhere.
__device__ __forceinline__ ArgmaxPair quad_row_argmax(ArgmaxPair p) {
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, p.v, o);
    const int i = __shfl_xor_sync(0xffffffffu, p.i, o);
    if (argmax_better(v, i, p.v, p.i)) {
      p.v = v;
      p.i = i;
    }
  }
  return p;
}
