// specc device prelude, generic family (src/generic/): element access, integer arithmetic,
// casts, ranking and reductions with exactly the interpreter's rules (ir/src/interp/).
// Prepended after common.cuh, vec.cuh and reduce.cuh to every single-op kernel.

// A `bool` element: one byte holding 0 or 1 (DType::Bool is 1 byte in the memory plan).
typedef unsigned char b8;

#define SPECC_I64_MIN (-9223372036854775807ll - 1)

// ---- integer and bool elements as the interpreter holds them: i64 values ----

__device__ __forceinline__ long long to_i64(int x) { return x; }
__device__ __forceinline__ long long to_i64(long long x) { return x; }
__device__ __forceinline__ long long to_i64(b8 x) { return x != 0; }

// Storing an i64 value: i32 wraps (two's complement truncation), bool is `v != 0`.
template <typename T> __device__ __forceinline__ T from_i64(long long x);
template <> __device__ __forceinline__ int from_i64<int>(long long x) {
  return (int)(unsigned int)(unsigned long long)x;
}
template <> __device__ __forceinline__ long long from_i64<long long>(long long x) { return x; }
template <> __device__ __forceinline__ b8 from_i64<b8>(long long x) { return x != 0; }

// ---- i64 arithmetic: wrapping, division and remainder by zero give 0 ----

__device__ __forceinline__ long long wadd(long long a, long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}
__device__ __forceinline__ long long wsub(long long a, long long b) {
  return (long long)((unsigned long long)a - (unsigned long long)b);
}
__device__ __forceinline__ long long wmul(long long a, long long b) {
  return (long long)((unsigned long long)a * (unsigned long long)b);
}
__device__ __forceinline__ long long wneg(long long a) {
  return (long long)(0ull - (unsigned long long)a);
}
// Rust `checked_div(b).unwrap_or(0)`: 0 for b == 0 and for the overflowing MIN / -1.
__device__ __forceinline__ long long idiv(long long a, long long b) {
  return (b == 0 || (a == SPECC_I64_MIN && b == -1)) ? 0 : a / b;
}
// Rust `checked_rem_euclid(b).unwrap_or(0)`: never negative; 0 where checked_div is 0.
__device__ __forceinline__ long long irem_euclid(long long a, long long b) {
  if (b == 0 || (a == SPECC_I64_MIN && b == -1)) return 0;
  const long long r = a % b;
  if (r >= 0) return r;
  const unsigned long long abs_b = b < 0 ? 0ull - (unsigned long long)b : (unsigned long long)b;
  return (long long)((unsigned long long)r + abs_b);
}
__device__ __forceinline__ long long imax(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long imin(long long a, long long b) { return a < b ? a : b; }

// ---- casts: float -> int truncates toward zero, saturating, NaN -> 0 (Rust `as`) ----

__device__ __forceinline__ long long f2i32(float x) {
  if (x != x) return 0;
  if (x >= 2147483648.0f) return 2147483647ll;
  if (x <= -2147483648.0f) return -2147483648ll;
  return (long long)(int)x;
}
__device__ __forceinline__ long long f2i64(float x) {
  if (x != x) return 0;
  if (x >= 9223372036854775808.0f) return 9223372036854775807ll;
  if (x <= -9223372036854775808.0f) return SPECC_I64_MIN;
  return (long long)x;
}

// ---- random_uniform: (splitmix64(seed ^ counter) >> 40) / 2^24, exact in f32 ----

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
  unsigned long long z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float uniform_f32(unsigned long long seed, long long counter) {
  return (float)(splitmix64(seed ^ (unsigned long long)counter) >> 40) / 16777216.0f;
}

// ---- ranking (argmax, topk): NaN ranks as -inf, -0 == +0, ties to the lower index ----

__device__ __forceinline__ float rank_key(float x) { return x != x ? neg_inf() : x; }
__device__ __forceinline__ long long rank_key(long long x) { return x; }
__device__ __forceinline__ float lowest_key(float) { return neg_inf(); }
__device__ __forceinline__ long long lowest_key(long long) { return SPECC_I64_MIN; }

template <typename K> struct Best {
  K v;
  int i;
};

// `(av, ai)` ranks before `(bv, bi)`: larger key, or equal key and lower index.
template <typename K>
__device__ __forceinline__ bool ranks_before(K av, int ai, K bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

// A candidate no real element loses to (lowest key, largest index).
template <typename K> __device__ __forceinline__ Best<K> no_best() {
  return Best<K>{lowest_key(K()), 0x7fffffff};
}

template <typename K> __device__ __forceinline__ Best<K> warp_best(Best<K> p) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const K v = __shfl_xor_sync(0xffffffffu, p.v, o);
    const int i = __shfl_xor_sync(0xffffffffu, p.i, o);
    if (ranks_before(v, i, p.v, p.i)) {
      p.v = v;
      p.i = i;
    }
  }
  return p;
}

// Best over the block; `scratch` holds blockDim.x / 32 entries. Every thread must call it
// (it synchronises) and every thread receives the result.
template <typename K> __device__ Best<K> block_best(Best<K> p, Best<K>* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  p = warp_best(p);
  __syncthreads();
  if (lane == 0) scratch[warp] = p;
  __syncthreads();
  Best<K> b = scratch[0];
  for (int w = 1; w < nw; ++w)
    if (ranks_before(scratch[w].v, scratch[w].i, b.v, b.i)) b = scratch[w];
  return b;
}

// ---- reductions of one value type with one operator ----

struct SumF32 {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
// Ignores NaN like Rust's f32::max.
struct MaxF32 {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumI64 {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return wadd(a, b);
  }
};
struct MaxI64 {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return imax(a, b);
  }
};

template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T x, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Reduction over the block in a fixed order (deterministic); same calling rules as
// block_best.
template <typename T, typename Op> __device__ T block_reduce(T x, Op op, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = warp_reduce(x, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  T t = scratch[0];
  for (int w = 1; w < nw; ++w) t = op(t, scratch[w]);
  return t;
}

// ---- sample: inverse CDF over the interpreter's blocked f32 running sum ----

// One block of NT threads samples one row of `v` probabilities (`SAMPLE_BLOCK` = BLK values a
// block of the row): with `s_j` block j's sequential sum, `P_j = s_0 + ... + s_{j-1}` in
// order, the running sum at element r of block j is `P_j + (p_0 + ... + p_r)` (the block's own
// partial sum), and the result is the smallest index whose running sum exceeds `u * P_n`, else
// `v - 1` (interp `sample`). The block sums are computed in parallel, one thread a block,
// each with `maxs_j`, the largest partial sum of the block (NaN ignored): f32 addition is
// monotone in each operand, so some running sum of block j exceeds the threshold exactly
// when `P_j + maxs_j` does. Thread 0 turns the sums into `P_j` in order; the first block past
// the threshold is found by a shared-memory minimum; thread 0 reruns its partial sums. `sums`
// and `maxs` hold ceil(v / BLK) floats each (shared memory). Returns the index in thread 0.
template <int NT, int BLK>
__device__ int sample_row(const float* p, int v, float u, float* sums, float* maxs,
                          int* first, float* thr_out) {
  const int nb = (v + BLK - 1) / BLK;
  for (int j = threadIdx.x; j < nb; j += NT) {
    const float* b = p + (long long)j * BLK;
    const int len = min(BLK, v - j * BLK);
    float s = 0.0f, m = neg_inf();
    if (len == BLK) {
#pragma unroll 16
      for (int r = 0; r < BLK; ++r) {
        s = __fadd_rn(s, b[r]);
        m = fmaxf(m, s);
      }
    } else {
      for (int r = 0; r < len; ++r) {
        s = __fadd_rn(s, b[r]);
        m = fmaxf(m, s);
      }
    }
    sums[j] = s;
    maxs[j] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float acc = 0.0f;
    for (int j = 0; j < nb; ++j) {
      const float sj = sums[j];
      sums[j] = acc;
      acc = __fadd_rn(acc, sj);
    }
    *thr_out = __fmul_rn(u, acc);
    *first = nb;
  }
  __syncthreads();
  const float thr = *thr_out;
  for (int j = threadIdx.x; j < nb; j += NT) {
    if (__fadd_rn(sums[j], maxs[j]) > thr) {
      atomicMin(first, j);
      break;
    }
  }
  __syncthreads();
  int res = v - 1;
  if (threadIdx.x == 0 && *first < nb) {
    const int j = *first;
    const float start = sums[j];
    const float* b = p + (long long)j * BLK;
    const int len = min(BLK, v - j * BLK);
    float s = 0.0f;
    for (int r = 0; r < len; ++r) {
      s = __fadd_rn(s, b[r]);
      if (__fadd_rn(start, s) > thr) {
        res = j * BLK + r;
        break;
      }
    }
  }
  return res;
}

// ---- draft trees (tree_build): a binary max-heap of candidates ----

// A candidate node: score, parent node, rank within its depth's top-K, depth.
struct TreeCand {
  float s;
  int p;
  int r;
  int d;
};

// The IR order (op `tree_build`): higher score (NaN as -inf), then lower parent, then lower
// rank. Strict and total over distinct candidates, so any heap pops the same sequence.
__device__ __forceinline__ bool tree_better(const TreeCand& a, const TreeCand& b) {
  const float ka = isnan(a.s) ? neg_inf() : a.s;
  const float kb = isnan(b.s) ? neg_inf() : b.s;
  if (ka != kb) return ka > kb;
  if (a.p != b.p) return a.p < b.p;
  return a.r < b.r;
}

__device__ inline void tree_push(TreeCand* h, int& n, TreeCand c) {
  int i = n++;
  while (i > 0) {
    const int up = (i - 1) / 2;
    if (!tree_better(c, h[up])) break;
    h[i] = h[up];
    i = up;
  }
  h[i] = c;
}

// Removes and returns the best candidate; `n > 0`.
__device__ inline TreeCand tree_pop(TreeCand* h, int& n) {
  const TreeCand top = h[0];
  const TreeCand last = h[--n];
  int i = 0;
  while (true) {
    const int l = 2 * i + 1;
    if (l >= n) break;
    const int c = (l + 1 < n && tree_better(h[l + 1], h[l])) ? l + 1 : l;
    if (!tree_better(h[c], last)) break;
    h[i] = h[c];
    i = c;
  }
  if (n > 0) h[i] = last;
  return top;
}
