//! MoE expert kernels: the grouped kernels (each selected expert's weights read once for
//! all its tokens; float stacks, or int4 / fp8 stacks read as stored with their scales)
//! wherever they take the operands, else the per-token generic kernel; and how their expert
//! matmuls multiply.

use specc_kernels_gen::generic::moe_grouped::{self, ExpertMatmul, MoeGroupedShape, Unsupported};
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

/// How the grouped kernels multiply `ops` (as [`grouped`]) into `out`: int4 group-32 stacks
/// with bf16 activations on tensor cores on every arch we emit (mma.sync m16n8k16 bf16 is
/// on sm_90a, sm_100a and sm_120): two integer-free unpack operations per two weights
/// instead of the CUDA-core path's ~3 issued instructions per weight and token, which bound
/// the int4 stacks to about a third of the copy bandwidth (bench/NOTES.md, "int4 grouped
/// experts on tensor cores"). Everything else (f32 activations, fp8 and float stacks) on
/// the CUDA cores.
pub fn expert_matmul(ops: &[TensorArg], out: &TensorArg) -> ExpertMatmul {
    match moe_grouped::int4_tensor_cores(&ops[0], &ops[2..], out) {
        Ok(()) => ExpertMatmul::Int4TensorCores,
        Err(_) => ExpertMatmul::CudaCores,
    }
}
