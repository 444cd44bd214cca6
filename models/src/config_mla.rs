//! DeepSeek-V3 / Kimi-K2 configs (`DeepseekV3ForCausalLM`; `model_type` `deepseek_v3`,
//! `kimi_k2`; the text model of `kimi_k25`): multi-head latent attention and the
//! DeepSeek MoE router, resolved into [`MlaSpec`] and [`MoeSpec`].
//!
//! Semantics follow transformers 5.24's `modeling_deepseek_v3.py` and
//! `_compute_yarn_parameters` (REFERENCE.md "DeepSeek-V3 / Kimi-K2").

use std::path::Path;

use serde_json::Value;
use specc_ir::{DType, RopeScaling, RopeStyle};

use crate::config::{Count, RawConfig, RawRope};
use crate::error::ModelError;

/// A field where JSON `null` means something (`q_lora_rank: null`): absent, null, or a value.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Nullable {
    #[default]
    Absent,
    Null,
    Value(Value),
}

impl<'de> serde::Deserialize<'de> for Nullable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match <Value as serde::Deserialize>::deserialize(d)? {
            Value::Null => Nullable::Null,
            v => Nullable::Value(v),
        })
    }
}

impl crate::raw::RawField for Nullable {
    const EXPECTED: &'static str = "any JSON value or null";
}

/// Multi-head latent attention sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaSpec {
    /// `q_lora_rank`: `None` (config `null`) means one `q_proj` instead of
    /// `q_a_proj` → `q_a_layernorm` → `q_b_proj`.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// `qk_head_dim^-0.5`, times `m²` with `m = 0.1 · mscale_all_dim · ln(factor) + 1`
    /// under YaRN with a non-zero `mscale_all_dim`.
    pub softmax_scale: f64,
    /// `rope_interleave` (default true): RoPE pairs `(2i, 2i + 1)` of the rope dims.
    pub rope_style: RopeStyle,
}

impl MlaSpec {
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Values one token's cache entry holds per layer: RMSNorm(c) and the rotated k_pe.
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// The DeepSeek MoE (noaux_tc router: sigmoid scores, a selection-only bias, group-limited
/// top-k; shared experts added to the routed ones).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpec {
    /// `n_routed_experts`.
    pub experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    /// `moe_intermediate_size`: each routed expert's FFN width.
    pub intermediate: usize,
    /// `n_shared_experts`: the shared MLP is `intermediate × n_shared` wide.
    pub shared_experts: usize,
    /// `first_k_dense_replace`: layers below it have a dense MLP.
    pub first_dense: usize,
    /// Stored dtypes of `mlp.gate.weight` and `mlp.gate.e_score_correction_bias` (f32 as
    /// transformers writes them; real checkpoints keep the gate in bf16). The router
    /// computes in f32 whatever they are stored as. Set from the safetensors headers by
    /// [`crate::Model::open`].
    pub router_dtype: DType,
    pub bias_dtype: DType,
}

impl MoeSpec {
    /// Whether decoder layer `layer` has the MoE MLP (else the dense one).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        layer >= self.first_dense
    }
}

/// `(ModelSpec.head_dim, kv_heads, mla, moe)` of a DeepSeek-V3 config.
pub(crate) struct Resolved {
    pub mla: MlaSpec,
    pub moe: MoeSpec,
}

fn count(file: &Path, field: &str, v: Option<Count>) -> Result<usize, ModelError> {
    match v {
        None => Err(ModelError::missing(file, field, "a positive integer")),
        Some(Count(0)) => Err(ModelError::field(file, field, "a positive integer", 0)),
        Some(Count(n)) => usize::try_from(n)
            .map_err(|_| ModelError::field(file, field, "a size that fits in memory", n)),
    }
}

/// An optional count with transformers' default.
fn count_or(
    file: &Path,
    field: &str,
    v: Option<Count>,
    default: usize,
) -> Result<usize, ModelError> {
    match v {
        None => Ok(default),
        v => count(file, field, v),
    }
}

/// YaRN's `get_mscale`: `0.1 · mscale · ln(scale) + 1`, or 1 when `scale ≤ 1`.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// `rope_scaling` / `rope_parameters` of type `yarn`, as `_compute_yarn_parameters` reads
/// it: `(scaling, softmax factor m²)`. `factor` defaults to
/// `max_position_embeddings / original_max_position_embeddings`, which defaults to
/// `max_position_embeddings`; `beta_fast` 32 and `beta_slow` 1 (also when 0); the cos/sin
/// factor is `attention_factor`, else `m(factor, mscale) / m(factor, mscale_all_dim)` when
/// both are non-zero, else `m(factor, 1)`.
pub(crate) fn yarn(
    file: &Path,
    pname: &str,
    p: &RawRope,
    max_position: usize,
) -> Result<(RopeScaling, f64), ModelError> {
    let f = |name: &str| format!("{pname}.{name}");
    let orig = match p.original_max_position_embeddings {
        None => max_position as u64,
        Some(Count(0)) => {
            return Err(ModelError::field(
                file,
                f("original_max_position_embeddings"),
                "a positive integer",
                0,
            ))
        }
        Some(Count(n)) => n,
    };
    let factor = match p.factor {
        None => max_position as f64 / orig as f64,
        Some(x) if x > 0.0 && x.is_finite() => x,
        Some(x) => return Err(ModelError::field(file, f("factor"), "a positive number", x)),
    };
    let finite = |name: &str, v: Option<f64>, default: f64| -> Result<f64, ModelError> {
        match v {
            None => Ok(default),
            Some(x) if x.is_finite() => Ok(x),
            Some(x) => Err(ModelError::field(file, f(name), "a finite number", x)),
        }
    };
    let nonzero_or = |x: f64, d: f64| if x == 0.0 { d } else { x };
    let beta_fast = nonzero_or(finite("beta_fast", p.beta_fast, 32.0)?, 32.0);
    let beta_slow = nonzero_or(finite("beta_slow", p.beta_slow, 1.0)?, 1.0);
    if beta_fast <= 0.0 || beta_slow <= 0.0 {
        return Err(ModelError::field(
            file,
            f(if beta_fast <= 0.0 {
                "beta_fast"
            } else {
                "beta_slow"
            }),
            "a positive number",
            beta_fast.min(beta_slow),
        ));
    }
    if p.truncate == Some(false) {
        return Err(ModelError::field(
            file,
            f("truncate"),
            "true or absent (an untruncated YaRN correction range is not supported)",
            false,
        ));
    }
    let mscale = finite("mscale", p.mscale, 0.0)?;
    let mscale_all_dim = finite("mscale_all_dim", p.mscale_all_dim, 0.0)?;
    let cos_sin = match p.attention_factor {
        Some(a) if a.is_finite() && a > 0.0 => a,
        Some(a) => {
            return Err(ModelError::field(
                file,
                f("attention_factor"),
                "a positive number",
                a,
            ))
        }
        None if mscale != 0.0 && mscale_all_dim != 0.0 => {
            yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        }
        None => yarn_mscale(factor, 1.0),
    };
    let softmax = if mscale_all_dim != 0.0 {
        yarn_mscale(factor, mscale_all_dim).powi(2)
    } else {
        1.0
    };
    Ok((
        RopeScaling::Yarn {
            factor,
            original_max_position: orig,
            beta_fast,
            beta_slow,
            mscale: cos_sin,
        },
        softmax,
    ))
}

/// MLA and MoE facts of a DeepSeek-V3 config; `heads` is `num_attention_heads`,
/// `softmax_factor` the YaRN `m²` (1 without YaRN).
pub(crate) fn resolve(
    raw: &RawConfig,
    file: &Path,
    heads: usize,
    softmax_factor: f64,
) -> Result<Resolved, ModelError> {
    let c = |field: &str, v: Option<Count>| count(file, field, v);
    if let Some(kv) = raw.num_key_value_heads {
        if kv.0 as usize != heads {
            return Err(ModelError::field(
                file,
                "num_key_value_heads",
                format!("num_attention_heads ({heads}): MLA has no grouped-query heads"),
                kv.0,
            ));
        }
    }
    let q_lora_rank = match &raw.q_lora_rank {
        Nullable::Absent => {
            return Err(ModelError::missing(
                file,
                "q_lora_rank",
                "a positive integer, or null for a plain q_proj",
            ))
        }
        Nullable::Null => None,
        Nullable::Value(v) => match v.as_u64() {
            Some(n) if n > 0 => Some(n as usize),
            _ => {
                return Err(ModelError::field(
                    file,
                    "q_lora_rank",
                    "a positive integer, or null for a plain q_proj",
                    v,
                ))
            }
        },
    };
    let kv_lora_rank = c("kv_lora_rank", raw.kv_lora_rank)?;
    let qk_nope_head_dim = c("qk_nope_head_dim", raw.qk_nope_head_dim)?;
    let qk_rope_head_dim = c("qk_rope_head_dim", raw.qk_rope_head_dim)?;
    let v_head_dim = c("v_head_dim", raw.v_head_dim)?;
    if qk_rope_head_dim % 2 != 0 {
        return Err(ModelError::field(
            file,
            "qk_rope_head_dim",
            "an even number (RoPE rotates pairs)",
            qk_rope_head_dim,
        ));
    }
    // transformers writes head_dim = qk_rope_head_dim (the rotary width).
    if let Some(Count(hd)) = raw.head_dim {
        if hd as usize != qk_rope_head_dim {
            return Err(ModelError::field(
                file,
                "head_dim",
                format!("qk_rope_head_dim ({qk_rope_head_dim}), the rotary width, or absent"),
                hd,
            ));
        }
    }
    let qk_head_dim = qk_nope_head_dim + qk_rope_head_dim;
    if let Some(Count(q)) = raw.qk_head_dim {
        if q as usize != qk_head_dim {
            return Err(ModelError::field(
                file,
                "qk_head_dim",
                format!(
                    "qk_nope_head_dim + qk_rope_head_dim ({qk_nope_head_dim} + {qk_rope_head_dim} = {qk_head_dim}) or absent"
                ),
                q,
            ));
        }
    }
    let rope_style = match raw.rope_interleave {
        Some(false) => RopeStyle::Half,
        _ => RopeStyle::Interleaved,
    };
    let mla = MlaSpec {
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim,
        softmax_scale: (qk_head_dim as f64).powf(-0.5) * softmax_factor,
        rope_style,
    };
    Ok(Resolved {
        mla,
        moe: resolve_moe(raw, file)?,
    })
}

fn resolve_moe(raw: &RawConfig, file: &Path) -> Result<MoeSpec, ModelError> {
    let experts = count(file, "n_routed_experts", raw.n_routed_experts)?;
    let top_k = count(file, "num_experts_per_tok", raw.num_experts_per_tok)?;
    let n_group = count_or(file, "n_group", raw.n_group, 1)?;
    let topk_group = count_or(file, "topk_group", raw.topk_group, 1)?;
    let intermediate = count(file, "moe_intermediate_size", raw.moe_intermediate_size)?;
    let shared_experts = count_or(file, "n_shared_experts", raw.n_shared_experts, 1)?;
    let first_dense = match raw.first_k_dense_replace {
        None => 0,
        Some(Count(n)) => n as usize,
    };
    if top_k > experts {
        return Err(ModelError::field(
            file,
            "num_experts_per_tok",
            format!("at most n_routed_experts ({experts})"),
            top_k,
        ));
    }
    if experts % n_group != 0 {
        return Err(ModelError::field(
            file,
            "n_group",
            format!("a divisor of n_routed_experts ({experts})"),
            n_group,
        ));
    }
    if topk_group > n_group {
        return Err(ModelError::field(
            file,
            "topk_group",
            format!("at most n_group ({n_group})"),
            topk_group,
        ));
    }
    let per_group = experts / n_group;
    if n_group > 1 && per_group < 2 {
        return Err(ModelError::field(
            file,
            "n_group",
            format!(
                "at most n_routed_experts / 2 ({}): a group scores its two best experts",
                experts / 2
            ),
            n_group,
        ));
    }
    if top_k > topk_group * per_group {
        return Err(ModelError::field(
            file,
            "num_experts_per_tok",
            format!(
                "at most topk_group × experts per group ({topk_group} × {per_group}), the experts routing may choose from"
            ),
            top_k,
        ));
    }
    let routed_scaling_factor = match raw.routed_scaling_factor {
        None => 1.0,
        Some(x) if x > 0.0 && x.is_finite() => x,
        Some(x) => {
            return Err(ModelError::field(
                file,
                "routed_scaling_factor",
                "a positive number",
                x,
            ))
        }
    };
    let must_be = |field: &str, v: &Option<String>, want: &str| match v {
        Some(s) if s != want => Err(ModelError::field(
            file,
            field,
            format!("\"{want}\" or absent"),
            format!("\"{s}\""),
        )),
        _ => Ok(()),
    };
    must_be("scoring_func", &raw.scoring_func, "sigmoid")?;
    must_be("topk_method", &raw.topk_method, "noaux_tc")?;
    if let Some(Count(f)) = raw.moe_layer_freq {
        if f != 1 {
            return Err(ModelError::field(
                file,
                "moe_layer_freq",
                "1 or absent (every layer from first_k_dense_replace on is MoE)",
                f,
            ));
        }
    }
    Ok(MoeSpec {
        experts,
        top_k,
        n_group,
        topk_group,
        norm_topk_prob: raw.norm_topk_prob.unwrap_or(true),
        routed_scaling_factor,
        intermediate,
        shared_experts,
        first_dense,
        router_dtype: DType::F32,
        bias_dtype: DType::F32,
    })
}
