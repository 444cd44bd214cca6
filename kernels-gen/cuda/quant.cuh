// specc device prelude, part 4: quantised weights read as stored (REFERENCE.md "Weight
// formats"), dequantised to f32 exactly as the interpreter does (`WeightRows`,
// ir/src/interp/matmul.rs): the weight value q (int4) or the fp8 value, times its scale in
// f32, one rounding.
//
// int4 `pack-quantized`: a row of K columns is K/2 bytes; byte c/2 holds column c, the low
// nibble for even c (nibble i of little-endian word j is column 8j + i), as u = q + 8.
// fp8 e4m3fn: one byte per column, S.EEEE.MMM with bias 7, no infinities, NaN = S.1111.111.

// u (0..15) as the float u - 8: 2^23 + u has u in its low mantissa bits; subtracting
// 2^23 + 8 is exact.
__device__ __forceinline__ float int4_value(unsigned int u) {
  return __int_as_float(0x4B000000 | (int)u) - 8388616.0f;
}

// The fp8 e4m3fn byte b as f32 (exact): exponent and mantissa moved into f32's fields, the
// bias difference 127 - 7 restored by a multiply by 2^120 (exact; subnormal e4m3 values
// are f32 subnormals before it), NaN kept.
__device__ __forceinline__ float fp8e4m3_value(unsigned int b) {
  const float mag = __uint_as_float((b & 0x7Fu) << 20) * 1.329227995784916e36f;  // 2^120
  const float v = (b & 0x80u) ? -mag : mag;
  return (b & 0x7Fu) == 0x7Fu ? __int_as_float(0x7fffffff) : v;
}

// Column c of a packed int4 row (unscaled q).
__device__ __forceinline__ float ld_int4(const unsigned char* row, long long c) {
  return int4_value((row[c >> 1] >> ((c & 1) * 4)) & 15u);
}

// Column c of an fp8 row (unscaled).
__device__ __forceinline__ float ld_fp8(const unsigned char* row, long long c) {
  return fp8e4m3_value(row[c]);
}

// Streaming loads of 4, 8 or 16 bytes (read-only path, no L1 allocation), as 32-bit words.
template <int BYTES>
__device__ __forceinline__ void ld_stream_words(const unsigned char* p, unsigned int (&w)[BYTES / 4]) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "4, 8 or 16 bytes");
  if constexpr (BYTES == 16) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
        : "l"(p));
  } else if constexpr (BYTES == 8) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
  }
}

// N consecutive int4 columns (N = 8 or 16) from `p`, the byte of the first (an even
// column, N/2-byte aligned), unscaled.
template <int N>
__device__ __forceinline__ void ld_stream_int4(const unsigned char* p, float (&o)[N]) {
  unsigned int w[N / 8];
  ld_stream_words<N / 2>(p, w);
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] = int4_value((w[i / 8] >> (4 * (i % 8))) & 15u);
}

// N consecutive fp8 columns (N = 4, 8 or 16) from `p` (N-byte aligned), unscaled.
template <int N>
__device__ __forceinline__ void ld_stream_fp8(const unsigned char* p, float (&o)[N]) {
  unsigned int w[N / 4];
  ld_stream_words<N>(p, w);
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] = fp8e4m3_value((w[i / 4] >> (8 * (i % 4))) & 0xFFu);
}

// Nibble e (0..7) of word w as the float 1 + u/16 (u = q + 8): the nibble moved into the top
// four mantissa bits of 1.0f, one shift and one lop3, no float op. For a run of columns with
// one scale s, Σ x·(q·s) = 16·s·(Σ x·unit − 1.5·Σ x) (u − 8 = 16·(unit − 1.5)), so the
// grouped expert kernels spend two integer ops and one FMA per weight.
__device__ __forceinline__ float int4_unit(unsigned int w, int e) {
  const int sh = 19 - 4 * e;
  const unsigned int m = sh >= 0 ? (w << sh) : (w >> -sh);
  return __uint_as_float((m & 0x00780000u) | 0x3F800000u);
}
