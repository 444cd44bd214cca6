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

// ---- programmatic dependent launch (PDL, sm_90+) ----
// The runtime launches kernels with programmatic stream serialization (runtime/src/cuda/
// launch.rs): a kernel's blocks may start while its predecessor in the stream still runs.
// Every generated kernel therefore begins with `pdl_enter()` (abi.rs / generic/mod.rs put it
// there), and before it touches no global memory except
//   - L2 prefetches of weights (`prefetch_l2`): weights are written only by the host before
//     any launch, and a prefetch moves no data into registers or memory, and
//   - the pointer table `bufs`, likewise written only by the host.
// Invariant (why this covers every hazard, including write-after-read on arena offsets the
// memory plan reuses): `griddepcontrol.wait` returns only once the whole predecessor grid
// has completed and its memory operations are performed and visible; the predecessor waited
// for its own predecessor the same way, so by induction every earlier kernel of the stream
// has finished. No kernel reads data an earlier kernel writes, nor writes memory an earlier
// kernel may still read, before that point.
// `launch_dependents` only lets the next grid's blocks be scheduled early (to spin in their
// own wait); it promises nothing about memory, so it can be issued right away.
// Launched without PDL (eagerly by tests, on older GPUs, with SPECC_PDL=0) the wait returns
// at once and the trigger is a no-op. Below sm_90 both compile to nothing.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits for the predecessor grid, then lets the successor's blocks launch.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

// Prefetches the 128-byte line holding `p` (a global address) into L2. Only for memory no
// kernel writes (weights): it may run before `pdl_enter()`.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p)));
}
