//! EAGLE-3 heads in their published format (SpecForge / EAGLE repos): config resolution
//! against the target, and the head's forward in IR.
//!
//! Conventions (pinned by tests): tap id `i` means the OUTPUT of target decoder layer `i`
//! (HF `hidden_states[i + 1]`); `eagle_config.eagle_aux_hidden_state_layer_ids` lists them,
//! default `[1, L/2 - 1, L - 4]`. The pair (g_t, x_{t+1}) sits at position t, where g_t is
//! `fc(concat(taps at t))` for pairs whose target hidden state is known, and the previous
//! chained step's pre-norm output otherwise. The head's token embedding is the target's.

use std::path::{Path, PathBuf};

use serde_json::Value;
use specc_ir::engine::Phase;
use specc_ir::{
    AttnMask, BinaryOp, DType, Dim, Graph, IrError, Op, RopeStyle, Shape, TensorType, ValueId,
};

use crate::config::ModelSpec;
use crate::error::ModelError;

/// Weight and state names of the head inside a step graph start with this.
pub const EAGLE_PREFIX: &str = "eagle/";
pub const ARCHITECTURE: &str = "LlamaForCausalLMEagle3";

/// A validated EAGLE-3 head.
#[derive(Clone, Debug, PartialEq)]
pub struct Eagle3Spec {
    /// The head's one decoder layer, read as a Llama config (its `vocab` is the target's).
    pub layer: ModelSpec,
    pub draft_vocab: usize,
    /// Target layers whose outputs are tapped, in `fc` input order.
    pub taps: Vec<usize>,
    pub config_file: PathBuf,
}

impl Eagle3Spec {
    /// Reads `dir/config.json` and checks it against the target.
    pub fn from_dir(dir: &Path, target: &ModelSpec) -> Result<Eagle3Spec, ModelError> {
        let (file, text) = crate::draft_config::read(dir)?;
        Self::from_json(&file, &text, target)
    }

    pub fn from_json(
        file: &Path,
        text: &str,
        target: &ModelSpec,
    ) -> Result<Eagle3Spec, ModelError> {
        let mut v = crate::draft_config::parse(file, text, ARCHITECTURE, "an EAGLE-3 head")?;
        let layers = v.get("num_hidden_layers");
        if layers.and_then(Value::as_u64) != Some(1) {
            return Err(ModelError::field(
                file,
                "num_hidden_layers",
                "1",
                layers.map_or("nothing (field absent)".to_string(), Value::to_string),
            ));
        }
        let draft_vocab = match v.get("draft_vocab_size") {
            None | Some(Value::Null) => None,
            Some(x) => Some(x.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                ModelError::field(file, "draft_vocab_size", "a positive integer", x)
            })? as usize),
        };
        let taps = match v.pointer("/eagle_config/eagle_aux_hidden_state_layer_ids") {
            None | Some(Value::Null) => default_taps(target.layers),
            Some(x) => x
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|i| i.as_u64().map(|n| n as usize))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| {
                    ModelError::field(
                        file,
                        "eagle_config.eagle_aux_hidden_state_layer_ids",
                        "a list of layer indices",
                        x,
                    )
                })?,
        };
        // The layer itself reads like a Llama config.
        v["architectures"] = Value::from(vec!["LlamaForCausalLM"]);
        if v.get("vocab_size").is_none() {
            v["vocab_size"] = Value::from(target.vocab);
        }
        let layer = crate::config::RawConfig::from_json(file, &v.to_string())?.resolve(file)?;
        let draft_vocab = draft_vocab.unwrap_or(layer.vocab);
        if layer.hidden != target.hidden {
            return Err(ModelError::field(
                file,
                "hidden_size",
                format!("the target's hidden size {}", target.hidden),
                layer.hidden,
            ));
        }
        if layer.vocab != target.vocab {
            return Err(ModelError::field(
                file,
                "vocab_size",
                format!("the target's vocabulary of {}", target.vocab),
                layer.vocab,
            ));
        }
        if taps.len() != 3 || taps.iter().any(|&t| t >= target.layers) {
            return Err(ModelError::field(
                file,
                "eagle_config.eagle_aux_hidden_state_layer_ids",
                format!("three target layer indices in 0..{}", target.layers),
                format!("{taps:?}"),
            ));
        }
        Ok(Eagle3Spec {
            layer,
            draft_vocab,
            taps,
            config_file: file.to_path_buf(),
        })
    }

    pub fn hidden(&self) -> usize {
        self.layer.hidden
    }
}

/// SGLang's default when a head names no taps: outputs of layers 1, L/2 − 1 and L − 4.
pub fn default_taps(layers: usize) -> Vec<usize> {
    vec![
        1.min(layers - 1),
        (layers / 2).saturating_sub(1),
        layers.saturating_sub(4),
    ]
}

fn w(g: &mut Graph, e: &Eagle3Spec, name: &str, dims: &[usize]) -> Result<ValueId, IrError> {
    g.weight(
        &format!("{EAGLE_PREFIX}{name}"),
        TensorType::new(e.layer.dtype, dims.iter().map(|&n| Dim::from(n))),
    )
}

fn norm(g: &mut Graph, e: &Eagle3Spec, x: ValueId, name: &str) -> Result<ValueId, IrError> {
    let wt = w(g, e, name, &[e.hidden()])?;
    g.add(
        Op::RmsNorm {
            eps: e.layer.rms_eps,
        },
        &[x, wt],
    )
}

/// `fc(taps)`: `[.., 3H] → [.., H]`.
pub fn fc(g: &mut Graph, e: &Eagle3Spec, taps: ValueId) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let h = e.hidden();
        let wt = w(g, e, "fc.weight", &[h, 3 * h])?;
        g.add(Op::MatMul, &[taps, wt])
    })
}

/// How the head's attention reads its KV cache.
#[derive(Clone, Copy, Debug)]
pub enum HeadAttn {
    /// Pair `t` writes slot `positions[t]` and attends slots `0..=positions[t]`.
    Causal,
    /// Draft-tree rows: pair `t` (RoPE at `positions[t]`) writes slot `slots[t]` and
    /// attends slots `0..prefix_len` plus `prefix_len + u` for the bits `u` of its
    /// `ancestors` row (`i64[B, t, W]`, itself included). The queries are padded with
    /// `query_rows − t` empty rows (slot −1, no bits) so that bits up to `query_rows − 1`
    /// count (`AttnMask::Tree` reads bits below the query count only); their outputs are
    /// dropped.
    Tree {
        slots: ValueId,
        prefix_len: ValueId,
        ancestors: ValueId,
        query_rows: u64,
    },
}

/// The head's decoder layer over pairs `(g, token embedding)` at `positions`, writing its
/// own KV cache. Returns the pre-norm output `[B, t, H]` (the next chained step's `g`).
pub fn midlayer(
    g: &mut Graph,
    e: &Eagle3Spec,
    emb: ValueId,
    gin: ValueId,
    positions: ValueId,
) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        midlayer_masked(g, e, emb, gin, positions, HeadAttn::Causal)
    })
}

/// [`midlayer`] under any [`HeadAttn`].
pub fn midlayer_masked(
    g: &mut Graph,
    e: &Eagle3Spec,
    emb: ValueId,
    gin: ValueId,
    positions: ValueId,
    attn: HeadAttn,
) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let s = &e.layer;
        let (h, hd, nq) = (s.hidden, s.head_dim, s.heads);
        let (bd, td) = (g.ty(gin).shape.dims()[0], g.ty(gin).shape.dims()[1]);
        let (q, k, v) = qkv(g, e, emb, gin, positions)?;
        let (kc, vc) = cache_states(g, e)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let o = match attn {
            HeadAttn::Causal => {
                let kc = g.add(Op::KvWrite, &[kc, k, positions])?;
                let vc = g.add(Op::KvWrite, &[vc, v, positions])?;
                g.add(
                    Op::Attention {
                        scale,
                        mask: AttnMask::Causal,
                    },
                    &[q, kc, vc, positions],
                )?
            }
            HeadAttn::Tree {
                slots,
                prefix_len,
                ancestors,
                query_rows,
            } => {
                let kc = g.add(Op::KvWrite, &[kc, k, slots])?;
                let vc = g.add(Op::KvWrite, &[vc, v, slots])?;
                let rows = td.as_static().expect("draft-tree rows are static");
                let pad = query_rows.saturating_sub(rows);
                let (q, slots, ancestors) = if pad == 0 {
                    (q, slots, ancestors)
                } else {
                    let fill = |g: &mut Graph, like: ValueId, value: f64| {
                        let mut dims = g.ty(like).shape.dims().to_vec();
                        dims[1] = Dim::Static(pad);
                        let ty = TensorType::new(g.ty(like).dtype, dims);
                        g.add(Op::Fill { value, ty }, &[])
                    };
                    let cat = |g: &mut Graph, x: ValueId, value: f64| {
                        let p = fill(g, x, value)?;
                        g.add(Op::Concat { axis: 1 }, &[x, p])
                    };
                    (
                        cat(g, q, 0.0)?,
                        cat(g, slots, -1.0)?,
                        cat(g, ancestors, 0.0)?,
                    )
                };
                let o = g.add(
                    Op::Attention {
                        scale,
                        mask: AttnMask::Tree,
                    },
                    &[q, kc, vc, slots, prefix_len, ancestors],
                )?;
                if pad == 0 {
                    o
                } else {
                    g.add(
                        Op::Slice {
                            axis: 1,
                            start: 0,
                            len: rows,
                        },
                        &[o],
                    )?
                }
            }
        };
        let o = g.add(
            Op::Reshape {
                shape: Shape::new([bd, td, Dim::from(nq * hd)]),
            },
            &[o],
        )?;
        let wo = w(g, e, "midlayer.self_attn.o_proj.weight", &[h, nq * hd])?;
        let o = g.add(Op::MatMul, &[o, wo])?;
        let x = g.add(Op::Binary(BinaryOp::Add), &[gin, o])?;
        let hx = norm(g, e, x, "midlayer.post_attention_layernorm.weight")?;
        let f = s.intermediate;
        let wg = w(g, e, "midlayer.mlp.gate_proj.weight", &[f, h])?;
        let wu = w(g, e, "midlayer.mlp.up_proj.weight", &[f, h])?;
        let wd = w(g, e, "midlayer.mlp.down_proj.weight", &[h, f])?;
        let gate = g.add(Op::MatMul, &[hx, wg])?;
        let up = g.add(Op::MatMul, &[hx, wu])?;
        let act = g.add(Op::SiluMul, &[gate, up])?;
        let m = g.add(Op::MatMul, &[act, wd])?;
        g.add(Op::Binary(BinaryOp::Add), &[x, m])
    })
}

/// The head's attention inputs for pairs `(g, token embedding)` at `positions`: q, k, v
/// `[B, t, heads, head_dim]`, q and k rotated.
fn qkv(
    g: &mut Graph,
    e: &Eagle3Spec,
    emb: ValueId,
    gin: ValueId,
    positions: ValueId,
) -> Result<(ValueId, ValueId, ValueId), IrError> {
    let s = &e.layer;
    let (h, hd, nq, nkv) = (s.hidden, s.head_dim, s.heads, s.kv_heads);
    let en = norm(g, e, emb, "midlayer.input_layernorm.weight")?;
    let hn = norm(g, e, gin, "midlayer.hidden_norm.weight")?;
    let cat = g.add(Op::Concat { axis: 2 }, &[en, hn])?;
    let (bd, td) = (g.ty(gin).shape.dims()[0], g.ty(gin).shape.dims()[1]);
    let proj = |g: &mut Graph, name: &str, out: usize| -> Result<ValueId, IrError> {
        let wt = w(
            g,
            e,
            &format!("midlayer.self_attn.{name}.weight"),
            &[out, 2 * h],
        )?;
        g.add(Op::MatMul, &[cat, wt])
    };
    let q = proj(g, "q_proj", nq * hd)?;
    let k = proj(g, "k_proj", nkv * hd)?;
    let v = proj(g, "v_proj", nkv * hd)?;
    let heads = |g: &mut Graph, x: ValueId, n: usize| {
        g.add(
            Op::Reshape {
                shape: Shape::new([bd, td, Dim::from(n), Dim::from(hd)]),
            },
            &[x],
        )
    };
    let q = heads(g, q, nq)?;
    let k = heads(g, k, nkv)?;
    let v = heads(g, v, nkv)?;
    let rope = Op::Rope {
        theta: s.rope_theta,
        scaling: s.rope_scaling.clone(),
        style: RopeStyle::Half,
        rotary_dim: hd as u64,
    };
    let q = g.add(rope.clone(), &[q, positions])?;
    let k = g.add(rope, &[k, positions])?;
    Ok((q, k, v))
}

/// The head's key and value caches.
fn cache_states(g: &mut Graph, e: &Eagle3Spec) -> Result<(ValueId, ValueId), IrError> {
    let s = &e.layer;
    let cache_ty = TensorType::new(
        s.dtype,
        [
            specc_ir::op::B,
            specc_ir::op::CTX,
            Dim::from(s.kv_heads),
            Dim::from(s.head_dim),
        ],
    );
    let kc = g.state(&format!("{EAGLE_PREFIX}kv.0.k"), cache_ty.clone())?;
    let vc = g.state(&format!("{EAGLE_PREFIX}kv.0.v"), cache_ty)?;
    Ok((kc, vc))
}

/// The head's cache writes for pairs `(g, token embedding)` at `positions` (negative: not
/// written), without the rest of its layer: a pair's key and value depend on the pair
/// alone, so these are the writes [`midlayer`] makes. Returns q, unused: computed so that
/// codegen sees the q/k/v pattern it fuses (callers keep it alive as an output).
pub fn write_pairs(
    g: &mut Graph,
    e: &Eagle3Spec,
    emb: ValueId,
    gin: ValueId,
    positions: ValueId,
) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let (q, k, v) = qkv(g, e, emb, gin, positions)?;
        let (kc, vc) = cache_states(g, e)?;
        g.add(Op::KvWrite, &[kc, k, positions])?;
        g.add(Op::KvWrite, &[vc, v, positions])?;
        Ok(q)
    })
}

/// f32 draft logits `[B, t, draft_vocab]` from the head's pre-norm output `[B, t, H]`:
/// `norm → lm_head`.
pub fn draft_logits(g: &mut Graph, e: &Eagle3Spec, out: ValueId) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let h = norm(g, e, out, "norm.weight")?;
        let lm = w(g, e, "lm_head.weight", &[e.draft_vocab, e.hidden()])?;
        let logits = g.add(Op::MatMul, &[h, lm])?;
        g.add(Op::Cast { to: DType::F32 }, &[logits])
    })
}

/// Greedy next token (in TARGET ids) from the head's pre-norm output `[B, t, H]`:
/// `norm → lm_head → argmax → d2t`.
pub fn next_token(g: &mut Graph, e: &Eagle3Spec, out: ValueId) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let logits = draft_logits(g, e, out)?;
        let draft_id = g.add(Op::Argmax, &[logits])?;
        to_target(g, e, draft_id)
    })
}

/// Draft ids (i32, any shape) mapped to target ids: `id + d2t[id]`.
pub fn to_target(g: &mut Graph, e: &Eagle3Spec, draft_id: ValueId) -> Result<ValueId, IrError> {
    g.with_phase(Phase::Draft, |g| {
        let d2t = g.weight(
            &format!("{EAGLE_PREFIX}d2t"),
            TensorType::new(DType::I64, [Dim::from(e.draft_vocab)]),
        )?;
        let table = g.add(
            Op::Reshape {
                shape: Shape::new([Dim::from(e.draft_vocab), Dim::Static(1)]),
            },
            &[d2t],
        )?;
        let offset = g.add(Op::Embedding, &[table, draft_id])?;
        let dims = g.ty(draft_id).shape.clone();
        let offset = g.add(Op::Reshape { shape: dims }, &[offset])?;
        let offset = g.add(Op::Cast { to: DType::I32 }, &[offset])?;
        g.add(Op::Binary(BinaryOp::Add), &[draft_id, offset])
    })
}
