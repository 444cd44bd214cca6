//! MoE expert kernels: the grouped kernels (each selected expert's weights read once for
//! all its tokens; float stacks, or int4 / fp8 stacks read as stored with their scales)
//! wherever they take the operands, else the per-token generic kernel; and how their expert
//! matmuls multiply.

use specc_ir::engine::{Arch, Target};
use specc_ir::DType;
use specc_kernels_gen::generic::moe_grouped::{
    self, CoreTiling, ExpertMatmul, Int4MmaGeometry, Int4MmaTiling, MoeGroupedShape, Unsupported,
};
use specc_kernels_gen::generic::TensorArg;

/// The grouped kernels' shape for `moe_experts` over `ops` (`x, gates, wg, wu, wd` and,
/// for int4 / fp8 stacks, `sg, su, sd`) into `out`, or why they do not take them; `top_k`
/// is the router's (the pairs a token can have), `None` when the gates come from elsewhere
/// (then every expert may be chosen).
pub fn grouped(
    ops: &[TensorArg],
    out: &TensorArg,
    top_k: Option<u64>,
) -> Result<MoeGroupedShape, Unsupported> {
    let (x, gates, wg) = (&ops[0], &ops[1], &ops[2]);
    moe_grouped::supported(x, &ops[2..], out)?;
    let (experts, ffn, hidden) = (wg.dims[0], wg.dims[1], wg.dims[2]);
    let tokens = gates.numel() / experts.max(1);
    Ok(MoeGroupedShape {
        tokens,
        experts,
        hidden,
        ffn,
        top_k: top_k.unwrap_or(experts),
    })
}

/// Tokens of a step from which int4 experts run on tensor cores: below it the CUDA-core
/// kernels measured as fast or faster at Kimi-K2.5's shapes (`kimi_bandwidth`; the tables
/// are in bench/NOTES.md, sessions 32 and 35).
pub const INT4_TENSOR_CORE_MIN_TOKENS: u64 = 8;

/// Tensor-core int4 tilings, preferred first; the first the operands and the target's shared
/// memory per block take is used. `g4s4w4-i` (a ring of 4 stages of 64 bytes a row, 4 warps
/// sharing one 32-row tile and interleaving its stages) measured fastest at 8 and 16 tokens;
/// 128-byte stages, deeper rings, 8-warp blocks and an L1 prefetch of the activations all
/// measured slower (`kimi_bandwidth`, bench/NOTES.md, sessions 32 and 35).
pub const INT4_TILINGS: [Int4MmaTiling; 2] = [Int4MmaTiling::G4_S4_W4_I, Int4MmaTiling::G4_S4_W4];

/// How the grouped kernels multiply `ops` (as [`grouped`]) into `out` on `target`: int4
/// group-32 stacks with bf16 activations on tensor cores (mma.sync m16n8k16 bf16, on every
/// arch we emit) from [`INT4_TENSOR_CORE_MIN_TOKENS`] tokens a step, tiled as the first of
/// [`INT4_TILINGS`] that fits: two integer-free unpack operations per two weights instead of
/// the CUDA-core path's ~3 issued instructions per weight and token. Everything else (fewer
/// tokens, f32 activations, fp8 and float stacks, widths off the stages) on the CUDA cores,
/// tiled as [`core_tiling`] says.
pub fn expert_matmul(ops: &[TensorArg], out: &TensorArg, target: &Target) -> ExpertMatmul {
    let hidden = ops[0].dims.last().copied().unwrap_or(1).max(1);
    let tokens = ops[0].numel() / hidden;
    let int4 = matches!(ops.get(2).map(|w| w.dtype), Some(DType::Int4Group { .. }));
    let hopper_only = !target.archs.is_empty() && target.archs.iter().all(|&a| a == Arch::Sm90a);
    let cuda = ExpertMatmul::CudaCores(core_tiling(int4 && hopper_only));
    if tokens < INT4_TENSOR_CORE_MIN_TOKENS {
        return cuda;
    }
    INT4_TILINGS
        .into_iter()
        .find(|&tl| {
            tl.smem_bytes() <= target.smem_per_block as u64
                && moe_grouped::int4_tensor_cores(&ops[0], &ops[2..], out, tl).is_ok()
        })
        .map_or(cuda, ExpertMatmul::Int4TensorCores)
}

/// The CUDA-core expert kernels' tiling: [`CoreTiling::PIPELINED`] where `pipelined` (int4
/// stacks on sm_90a only: their packed words leave the registers for a second trip in
/// flight, measured faster there; ptxas for sm_100a / sm_120 spills it, and float and fp8
/// loads are held as f32, which a second trip would spill; bench/NOTES.md, session 51),
/// else [`CoreTiling::DEFAULT`]; or the one of [`CoreTiling::VARIANTS`] named by
/// `SPECC_MOE_TILING` in the build's environment (device A/B runs of whole engines; an
/// unknown name is ignored with a note).
pub fn core_tiling(pipelined: bool) -> CoreTiling {
    let default = if pipelined {
        CoreTiling::PIPELINED
    } else {
        CoreTiling::DEFAULT
    };
    let Ok(name) = std::env::var("SPECC_MOE_TILING") else {
        return default;
    };
    match CoreTiling::VARIANTS.into_iter().find(|t| t.name() == name) {
        Some(t) => t,
        None => {
            eprintln!("note: SPECC_MOE_TILING={name} is not a tiling of CoreTiling::VARIANTS; using the default");
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specc_ir::engine::Arch;
    use specc_ir::DType;
    use specc_kernels_gen::abi::Loc;

    /// `moe_experts` operands: `x [t, h]`, `gates [t, e]`, stacks of `w` (with scales of
    /// `s` when quantised), activations `act`; and the output.
    fn operands(
        w: DType,
        s: DType,
        act: DType,
        h: u64,
        f: u64,
        t: u64,
    ) -> (Vec<TensorArg>, TensorArg) {
        let e = 384;
        let arg = |i: u64, dt, dims: &[u64]| TensorArg::new(Loc::arena(i << 20), dt, dims);
        let mut ops = vec![
            arg(0, act, &[t, h]),
            arg(1, act, &[t, e]),
            arg(2, w, &[e, f, h]),
            arg(3, w, &[e, f, h]),
            arg(4, w, &[e, h, f]),
        ];
        let scales = |rows: u64, k: u64, blk: u64| [e, rows.div_ceil(blk), k.div_ceil(blk)];
        match w {
            DType::Int4Group { group } => {
                let g = group as u64;
                ops.push(arg(5, s, &[e, f, h / g]));
                ops.push(arg(6, s, &[e, f, h / g]));
                ops.push(arg(7, s, &[e, h, f / g]));
            }
            DType::Fp8E4M3 => {
                ops.push(arg(5, s, &scales(f, h, 128)));
                ops.push(arg(6, s, &scales(f, h, 128)));
                ops.push(arg(7, s, &scales(h, f, 128)));
            }
            _ => {}
        }
        (ops, arg(8, act, &[t, h]))
    }

    fn pick(w: DType, s: DType, act: DType, h: u64, f: u64) -> ExpertMatmul {
        pick_at(w, s, act, h, f, INT4_TENSOR_CORE_MIN_TOKENS)
    }

    fn pick_at(w: DType, s: DType, act: DType, h: u64, f: u64, t: u64) -> ExpertMatmul {
        pick_on(w, s, act, h, f, t, &Target::for_archs(&[Arch::Sm90a]))
    }

    fn pick_on(
        w: DType,
        s: DType,
        act: DType,
        h: u64,
        f: u64,
        t: u64,
        target: &Target,
    ) -> ExpertMatmul {
        let (ops, out) = operands(w, s, act, h, f, t);
        grouped(&ops, &out, Some(8)).expect("grouped kernels take these operands");
        expert_matmul(&ops, &out, target)
    }

    /// Kimi-K2.5's int4 experts with bf16 activations run on tensor cores from
    /// [`INT4_TENSOR_CORE_MIN_TOKENS`] tokens a step, in stages of 64 bytes a row; fewer
    /// tokens, f32 activations, another group, widths off the 128-column stages, fp8 and
    /// bf16 stacks on CUDA cores.
    #[test]
    fn int4_bf16_experts_take_tensor_cores() {
        let i4 = DType::Int4Group { group: 32 };
        let (bf, f32) = (DType::BF16, DType::F32);
        let tc = ExpertMatmul::Int4TensorCores(Int4MmaTiling::G4_S4_W4_I);
        // int4 on CUDA cores pipelined on sm_90a, fp8 and float stacks not.
        let cuda = ExpertMatmul::CudaCores(CoreTiling::PIPELINED);
        for t in [1, 2, 4] {
            assert_eq!(pick_at(i4, bf, bf, 7168, 2048, t), cuda, "T={t}");
        }
        for t in [8, 16] {
            assert_eq!(pick_at(i4, bf, bf, 7168, 2048, t), tc, "T={t}");
        }
        assert_eq!(pick(i4, bf, bf, 512, 256), tc);
        assert_eq!(pick(i4, bf, bf, 512, 384), tc);
        // Every arch we emit holds the 36 KiB ring, also within 48 KiB a block.
        let all = Target::for_archs(&[Arch::Sm90a, Arch::Sm100a, Arch::Sm120]);
        assert_eq!(pick_on(i4, bf, bf, 7168, 2048, 8, &all), tc);
        // Pipelined only where every arch is sm_90a.
        let plain = ExpertMatmul::CUDA_CORES;
        assert_eq!(pick_on(i4, bf, bf, 7168, 2048, 1, &all), plain);
        let small = Target {
            smem_per_block: 48 * 1024,
            ..all
        };
        assert_eq!(pick_on(i4, bf, bf, 7168, 2048, 8, &small), tc);
        assert_eq!(pick(i4, bf, f32, 7168, 2048), cuda);
        assert_eq!(pick(i4, f32, bf, 7168, 2048), cuda);
        assert_eq!(
            pick(DType::Int4Group { group: 64 }, bf, bf, 7168, 2048),
            cuda
        );
        assert_eq!(pick(i4, bf, bf, 7168 + 32, 2048), cuda);
        assert_eq!(pick(i4, bf, bf, 64, 32), cuda);
        assert_eq!(pick(DType::Fp8E4M3, f32, bf, 7168, 2048), plain);
        assert_eq!(pick(bf, bf, bf, 7168, 2048), plain);
    }
}
