//! MoE expert kernels: the grouped kernels (each selected expert's weights read once for
//! all its tokens) wherever their loads fit the shapes, else the per-token generic kernel.

use specc_kernels_gen::generic::moe_grouped::{self, MoeGroupedShape};
use specc_kernels_gen::generic::TensorArg;

/// The grouped kernels' shape for `moe_experts` over `ops` (`x, gates, wg, wu, wd`) into
/// `out`, where they take the operands; `top_k` is the router's (the pairs a token can
/// have), `None` when the gates come from elsewhere (then every expert may be chosen).
pub fn grouped(ops: &[TensorArg], out: &TensorArg, top_k: Option<u64>) -> Option<MoeGroupedShape> {
    let (x, gates, wg, wd) = (&ops[0], &ops[1], &ops[2], &ops[4]);
    if !moe_grouped::supported(x, wg, wd, out) || ops[3].dtype != wg.dtype {
        return None;
    }
    let (experts, ffn, hidden) = (wg.dims[0], wg.dims[1], wg.dims[2]);
    let tokens = gates.numel() / experts.max(1);
    Some(MoeGroupedShape {
        tokens,
        experts,
        hidden,
        ffn,
        top_k: top_k.unwrap_or(experts),
    })
}
