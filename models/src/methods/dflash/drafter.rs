//! DFlash block-diffusion drafters in their published format (z-lab): config resolution
//! against the target, and the drafter's forward in IR.
//!
//! Conventions (scripts/train/README.md, pinned by the parity test against
//! `models/default/dflash/reference.safetensors`):
//! - tap id `l` = the raw OUTPUT of target decoder layer `l` (before the target's final
//!   norm), concatenated in the order of `target_layer_ids`;
//! - `ctx_p = hidden_norm(fc(taps(p)))` for every committed position `p`; in every drafter
//!   layer the context keys are `RoPE(k_norm(k_proj(ctx_p)), p)` and the values
//!   `v_proj(ctx_p)` (ctx is not input-normed). They depend on `p` only, so they live in
//!   the drafter's per-layer KV cache `dflash/kv.{l}.{k,v}` at slot `p`;
//! - the block `[x(n), MASK × (B − 1)]` at positions `n .. n+B−1` is embedded with the
//!   TARGET's embedding; each layer: queries from the block only, keys/values = context
//!   slots `0..n` + the block's own B entries (written at slots `n..n+B−1`), non-causal
//!   inside the block (a `Tree` mask with every ancestor bit set, `prefix_len = n`);
//! - logits = target lm_head(drafter `norm`(h)) (the embedding table for a tied target),
//!   WITHOUT the target's final norm. Row `i` predicts the token AT position `n + i`; row 0
//!   (the bonus) is unused.
//!
//! Formulation for codegen: a layer's q, k and v are always projected from ONE input (the
//! fused q/k/v + per-head norm + RoPE + KV-write kernel is the only place RoPE runs). In a
//! step, the pending context rows ride along with the block: each layer projects
//! `concat(ctx rows, input_layernorm(block))` at `concat(ctx positions, block positions)`
//! and drops the context rows after attention; the prompt's context (drafter prefill)
//! computes queries it never uses. Both are exact: context keys/values are the same
//! numbers either way.

use std::path::{Path, PathBuf};

use serde_json::Value;
use specc_ir::engine::Phase;
use specc_ir::op::B;
use specc_ir::{
    AttnMask, BinaryOp, DType, Dim, Graph, IrError, Op, RopeStyle, Shape, TensorType, ValueId,
};

use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::lower::embed;
use crate::spec_config::MAX_STEPS;

/// Weight and state names of the drafter inside a graph start with this.
pub const DFLASH_PREFIX: &str = "dflash/";
pub const ARCHITECTURE: &str = "DFlashDraftModel";

/// A validated DFlash drafter.
#[derive(Clone, Debug, PartialEq)]
pub struct DFlashSpec {
    /// The drafter's decoder layers, read as a Qwen3 config (`layers` = its
    /// `num_hidden_layers`; `vocab` is the target's: it has no embedding of its own).
    pub layer: ModelSpec,
    /// B: the block drafted in one forward (the bonus token + B − 1 masks); k = B − 1.
    pub block_size: usize,
    pub mask_token: u32,
    /// Target layers whose outputs are tapped, in `fc` input order.
    pub taps: Vec<usize>,
    pub config_file: PathBuf,
}

/// A top-level field, or the same field under `dflash_config` (published checkpoints
/// write both). Returns the value and the dotted field name it came from.
fn lookup<'a>(v: &'a Value, key: &str) -> Option<(&'a Value, String)> {
    let top = v.get(key).filter(|x| !x.is_null());
    let nested = v
        .get("dflash_config")
        .and_then(|c| c.get(key))
        .filter(|x| !x.is_null());
    match (top, nested) {
        (Some(t), _) => Some((t, key.to_string())),
        (None, Some(n)) => Some((n, format!("dflash_config.{key}"))),
        (None, None) => None,
    }
}

fn read_json(file: &Path) -> Result<(Value, String), ModelError> {
    let text = crate::files::read_text(file)?;
    let v: Value = serde_json::from_str(&text).map_err(|e| ModelError::json(file, &e))?;
    Ok((v, text))
}

/// `block_size` of the drafter whose `config.json` is in `dir` (the spec file's `num_steps`
/// defaults to `block_size − 1`).
pub fn block_size_of(dir: &Path) -> Result<usize, ModelError> {
    let file = dir.join("config.json");
    let (v, _) = read_json(&file)?;
    block_size(&file, &v)
}

fn block_size(file: &Path, v: &Value) -> Result<usize, ModelError> {
    let max = MAX_STEPS as u64 + 1;
    let expected = format!("an integer in 2..={max} (the bonus token plus the drafted tokens)");
    match lookup(v, "block_size") {
        None => Err(ModelError::missing(file, "block_size", &expected)),
        Some((x, name)) => x
            .as_u64()
            .filter(|n| (2..=max).contains(n))
            .map(|n| n as usize)
            .ok_or_else(|| ModelError::field(file, name, expected, x)),
    }
}

impl DFlashSpec {
    /// Reads `dir/config.json` and checks it against the target.
    pub fn from_dir(dir: &Path, target: &ModelSpec) -> Result<DFlashSpec, ModelError> {
        let (file, text) = crate::draft_config::read(dir)?;
        Self::from_json(&file, &text, target)
    }

    pub fn from_json(
        file: &Path,
        text: &str,
        target: &ModelSpec,
    ) -> Result<DFlashSpec, ModelError> {
        let mut v = crate::draft_config::parse(file, text, ARCHITECTURE, "a DFlash drafter")?;
        let block_size = block_size(file, &v)?;
        let mask_token = match lookup(&v, "mask_token_id") {
            None => {
                return Err(ModelError::missing(
                    file,
                    "mask_token_id",
                    "a token id (top level or under dflash_config)",
                ))
            }
            Some((x, name)) => x
                .as_u64()
                .filter(|&n| n < target.vocab as u64)
                .ok_or_else(|| {
                    ModelError::field(
                        file,
                        name,
                        format!("a token id in the target's vocabulary 0..{}", target.vocab),
                        x,
                    )
                })? as u32,
        };
        let taps_expected = format!(
            "a non-empty list of target layer indices in 0..{}",
            target.layers
        );
        let parse_taps = |x: &Value, name: &str| -> Result<Vec<usize>, ModelError> {
            x.as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|i| i.as_u64().map(|n| n as usize))
                        .collect::<Option<Vec<_>>>()
                })
                .filter(|t| !t.is_empty() && t.iter().all(|&l| l < target.layers))
                .ok_or_else(|| ModelError::field(file, name, taps_expected.clone(), x))
        };
        let taps = match lookup(&v, "target_layer_ids") {
            None => {
                return Err(ModelError::missing(
                    file,
                    "target_layer_ids",
                    "a list of target layer indices (top level or under dflash_config)",
                ))
            }
            Some((x, name)) => parse_taps(x, &name)?,
        };
        // Both spellings present: they must agree.
        if let Some(n) = v
            .get("dflash_config")
            .and_then(|c| c.get("target_layer_ids"))
            .filter(|x| !x.is_null())
        {
            let nested = parse_taps(n, "dflash_config.target_layer_ids")?;
            if nested != taps {
                return Err(ModelError::field(
                    file,
                    "dflash_config.target_layer_ids",
                    format!("the same list as target_layer_ids {taps:?}"),
                    format!("{nested:?}"),
                ));
            }
        }
        if let Some(x) = v.get("num_target_layers").filter(|x| !x.is_null()) {
            if x.as_u64() != Some(target.layers as u64) {
                return Err(ModelError::field(
                    file,
                    "num_target_layers",
                    format!("the target's number of layers, {}", target.layers),
                    x,
                ));
            }
        }
        let layers = v.get("num_hidden_layers").and_then(Value::as_u64);
        if let Some(x) = v.get("layer_types").filter(|x| !x.is_null()) {
            let ok = x.as_array().is_some_and(|a| {
                a.iter().all(|t| t.as_str() == Some("full_attention"))
                    && layers.is_none_or(|n| a.len() as u64 == n)
            });
            if !ok {
                return Err(ModelError::field(
                    file,
                    "layer_types",
                    "\"full_attention\" for every layer (sliding-window drafter layers are not supported)",
                    x,
                ));
            }
        }
        if let Some(x) = v.get("vocab_size").filter(|x| !x.is_null()) {
            if x.as_u64() != Some(target.vocab as u64) {
                return Err(ModelError::field(
                    file,
                    "vocab_size",
                    format!("the target's vocabulary of {}", target.vocab),
                    x,
                ));
            }
        }
        // The layers themselves read like a Qwen3 config (per-head q_norm / k_norm).
        v["architectures"] = Value::from(vec!["Qwen3ForCausalLM"]);
        v["vocab_size"] = Value::from(target.vocab);
        let layer = crate::config::RawConfig::from_json(file, &v.to_string())?.resolve(file)?;
        if layer.hidden != target.hidden {
            return Err(ModelError::field(
                file,
                "hidden_size",
                format!("the target's hidden size {}", target.hidden),
                layer.hidden,
            ));
        }
        Ok(DFlashSpec {
            layer,
            block_size,
            mask_token,
            taps,
            config_file: file.to_path_buf(),
        })
    }

    pub fn hidden(&self) -> usize {
        self.layer.hidden
    }

    /// Width of the concatenated taps, `fc`'s input.
    pub fn taps_width(&self) -> usize {
        self.taps.len() * self.hidden()
    }

    /// k: the draft tokens of one block.
    pub fn num_steps(&self) -> usize {
        self.block_size - 1
    }
}

/// Names of drafter layer `layer`'s key and value cache states.
pub fn kv_state_names(layer: usize) -> (String, String) {
    (
        format!("{DFLASH_PREFIX}kv.{layer}.k"),
        format!("{DFLASH_PREFIX}kv.{layer}.v"),
    )
}

fn w(g: &mut Graph, d: &DFlashSpec, name: &str, dims: &[usize]) -> Result<ValueId, IrError> {
    g.weight(
        &format!("{DFLASH_PREFIX}{name}"),
        TensorType::new(d.layer.dtype, dims.iter().map(|&n| Dim::from(n))),
    )
}

fn norm(
    g: &mut Graph,
    d: &DFlashSpec,
    x: ValueId,
    name: &str,
    width: usize,
) -> Result<ValueId, IrError> {
    let wt = w(g, d, name, &[width])?;
    g.add(
        Op::RmsNorm {
            eps: d.layer.rms_eps,
        },
        &[x, wt],
    )
}

fn linear(
    g: &mut Graph,
    d: &DFlashSpec,
    x: ValueId,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<ValueId, IrError> {
    let wt = w(g, d, name, &[out, inp])?;
    g.add(Op::MatMul, &[x, wt])
}

fn cast_to(g: &mut Graph, x: ValueId, to: DType) -> Result<ValueId, IrError> {
    if g.ty(x).dtype == to {
        Ok(x)
    } else {
        g.add(Op::Cast { to }, &[x])
    }
}

fn heads(g: &mut Graph, x: ValueId, n: usize, hd: usize) -> Result<ValueId, IrError> {
    let (bd, td) = (g.ty(x).shape.dims()[0], g.ty(x).shape.dims()[1]);
    g.add(
        Op::Reshape {
            shape: Shape::new([bd, td, Dim::from(n), Dim::from(hd)]),
        },
        &[x],
    )
}

fn rope(d: &DFlashSpec) -> Op {
    Op::Rope {
        theta: d.layer.rope_theta,
        scaling: d.layer.rope_scaling.clone(),
        style: RopeStyle::Half,
        rotary_dim: d.layer.head_dim as u64,
    }
}

/// Layer `l`'s attention inputs for `x` `[B, t, H]` at `positions`: q (q_norm + RoPE), k
/// (k_norm + RoPE), both written with v into the layer's caches. Returns q and the updated
/// caches. q, k and v are always projected together: codegen fuses exactly this pattern
/// (three matmuls of one input, per-head norms, RoPE, KV write) into one kernel.
fn qkv_write(
    g: &mut Graph,
    d: &DFlashSpec,
    l: usize,
    x: ValueId,
    positions: ValueId,
) -> Result<(ValueId, ValueId, ValueId), IrError> {
    let s = &d.layer;
    let (h, hd) = (s.hidden, s.head_dim);
    let p = format!("layers.{l}.self_attn");
    let q = linear(g, d, x, &format!("{p}.q_proj.weight"), s.q_dim(), h)?;
    let k = linear(g, d, x, &format!("{p}.k_proj.weight"), s.kv_dim(), h)?;
    let v = linear(g, d, x, &format!("{p}.v_proj.weight"), s.kv_dim(), h)?;
    let q = heads(g, q, s.heads, hd)?;
    let k = heads(g, k, s.kv_heads, hd)?;
    let v = heads(g, v, s.kv_heads, hd)?;
    let q = norm(g, d, q, &format!("{p}.q_norm.weight"), hd)?;
    let k = norm(g, d, k, &format!("{p}.k_norm.weight"), hd)?;
    let q = g.add(rope(d), &[q, positions])?;
    let k = g.add(rope(d), &[k, positions])?;
    let (kn, vn) = kv_state_names(l);
    let kc = g.state(&kn, cache_ty(d))?;
    let kc = g.add(Op::KvWrite, &[kc, k, positions])?;
    let vc = g.state(&vn, cache_ty(d))?;
    let vc = g.add(Op::KvWrite, &[vc, v, positions])?;
    Ok((q, kc, vc))
}

fn cache_ty(d: &DFlashSpec) -> TensorType {
    TensorType::new(
        d.layer.dtype,
        [
            B,
            specc_ir::op::CTX,
            Dim::from(d.layer.kv_heads),
            Dim::from(d.layer.head_dim),
        ],
    )
}

/// `ctx = hidden_norm(fc(taps))`: `[B, t, n_tap·H] → [B, t, H]` in the drafter's dtype.
pub fn context(g: &mut Graph, d: &DFlashSpec, taps: ValueId) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let x = fc(g, d, taps)?;
        norm(g, d, x, "hidden_norm.weight", d.hidden())
    })
}

fn fc(g: &mut Graph, d: &DFlashSpec, taps: ValueId) -> Result<ValueId, IrError> {
    let taps = cast_to(g, taps, d.layer.dtype)?;
    linear(g, d, taps, "fc.weight", d.hidden(), d.taps_width())
}

/// The "target hidden → draft KV" copy for a prompt: every layer's context keys and values
/// of `ctx = hidden_norm(fc(taps))` (`taps` `[B, t, n_tap·H]`) written into the drafter's
/// caches at `positions` (negative: not written). Returns each layer's (unused) context
/// queries: they are computed only so codegen sees its fused pattern (q/k/v of one input,
/// per-head norms, RoPE, KV write), and callers keep them alive as graph outputs. For the
/// same reason each layer applies `hidden_norm` itself: it becomes that layer's fused
/// prologue, where one shared normed input would put six matmuls in one group.
pub fn write_context(
    g: &mut Graph,
    d: &DFlashSpec,
    taps: ValueId,
    positions: ValueId,
) -> Result<Vec<ValueId>, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let x = fc(g, d, taps)?;
        (0..d.layer.layers)
            .map(|l| {
                let ctx = norm(g, d, x, "hidden_norm.weight", d.hidden())?;
                Ok(qkv_write(g, d, l, ctx, positions)?.0)
            })
            .collect()
    })
}

/// The drafter over one block: `tokens` `[B, t]` (bonus + masks) at `positions` `[B, t]`
/// (`n .. n+t−1`), attending the context slots `0..prefix_len[b]` in the caches and the
/// whole block (non-causal). Returns f32 logits `[B, t, V]` through the target's LM head.
///
/// `pending` = (ctx `[B, c, H]`, positions `[B, c]`): context rows not yet in the caches
/// (negative positions: none). Every layer writes their keys/values together with the
/// block's, in one projection of `concat(ctx, input_layernorm(h))` at
/// `concat(ctx positions, block positions)`; the context rows' query outputs are dropped.
/// The block's own keys/values land at `positions` (scratch slots that later context
/// writes overwrite).
pub fn block_logits(
    g: &mut Graph,
    target: &ModelSpec,
    d: &DFlashSpec,
    pending: Option<(ValueId, ValueId)>,
    tokens: ValueId,
    positions: ValueId,
    prefix_len: ValueId,
) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let s = &d.layer;
        let (h, hd) = (s.hidden, s.head_dim);
        let (bd, td) = (g.ty(tokens).shape.dims()[0], g.ty(tokens).shape.dims()[1]);
        let t = td
            .as_static()
            .expect("a DFlash block has a static number of tokens");
        assert!((1..=64).contains(&t), "a block holds 1..=64 tokens");
        let c = match pending {
            Some((ctx, _)) => g.ty(ctx).shape.dims()[1]
                .as_static()
                .expect("static pending context rows"),
            None => 0,
        };
        let rows = Dim::Static(c + t);
        let all_pos = match pending {
            Some((_, cpos)) => g.add(Op::Concat { axis: 1 }, &[cpos, positions])?,
            None => positions,
        };
        // Every row sees every block slot: bits 0..t set (all 64 bits: −1). Context rows are
        // dropped after attention, so what they see does not matter.
        let all_bits = if t == 64 {
            -1.0
        } else {
            ((1u64 << t) - 1) as f64
        };
        let ancestors = g.add(
            Op::Fill {
                value: all_bits,
                ty: TensorType::new(DType::I64, [bd, rows]),
            },
            &[],
        )?;
        let (emb, table) = embed(g, target, "", tokens)?;
        let mut x = cast_to(g, emb, s.dtype)?;
        for l in 0..s.layers {
            let p = format!("layers.{l}");
            let hn = norm(g, d, x, &format!("{p}.input_layernorm.weight"), h)?;
            let xin = match pending {
                Some((ctx, _)) => g.add(Op::Concat { axis: 1 }, &[ctx, hn])?,
                None => hn,
            };
            let (q, kc, vc) = qkv_write(g, d, l, xin, all_pos)?;
            let o = g.add(
                Op::Attention {
                    scale: 1.0 / (hd as f64).sqrt(),
                    mask: AttnMask::Tree,
                },
                &[q, kc, vc, all_pos, prefix_len, ancestors],
            )?;
            let o = g.add(
                Op::Reshape {
                    shape: Shape::new([bd, rows, Dim::from(s.q_dim())]),
                },
                &[o],
            )?;
            let o = if c > 0 {
                g.add(
                    Op::Slice {
                        axis: 1,
                        start: c,
                        len: t,
                    },
                    &[o],
                )?
            } else {
                o
            };
            let o = linear(
                g,
                d,
                o,
                &format!("{p}.self_attn.o_proj.weight"),
                h,
                s.q_dim(),
            )?;
            x = g.add(Op::Binary(BinaryOp::Add), &[x, o])?;
            let hx = norm(g, d, x, &format!("{p}.post_attention_layernorm.weight"), h)?;
            let f = s.intermediate;
            let gate = linear(g, d, hx, &format!("{p}.mlp.gate_proj.weight"), f, h)?;
            let up = linear(g, d, hx, &format!("{p}.mlp.up_proj.weight"), f, h)?;
            let act = g.add(Op::SiluMul, &[gate, up])?;
            let m = linear(g, d, act, &format!("{p}.mlp.down_proj.weight"), h, f)?;
            x = g.add(Op::Binary(BinaryOp::Add), &[x, m])?;
        }
        let hf = norm(g, d, x, "norm.weight", h)?;
        let lm = if target.tie_embeddings {
            table
        } else {
            g.weight(
                "lm_head.weight",
                TensorType::new(target.dtype, [Dim::from(target.vocab), Dim::from(h)]),
            )?
        };
        let logits = g.add(Op::MatMul, &[hf, lm])?;
        cast_to(g, logits, DType::F32)
    })
}
