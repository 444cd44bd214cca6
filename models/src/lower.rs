//! Lowering a dense decoder-only [`ModelSpec`] (Llama, Qwen3) to one IR graph that serves
//! prefill and decode alike: the bucket dims are `B` sequences, `T` tokens this step and
//! `Ctx` KV-cache slots per sequence.
//!
//! Graph interface:
//! - inputs `tokens` i32[B,T] and `positions` i32[B,T] (absolute; negative = padding lane,
//!   which writes no KV and whose outputs are meaningless);
//! - states `kv.{l}.k`, `kv.{l}.v`: dtype[B,Ctx,kv_heads,head_dim], updated in place;
//! - weights by their HF tensor names, in the checkpoint dtype;
//! - outputs `logits` f32[B,T,vocab] and `next_token` i32[B,T] (argmax of logits).
//!
//! The pieces (`embed`, [`decoder_layer`], `lm_head`) are public so drafts that reuse the
//! target's layers (EAGLE-3 taps, DFlash) can build on them.

use specc_ir::engine::Phase;
use specc_ir::op::{dims, B, T};

use specc_ir::{
    AttnMask, BinaryOp, DType, Dim, Graph, IrError, Op, RopeStyle, Shape, TensorType, ValueId,
};

use crate::config::ModelSpec;
use crate::error::ModelError;

pub const TOKENS: &str = "tokens";
pub const POSITIONS: &str = "positions";
pub const LOGITS: &str = "logits";
pub const NEXT_TOKEN: &str = "next_token";

/// Names of layer `layer`'s key and value cache states.
pub fn kv_state_names(layer: usize) -> (String, String) {
    (format!("kv.{layer}.k"), format!("kv.{layer}.v"))
}

/// The whole dense model as one graph (see the module docs for its interface).
pub fn lower_dense(spec: &ModelSpec) -> Result<Graph, ModelError> {
    lower_dense_prefixed(spec, "", Phase::Target)
}

/// [`lower_dense`] with every weight and state name prefixed by `prefix` (a draft model
/// next to its target: `draft/model.layers.0...`, `draft/kv.0.k`), every node marked as
/// computing for `phase` (the model's part of a step).
pub fn lower_dense_prefixed(
    spec: &ModelSpec,
    prefix: &str,
    phase: Phase,
) -> Result<Graph, ModelError> {
    let wrap = |source| ModelError::Lower {
        model: spec.arch.hf_name().into(),
        source,
    };
    let mut g = Graph::new(spec.arch.hf_name());
    g.begin_phase(phase);
    build_dense(&mut g, spec, prefix).map_err(wrap)?;
    specc_ir::verify(&g).map_err(wrap)?;
    Ok(g)
}

fn build_dense(g: &mut Graph, spec: &ModelSpec, prefix: &str) -> Result<(), IrError> {
    let ids_ty = TensorType::new(DType::I32, [B, T]);
    let tokens = g.input(TOKENS, ids_ty.clone())?;
    let positions = g.input(POSITIONS, ids_ty)?;
    let (mut x, embed_w) = embed(g, spec, prefix, tokens)?;
    for layer in 0..spec.layers {
        let names = LayerNames::of(spec, prefix, layer);
        x = decoder_layer(g, spec, &names, x, positions)?;
    }
    let logits = lm_head(g, spec, prefix, x, embed_w)?;
    let next = g.add(Op::Argmax, &[logits])?;
    g.set_output(LOGITS, logits);
    g.set_output(NEXT_TOKEN, next);
    Ok(())
}

/// A static weight of the spec's dtype.
pub(crate) fn weight(
    g: &mut Graph,
    spec: &ModelSpec,
    name: &str,
    shape: &[usize],
) -> Result<ValueId, IrError> {
    let ty = TensorType::new(spec.dtype, shape.iter().map(|&n| Dim::from(n)));
    g.weight(name, ty)
}

/// `x · wᵀ` with `w = name: [out, in]`.
pub(crate) fn linear(
    g: &mut Graph,
    spec: &ModelSpec,
    x: ValueId,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<ValueId, IrError> {
    match quant_weight(g, spec, name, out, inp)? {
        (w, Some(scale)) => g.add(Op::MatMul, &[x, w, scale]),
        (w, None) => g.add(Op::MatMul, &[x, w]),
    }
}

/// The weight `name` (`{stem}.weight`, `[out, in]`) as stored: the spec's dtype, or a
/// quantised weight and its scale when the checkpoint stores the Linear `stem` quantised
/// ([`crate::quant::QuantSpec`]): `{stem}.weight` fp8e4m3 + `{stem}.weight_scale_inv`, or
/// `{stem}.weight_packed` int4g + `{stem}.weight_scale`.
pub(crate) fn quant_weight(
    g: &mut Graph,
    spec: &ModelSpec,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<(ValueId, Option<ValueId>), IrError> {
    let Some((stem, f)) = spec.quant.format_of(name) else {
        return Ok((weight(g, spec, name, &[out, inp])?, None));
    };
    let (wn, sn) = f.names(stem);
    let dims = |a: u64, b: u64| [Dim::from(a as usize), Dim::from(b as usize)];
    let w = g.weight(
        &wn,
        TensorType::new(f.weight_dtype(), dims(out as u64, inp as u64)),
    )?;
    let [sr, sc] =
        specc_ir::scale_shape(f.weight_dtype(), out as u64, inp as u64).expect("quantised dtype");
    let s = g.weight(&sn, TensorType::new(f.scale_dtype(), dims(sr, sc)))?;
    Ok((w, Some(s)))
}

/// The weight `name` `[out, in]` as a plain matrix of the spec's dtype, dequantised in the
/// graph when stored quantised (for weights that are reshaped or sliced before use).
pub(crate) fn plain_weight(
    g: &mut Graph,
    spec: &ModelSpec,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<ValueId, IrError> {
    match quant_weight(g, spec, name, out, inp)? {
        (w, Some(scale)) => g.add(Op::Dequantize { to: spec.dtype }, &[w, scale]),
        (w, None) => Ok(w),
    }
}

pub(crate) fn rmsnorm(
    g: &mut Graph,
    spec: &ModelSpec,
    x: ValueId,
    name: &str,
    width: usize,
) -> Result<ValueId, IrError> {
    let w = weight(g, spec, name, &[width])?;
    g.add(Op::RmsNorm { eps: spec.rms_eps }, &[x, w])
}

/// `x` converted to `to` unless it already is.
pub(crate) fn cast_to(g: &mut Graph, x: ValueId, to: DType) -> Result<ValueId, IrError> {
    if g.ty(x).dtype == to {
        Ok(x)
    } else {
        g.add(Op::Cast { to }, &[x])
    }
}

/// Token embedding `[B,T,hidden]` in the activation dtype, and the table's id (shared with
/// the LM head when embeddings are tied).
pub fn embed(
    g: &mut Graph,
    spec: &ModelSpec,
    prefix: &str,
    tokens: ValueId,
) -> Result<(ValueId, ValueId), IrError> {
    let table = weight(
        g,
        spec,
        &format!("{prefix}{}model.embed_tokens.weight", spec.weight_prefix),
        &[spec.vocab, spec.hidden],
    )?;
    let x = g.add(Op::Embedding, &[table, tokens])?;
    Ok((cast_to(g, x, spec.dtype)?, table))
}

/// Final norm, LM head (`lm_head.weight`, or the embedding table when tied), cast to f32:
/// `logits` f32[B,T,vocab].
pub fn lm_head(
    g: &mut Graph,
    spec: &ModelSpec,
    prefix: &str,
    x: ValueId,
    embed_table: ValueId,
) -> Result<ValueId, IrError> {
    let h = rmsnorm(
        g,
        spec,
        x,
        &format!("{prefix}{}model.norm.weight", spec.weight_prefix),
        spec.hidden,
    )?;
    let logits = if spec.tie_embeddings {
        g.add(Op::MatMul, &[h, embed_table])?
    } else {
        linear(
            g,
            spec,
            h,
            &format!("{prefix}{}lm_head.weight", spec.weight_prefix),
            spec.vocab,
            spec.hidden,
        )?
    };
    cast_to(g, logits, DType::F32)
}

/// Where one decoder layer's weights and caches live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerNames {
    /// Weight-name prefix without the trailing dot, e.g. `model.layers.3`.
    pub weights: String,
    /// Cache state names.
    pub k_cache: String,
    pub v_cache: String,
    /// The layer's index (DeepSeek-V3 picks its dense or MoE MLP by it).
    pub layer: usize,
}

impl LayerNames {
    /// Layer `layer` of a target model.
    /// Layer `layer` of a model whose names carry `prefix` (empty for the target).
    pub fn with_prefix(prefix: &str, layer: usize) -> LayerNames {
        let (k_cache, v_cache) = kv_state_names(layer);
        LayerNames {
            weights: format!("{prefix}model.layers.{layer}"),
            k_cache: format!("{prefix}{k_cache}"),
            v_cache: format!("{prefix}{v_cache}"),
            layer,
        }
    }

    /// Layer `layer` of the model `spec` under `prefix`: its weights also carry the
    /// spec's [`ModelSpec::weight_prefix`] (Kimi-K2.5's `language_model.`), its caches not.
    pub fn of(spec: &ModelSpec, prefix: &str, layer: usize) -> LayerNames {
        LayerNames {
            weights: format!("{prefix}{}model.layers.{layer}", spec.weight_prefix),
            ..Self::with_prefix(prefix, layer)
        }
    }

    pub fn target(layer: usize) -> LayerNames {
        let (k_cache, v_cache) = kv_state_names(layer);
        LayerNames {
            weights: format!("model.layers.{layer}"),
            k_cache,
            v_cache,
            layer,
        }
    }
}

/// Which cache slots the tokens of a layer write and attend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerMask {
    /// Token `t` writes slot `positions[t]` and attends slots `0..=positions[t]`.
    Causal,
    /// A draft tree: token `t` (RoPE at `positions[t]` = prefix + depth) writes slot
    /// `slots[t]` (= prefix + node) and attends the prefix plus its ancestors
    /// (`AttnMask::Tree` with `prefix_len` `[B]` and `ancestors` `i64[B, T(, W)]`).
    Tree {
        slots: ValueId,
        prefix_len: ValueId,
        ancestors: ValueId,
    },
}

/// One pre-norm decoder layer on `x` [B,T,hidden] at `positions` [B,T]:
/// `x + attn(rmsnorm(x))`, then `+ mlp(rmsnorm(·))`. Writes this step's K/V into the layer's
/// caches at `positions` and attends causally over them.
pub fn decoder_layer(
    g: &mut Graph,
    spec: &ModelSpec,
    names: &LayerNames,
    x: ValueId,
    positions: ValueId,
) -> Result<ValueId, IrError> {
    Ok(decoder_layer_masked(g, spec, names, x, positions, LayerMask::Causal)?.0)
}

/// [`decoder_layer`] under any [`LayerMask`]; also returns the layer's updated key and
/// value caches (the results of its `kv_write`s), for commits that move cache rows.
pub fn decoder_layer_masked(
    g: &mut Graph,
    spec: &ModelSpec,
    names: &LayerNames,
    x: ValueId,
    positions: ValueId,
    mask: LayerMask,
) -> Result<(ValueId, ValueId, ValueId), IrError> {
    if spec.mla.is_some() {
        return crate::lower_mla::decoder_layer(g, spec, names, x, positions, mask);
    }
    let p = &names.weights;
    let h = rmsnorm(
        g,
        spec,
        x,
        &format!("{p}.input_layernorm.weight"),
        spec.hidden,
    )?;
    let (a, kc, vc) = attention(g, spec, names, h, positions, mask)?;
    let x = g.add(Op::Binary(BinaryOp::Add), &[x, a])?;
    let h = rmsnorm(
        g,
        spec,
        x,
        &format!("{p}.post_attention_layernorm.weight"),
        spec.hidden,
    )?;
    let m = mlp(g, spec, p, h)?;
    Ok((g.add(Op::Binary(BinaryOp::Add), &[x, m])?, kc, vc))
}

/// Self-attention block (without the residual): q/k/v projections, per-head q/k norm
/// (Qwen3), RoPE, KV write, GQA attention under `mask`, output projection. Returns the
/// projection and the updated key / value caches.
fn attention(
    g: &mut Graph,
    spec: &ModelSpec,
    names: &LayerNames,
    h: ValueId,
    positions: ValueId,
    mask: LayerMask,
) -> Result<(ValueId, ValueId, ValueId), IrError> {
    let p = &names.weights;
    let (hd, nq, nkv) = (spec.head_dim, spec.heads, spec.kv_heads);
    // Token dims come from the input: a bucket `T`, or a static count inside a step graph.
    let (bd, td) = (g.ty(h).shape.dims()[0], g.ty(h).shape.dims()[1]);
    let heads_shape = |n: usize| dims(&[bd, td, Dim::from(n), Dim::from(hd)]);
    let q = linear(
        g,
        spec,
        h,
        &format!("{p}.self_attn.q_proj.weight"),
        spec.q_dim(),
        spec.hidden,
    )?;
    let k = linear(
        g,
        spec,
        h,
        &format!("{p}.self_attn.k_proj.weight"),
        spec.kv_dim(),
        spec.hidden,
    )?;
    let v = linear(
        g,
        spec,
        h,
        &format!("{p}.self_attn.v_proj.weight"),
        spec.kv_dim(),
        spec.hidden,
    )?;
    let mut q = g.add(
        Op::Reshape {
            shape: heads_shape(nq),
        },
        &[q],
    )?;
    let mut k = g.add(
        Op::Reshape {
            shape: heads_shape(nkv),
        },
        &[k],
    )?;
    let v = g.add(
        Op::Reshape {
            shape: heads_shape(nkv),
        },
        &[v],
    )?;
    if spec.qk_norm {
        q = rmsnorm(g, spec, q, &format!("{p}.self_attn.q_norm.weight"), hd)?;
        k = rmsnorm(g, spec, k, &format!("{p}.self_attn.k_norm.weight"), hd)?;
    }
    let rope = Op::Rope {
        theta: spec.rope_theta,
        scaling: spec.rope_scaling.clone(),
        style: RopeStyle::Half,
        rotary_dim: hd as u64,
    };
    let q = g.add(rope.clone(), &[q, positions])?;
    let k = g.add(rope, &[k, positions])?;
    let cache_ty = TensorType::new(
        spec.dtype,
        [B, specc_ir::op::CTX, Dim::from(nkv), Dim::from(hd)],
    );
    let k_cache = g.state(&names.k_cache, cache_ty.clone())?;
    let v_cache = g.state(&names.v_cache, cache_ty)?;
    let slots = match mask {
        LayerMask::Causal => positions,
        LayerMask::Tree { slots, .. } => slots,
    };
    let k_cache = g.add(Op::KvWrite, &[k_cache, k, slots])?;
    let v_cache = g.add(Op::KvWrite, &[v_cache, v, slots])?;
    let scale = 1.0 / (hd as f64).sqrt();
    let o = match mask {
        LayerMask::Causal => g.add(
            Op::Attention {
                scale,
                mask: AttnMask::Causal,
            },
            &[q, k_cache, v_cache, positions],
        )?,
        LayerMask::Tree {
            prefix_len,
            ancestors,
            ..
        } => g.add(
            Op::Attention {
                scale,
                mask: AttnMask::Tree,
            },
            &[q, k_cache, v_cache, slots, prefix_len, ancestors],
        )?,
    };
    let o = g.add(
        Op::Reshape {
            shape: Shape::new([bd, td, Dim::from(spec.q_dim())]),
        },
        &[o],
    )?;
    let o = linear(
        g,
        spec,
        o,
        &format!("{p}.self_attn.o_proj.weight"),
        spec.hidden,
        spec.q_dim(),
    )?;
    Ok((o, k_cache, v_cache))
}

/// SwiGLU MLP: `down(silu(gate(h)) · up(h))`.
pub(crate) fn mlp(
    g: &mut Graph,
    spec: &ModelSpec,
    p: &str,
    h: ValueId,
) -> Result<ValueId, IrError> {
    let (hid, ffn) = (spec.hidden, spec.intermediate);
    let gate = linear(g, spec, h, &format!("{p}.mlp.gate_proj.weight"), ffn, hid)?;
    let up = linear(g, spec, h, &format!("{p}.mlp.up_proj.weight"), ffn, hid)?;
    let act = g.add(Op::SiluMul, &[gate, up])?;
    linear(g, spec, act, &format!("{p}.mlp.down_proj.weight"), hid, ffn)
}
