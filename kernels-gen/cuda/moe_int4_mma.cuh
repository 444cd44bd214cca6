// Tensor-core helpers of the grouped int4 expert kernels (module items of `moe_gate_up` /
// `moe_down` on the int4 tensor-core path; src/generic/moe_grouped/int4_mma.rs).
//
// Fragments of mma.m16n8k16 (bf16 in, f32 accumulate), lane = 4·g + t: A holds weight rows
// g and g + 8, B the activations of token g, D rows g / g + 8 × tokens 2t, 2t + 1.
// K permutation (the same for A and B, so every dot product is unchanged): a lane holds
// word t (columns 8t .. 8t + 7 of a 32-column group) of its rows, nibbles n0..n7. Step 0 of
// the group takes slots {2t, 2t+1} = columns (8t, 8t+4) and {2t+8, 2t+9} = (8t+1, 8t+5),
// step 1 the same + 2. Both steps draw from one group, so one scale multiplies each
// group's partial sum after its two mma.

// 8 bytes global -> shared, asynchronously; zero-filled without reading when `ok` is false.
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(smem_addr(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(ok ? 8 : 0)
               : "memory");
}

// 16 bytes global -> shared from `base + OFF` (OFF an immediate of the instruction),
// asynchronously through L2 only; zero-filled without reading when `ok` is false.
template <long long OFF>
__device__ __forceinline__ void cp_async16_at(void* dst, const void* base, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1+%3], 16, %2;" ::"r"(smem_addr(dst)),
               "l"(__cvta_generic_to_global(base)), "r"(ok ? 16 : 0), "n"(OFF)
               : "memory");
}

// Four 8×8 b16 matrices from shared memory (lanes 8i .. 8i + 7 give matrix i's row
// addresses): word t of row g of matrix i into d[i].
__device__ __forceinline__ void ldmatrix_x4(unsigned (&d)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(smem_addr(row))
               : "memory");
}

// 16 bytes of activations through the read-only path (allocated in L1: the block's other
// warps read the same tokens); zeros and no access when `ok` is false. Volatile: kept in
// program order among the ring's copies and waits, so a stage's later sub-steps do not hold
// their activations in registers across the earlier ones.
__device__ __forceinline__ uint4 ld_x16_if(const void* p, bool ok) {
  uint4 r;
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "r"((int)ok));
  return r;
}

// Nibbles p and p + 4 of word q (u = q + 8, 0..15) as the bf16 pair (u − 8): OR-ing u into
// the mantissa of 128.0 (0x4300) gives exactly 128 + u, and 128 + u − 136 is exact.
template <int P> __device__ __forceinline__ unsigned int4_pair(unsigned q) {
  const unsigned v = ((q >> (4 * P)) & 0x000F000Fu) | 0x43004300u;
  const unsigned c136 = 0x43084308u;  // bf16x2 (136, 136)
  const __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                                   *reinterpret_cast<const __nv_bfloat162*>(&c136));
  return *reinterpret_cast<const unsigned*>(&r);
}

// The activation pair (x[P], x[P + 4]) of 8 bf16 `x` (columns 8t .. 8t + 7), as int4_pair<P>
// pairs the nibbles.
template <int P> __device__ __forceinline__ unsigned x_pair(const uint4& x) {
  const unsigned lo = (P & 2) ? x.y : x.x, hi = (P & 2) ? x.w : x.z;
  return __byte_perm(lo, hi, (P & 1) ? 0x7632 : 0x5410);
}

// A fragments of one 32-column group of an m16 tile (`lo` / `hi` word t of rows g / g + 8):
// a[0..4] step 0, a[4..8] step 1.
struct Int4A {
  unsigned a[8];
};
__device__ __forceinline__ Int4A int4_a(unsigned lo, unsigned hi) {
  return {{int4_pair<0>(lo), int4_pair<0>(hi), int4_pair<1>(lo), int4_pair<1>(hi),
           int4_pair<2>(lo), int4_pair<2>(hi), int4_pair<3>(lo), int4_pair<3>(hi)}};
}

// B fragments of the same group for token g (`x` its 8 bf16 at columns 8t .. 8t + 7):
// b[0..2] step 0, b[2..4] step 1.
struct Int4B {
  unsigned b[4];
};
__device__ __forceinline__ Int4B int4_b(const uint4& x) {
  return {{x_pair<0>(x), x_pair<1>(x), x_pair<2>(x), x_pair<3>(x)}};
}

// d = the group's unscaled sums: two m16n8k16 steps from zero, bf16 products exact, f32 sums.
__device__ __forceinline__ void int4_group_mma(float (&d)[4], const Int4A& a, const Int4B& b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a.a[0]), "r"(a.a[1]), "r"(a.a[2]), "r"(a.a[3]), "r"(b.b[0]), "r"(b.b[1]), "f"(0.0f));
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a.a[4]), "r"(a.a[5]), "r"(a.a[6]), "r"(a.a[7]), "r"(b.b[2]), "r"(b.b[3]));
}

// Element i (0, 1) of 2 bf16 held as raw bits, as f32 (exact).
__device__ __forceinline__ float bf16x2_at(unsigned w, int i) {
  return __uint_as_float(i ? (w & 0xFFFF0000u) : (w << 16));
}
