// specc device prelude, part 2: vector loads and stores of N elements converted to/from f32.
// The pointer must be aligned to N * sizeof(T) bytes (at most 16 bytes per instruction;
// wider vectors split into several 16-byte accesses). Generators check alignment statically.

template <int N, typename T> struct alignas(N * sizeof(T) < 16 ? N * sizeof(T) : 16) VecT {
  T v[N];
};

// Load N elements of T at `p` as f32.
template <int N, typename T> __device__ __forceinline__ void ld_vec(const T* p, float (&o)[N]) {
  const VecT<N, T> t = *reinterpret_cast<const VecT<N, T>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] = to_f32(t.v[i]);
}

// Store N f32 values at `p`, rounded to T.
template <int N, typename T> __device__ __forceinline__ void st_vec(T* p, const float (&x)[N]) {
  VecT<N, T> t;
#pragma unroll
  for (int i = 0; i < N; ++i) t.v[i] = from_f32<T>(x[i]);
  *reinterpret_cast<VecT<N, T>*>(p) = t;
}

// 16 bytes through the read-only path without allocating in L1: for weights, read once per
// kernel. Not `volatile`, so the compiler may hoist these loads to keep several in flight.
__device__ __forceinline__ uint4 ld_stream_u4(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// Streaming load of N elements of T (N * sizeof(T) a multiple of 16) as f32.
template <int N, typename T>
__device__ __forceinline__ void ld_stream_vec(const T* p, float (&o)[N]) {
  static_assert((N * sizeof(T)) % 16 == 0, "streaming loads move whole 16-byte words");
  constexpr int WORDS = N * sizeof(T) / 16;
  constexpr int PER = 16 / sizeof(T);
#pragma unroll
  for (int w = 0; w < WORDS; ++w) {
    const uint4 u = ld_stream_u4(p + w * PER);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < PER; ++i) o[w * PER + i] = to_f32(e[i]);
  }
}

// Raw 16-byte copy (no conversion) from global to any address space.
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}

__device__ __forceinline__ void zero16(void* dst) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
}
