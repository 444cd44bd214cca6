//! The DeepSeek-V3 decoder layer (`DeepseekV3ForCausalLM`; REFERENCE.md "DeepSeek-V3 /
//! Kimi-K2"): multi-head latent attention in the absorbed form, then a dense SwiGLU MLP
//! (layers below `first_k_dense_replace`) or the DeepSeek MoE.
//!
//! Per layer the KV cache holds, per token, RMSNorm(c) (`kv_lora_rank` values) in state
//! `kv.{l}.k` `[B, Ctx, 1, kv_lora_rank]` and the rotated shared key `k_pe`
//! (`qk_rope_head_dim`) in `kv.{l}.v` `[B, Ctx, 1, qk_rope_head_dim]`: 576 values for
//! Kimi-K2, against 2·H·(192 + 128) for the expanded keys and values. Two states rather
//! than one keep the commit of a draft tree (which moves a layer's two cache rows) the
//! same for every architecture.
//!
//! Attention: `q_lat = q_nope · W_UK` per head (`head_matmul`, W_UK = the first
//! `qk_nope_head_dim` rows of each head's `kv_b_proj` block), `mla_attention` over the
//! latent cache, `· W_UVᵀ` per head (the last `v_head_dim` rows), `o_proj`.

use specc_ir::op::{dims, B, CTX};
use specc_ir::{
    AttnMask, BinaryOp, DType, Dim, Graph, IrError, MoeScoring, Op, Shape, TensorType, ValueId,
};

use crate::config::ModelSpec;
use crate::config_mla::{MlaSpec, MoeSpec};
use crate::lower::{
    cast_to, linear, mlp, plain_weight, quant_weight, rmsnorm, weight, LayerMask, LayerNames,
};

/// RMSNorm epsilon of `q_a_layernorm` and `kv_a_layernorm`: transformers builds them with
/// `DeepseekV3RMSNorm(rank)`, its default eps, not `rms_norm_eps`.
pub const LORA_NORM_EPS: f64 = 1e-6;

/// One DeepSeek-V3 decoder layer: `x + mla(rmsnorm(x))`, then `+ mlp_or_moe(rmsnorm(·))`.
/// Returns the output and the layer's updated latent and rope-key caches.
pub(crate) fn decoder_layer(
    g: &mut Graph,
    spec: &ModelSpec,
    names: &LayerNames,
    x: ValueId,
    positions: ValueId,
    mask: LayerMask,
) -> Result<(ValueId, ValueId, ValueId), IrError> {
    let mla = spec
        .mla
        .as_ref()
        .expect("decoder_layer dispatches here only for MLA");
    let p = &names.weights;
    let h = rmsnorm(
        g,
        spec,
        x,
        &format!("{p}.input_layernorm.weight"),
        spec.hidden,
    )?;
    let (a, c_cache, pe_cache) = attention(g, spec, mla, names, h, positions, mask)?;
    let x = g.add(Op::Binary(BinaryOp::Add), &[x, a])?;
    let h = rmsnorm(
        g,
        spec,
        x,
        &format!("{p}.post_attention_layernorm.weight"),
        spec.hidden,
    )?;
    let m = match &spec.moe {
        Some(moe) if moe.is_moe_layer(names.layer) => moe_block(g, spec, moe, p, h)?,
        _ => mlp(g, spec, p, h)?,
    };
    Ok((
        g.add(Op::Binary(BinaryOp::Add), &[x, m])?,
        c_cache,
        pe_cache,
    ))
}

/// Cache state types of one layer: latent `[B, Ctx, 1, kv_lora_rank]`, rope key
/// `[B, Ctx, 1, qk_rope_head_dim]`.
pub fn cache_types(spec: &ModelSpec, mla: &MlaSpec) -> (TensorType, TensorType) {
    let t = |w: usize| TensorType::new(spec.dtype, [B, CTX, Dim::Static(1), Dim::from(w)]);
    (t(mla.kv_lora_rank), t(mla.qk_rope_head_dim))
}

fn rmsnorm_eps(
    g: &mut Graph,
    spec: &ModelSpec,
    x: ValueId,
    name: &str,
    width: usize,
    eps: f64,
) -> Result<ValueId, IrError> {
    let w = g.weight(name, TensorType::new(spec.dtype, [Dim::from(width)]))?;
    g.add(Op::RmsNorm { eps }, &[x, w])
}

fn slice(
    g: &mut Graph,
    x: ValueId,
    axis: usize,
    start: usize,
    len: usize,
) -> Result<ValueId, IrError> {
    g.add(
        Op::Slice {
            axis,
            start: start as u64,
            len: len as u64,
        },
        &[x],
    )
}

/// Whether q_a and kv_a read the normed hidden state as one matrix, their weights stacked
/// (`concat` of the two checkpoint weights: one launch of 2112 columns at Kimi's dims
/// instead of 1536 and 576, and the weights built once at upload), each consumer reading
/// its columns of the product. Only where q_a, kv_a and q_b are stored unquantised: a
/// quantised weight's block scales need not stack, and the quantised matmul reads
/// contiguous rows of x.
fn stacks_q_a_kv_a(spec: &ModelSpec, names: &[&str]) -> bool {
    names.iter().all(|n| spec.quant.format_of(n).is_none())
}

fn reshape(g: &mut Graph, x: ValueId, ds: &[Dim]) -> Result<ValueId, IrError> {
    g.add(Op::Reshape { shape: dims(ds) }, &[x])
}

fn attention(
    g: &mut Graph,
    spec: &ModelSpec,
    mla: &MlaSpec,
    names: &LayerNames,
    h: ValueId,
    positions: ValueId,
    mask: LayerMask,
) -> Result<(ValueId, ValueId, ValueId), IrError> {
    let p = &names.weights;
    let (nh, hid) = (spec.heads, spec.hidden);
    let (dn, dr, dv, l) = (
        mla.qk_nope_head_dim,
        mla.qk_rope_head_dim,
        mla.v_head_dim,
        mla.kv_lora_rank,
    );
    let qk = mla.qk_head_dim();
    let (bd, td) = (g.ty(h).shape.dims()[0], g.ty(h).shape.dims()[1]);
    let s = Dim::from;
    let kv_a_name = format!("{p}.self_attn.kv_a_proj_with_mqa.weight");
    let (q, kva) = match mla.q_lora_rank {
        Some(r) => {
            let q_a_name = format!("{p}.self_attn.q_a_proj.weight");
            let q_b_name = format!("{p}.self_attn.q_b_proj.weight");
            let (qa, kva) = if stacks_q_a_kv_a(spec, &[&q_a_name, &kv_a_name, &q_b_name]) {
                let wq = weight(g, spec, &q_a_name, &[r, hid])?;
                let wkv = weight(g, spec, &kv_a_name, &[l + dr, hid])?;
                let w = g.add(Op::Concat { axis: 0 }, &[wq, wkv])?;
                let both = g.add(Op::MatMul, &[h, w])?;
                (slice(g, both, 2, 0, r)?, slice(g, both, 2, r, l + dr)?)
            } else {
                (
                    linear(g, spec, h, &q_a_name, r, hid)?,
                    linear(g, spec, h, &kv_a_name, l + dr, hid)?,
                )
            };
            let qa = rmsnorm_eps(
                g,
                spec,
                qa,
                &format!("{p}.self_attn.q_a_layernorm.weight"),
                r,
                LORA_NORM_EPS,
            )?;
            (linear(g, spec, qa, &q_b_name, nh * qk, r)?, kva)
        }
        None => (
            linear(
                g,
                spec,
                h,
                &format!("{p}.self_attn.q_proj.weight"),
                nh * qk,
                hid,
            )?,
            linear(g, spec, h, &kv_a_name, l + dr, hid)?,
        ),
    };
    let q = reshape(g, q, &[bd, td, s(nh), s(qk)])?;
    let q_nope = slice(g, q, 3, 0, dn)?;
    let q_pe = slice(g, q, 3, dn, dr)?;
    let c = slice(g, kva, 2, 0, l)?;
    let c = rmsnorm_eps(
        g,
        spec,
        c,
        &format!("{p}.self_attn.kv_a_layernorm.weight"),
        l,
        LORA_NORM_EPS,
    )?;
    let c = reshape(g, c, &[bd, td, s(1), s(l)])?;
    let k_pe = slice(g, kva, 2, l, dr)?;
    let k_pe = reshape(g, k_pe, &[bd, td, s(1), s(dr)])?;
    let rope = Op::Rope {
        theta: spec.rope_theta,
        scaling: spec.rope_scaling.clone(),
        style: mla.rope_style,
        rotary_dim: dr as u64,
    };
    let q_pe = g.add(rope.clone(), &[q_pe, positions])?;
    let k_pe = g.add(rope, &[k_pe, positions])?;

    let (c_ty, pe_ty) = cache_types(spec, mla);
    let c_cache = g.state(&names.k_cache, c_ty)?;
    let pe_cache = g.state(&names.v_cache, pe_ty)?;
    let slots = match mask {
        LayerMask::Causal => positions,
        LayerMask::Tree { slots, .. } => slots,
    };
    let c_cache = g.add(Op::KvWrite, &[c_cache, c, slots])?;
    let pe_cache = g.add(Op::KvWrite, &[pe_cache, k_pe, slots])?;

    let kv_b = plain_weight(
        g,
        spec,
        &format!("{p}.self_attn.kv_b_proj.weight"),
        nh * (dn + dv),
        l,
    )?;
    let kv_b = g.add(
        Op::Reshape {
            shape: Shape::new([s(nh), s(dn + dv), s(l)]),
        },
        &[kv_b],
    )?;
    let w_uk = slice(g, kv_b, 1, 0, dn)?;
    let w_uv = slice(g, kv_b, 1, dn, dv)?;
    let q_lat = g.add(Op::HeadMatMul { trans_w: false }, &[q_nope, w_uk])?;
    let scale = mla.softmax_scale;
    let o_lat = match mask {
        LayerMask::Causal => g.add(
            Op::MlaAttention {
                scale,
                mask: AttnMask::Causal,
            },
            &[q_lat, q_pe, c_cache, pe_cache, positions],
        )?,
        LayerMask::Tree {
            prefix_len,
            ancestors,
            ..
        } => g.add(
            Op::MlaAttention {
                scale,
                mask: AttnMask::Tree,
            },
            &[q_lat, q_pe, c_cache, pe_cache, slots, prefix_len, ancestors],
        )?,
    };
    let o = g.add(Op::HeadMatMul { trans_w: true }, &[o_lat, w_uv])?;
    let o = reshape(g, o, &[bd, td, s(nh * dv)])?;
    let o = linear(
        g,
        spec,
        o,
        &format!("{p}.self_attn.o_proj.weight"),
        hid,
        nh * dv,
    )?;
    Ok((o, c_cache, pe_cache))
}

/// `down(silu(gate(h)) · up(h))` with the projections `{stem}.{gate,up,down}_proj.weight`.
fn swiglu(
    g: &mut Graph,
    spec: &ModelSpec,
    stem: &str,
    ffn: usize,
    h: ValueId,
) -> Result<ValueId, IrError> {
    let hid = spec.hidden;
    let gate = linear(g, spec, h, &format!("{stem}.gate_proj.weight"), ffn, hid)?;
    let up = linear(g, spec, h, &format!("{stem}.up_proj.weight"), ffn, hid)?;
    let act = g.add(Op::SiluMul, &[gate, up])?;
    linear(g, spec, act, &format!("{stem}.down_proj.weight"), hid, ffn)
}

/// Every routed expert's `{proj}` weight `[rows, cols]` stacked into `[E, rows, cols]`, with
/// their scales stacked the same way when the experts are stored quantised (all experts of
/// a projection share one format: `Checkpoint::adapt_quant` checked).
fn stacked(
    g: &mut Graph,
    spec: &ModelSpec,
    moe: &MoeSpec,
    p: &str,
    proj: &str,
    rows: usize,
    cols: usize,
) -> Result<(ValueId, Option<ValueId>), IrError> {
    let mut ws = Vec::with_capacity(moe.experts);
    let mut scales = Vec::new();
    for j in 0..moe.experts {
        let name = format!("{p}.mlp.experts.{j}.{proj}.weight");
        let (w, scale) = quant_weight(g, spec, &name, rows, cols)?;
        ws.push(lead_one(g, w)?);
        if let Some(s) = scale {
            scales.push(lead_one(g, s)?);
        }
    }
    let w = g.add(Op::Concat { axis: 0 }, &ws)?;
    let s = if scales.is_empty() {
        None
    } else {
        Some(g.add(Op::Concat { axis: 0 }, &scales)?)
    };
    Ok((w, s))
}

/// `[a, b]` viewed as `[1, a, b]`.
fn lead_one(g: &mut Graph, v: ValueId) -> Result<ValueId, IrError> {
    let mut dims = vec![Dim::from(1usize)];
    dims.extend(g.ty(v).shape.dims().iter().cloned());
    g.add(
        Op::Reshape {
            shape: Shape::new(dims),
        },
        &[v],
    )
}

/// The DeepSeek MoE: router in f32 (`mlp.gate.weight`, sigmoid, the
/// `e_score_correction_bias` for selection only, group-limited top-k) over the routed
/// experts, plus the shared experts.
fn moe_block(
    g: &mut Graph,
    spec: &ModelSpec,
    moe: &MoeSpec,
    p: &str,
    h: ValueId,
) -> Result<ValueId, IrError> {
    let (e, hid, f) = (moe.experts, spec.hidden, moe.intermediate);
    let s = Dim::from;
    let h32 = cast_to(g, h, DType::F32)?;
    let gate_w = g.weight(
        &format!("{p}.mlp.gate.weight"),
        TensorType::new(moe.router_dtype, [s(e), s(hid)]),
    )?;
    let logits = g.add(Op::MatMul, &[h32, gate_w])?;
    let bias = g.weight(
        &format!("{p}.mlp.gate.e_score_correction_bias"),
        TensorType::new(moe.bias_dtype, [s(e)]),
    )?;
    let bias = cast_to(g, bias, DType::F32)?;
    let gates = g.add(
        Op::MoeRoute {
            top_k: moe.top_k as u64,
            scoring: MoeScoring::Sigmoid,
            n_group: moe.n_group as u64,
            topk_group: moe.topk_group as u64,
            norm_topk_prob: moe.norm_topk_prob,
            scaling: moe.routed_scaling_factor,
        },
        &[logits, bias],
    )?;
    let (wg, sg) = stacked(g, spec, moe, p, "gate_proj", f, hid)?;
    let (wu, su) = stacked(g, spec, moe, p, "up_proj", f, hid)?;
    let (wd, sd) = stacked(g, spec, moe, p, "down_proj", hid, f)?;
    let mut args = vec![h, gates, wg, wu, wd];
    args.extend([sg, su, sd].into_iter().flatten());
    let routed = g.add(Op::MoeExperts, &args)?;
    let shared = swiglu(
        g,
        spec,
        &format!("{p}.mlp.shared_experts"),
        f * moe.shared_experts,
        h,
    )?;
    g.add(Op::Binary(BinaryOp::Add), &[routed, shared])
}

/// Elements of every weight a DeepSeek-V3 model reads, or `None` on `u64` overflow.
pub(crate) fn param_count(spec: &ModelSpec, mla: &MlaSpec, moe: &MoeSpec) -> Option<u64> {
    let n = |x: usize| x as u64;
    let (h, nh) = (n(spec.hidden), n(spec.heads));
    let qk = n(mla.qk_head_dim());
    let q = match mla.q_lora_rank {
        Some(r) => h
            .checked_mul(n(r))?
            .checked_add(n(r))?
            .checked_add(n(r).checked_mul(nh.checked_mul(qk)?)?)?,
        None => h.checked_mul(nh.checked_mul(qk)?)?,
    };
    let l = n(mla.kv_lora_rank);
    let kv_a = h
        .checked_mul(l.checked_add(n(mla.qk_rope_head_dim))?)?
        .checked_add(l)?;
    let kv_b = l.checked_mul(nh.checked_mul(n(mla.qk_nope_head_dim + mla.v_head_dim))?)?;
    let o = nh.checked_mul(n(mla.v_head_dim))?.checked_mul(h)?;
    let attn = q.checked_add(kv_a)?.checked_add(kv_b)?.checked_add(o)?;
    let norms = h.checked_mul(2)?;
    let dense = h.checked_mul(n(spec.intermediate))?.checked_mul(3)?;
    let f = n(moe.intermediate);
    let expert = h.checked_mul(f)?.checked_mul(3)?;
    let e = n(moe.experts);
    let moe_mlp = e
        .checked_mul(expert)?
        .checked_add(e.checked_mul(h)?.checked_add(e)?)?
        .checked_add(expert.checked_mul(n(moe.shared_experts))?)?;
    let dense_layers = n(moe.first_dense.min(spec.layers));
    let moe_layers = n(spec.layers) - dense_layers;
    let per_layer = attn.checked_add(norms)?;
    let heads = if spec.tie_embeddings { 1 } else { 2 };
    let embed = n(spec.vocab).checked_mul(h)?.checked_mul(heads)?;
    n(spec.layers)
        .checked_mul(per_layer)?
        .checked_add(dense_layers.checked_mul(dense)?)?
        .checked_add(moe_layers.checked_mul(moe_mlp)?)?
        .checked_add(embed)?
        .checked_add(h)
}
