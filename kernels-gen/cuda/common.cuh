// specc device prelude, part 1: the kernel ABI struct and scalar conversions.
// Prepended (with vec.cuh and reduce.cuh) to every generated module; see src/abi.rs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef __nv_bfloat16 bf16;
typedef __half f16;

// Bucket constants of one launch, passed by value as the last kernel parameter.
// Mirrors `specc_kernels_gen::abi::StepConsts` (repr(C), 16 bytes).
struct StepConsts {
  int b;    // sequences in the bucket (B)
  int t;    // tokens per sequence in this step (T)
  int ctx;  // KV cache slots per sequence (Ctx)
  int m;    // token rows, B * T
};

// (value, index) pair of an argmax; partial results of a split argmax are stored as this.
struct ArgmaxPair {
  float v;
  int i;
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }

// Conversion from f32 with round-to-nearest-even, selected by the destination type.
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }

// The f32 value of `x` rounded to `T`: what the interpreter holds after an op whose result
// dtype is `T`.
template <typename T> __device__ __forceinline__ float round_to(float x) {
  return to_f32(from_f32<T>(x));
}

// KV cache slot of position `p`: min(p, ctx - 1), or -1 when p < 0 (a padding lane).
__device__ __forceinline__ int cache_slot(long long p, int ctx) {
  return p < 0 ? -1 : (int)(p < (long long)(ctx - 1) ? p : (long long)(ctx - 1));
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// SiLU in f32 with an accurate exponential: x / (1 + e^-x).
__device__ __forceinline__ float silu_f32(float x) { return x / (1.0f + expf(-x)); }

// `a` beats `b` in an argmax: larger value, or equal value and lower index.
__device__ __forceinline__ bool argmax_better(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}
