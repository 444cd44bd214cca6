// Tensor-core helpers of the gemv_mma family (module items of those kernels only).
//
// "Swap AB": the weight tile is the A operand (16 output columns n on the m16 side) and the
// x rows are the B operand (8 token rows on the n8 side), so D = W · xᵀ is yᵀ.
//
// K permutation: a lane (g = lane / 4, t = lane % 4) holds 8 consecutive k (one 16-byte
// load) of weight rows g and g + 8 and the same 8 k of token row g. Two m16n8k16 steps
// consume them: in the first, logical k slot s of the fragment layout is actual k
// 8·(s % 4) + 2·(s / 4) + {0, 1}, in the second the same + 4. A and B use the same map,
// so Σ_k W[n][k]·x[m][k] is unchanged and every operand comes from one 16-byte load.

// D += A·B over 32 k: `lo` / `hi` are 8 k of weight rows g / g + 8, `b` 8 k of x row g.
#define SPECC_MMA_K32(NAME, PTX_TYPE)                                                        \
  __device__ __forceinline__ void NAME(float (&d)[4], const uint4& lo, const uint4& hi,     \
                                       const uint4& b) {                                    \
    asm("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE ".f32 "              \
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                   \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                    \
        : "r"(lo.x), "r"(hi.x), "r"(lo.y), "r"(hi.y), "r"(b.x), "r"(b.y));                  \
    asm("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE ".f32 "              \
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                   \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                    \
        : "r"(lo.z), "r"(hi.z), "r"(lo.w), "r"(hi.w), "r"(b.z), "r"(b.w));                  \
  }
SPECC_MMA_K32(mma_k32_bf16, "bf16")
SPECC_MMA_K32(mma_k32_f16, "f16")
#undef SPECC_MMA_K32

// Predicated 16-byte loads: zeros when `ok` is false, and then no memory access at all
// (the predicate is inside the PTX, so the compiler cannot speculate the load past the
// bounds check). Weights stream without L1 allocation (read once); x rows allocate in L1
// (the other warps and blocks of the SM read them too). Both use the read-only path,
// valid because no thread writes weights or x during the kernel.
#define SPECC_LD_U4_IF(NAME, CACHE)                                                          \
  __device__ __forceinline__ uint4 NAME(const void* p, bool ok) {                           \
    uint4 r;                                                                                \
    asm("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"                                       \
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"               \
        " @q ld.global.nc" CACHE ".v4.u32 {%0, %1, %2, %3}, [%4];\n}"                        \
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)                                        \
        : "l"(p), "r"((int)ok));                                                            \
    return r;                                                                               \
  }
SPECC_LD_U4_IF(ld_stream_u4_if, ".L1::no_allocate")
SPECC_LD_U4_IF(ld_nc_u4_if, "")
#undef SPECC_LD_U4_IF

// 8 elements of T as raw 16-byte words (loaded now, converted at use so that the load
// stays in flight); zeros when `ok` is false.
template <typename T> struct Raw8 {
  uint4 w[sizeof(T) / 2];
};

template <typename T> __device__ __forceinline__ Raw8<T> ld_raw8_if(const T* p, bool ok) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 2); ++i) r.w[i] = ld_nc_u4_if(p + i * (16 / sizeof(T)), ok);
  return r;
}

// The fused RMSNorm of 8 x elements, as the IR op rounds it: round(round(x · r) · g).
template <typename XT, typename GT>
__device__ __forceinline__ uint4 rms_scale8(const uint4& xr, const Raw8<GT>& g, float r) {
  const XT* xe = reinterpret_cast<const XT*>(&xr);
  const GT* ge = reinterpret_cast<const GT*>(&g);
  uint4 o;
  XT* oe = reinterpret_cast<XT*>(&o);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float nv = round_to<XT>(to_f32(xe[e]) * r);
    oe[e] = from_f32<XT>(nv * to_f32(ge[e]));
  }
  return o;
}

// Argmax over the 8 lanes of a warp that share t = lane % 4 (lanes t, t + 4, ..., t + 28);
// ties go to the lower index. Every lane receives its group's result.
__device__ __forceinline__ ArgmaxPair quad_column_argmax(ArgmaxPair p) {
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, p.v, o);
    const int i = __shfl_xor_sync(0xffffffffu, p.i, o);
    if (argmax_better(v, i, p.v, p.i)) {
      p.v = v;
      p.i = i;
    }
  }
  return p;
}
