//! The grouped experts at Kimi-K2's shapes (H 7168, F 2048, top-8; 64 experts so the stacks
//! fit beside each other: 5.6 GB bf16, 1.6 GB int4): bf16 stacks (Kimi-K2) and int4 group 32
//! with bf16 scales (Kimi-K2.5), bf16 activations, at 16, 8, 4, 2 and 1 tokens of uniform
//! random routing; int4 on the CUDA cores in every tiling of `CoreTiling::VARIANTS` (their
//! outputs bit-identical to each other) and on tensor cores in every tiling of
//! `Int4MmaTiling::VARIANTS`. Checks: every token's output bit-identical to the 16-token
//! run's at 8, 4, 2 and 1 tokens (batch invariance); token 0 against a host reference in f64
//! with the interpreter's roundings (computed once per stack dtype).
//! Then times the four kernels, `moe_gate_up` and `moe_down` alone, in GB/s over the bytes of
//! the experts the tokens selected, next to the device's copy bandwidth; a table of every
//! variant's % of the copy bandwidth at each T last.

use super::gpu::{assert_close, bf16_tol, Gpu, Mem, Rng};
use super::quant_cases::grouped::case_with;
use specc_ir::DType;
use specc_kernels_gen::abi::{Bucket, Dtype};
use specc_kernels_gen::generic::moe_grouped::{
    CoreTiling, ExpertMatmul, Int4MmaGeometry, Int4MmaTiling, MoeGroupedShape,
};
use specc_kernels_gen::quant::QuantFormat;

const E: usize = 64;
const H: usize = 7168;
const F: usize = 2048;
const TOP_K: usize = 8;
const GROUP: usize = 32;

/// Stack bytes filled 8 at a time from a xorshift: bf16 values of magnitude 2^-7 .. 2^-4
/// (no NaN, no infinity), any int4 nibble.
fn fill(bytes: &mut [u8], bf16: bool, seed: u64) {
    let mut r = seed | 1;
    for chunk in bytes.chunks_mut(8) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        let mut v = r;
        if bf16 {
            let mut w = 0u64;
            for i in 0..4 {
                let x = (v >> (16 * i)) as u16;
                let e = 120 + ((x >> 7) & 3);
                w |= ((x & 0x807F | (e << 7)) as u64) << (16 * i);
            }
            v = w;
        }
        let b = v.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// Uniform routing: `TOP_K` distinct experts a token, gates in `[0.1, 1)`.
fn gates(t: usize, rng: &mut Rng) -> Vec<f64> {
    let mut g = vec![0.0; t * E];
    for row in g.chunks_mut(E) {
        let mut picked = 0;
        while picked < TOP_K {
            let ex = ((rng.next(0.5) + 0.5) * E as f64) as usize % E;
            if row[ex] == 0.0 {
                row[ex] = 0.55 + rng.next(0.45);
                picked += 1;
            }
        }
    }
    g
}

fn bf16_at(b: &[u8], i: usize) -> f64 {
    half::bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f64()
}

fn round_bf16(v: f64) -> f64 {
    half::bf16::from_f32(v as f32).to_f64()
}

/// The stacks as stored: `w[m]` bytes, `s[m]` bf16 scales (int4).
struct Stacks {
    int4: bool,
    w: Vec<Vec<u8>>,
    s: Vec<Vec<u8>>,
}

impl Stacks {
    /// Weight `(row, col)` of expert `ex`'s matrix `m` (`[rows, k]`).
    fn at(&self, m: usize, ex: usize, rows: usize, k: usize, row: usize, col: usize) -> f64 {
        let i = (ex * rows + row) * k + col;
        if !self.int4 {
            return bf16_at(&self.w[m], i);
        }
        let q = ((self.w[m][i / 2] >> (4 * (i % 2))) & 15) as f64 - 8.0;
        let s = bf16_at(&self.s[m], (ex * rows + row) * (k / GROUP) + col / GROUP);
        q * s
    }

    /// Bytes of one expert (three matrices and their scales).
    fn expert_bytes(&self) -> u64 {
        let per: u64 = self.w.iter().chain(&self.s).map(|b| b.len() as u64).sum();
        per / E as u64
    }
}

/// Token `tk`'s output with the interpreter's roundings: `R(silu(R(g)))·R(u)` rounded, the
/// down product rounded, `Σ gate·y` in f32 in increasing expert order, rounded.
fn reference(st: &Stacks, x: &[f64], g: &[f64], tk: usize) -> Vec<f64> {
    let xr = &x[tk * H..(tk + 1) * H];
    let mut out = vec![0f32; H];
    for ex in 0..E {
        let gate = g[tk * E + ex];
        if gate == 0.0 {
            continue;
        }
        let act: Vec<f64> = (0..F)
            .map(|j| {
                let dot = |m| {
                    (0..H)
                        .map(|c| xr[c] * st.at(m, ex, F, H, j, c))
                        .sum::<f64>()
                };
                let (gv, uv) = (round_bf16(dot(0)), round_bf16(dot(1)));
                let sl = round_bf16(gv / (1.0 + (-gv).exp()));
                round_bf16(sl * uv)
            })
            .collect();
        for (i, o) in out.iter_mut().enumerate() {
            let y = round_bf16((0..F).map(|j| act[j] * st.at(2, ex, H, F, i, j)).sum());
            *o += (gate as f32) * y as f32;
        }
    }
    out.iter().map(|&v| round_bf16(v as f64)).collect()
}

impl Stacks {
    /// The stacks as Kimi-K2 (bf16) or Kimi-K2.5 (int4 group 32, bf16 scales) store them,
    /// filled from fixed seeds.
    fn new(int4: bool) -> Stacks {
        let fmt = QuantFormat::of(w_dtype(int4));
        let mut st = Stacks {
            int4,
            w: Vec::new(),
            s: Vec::new(),
        };
        for (m, &(n, k)) in DIMS.iter().enumerate() {
            let bytes = fmt.map_or(2 * n * k, |f| f.weight_bytes(n as u64, k as u64) as usize);
            let mut b = vec![0u8; E * bytes];
            fill(&mut b, !int4, 0x5EED + m as u64);
            st.w.push(b);
            if let Some(f) = fmt {
                let vals: Vec<u8> = (0..E * f.scale_numel(n as u64, k as u64) as usize)
                    .flat_map(|i| {
                        half::bf16::from_f64(0.004 + 0.002 * (i % 7) as f64).to_le_bytes()
                    })
                    .collect();
                st.s.push(vals);
            }
        }
        st
    }
}

/// `[rows, k]` of `Wg`, `Wu`, `Wd`.
const DIMS: [(usize, usize); 3] = [(F, H), (F, H), (H, F)];
/// Copies of the stacks the timing cycles through: down alone at T = 1 reads 66 MB of int4,
/// about the H200's 50 MB L2, so one copy would time it partly from L2.
const COPIES: usize = 3;
/// Token counts, largest first (the first run is the batch-invariance reference).
const TOKENS: [usize; 5] = [16, 8, 4, 2, 1];

/// The token counts to run: `SPECC_KIMI_TOKENS` (e.g. `8,1`, for a profiler run over a few
/// launches), else [`TOKENS`]; largest first.
fn tokens() -> Vec<usize> {
    let mut t: Vec<usize> = std::env::var("SPECC_KIMI_TOKENS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| TOKENS.to_vec());
    t.retain(|&n| (1..=TOKENS[0]).contains(&n));
    t.sort_unstable_by(|a, b| b.cmp(a));
    t
}

/// Whether variant `name` runs: `SPECC_KIMI_VARIANTS` lists names (`bf16`, `int4g32`,
/// `g4s4w4`, …; a variant runs when its name ends with one of them), else every variant.
fn wanted(name: &str) -> bool {
    std::env::var("SPECC_KIMI_VARIANTS").map_or(true, |v| {
        v.split(',')
            .any(|w| !w.is_empty() && name.ends_with(w.trim()))
    })
}

fn w_dtype(int4: bool) -> DType {
    if int4 {
        DType::Int4Group {
            group: GROUP as u32,
        }
    } else {
        DType::BF16
    }
}

/// One variant's timings: per count of [`TOKENS`], % of the copy bandwidth of the four
/// kernels, of `moe_gate_up` and of `moe_down`, and the four kernels' milliseconds; and its
/// output at the first count.
struct Timings {
    name: String,
    pct: Vec<[f64; 4]>,
    first: Vec<f64>,
}

/// Checks and times the grouped kernels over `st` with the expert matmuls as `mm`; `want0`
/// is token 0's reference output (computed by the first run over `st`).
fn run(
    gpu: &Gpu,
    st: &Stacks,
    mm: ExpertMatmul,
    copy_gbps: f64,
    want0: &mut Option<Vec<f64>>,
) -> Timings {
    let name = match (st.int4, mm) {
        (false, _) => "bf16".to_string(),
        (true, ExpertMatmul::CUDA_CORES) => "int4g32".to_string(),
        (true, ExpertMatmul::CudaCores(tl)) => format!("int4g32 {}", tl.name()),
        (true, ExpertMatmul::Int4TensorCores(tl)) => format!("int4g32 mma {}", tl.name()),
    };
    let w_dt = w_dtype(st.int4);
    let mut rng = Rng::new(7168);
    let tmax = TOKENS[0];
    let counts = tokens();
    let x = rng.vec(tmax * H, 1.0);
    let g = gates(tmax, &mut rng);
    let mut bufs: Vec<Vec<u8>> = st.w.iter().chain(&st.s).cloned().collect();
    let mut full: Option<Vec<f64>> = None;
    let mut pct = Vec::new();
    for &t in &counts {
        let shape = MoeGroupedShape {
            tokens: t as u64,
            experts: E as u64,
            hidden: H as u64,
            ffn: F as u64,
            top_k: TOP_K as u64,
        };
        let c = case_with(mm, w_dt, DType::BF16, DType::BF16, shape);
        let kernels = c.kernels();
        let mut mem = Mem::new(c.arena_bytes, &[]);
        mem.bufs = std::mem::take(&mut bufs);
        mem.put(c.ops[0].loc, Dtype::BF16, &x[..t * H]);
        mem.put(c.ops[1].loc, Dtype::BF16, &g[..t * E]);
        let bucket = Bucket {
            b: 1,
            t: t as u32,
            ctx: 1,
        };
        let refs: Vec<_> = kernels.iter().collect();
        gpu.run(&mut mem, &refs, bucket);
        let got = mem.get(c.out.loc, Dtype::BF16, t * H);
        let label = format!("kimi {name} T={t}");
        match &full {
            None => {
                let want = want0.get_or_insert_with(|| {
                    let xs = mem.get(c.ops[0].loc, Dtype::BF16, t * H);
                    let gs = mem.get(c.ops[1].loc, Dtype::BF16, t * E);
                    reference(st, &xs, &gs, 0)
                });
                let (rtol, atol) = bf16_tol(want);
                assert_close(&format!("{label} token 0"), &got[..H], want, rtol, atol);
                full = Some(got);
            }
            Some(all) => {
                let same = got.iter().zip(all).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{label}: outputs differ from the 16-token run's");
                println!("{label}: bit-identical to the 16-token run's first {t} tokens");
            }
        }
        let used = (0..E)
            .filter(|&ex| (0..t).any(|tk| g[tk * E + ex] != 0.0))
            .count() as u64;
        let per = st.expert_bytes();
        let wd = (st.w[2].len() + st.s.get(2).map_or(0, Vec::len)) as u64 / E as u64;
        let bytes = [used * per, used * (per - wd), used * wd];
        let us = gpu.time_many(&mem, &[&refs, &refs[1..2], &refs[2..3]], bucket, COPIES, 20);
        let gbps = |i: usize| bytes[i] as f64 / (us[i] * 1e-6) / 1e9;
        let part = |i: usize| {
            format!(
                "{:.3} ms {:.0} GB/s ({:.1} %)",
                us[i] * 1e-3,
                gbps(i),
                100.0 * gbps(i) / copy_gbps
            )
        };
        println!(
            "BANDWIDTH {label}: {used} experts, {:.1} MB; all four kernels {}; gate_up {}; down {}",
            bytes[0] as f64 / 1e6,
            part(0),
            part(1),
            part(2)
        );
        let p = |i: usize| 100.0 * gbps(i) / copy_gbps;
        pct.push([p(0), p(1), p(2), us[0] * 1e-3]);
        bufs = std::mem::take(&mut mem.bufs);
    }
    println!(
        "PASS kimi {name}: token 0 within tolerance, T = {counts:?} bit-identical to the first"
    );
    Timings {
        name,
        pct,
        first: full.unwrap_or_default(),
    }
}

/// The table of every variant: per T, `all% (gate_up% / down%)` of the copy bandwidth.
fn print_table(rows: &[Timings], copy_gbps: f64) {
    println!();
    println!(
        "BANDWIDTH TABLE: % of copy ({copy_gbps:.0} GB/s) over the selected experts' bytes, \
         all four kernels (gate_up / down alone) and ms of all four"
    );
    let mut head = format!("{:<22}", "variant");
    for t in tokens().iter().rev() {
        head += &format!(" | {:<26}", format!("T={t}"));
    }
    println!("{head}");
    for r in rows {
        let mut line = format!("{:<22}", r.name);
        for p in r.pct.iter().rev() {
            line += &format!(
                " | {:<26}",
                format!("{:.1} ({:.0}/{:.0}) {:.3}", p[0], p[1], p[2], p[3])
            );
        }
        println!("{line}");
    }
}

#[test]
fn kimi_bandwidth() {
    let Some(gpu) = Gpu::new() else { return };
    let copy = gpu.copy_gbps(20);
    println!("BANDWIDTH copy: {copy:.0} GB/s (read + write)");
    let mut rows = Vec::new();
    if wanted("bf16") {
        let bf16 = Stacks::new(false);
        rows.push(run(&gpu, &bf16, ExpertMatmul::CUDA_CORES, copy, &mut None));
    }
    let int4 = Stacks::new(true);
    let mut want0 = None;
    let mut default_out: Option<Vec<f64>> = None;
    for tl in CoreTiling::VARIANTS {
        let name = if tl == CoreTiling::DEFAULT {
            "int4g32".to_string()
        } else {
            tl.name()
        };
        if !wanted(&name) {
            continue;
        }
        let r = run(&gpu, &int4, ExpertMatmul::CudaCores(tl), copy, &mut want0);
        // Every CUDA-core tiling sums each lane's columns in the same order.
        match &default_out {
            None => default_out = Some(r.first.clone()),
            Some(d) => {
                let same = r
                    .first
                    .iter()
                    .zip(d)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "int4g32 {}: outputs differ from the first tiling's",
                    tl.name()
                );
                println!(
                    "int4g32 {}: bit-identical to the first CUDA-core tiling",
                    tl.name()
                );
            }
        }
        rows.push(r);
    }
    for tl in Int4MmaTiling::VARIANTS {
        if !wanted(&tl.name()) {
            continue;
        }
        if tl.smem_bytes() > gpu.target().smem_per_block as u64 {
            println!(
                "SKIP int4g32 mma {}: {} B of shared memory a block",
                tl.name(),
                tl.smem_bytes()
            );
            continue;
        }
        let mm = ExpertMatmul::Int4TensorCores(tl);
        rows.push(run(&gpu, &int4, mm, copy, &mut want0));
    }
    print_table(&rows, copy);
}
