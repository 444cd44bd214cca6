//! The grouped MoE kernels, at Kimi-K2.5's routed experts (H 7168, F 2048, int4 group 32
//! with bf16 scales, or bf16 as Kimi-K2's, E 384, top-8), DeepSeek-V3's fp8
//! experts (E 256, 128-blocks) and the quantised fixtures' shapes (int4 H 64 / F 32, fp8
//! H 160 / F 48: partial edge blocks), and the operand layout the device test runs them in.

use specc_ir::DType;
use specc_kernels_gen::abi::{KernelSource, Loc};
use specc_kernels_gen::generic::moe_grouped::{
    moe_grouped, CoreTiling, ExpertMatmul, Int4MmaTiling, MoeGroupedShape, MoeScratch,
};
use specc_kernels_gen::generic::TensorArg;
use specc_kernels_gen::quant::QuantFormat;

/// A `moe_experts` for the grouped kernels: `x [T, H]`, `gates [T, E]`, the
/// output and the scratch in the arena (256-byte aligned, in that order); the stacks
/// `wg, wu, wd` in table slots 0..3, their scales (quantised stacks) in 3..6.
pub struct Case {
    pub shape: MoeGroupedShape,
    /// How `moe_gate_up` / `moe_down` multiply.
    pub matmul: ExpertMatmul,
    /// `x, gates, wg, wu, wd` and, quantised, `sg, su, sd`.
    pub ops: Vec<TensorArg>,
    pub out: TensorArg,
    pub scratch: MoeScratch,
    pub arena_bytes: u64,
}

/// The case for `tokens` tokens of activations `act`, experts stored as `w` (float, or
/// quantised with scales `s`): `e` experts of `[f, h]` gate / up and `[h, f]` down, `top_k`
/// per token, the expert matmuls as `matmul`.
pub fn case_with(
    matmul: ExpertMatmul,
    w: DType,
    s: DType,
    act: DType,
    shape: MoeGroupedShape,
) -> Case {
    let MoeGroupedShape {
        tokens: t,
        experts: e,
        hidden: h,
        ffn: f,
        ..
    } = shape;
    let elem = act.size_bytes().unwrap() as u64;
    let mut at = 0u64;
    let mut next = |bytes: u64| {
        let l = Loc::arena(at);
        at += bytes.next_multiple_of(256);
        l
    };
    let x = TensorArg::new(next(t * h * elem), act, &[t, h]);
    let gates = TensorArg::new(next(t * e * elem), act, &[t, e]);
    let out = TensorArg::new(next(t * h * elem), act, &[t, h]);
    let stat = next(4);
    let [meta, pair_token, pair_gate, pair_of, a, y] = shape.scratch_bytes(elem).map(&mut next);
    let scratch = MoeScratch {
        stat,
        meta,
        pair_token,
        pair_gate,
        pair_of,
        act: a,
        y,
    };
    let slot = |i: u32, dt, dims: &[u64]| TensorArg::new(Loc::table(i), dt, dims);
    let mut ops = vec![
        x,
        gates,
        slot(0, w, &[e, f, h]),
        slot(1, w, &[e, f, h]),
        slot(2, w, &[e, h, f]),
    ];
    if let Some(fmt) = QuantFormat::of(w) {
        ops.extend([
            slot(3, s, &[e, fmt.scale_rows(f), fmt.scale_cols(h)]),
            slot(4, s, &[e, fmt.scale_rows(f), fmt.scale_cols(h)]),
            slot(5, s, &[e, fmt.scale_rows(h), fmt.scale_cols(f)]),
        ]);
    }
    Case {
        shape,
        matmul,
        ops,
        out,
        scratch,
        arena_bytes: at,
    }
}

impl Case {
    /// The four kernels: dispatch, gate/up, down, combine.
    pub fn kernels(&self) -> Vec<KernelSource> {
        let o = &self.ops;
        moe_grouped(
            self.shape,
            self.matmul,
            &o[0],
            &o[1],
            &o[2..],
            &self.out,
            &self.scratch,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// One compiled grouped case: its label, stacks, scales, activations, shape and matmul.
pub struct Compiled {
    pub label: String,
    pub w: DType,
    pub s: DType,
    pub act: DType,
    pub shape: MoeGroupedShape,
    pub matmul: ExpertMatmul,
}

impl Compiled {
    pub fn case(&self) -> Case {
        case_with(self.matmul, self.w, self.s, self.act, self.shape)
    }
}

/// The tiling of the `kimi mma` cases: the one `codegen::choose::moe` prefers.
pub const MMA_DEFAULT: Int4MmaTiling = Int4MmaTiling::G4_S4_W4_I;

/// The compiled matrix: Kimi-K2.5 int4 on both paths (tensor cores at every token count of
/// a verify, 1..16, in [`MMA_DEFAULT`]'s tiling, and every other tiling the device times at
/// 1 and 16), DeepSeek-V3 fp8, Kimi-K2 bf16 and the fixtures on the CUDA cores.
pub fn shapes() -> Vec<Compiled> {
    let i4 = DType::Int4Group { group: 32 };
    let sh = |tokens, experts, hidden, ffn, top_k| MoeGroupedShape {
        tokens,
        experts,
        hidden,
        ffn,
        top_k,
    };
    let cuda = ExpertMatmul::CUDA_CORES;
    let mma = ExpertMatmul::Int4TensorCores(MMA_DEFAULT);
    let mut out = Vec::new();
    let mut push = |label: String, w, s, act, shape, matmul| {
        out.push(Compiled {
            label,
            w,
            s,
            act,
            shape,
            matmul,
        })
    };
    for t in [1, 16] {
        let kimi = sh(t, 384, 7168, 2048, 8);
        push(
            format!("kimi T={t}"),
            i4,
            DType::BF16,
            DType::BF16,
            kimi,
            cuda,
        );
        push(
            format!("deepseek fp8 T={t}"),
            DType::Fp8E4M3,
            DType::F32,
            DType::BF16,
            sh(t, 256, 7168, 2048, 8),
            cuda,
        );
        push(
            format!("kimi bf16 T={t}"),
            DType::BF16,
            DType::BF16,
            DType::BF16,
            kimi,
            cuda,
        );
        push(
            format!("fixture int4 T={t}"),
            i4,
            DType::BF16,
            DType::F32,
            sh(t, 8, 64, 32, 2),
            cuda,
        );
        push(
            format!("fixture fp8 T={t}"),
            DType::Fp8E4M3,
            DType::F32,
            DType::F32,
            sh(t, 8, 160, 48, 2),
            cuda,
        );
    }
    for t in [1, 2, 4, 8, 16] {
        let kimi = sh(t, 384, 7168, 2048, 8);
        push(
            format!("kimi mma T={t}"),
            i4,
            DType::BF16,
            DType::BF16,
            kimi,
            mma,
        );
    }
    for tl in Int4MmaTiling::VARIANTS
        .into_iter()
        .filter(|&tl| tl != MMA_DEFAULT)
    {
        for t in [1, 16] {
            push(
                format!("kimi mma {} T={t}", tl.name()),
                i4,
                DType::BF16,
                DType::BF16,
                sh(t, 384, 7168, 2048, 8),
                ExpertMatmul::Int4TensorCores(tl),
            );
        }
    }
    for tl in CoreTiling::VARIANTS
        .into_iter()
        .filter(|&tl| tl != CoreTiling::DEFAULT)
    {
        for t in [1, 16] {
            push(
                format!("kimi {} T={t}", tl.name()),
                i4,
                DType::BF16,
                DType::BF16,
                sh(t, 384, 7168, 2048, 8),
                ExpertMatmul::CudaCores(tl),
            );
        }
    }
    // Odd shapes (the last trip and row tile overrun) through a pipelined tiling.
    let piped = ExpertMatmul::CudaCores(CoreTiling::PIPELINED);
    push(
        "fixture int4 pipelined T=16".into(),
        i4,
        DType::BF16,
        DType::F32,
        sh(16, 8, 64, 32, 2),
        piped,
    );
    push(
        "fixture fp8 pipelined T=16".into(),
        DType::Fp8E4M3,
        DType::F32,
        DType::F32,
        sh(16, 8, 160, 48, 2),
        piped,
    );
    push(
        "small mma T=16".into(),
        i4,
        DType::BF16,
        DType::BF16,
        sh(16, 8, 512, 256, 2),
        mma,
    );
    out
}

/// Every grouped kernel of [`shapes`], labelled `moe_grouped <shape> <kernel name>`.
pub fn all() -> Vec<(String, KernelSource)> {
    let mut out = Vec::new();
    for c in shapes() {
        for k in c.case().kernels() {
            let family = k
                .name
                .rsplit_once('_')
                .map_or(k.name.as_str(), |p| p.0)
                .to_string();
            out.push((format!("moe_grouped {} {family}", c.label), k));
        }
    }
    out
}
