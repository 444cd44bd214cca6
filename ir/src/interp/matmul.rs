//! `matmul`: `out[m, n] = R(Σ_k x[m, k] · w[n, k])`, each sum in dot order (see
//! [`super::util::dot`]); `w` dequantised per element first (see [`WeightRows`]).
//!
//! The computation is blocked so that each weight row is read once for all rows of `x`:
//! the output columns are taken [`COLS`] at a time (their weight rows dequantised once), and
//! against them the rows of `x` a few at a time, each tile of rows × columns accumulating
//! in registers. Every output element is still one [`dot`](super::util::dot)-ordered sum of
//! its own row and column: the tiling changes which elements are computed together, never
//! the order of any element's additions, so results are identical for any row count (a
//! row alone or in a batch) and any thread count. Threads split the columns into
//! contiguous ranges ([`super::pool`]). On x86-64 the tiles are AVX registers, the lane
//! sums are combined with `hadd` in `dot`'s order, and the weights are prefetched ahead of
//! the loads. (AVX-512 tiles, two columns per register, were faster in isolation but
//! slower in whole runs on the Xeon this was measured on: 410-418 ms of CPU against
//! 359-371 ms for the default's 200 tokens, `bench/NOTES.md`.)

use std::ops::Range;
use std::sync::Mutex;

use super::pool;
use super::tensor::{round_into, round_to, Tensor};
use super::util::{dot, f32s, OpResult, Out};
use crate::DType;

/// Output columns per block: their weight rows are (dequantised and) kept hot while every
/// row of `x` passes over them.
const COLS: usize = 8;

/// Rows of `x` per tile: one register per row accumulating against the same weight
/// register, so a verify step's 6 rows are 6 independent sums (an add's latency, not its
/// throughput, bounds fewer).
const ROWS: usize = 8;

/// Multiply-adds a thread's part must have at least: waking a worker costs tens of µs,
/// and on a 2-core machine the embedded default's matmuls (up to 1.1 M multiply-adds for
/// a 6-token verify) ran slower on two threads than on one.
const MIN_PART_WORK: usize = 1 << 22;

/// Dequantised weight rows of a matmul: plain floats are used in place; fp8 and int4
/// rows are expanded into a scratch row as `w · scale` in f32.
pub(crate) enum WeightRows<'t> {
    Plain(&'t [f32]),
    Fp8 {
        w: &'t [f32],
        scale: &'t [f32],
        scale_cols: usize,
    },
    Int4 {
        q: &'t [i64],
        scale: &'t [f32],
        group: usize,
        groups: usize,
    },
}

impl<'t> WeightRows<'t> {
    /// Checks `w` ([N, K]) and its optional `scale` against the quantisation rules of
    /// `matmul` (op.rs).
    pub(crate) fn new(w: &'t Tensor, scale: Option<&'t Tensor>) -> Result<Self, String> {
        Self::part(w, scale, 0, 1)
    }

    /// Expert `e`'s rows of stacked weights `w` [E, N, K] with their stacked `scale`
    /// [E, ...] (the `moe_experts` rules): the same dequantisation as one `matmul` weight.
    pub(crate) fn expert(
        w: &'t Tensor,
        scale: Option<&'t Tensor>,
        e: usize,
    ) -> Result<Self, String> {
        Self::part(w, scale, e, w.shape[0])
    }

    /// Part `e` of `parts` equal parts along the leading axis of `w` (and `scale`), whose
    /// trailing two dims are [N, K].
    fn part(
        w: &'t Tensor,
        scale: Option<&'t Tensor>,
        e: usize,
        parts: usize,
    ) -> Result<Self, String> {
        let r = w.shape.len();
        let (n, k) = (w.shape[r - 2], w.shape[r - 1]);
        let lead: Vec<usize> = w.shape[..r - 2].to_vec();
        let parts = parts.max(1);
        let cut = |len: usize| e * len / parts..(e + 1) * len / parts;
        match (w.dtype, scale) {
            (DType::Fp8E4M3, Some(s)) => {
                let b = crate::FP8_BLOCK as usize;
                let mut want = lead.clone();
                want.extend([n.div_ceil(b), k.div_ceil(b)]);
                if s.shape != want || s.dtype != DType::F32 {
                    return Err(format!("fp8 scale must be f32{want:?}, got {s}"));
                }
                let (wv, sv) = (f32s(w, "fp8 weight")?, f32s(s, "fp8 scale")?);
                Ok(WeightRows::Fp8 {
                    w: &wv[cut(wv.len())],
                    scale: &sv[cut(sv.len())],
                    scale_cols: want[r - 1],
                })
            }
            (DType::Int4Group { group }, Some(s)) => {
                let group = group as usize;
                let mut want = lead.clone();
                want.extend([n, k.div_ceil(group)]);
                if s.shape != want {
                    return Err(format!("int4g{group} scale must be {want:?}, got {s}"));
                }
                let q = super::util::i64s(w, "int4 weight")?;
                let q = &q[cut(q.len())];
                if let Some(bad) = q.iter().find(|v| !(-8..=7).contains(*v)) {
                    return Err(format!("int4 weight value {bad} outside -8..=7"));
                }
                let sv = f32s(s, "int4 scale")?;
                Ok(WeightRows::Int4 {
                    q,
                    scale: &sv[cut(sv.len())],
                    group,
                    groups: want[r - 1],
                })
            }
            (_, None) => {
                let wv = f32s(w, "matmul weight")?;
                Ok(WeightRows::Plain(&wv[cut(wv.len())]))
            }
            (other, Some(_)) => Err(format!("matmul scale given for {other} weight")),
        }
    }

    /// Row `r` of the dequantised weight (length `k`), using `buf` as scratch.
    pub(crate) fn row<'b>(&'b self, r: usize, k: usize, buf: &'b mut [f32]) -> &'b [f32] {
        match *self {
            WeightRows::Plain(w) => &w[r * k..(r + 1) * k],
            WeightRows::Fp8 {
                w,
                scale,
                scale_cols,
            } => {
                let b = crate::FP8_BLOCK as usize;
                let srow = &scale[(r / b) * scale_cols..];
                for (c, x) in buf.iter_mut().enumerate() {
                    *x = w[r * k + c] * srow[c / b];
                }
                buf
            }
            WeightRows::Int4 {
                q,
                scale,
                group,
                groups,
            } => {
                let srow = &scale[r * groups..(r + 1) * groups];
                for (c, b) in buf.iter_mut().enumerate() {
                    *b = q[r * k + c] as f32 * srow[c / group];
                }
                buf
            }
        }
    }
}

/// `dequantize`: every row of `w` as `matmul` dequantises it, rounded to the output dtype.
pub(crate) fn dequantize(w: &Tensor, scale: &Tensor, out: &Out) -> OpResult {
    let (n, k) = (w.shape[0], w.shape[1]);
    let rows = WeightRows::new(w, Some(scale))?;
    let mut buf = vec![0.0f32; k];
    let mut res = Vec::with_capacity(n * k);
    for r in 0..n {
        res.extend(
            rows.row(r, k, &mut buf)
                .iter()
                .map(|&v| round_to(out.dtype, v)),
        );
    }
    Ok(out.f32(res))
}

pub(crate) fn matmul(x: &Tensor, w: &Tensor, scale: Option<&Tensor>, out: &Out) -> OpResult {
    matmul_split(x, w, scale, out, pool::threads(), MIN_PART_WORK)
}

/// [`matmul`] on at most `threads` threads, each part at least `min_part_work`
/// multiply-adds.
fn matmul_split(
    x: &Tensor,
    w: &Tensor,
    scale: Option<&Tensor>,
    out: &Out,
    threads: usize,
    min_part_work: usize,
) -> OpResult {
    let xv = f32s(x, "matmul input")?;
    let (n, k) = (w.shape[0], w.shape[1]);
    let rows = WeightRows::new(w, scale)?;
    let m = out.numel().checked_div(n).unwrap_or(0);
    #[cfg(target_arch = "x86_64")]
    let (one_row_tile, timed) = match m {
        1 => one_row::pick(k, n),
        _ => (4, false),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let one_row_tile = 4;
    let a = Operands {
        x: xv,
        rows: &rows,
        m,
        k,
        dtype: out.dtype,
        one_row_tile,
    };
    #[cfg(target_arch = "x86_64")]
    let t0 = std::time::Instant::now();
    let res = a.all_columns(n, threads, min_part_work);
    #[cfg(target_arch = "x86_64")]
    if m == 1 {
        one_row::record(k, n, one_row_tile, timed.then(|| t0.elapsed()));
    }
    Ok(out.f32(res))
}

impl Operands<'_> {
    /// Every output column (`n` of them) for every row, on at most `threads` threads, each
    /// part at least `min_part_work` multiply-adds.
    fn all_columns(&self, n: usize, threads: usize, min_part_work: usize) -> Vec<f32> {
        let (m, k) = (self.m, self.k);
        let mut res = vec![0.0f32; m * n];
        let blocks = n.div_ceil(COLS);
        let parts = threads
            .min(blocks)
            .min((m * n * k / min_part_work.max(1)).max(1))
            .max(1);
        if parts == 1 {
            self.columns(0..n, &mut res, n);
            return res;
        }
        // Part `p` computes the columns of blocks `p·blocks/parts ..`, into its own
        // [m, width] buffer, copied into place afterwards.
        let range =
            |p: usize| (p * blocks / parts * COLS).min(n)..((p + 1) * blocks / parts * COLS).min(n);
        let bufs: Vec<Mutex<Vec<f32>>> = (0..parts)
            .map(|p| Mutex::new(vec![0.0; m * range(p).len()]))
            .collect();
        pool::parts(parts, &|p| {
            let cols = range(p);
            let width = cols.len();
            let mut buf = bufs[p].lock().unwrap_or_else(|e| e.into_inner());
            self.columns(cols, &mut buf, width);
        });
        for (p, buf) in bufs.into_iter().enumerate() {
            let cols = range(p);
            let buf = buf.into_inner().unwrap_or_else(|e| e.into_inner());
            if cols.is_empty() {
                continue;
            }
            for (dst, src) in res.chunks_mut(n).zip(buf.chunks(cols.len())) {
                dst[cols.clone()].copy_from_slice(src);
            }
        }
        res
    }
}

/// `out[i] = dot(x, rows[i])` for every row (each [`dot`] bit for bit, several rows at a
/// time where the CPU allows): the attention scores of one query.
pub(crate) fn dots(x: &[f32], rows: &[&[f32]], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX (checked just above).
        unsafe { dots_avx(x, rows, out) };
        return;
    }
    for (o, r) in out.iter_mut().zip(rows) {
        *o = dot(x, r);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn dots_avx(x: &[f32], rows: &[&[f32]], out: &mut [f32]) {
    // SAFETY: AVX is enabled in this function. Four rows per tile: these rows are in
    // cache, where independent sums pay.
    unsafe { avx::row_block::<1, 4>([x], rows, out, 0, false) }
}

/// `out[r · stride + i] = dot(xs[r], rows[i])` for every query `r` and row `i`: [`dots`] for
/// several queries against the same rows (the attention scores of the query heads that
/// share a kv head), each row's loads shared by the queries; bit for bit [`dots`] per query.
pub(crate) fn dots_rows(xs: &[&[f32]], rows: &[&[f32]], out: &mut [f32], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX (checked just above).
        unsafe { dots_rows_avx(xs, rows, out, stride) };
        return;
    }
    for (r, x) in xs.iter().enumerate() {
        dots(x, rows, &mut out[r * stride..][..rows.len()]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn dots_rows_avx(xs: &[&[f32]], rows: &[&[f32]], out: &mut [f32], stride: usize) {
    let mut r = 0;
    // SAFETY (all calls): AVX is enabled in this function. Eight accumulators a tile.
    while r + 4 <= xs.len() {
        let x = [xs[r], xs[r + 1], xs[r + 2], xs[r + 3]];
        unsafe { avx::row_block::<4, 2>(x, rows, &mut out[r * stride..], stride, false) };
        r += 4;
    }
    while r + 2 <= xs.len() {
        let x = [xs[r], xs[r + 1]];
        unsafe { avx::row_block::<2, 4>(x, rows, &mut out[r * stride..], stride, false) };
        r += 2;
    }
    if r < xs.len() {
        unsafe { avx::row_block::<1, 4>([xs[r]], rows, &mut out[r * stride..], stride, false) };
    }
}

/// What every part of one matmul reads.
struct Operands<'a> {
    x: &'a [f32],
    rows: &'a WeightRows<'a>,
    m: usize,
    k: usize,
    dtype: DType,
    /// Weight rows per AVX tile when `m` is 1 (see [`one_row`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    one_row_tile: usize,
}

impl Operands<'_> {
    /// Output columns `cols` for every row into `dst` (`dst[i·stride + j - cols.start]`).
    fn columns(&self, cols: Range<usize>, dst: &mut [f32], stride: usize) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU supports AVX (checked just above).
            unsafe { self.columns_avx(cols, dst, stride) };
            return;
        }
        self.columns_portable(cols, dst, stride);
    }

    /// [`Operands::columns`] one [`dot`] at a time.
    fn columns_portable(&self, cols: Range<usize>, dst: &mut [f32], stride: usize) {
        self.blocks(cols, dst, stride, |x, w, sums, _| {
            for (r, xr) in x.iter().enumerate() {
                for (j, wr) in w.iter().enumerate() {
                    sums[r * COLS + j] = dot(xr, wr);
                }
            }
        });
    }

    /// [`Operands::columns`] with AVX tiles (see [`avx`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    unsafe fn columns_avx(&self, cols: Range<usize>, dst: &mut [f32], stride: usize) {
        self.blocks(cols, dst, stride, |x, w, sums, pf| match x.len() {
            // SAFETY (all arms): AVX is enabled in this function, which they inline into.
            // One weight row per tile from 2 rows of x: measured on an AMD EPYC (Zen 4)
            // with weights streamed from memory, tiles over 2+ weight rows ran 2-3x slower
            // (704 × 256, 4 rows of x: 54 µs against 1 weight row at a time, 150 µs
            // against 2). One row of x takes four weight rows where that is faster (one
            // sum alone waits on its add's latency: Xeon, the embedded default's layers,
            // 13 µs instead of 26 µs in L2) and one where it is not (the AMD EPYC again:
            // plain decoding 1.7x faster with one): [`one_row`] times both.
            1 if self.one_row_tile == 1 => unsafe {
                avx::row_block::<1, 1>([x[0]], w, sums, COLS, pf)
            },
            1 => unsafe { avx::row_block::<1, 4>([x[0]], w, sums, COLS, pf) },
            2 => unsafe { avx::row_block::<2, 1>([x[0], x[1]], w, sums, COLS, pf) },
            3 => unsafe { avx::row_block::<3, 1>([x[0], x[1], x[2]], w, sums, COLS, pf) },
            4 => unsafe { avx::row_block::<4, 1>([x[0], x[1], x[2], x[3]], w, sums, COLS, pf) },
            5 => unsafe {
                avx::row_block::<5, 1>(std::array::from_fn(|r| x[r]), w, sums, COLS, pf)
            },
            6 => unsafe {
                avx::row_block::<6, 1>(std::array::from_fn(|r| x[r]), w, sums, COLS, pf)
            },
            7 => unsafe {
                avx::row_block::<7, 1>(std::array::from_fn(|r| x[r]), w, sums, COLS, pf)
            },
            _ => unsafe {
                avx::row_block::<8, 1>(std::array::from_fn(|r| x[r]), w, sums, COLS, pf)
            },
        });
    }

    /// Walks the output in blocks: [`COLS`] columns at a time (their weight rows
    /// dequantised once), and for them the rows of `x` up to [`ROWS`] at a time;
    /// `kernel(x rows, weight rows, sums, first)` writes the unrounded dot product of every
    /// pair `(r, j)` into `sums[r · COLS + j]`, rounded and stored here; `first` says the
    /// weight rows are new (the first rows of `x` against them: prefetching the weights
    /// ahead pays there, not when later rows of `x` find them in cache).
    #[inline(always)]
    fn blocks(
        &self,
        cols: Range<usize>,
        dst: &mut [f32],
        stride: usize,
        mut kernel: impl FnMut(&[&[f32]], &[&[f32]], &mut [f32; ROWS * COLS], bool),
    ) {
        let (m, k) = (self.m, self.k);
        let mut scratch = match self.rows {
            WeightRows::Plain(_) => Vec::new(),
            _ => vec![0.0f32; COLS * k],
        };
        let mut c0 = cols.start;
        while c0 < cols.end {
            let width = COLS.min(cols.end - c0);
            let mut w: [&[f32]; COLS] = [&[]; COLS];
            match self.rows {
                WeightRows::Plain(wv) => {
                    for (j, wr) in w.iter_mut().take(width).enumerate() {
                        *wr = &wv[(c0 + j) * k..][..k];
                    }
                }
                quantised => {
                    for (j, buf) in scratch.chunks_mut(k.max(1)).take(width).enumerate() {
                        quantised.row(c0 + j, k, buf);
                    }
                    for (j, wr) in w.iter_mut().take(width).enumerate() {
                        *wr = &scratch[j * k..][..k];
                    }
                }
            }
            let at = c0 - cols.start;
            let mut i = 0;
            while i < m {
                let rows = ROWS.min(m - i);
                let mut x: [&[f32]; ROWS] = [&[]; ROWS];
                for (r, xr) in x.iter_mut().take(rows).enumerate() {
                    *xr = &self.x[(i + r) * k..][..k];
                }
                let mut sums = [0.0f32; ROWS * COLS];
                kernel(&x[..rows], &w[..width], &mut sums, i == 0);
                for (r, sr) in sums.chunks_exact(COLS).take(rows).enumerate() {
                    let d = &mut dst[(i + r) * stride + at..][..width];
                    round_into(self.dtype, &sr[..width], d);
                }
                i += rows;
            }
            c0 += width;
        }
    }
}

/// The weight rows a single row of `x` is tiled against, per matmul shape: both tiles give
/// the same bits, and which is faster depends on the CPU and the shape (see
/// [`Operands::columns_avx`]; a microbenchmark did not predict the whole model), so the
/// first calls of each shape alternate the two inside the running model and the faster on
/// average is kept.
#[cfg(target_arch = "x86_64")]
pub(crate) mod one_row {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    /// Forces a tile (`1` or `4`) instead of timing.
    pub const TILE_VAR: &str = "SPECC_CPU_ONE_ROW_TILE";
    /// The tiles: weight rows per tile.
    const TILES: [usize; 2] = [1, 4];
    /// First calls of a shape not timed (cold caches, page faults).
    const WARMUP: u32 = 2;
    /// Timed calls of each tile before the choice.
    const TRIALS: u32 = 12;

    #[derive(Clone, Copy)]
    enum Shape {
        Trial { calls: u32, secs: [f64; 2] },
        Chosen(usize),
    }

    fn shapes() -> &'static Mutex<HashMap<(usize, usize), Shape>> {
        static SHAPES: OnceLock<Mutex<HashMap<(usize, usize), Shape>>> = OnceLock::new();
        SHAPES.get_or_init(Default::default)
    }

    fn forced() -> Option<usize> {
        static FORCED: OnceLock<Option<usize>> = OnceLock::new();
        *FORCED.get_or_init(|| {
            let v = std::env::var(TILE_VAR).ok()?;
            v.trim().parse().ok().filter(|c| TILES.contains(c))
        })
    }

    /// The tile for a one-row matmul over `k` × `n` weights, and whether its time counts
    /// (what [`record`] is told).
    pub fn pick(k: usize, n: usize) -> (usize, bool) {
        if let Some(c) = forced() {
            return (c, false);
        }
        let mut map = shapes().lock().unwrap_or_else(|e| e.into_inner());
        match *map.entry((k, n)).or_insert(Shape::Trial {
            calls: 0,
            secs: [0.0; 2],
        }) {
            Shape::Chosen(c) => (c, false),
            Shape::Trial { calls, .. } => (TILES[calls as usize % 2], calls >= WARMUP),
        }
    }

    /// A call of `tile` over `k` × `n` took `took` (`None`: a warm-up, untimed): counted,
    /// and after [`TRIALS`] timed calls of each tile the faster on average is chosen for
    /// good.
    pub fn record(k: usize, n: usize, tile: usize, took: Option<Duration>) {
        let mut map = shapes().lock().unwrap_or_else(|e| e.into_inner());
        let Some(Shape::Trial { calls, secs }) = map.get_mut(&(k, n)) else {
            return;
        };
        if let Some(took) = took {
            secs[usize::from(tile != TILES[0])] += took.as_secs_f64();
        }
        *calls += 1;
        if *calls >= WARMUP + 2 * TRIALS {
            let c = if secs[0] <= secs[1] {
                TILES[0]
            } else {
                TILES[1]
            };
            map.insert((k, n), Shape::Chosen(c));
        }
    }

    /// One-row matmul shapes seen whose tile is still being timed.
    pub fn pending() -> usize {
        let map = shapes().lock().unwrap_or_else(|e| e.into_inner());
        map.values()
            .filter(|s| matches!(s, Shape::Trial { .. }))
            .count()
    }

    /// The tile chosen for `k` × `n`, once chosen (tests).
    #[cfg(test)]
    pub fn chosen(k: usize, n: usize) -> Option<usize> {
        let map = shapes().lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&(k, n)) {
            Some(Shape::Chosen(c)) => Some(*c),
            _ => None,
        }
    }
}

/// AVX tiles: `R` rows of `x` against `C` weight rows, one 8-lane register per pair.
/// Lane `l` of a register accumulates the products of elements `≡ l mod 8` with one
/// multiply and one add each (never fused), in element order, and the lanes are combined
/// as [`dot`] combines them, then the tail added in order: every result is bit for bit
/// [`dot`] of its pair.
#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_castps256_ps128, _mm256_extractf128_ps, _mm256_hadd_ps,
        _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm_add_ps, _mm_prefetch, _mm_storeu_ps,
        _MM_HINT_T0,
    };

    /// How far ahead of the loads (in floats) the weights are prefetched (512 and 1024
    /// measured alike, 256 slower at 6 rows).
    const PREFETCH: usize = 512;

    /// The products of `x` with every row of `w` into `sums[r · stride + j]`, `C`
    /// weight rows at a time (the last few one at a time).
    ///
    /// # Safety
    /// The CPU must support AVX (callers are compiled with it enabled).
    #[inline(always)]
    pub(super) unsafe fn row_block<const R: usize, const C: usize>(
        x: [&[f32]; R],
        w: &[&[f32]],
        sums: &mut [f32],
        stride: usize,
        pf: bool,
    ) {
        let mut j = 0;
        while j + C <= w.len() {
            let ws: [&[f32]; C] = std::array::from_fn(|c| w[j + c]);
            // SAFETY: AVX is supported (this function's contract).
            let s = unsafe { tile::<R, C>(&x, &ws, pf) };
            for (r, row) in s.iter().enumerate() {
                sums[r * stride + j..][..C].copy_from_slice(row);
            }
            j += C;
        }
        while j < w.len() {
            // SAFETY: as above.
            let s = unsafe { tile::<R, 1>(&x, &[w[j]], pf) };
            for (r, row) in s.iter().enumerate() {
                sums[r * stride + j] = row[0];
            }
            j += 1;
        }
    }

    /// # Safety
    /// The CPU must support AVX; every slice of `x` and `w` has the same length.
    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        x: &[&[f32]; R],
        w: &[&[f32]; C],
        pf: bool,
    ) -> [[f32; C]; R] {
        let k = w[0].len();
        assert!(x.iter().chain(w).all(|v| v.len() == k));
        let body = k - k % 8;
        // SAFETY: AVX is supported; every load reads 8 floats at `at + 8 <= body <= k`
        // of a slice of length `k`.
        unsafe {
            let mut acc: [[__m256; C]; R] = [[_mm256_setzero_ps(); C]; R];
            let mut at = 0;
            while at < body {
                for wc in w.iter().filter(|_| pf) {
                    // Software prefetch of the weights `PREFETCH` floats ahead: the
                    // hardware prefetchers stop at 4 KiB pages, and a verify step's
                    // matmuls otherwise wait on the weight loads (profiled: most samples
                    // of the tile on the first use of the weight register). A prefetch
                    // past the end of the weights is harmless (it never faults).
                    _mm_prefetch::<_MM_HINT_T0>(wc.as_ptr().wrapping_add(at + PREFETCH).cast());
                }
                let wv: [__m256; C] =
                    std::array::from_fn(|c| _mm256_loadu_ps(w[c].as_ptr().add(at)));
                for r in 0..R {
                    let xv = _mm256_loadu_ps(x[r].as_ptr().add(at));
                    for c in 0..C {
                        acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(xv, wv[c]));
                    }
                }
                at += 8;
            }
            let mut out = [[0.0f32; C]; R];
            // Four registers at a time: `hadd` adds neighbouring lanes, so two rounds of it
            // give `(a0 + a1) + (a2 + a3)` and `(a4 + a5) + (a6 + a7)` of each register in
            // lanes i and i + 4, and one add of the halves finishes `dot`'s combination.
            let mut g = 0;
            while g < R * C {
                let reg = |i: usize| {
                    if i < R * C {
                        acc[i / C][i % C]
                    } else {
                        _mm256_setzero_ps()
                    }
                };
                let h1 = _mm256_hadd_ps(reg(g), reg(g + 1));
                let h2 = _mm256_hadd_ps(reg(g + 2), reg(g + 3));
                let h = _mm256_hadd_ps(h1, h2);
                let four = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
                let mut s = [0.0f32; 4];
                _mm_storeu_ps(s.as_mut_ptr(), four);
                for (i, &v) in s.iter().enumerate().take((R * C).saturating_sub(g)) {
                    out[(g + i) / C][(g + i) % C] = v;
                }
                g += 4;
            }
            if body < k {
                for r in 0..R {
                    for c in 0..C {
                        for t in body..k {
                            out[r][c] += x[r][t] * w[c][t];
                        }
                    }
                }
            }
            out
        }
    }
}

/// One-row matmul shapes this process has run whose tile is still being chosen (their first
/// calls alternate the two tiles, one of them slower): what a step timed now would carry and
/// later steps will not. 0 off x86-64, where there is one tile.
pub fn one_row_tiles_pending() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        one_row::pending()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::super::tensor::round_to;
    use super::super::testutil::*;
    use super::super::util::{dot, Out};
    use super::*;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                let h = super::super::splitmix64(seed.wrapping_mul(0x9E37) ^ i);
                (h >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    fn out(dtype: DType, m: usize, n: usize) -> Out {
        Out {
            dtype,
            shape: vec![m, n],
        }
    }

    /// Several queries against the same rows give each query's [`dots`] bit for bit, at
    /// query counts that take every tile (4, 2 and a lone row) and row lengths with a tail.
    #[test]
    fn dots_of_several_queries_equal_each_alone() {
        for (queries, len, n) in [(1, 32, 5), (2, 37, 9), (3, 32, 7), (4, 40, 13), (7, 8, 3)] {
            let xs: Vec<Vec<f32>> = (0..queries)
                .map(|q| {
                    (0..len)
                        .map(|i| ((q * 31 + i * 7) % 23) as f32 * 0.173 - 1.9)
                        .collect()
                })
                .collect();
            let rows: Vec<Vec<f32>> = (0..n)
                .map(|r| {
                    (0..len)
                        .map(|i| ((r * 13 + i * 5) % 19) as f32 * 0.311 - 2.7)
                        .collect()
                })
                .collect();
            let xr: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
            let rr: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            let mut all = vec![0.0f32; queries * n];
            dots_rows(&xr, &rr, &mut all, n);
            for (q, x) in xr.iter().enumerate() {
                let mut one = vec![0.0f32; n];
                dots(x, &rr, &mut one);
                let same = one
                    .iter()
                    .zip(&all[q * n..])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{queries} queries of {len}, query {q}");
                assert_eq!(one[0].to_bits(), dot(x, rr[0]).to_bits());
            }
        }
    }

    /// Every element equals `R(dot(x_i, w_j))` exactly, whatever the number of rows in the
    /// batch and the number of threads: rows of a batch computed alone, the whole batch on
    /// 1, 2 and 3 threads, for widths that leave partial tiles and a tail after the lanes.
    #[test]
    fn rows_and_threads_do_not_change_any_bit() {
        for &(m, n, k) in &[(1, 3, 5), (7, 37, 21), (6, 530, 259), (9, 64, 8)] {
            for dtype in [DType::F32, DType::BF16] {
                let x = tf(dtype, &[m, k], &values(1, m * k));
                let w = tf(dtype, &[n, k], &values(2, n * k));
                let (xv, wv) = (x.as_f32().unwrap(), w.as_f32().unwrap());
                let want: Vec<f32> = (0..m * n)
                    .map(|e| {
                        let (i, j) = (e / n, e % n);
                        round_to(dtype, dot(&xv[i * k..][..k], &wv[j * k..][..k]))
                    })
                    .collect();
                for threads in [1, 2, 3] {
                    let r = matmul_split(&x, &w, None, &out(dtype, m, n), threads, 1).unwrap();
                    assert_eq!(
                        r.as_f32().unwrap(),
                        want,
                        "{m}x{n}x{k} {dtype}, {threads} threads"
                    );
                }
                for i in 0..m {
                    let xi = tf(dtype, &[1, k], &xv[i * k..][..k]);
                    for threads in [1, 2] {
                        let r = matmul_split(&xi, &w, None, &out(dtype, 1, n), threads, 1).unwrap();
                        assert_eq!(r.as_f32().unwrap(), &want[i * n..][..n], "row {i} alone");
                    }
                }
            }
        }
    }

    /// A row alone gives the same bits on either tile, and the calls of a shape settle on
    /// one tile after the trial calls; the calls during the trial are exact too.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn one_row_tiles_agree_and_the_first_calls_choose_one() {
        let (n, k) = (29, 37 * 8 + 5);
        let xv = values(3, k);
        let wv = values(4, n * k);
        let rows = WeightRows::Plain(&wv);
        let run = |one_row_tile| {
            let a = Operands {
                x: &xv,
                rows: &rows,
                m: 1,
                k,
                dtype: DType::F32,
                one_row_tile,
            };
            a.all_columns(n, 1, 1)
        };
        let want: Vec<f32> = (0..n).map(|j| dot(&xv, &wv[j * k..][..k])).collect();
        assert_eq!(run(1), want);
        assert_eq!(run(4), want);
        let (x, w) = (tf(DType::F32, &[1, k], &xv), tf(DType::F32, &[n, k], &wv));
        for _ in 0..64 {
            let r = matmul_split(&x, &w, None, &out(DType::F32, 1, n), 1, 1).unwrap();
            assert_eq!(r.as_f32().unwrap(), want);
        }
        let forced = std::env::var(one_row::TILE_VAR).is_ok();
        assert!(forced || matches!(one_row::chosen(k, n), Some(1 | 4)));
    }

    /// The AVX tiles and the portable path (one `dot` per element) agree bit for bit.
    #[test]
    fn portable_path_agrees() {
        for m in 1..=9 {
            for (n, k) in [(29, 83), (30, 64), (5, 7)] {
                let x = tf(DType::F32, &[m, k], &values(6, m * k));
                let w = tf(DType::F32, &[n, k], &values(7, n * k));
                let rows = WeightRows::new(&w, None).unwrap();
                for one_row_tile in [1, 4] {
                    let a = Operands {
                        x: x.as_f32().unwrap(),
                        rows: &rows,
                        m,
                        k,
                        dtype: DType::BF16,
                        one_row_tile,
                    };
                    let (mut fast, mut portable) = (vec![0.0; m * n], vec![1.0; m * n]);
                    a.columns(0..n, &mut fast, n);
                    a.columns_portable(0..n, &mut portable, n);
                    assert_eq!(fast, portable, "{m}x{n}x{k}");
                    #[cfg(target_arch = "x86_64")]
                    if std::arch::is_x86_feature_detected!("avx") {
                        let mut avx = vec![2.0; m * n];
                        // SAFETY: the CPU supports AVX (checked just above).
                        unsafe { a.columns_avx(0..n, &mut avx, n) };
                        assert_eq!(avx, portable, "{m}x{n}x{k}, AVX tiles");
                    }
                }
            }
        }
        // The attention scores' tiles (four keys at a time, then one).
        let (n, k) = (7, 40);
        let x = values(8, k);
        let w = values(9, n * k);
        let rows: Vec<&[f32]> = w.chunks(k).collect();
        let mut got = vec![0.0; n];
        dots(&x, &rows, &mut got);
        let want: Vec<f32> = rows.iter().map(|r| dot(&x, r)).collect();
        assert_eq!(got, want);
    }

    /// Quantised weights take the same path through dequantised scratch rows.
    #[test]
    fn int4_batch_equals_rows_alone() {
        let (m, n, k, g) = (5, 19, 64, 32);
        let x = tf(DType::F32, &[m, k], &values(3, m * k));
        let q: Vec<i64> = values(4, n * k).iter().map(|v| (v * 7.9) as i64).collect();
        let w = ti(DType::Int4Group { group: g }, &[n, k], &q);
        let s = tf(DType::BF16, &[n, k / g as usize], &values(5, n * 2));
        let all = matmul_split(&x, &w, Some(&s), &out(DType::F32, m, n), 2, 1).unwrap();
        let xv = x.as_f32().unwrap();
        for i in 0..m {
            let xi = tf(DType::F32, &[1, k], &xv[i * k..][..k]);
            let r = matmul_split(&xi, &w, Some(&s), &out(DType::F32, 1, n), 1, 1).unwrap();
            assert_eq!(r.as_f32().unwrap(), &all.as_f32().unwrap()[i * n..][..n]);
        }
    }
}
