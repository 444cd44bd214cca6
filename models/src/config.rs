//! Hugging Face `config.json`: the raw layout as written ([`RawConfig`]), resolved once into
//! the validated [`ModelSpec`] that everything downstream reads.
//!
//! Both layouts transformers writes are accepted:
//! - Hub / transformers 4: top-level `rope_theta`, `rope_scaling {rope_type | type, ...}`,
//!   `torch_dtype`;
//! - transformers 5: `rope_parameters {rope_type, rope_theta, ...}`, `dtype`.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use specc_ir::{DType, RopeScaling};

use crate::error::ModelError;
use crate::raw::RawField;

/// Architectures this crate lowers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// `LlamaForCausalLM` (Llama 2/3.x and look-alikes).
    Llama,
    /// `Qwen3ForCausalLM`: Llama plus per-head `q_norm` / `k_norm`.
    Qwen3,
    /// `DeepseekV3ForCausalLM` (DeepSeek-V3, Kimi-K2; the text model of Kimi-K2.5):
    /// multi-head latent attention, dense MLP layers then DeepSeek MoE layers.
    DeepseekV3,
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Llama, Arch::Qwen3, Arch::DeepseekV3];

    /// The `architectures` entry naming this arch.
    pub fn hf_name(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::DeepseekV3 => "DeepseekV3ForCausalLM",
        }
    }

    /// The `model_type` naming this arch (used only when `architectures` is absent).
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::DeepseekV3 => "deepseek_v3",
        }
    }

    fn supported_list() -> String {
        let names: Vec<String> = Arch::ALL
            .iter()
            .map(|a| format!("\"{}\"", a.hf_name()))
            .collect();
        format!("one of {}", names.join(", "))
    }
}

/// `architectures` entry of Kimi-K2.5's multimodal checkpoint (its text model is lowered).
pub const KIMI_K25_ARCH: &str = "KimiK25ForConditionalGeneration";

/// Where Kimi-K2.5 keeps its text model's tensors.
pub const KIMI_K25_TEXT_PREFIX: &str = "language_model.";

/// A validated dense decoder-only model: every fact the lowering needs, nothing else.
///
/// Invariants (checked by [`RawConfig::resolve`]): all sizes are positive;
/// `heads % kv_heads == 0`; `head_dim` is even; `rms_eps > 0`; `rope_theta > 0`; the
/// parameter count ([`ModelSpec::param_count`]) fits in a `u64`; the BOS and EOS ids lie
/// inside the vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub arch: Arch,
    pub hidden: usize,
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// FFN width.
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// `lm_head` shares `model.embed_tokens.weight`.
    pub tie_embeddings: bool,
    pub max_position: usize,
    /// Multi-token-prediction layers stored after the decoder layers
    /// (`num_nextn_predict_layers`): decoding never reads them.
    pub mtp_layers: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Weight and activation dtype (`torch_dtype` / `dtype`).
    pub dtype: DType,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Multi-head latent attention (DeepSeek-V3); `head_dim` is then its q/k width
    /// (`qk_nope_head_dim + qk_rope_head_dim`) and `kv_heads == heads`.
    pub mla: Option<crate::config_mla::MlaSpec>,
    /// DeepSeek MoE layers from `first_k_dense_replace` on (DeepSeek-V3).
    pub moe: Option<crate::config_mla::MoeSpec>,
    /// Prefix of every weight name: empty, or `language_model.` for the text model of a
    /// multimodal checkpoint (Kimi-K2.5).
    pub weight_prefix: String,
    /// The `quantization_config` scheme, and (once [`crate::Checkpoint::adapt_quant`] has
    /// read the headers) the storage format of every quantised Linear.
    pub quant: crate::quant::QuantSpec,
}

impl ModelSpec {
    /// Reads and resolves a `config.json`.
    pub fn from_file(file: &Path) -> Result<ModelSpec, ModelError> {
        Self::from_json(file, &crate::files::read_text(file)?)
    }

    /// Resolves config text; `file` only names the source in errors.
    pub fn from_json(file: &Path, text: &str) -> Result<ModelSpec, ModelError> {
        RawConfig::from_json(file, text)?.resolve(file)
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Elements of every weight the dense lowering reads, or `None` when the count
    /// overflows a `u64` (no such model fits anywhere).
    pub fn param_count(&self) -> Option<u64> {
        if let (Some(mla), Some(moe)) = (&self.mla, &self.moe) {
            return crate::lower_mla::param_count(self, mla, moe);
        }
        let n = |x: usize| x as u64;
        let (h, v, i) = (n(self.hidden), n(self.vocab), n(self.intermediate));
        let (q, kv) = (
            n(self.heads).checked_mul(n(self.head_dim))?,
            n(self.kv_heads).checked_mul(n(self.head_dim))?,
        );
        // q, k, v and o projections; gate, up and down; two norms (+ q/k norms).
        let attn = h.checked_mul(q.checked_add(kv.checked_mul(2)?)?.checked_add(q)?)?;
        let mlp = h.checked_mul(i)?.checked_mul(3)?;
        let norms = h
            .checked_mul(2)?
            .checked_add(n(self.head_dim).checked_mul(2)?)?;
        let layer = attn.checked_add(mlp)?.checked_add(norms)?;
        let heads = if self.tie_embeddings { 1 } else { 2 };
        let embed = v.checked_mul(h)?.checked_mul(heads)?;
        n(self.layers)
            .checked_mul(layer)?
            .checked_add(embed)?
            .checked_add(h)
    }

    /// Checks that token `ids` (from `what`: a flag, a tokenizer, a prompt) lie inside the
    /// vocabulary of the config `file`.
    pub fn check_token_ids(&self, file: &Path, what: &str, ids: &[u32]) -> Result<(), ModelError> {
        match ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= self.vocab)
        {
            None => Ok(()),
            Some((i, id)) => Err(ModelError::request(
                what,
                format!(
                    "token ids below vocab_size ({}, {})",
                    self.vocab,
                    file.display()
                ),
                format!("id {id} at position {i}"),
            )),
        }
    }
}

/// A positive size (`hidden_size`, `num_attention_heads`, ...); zero is rejected at resolve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct Count(pub u64);

/// A token id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct TokenId(pub u32);

/// `eos_token_id`: one id or a list of them.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(TokenId),
    Many(Vec<TokenId>),
}

impl RawField for Count {
    const EXPECTED: &'static str = "a positive integer";
}
impl RawField for TokenId {
    const EXPECTED: &'static str = "a token id (an integer in 0..2^32)";
}
impl RawField for TokenIds {
    const EXPECTED: &'static str = "a token id or a list of token ids";
}

raw_struct! {
    /// `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5).
    pub struct RawRope {
        rope_type: Option<String>,
        /// The pre-4.45 spelling of `rope_type`.
        legacy_type as "type": Option<String>,
        /// Only in `rope_parameters`.
        rope_theta: Option<f64>,
        factor: Option<f64>,
        low_freq_factor: Option<f64>,
        high_freq_factor: Option<f64>,
        original_max_position_embeddings: Option<Count>,
        /// YaRN (DeepSeek-V3).
        beta_fast: Option<f64>,
        beta_slow: Option<f64>,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        attention_factor: Option<f64>,
        truncate: Option<bool>,
    }
}

raw_struct! {
    /// `config.json` as written. Unknown fields are ignored; absent fields are `None`.
    pub struct RawConfig {
        architectures: Option<Vec<String>>,
        model_type: Option<String>,
        hidden_size: Option<Count>,
        intermediate_size: Option<Count>,
        num_hidden_layers: Option<Count>,
        num_attention_heads: Option<Count>,
        num_key_value_heads: Option<Count>,
        head_dim: Option<Count>,
        vocab_size: Option<Count>,
        max_position_embeddings: Option<Count>,
        num_nextn_predict_layers: Option<Count>,
        rms_norm_eps: Option<f64>,
        rope_theta: Option<f64>,
        rope_scaling: Option<RawRope>,
        rope_parameters: Option<RawRope>,
        tie_word_embeddings: Option<bool>,
        attention_bias: Option<bool>,
        mlp_bias: Option<bool>,
        hidden_act: Option<String>,
        use_sliding_window: Option<bool>,
        quantization_config: Option<Value>,
        bos_token_id: Option<TokenId>,
        eos_token_id: Option<TokenIds>,
        torch_dtype: Option<String>,
        dtype: Option<String>,
        /// DeepSeek-V3 (`config_mla`).
        q_lora_rank: crate::config_mla::Nullable,
        kv_lora_rank: Option<Count>,
        qk_nope_head_dim: Option<Count>,
        qk_rope_head_dim: Option<Count>,
        /// Written by transformers: `qk_nope_head_dim + qk_rope_head_dim`.
        qk_head_dim: Option<Count>,
        v_head_dim: Option<Count>,
        rope_interleave: Option<bool>,
        moe_intermediate_size: Option<Count>,
        n_routed_experts: Option<Count>,
        n_shared_experts: Option<Count>,
        num_experts_per_tok: Option<Count>,
        n_group: Option<Count>,
        topk_group: Option<Count>,
        first_k_dense_replace: Option<Count>,
        moe_layer_freq: Option<Count>,
        norm_topk_prob: Option<bool>,
        routed_scaling_factor: Option<f64>,
        scoring_func: Option<String>,
        topk_method: Option<String>,
        /// Kimi-K2.5: the text model's config.
        text_config: Option<Box<RawConfig>>,
    }
}

impl RawConfig {
    /// Parses config text. Errors name the first field whose JSON type is wrong.
    pub fn from_json(file: &Path, text: &str) -> Result<RawConfig, ModelError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ModelError::json(file, &e))?;
        crate::raw::from_value(file, v)
    }

    /// Validates and derives every fact of the model.
    pub fn resolve(&self, file: &Path) -> Result<ModelSpec, ModelError> {
        if self.is_kimi_k25() {
            return self.resolve_kimi_k25(file);
        }
        let arch = self.arch(file)?;
        let count = |field: &str, v: Option<Count>| -> Result<usize, ModelError> {
            match v {
                None => Err(ModelError::missing(file, field, Count::EXPECTED)),
                Some(Count(0)) => Err(ModelError::field(file, field, Count::EXPECTED, 0)),
                Some(Count(n)) => usize::try_from(n)
                    .map_err(|_| ModelError::field(file, field, "a size that fits in memory", n)),
            }
        };
        let hidden = count("hidden_size", self.hidden_size)?;
        let layers = count("num_hidden_layers", self.num_hidden_layers)?;
        let heads = count("num_attention_heads", self.num_attention_heads)?;
        let intermediate = count("intermediate_size", self.intermediate_size)?;
        let vocab = count("vocab_size", self.vocab_size)?;
        let max_position = count("max_position_embeddings", self.max_position_embeddings)?;
        // HF semantics: absent num_key_value_heads means multi-head attention.
        let kv_heads = match self.num_key_value_heads {
            None => heads,
            // MLA: config_mla checks num_key_value_heads == num_attention_heads.
            _ if arch == Arch::DeepseekV3 => heads,
            v => count("num_key_value_heads", v)?,
        };
        if heads % kv_heads != 0 {
            return Err(ModelError::field(
                file,
                "num_key_value_heads",
                format!("a divisor of num_attention_heads ({heads})"),
                kv_heads,
            ));
        }
        let head_dim = match (arch, self.head_dim) {
            // MLA: the q/k width, set below from qk_nope_head_dim + qk_rope_head_dim.
            (Arch::DeepseekV3, _) => 2,
            (_, Some(_)) => count("head_dim", self.head_dim)?,
            (Arch::Llama, None) => {
                if hidden % heads != 0 {
                    return Err(ModelError::field(
                        file,
                        "hidden_size",
                        format!(
                            "a multiple of num_attention_heads ({heads}) when head_dim is absent"
                        ),
                        hidden,
                    ));
                }
                hidden / heads
            }
            (Arch::Qwen3, None) => {
                return Err(ModelError::missing(file, "head_dim", Count::EXPECTED))
            }
        };
        if head_dim % 2 != 0 {
            return Err(ModelError::field(
                file,
                "head_dim",
                "an even number (RoPE rotates pairs)",
                head_dim,
            ));
        }
        let rms_eps = positive(file, "rms_norm_eps", self.rms_norm_eps)?;
        let (rope_theta, rope_scaling, softmax_factor) = self.rope(file, arch, max_position)?;
        self.check_unsupported(file, arch)?;
        let deepseek = match arch {
            Arch::DeepseekV3 => Some(crate::config_mla::resolve(
                self,
                file,
                heads,
                softmax_factor,
            )?),
            _ => None,
        };
        let head_dim = deepseek.as_ref().map_or(head_dim, |d| d.mla.qk_head_dim());
        let (mla, moe) = match deepseek {
            Some(d) => (Some(d.mla), Some(d.moe)),
            None => (None, None),
        };
        let spec = ModelSpec {
            arch,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            rms_eps,
            rope_theta,
            rope_scaling,
            tie_embeddings: self.tie_word_embeddings.unwrap_or(false),
            max_position,
            mtp_layers: self.num_nextn_predict_layers.map_or(0, |c| c.0 as usize),
            bos_token_id: self.bos_token_id.map(|t| t.0),
            eos_token_ids: match &self.eos_token_id {
                None => Vec::new(),
                Some(TokenIds::One(t)) => vec![t.0],
                Some(TokenIds::Many(ts)) => ts.iter().map(|t| t.0).collect(),
            },
            dtype: self.dtype(file)?,
            qk_norm: arch == Arch::Qwen3,
            mla,
            moe,
            weight_prefix: String::new(),
            quant: crate::quant::QuantSpec {
                scheme: crate::quant::resolve_scheme(
                    file,
                    "quantization_config",
                    self.quantization_config.as_ref(),
                )?,
                formats: Default::default(),
            },
        };
        Self::check_sizes(file, &spec)?;
        Ok(spec)
    }

    /// The parameter count fits a `u64`, and the special tokens are ids of the vocabulary
    /// (an id past it would be clamped by the embedding: a wrong token, silently).
    fn check_sizes(file: &Path, spec: &ModelSpec) -> Result<(), ModelError> {
        if spec.param_count().is_none() {
            return Err(ModelError::field(
                file,
                "hidden_size",
                "sizes whose parameter count fits in 64 bits (with intermediate_size, num_hidden_layers and vocab_size)",
                spec.hidden,
            ));
        }
        let vocab = format!("a token id below vocab_size ({})", spec.vocab);
        if let Some(b) = spec.bos_token_id.filter(|&b| b as usize >= spec.vocab) {
            return Err(ModelError::field(file, "bos_token_id", vocab, b));
        }
        if let Some(e) = spec
            .eos_token_ids
            .iter()
            .find(|&&e| e as usize >= spec.vocab)
        {
            return Err(ModelError::field(file, "eos_token_id", vocab, e));
        }
        Ok(())
    }

    fn arch(&self, file: &Path) -> Result<Arch, ModelError> {
        if let Some(list) = &self.architectures {
            return list
                .iter()
                .find_map(|name| Arch::ALL.into_iter().find(|a| a.hf_name() == name))
                .ok_or_else(|| {
                    ModelError::field(
                        file,
                        "architectures",
                        Arch::supported_list(),
                        serde_json::to_string(list).unwrap_or_default(),
                    )
                });
        }
        match &self.model_type {
            Some(mt) if mt == "kimi_k2" => Ok(Arch::DeepseekV3),
            Some(mt) => Arch::ALL
                .into_iter()
                .find(|a| a.model_type() == mt)
                .ok_or_else(|| {
                    let types: Vec<String> = Arch::ALL
                        .iter()
                        .map(|a| format!("\"{}\"", a.model_type()))
                        .collect();
                    ModelError::field(
                        file,
                        "model_type",
                        format!("one of {} (architectures is absent)", types.join(", ")),
                        format!("\"{mt}\""),
                    )
                }),
            None => Err(ModelError::missing(
                file,
                "architectures",
                &Arch::supported_list(),
            )),
        }
    }

    /// `(theta, scaling)` from `rope_parameters` (preferred) or `rope_theta` + `rope_scaling`.
    /// `(theta, scaling, softmax factor)`; the factor is YaRN's `m²` for MLA, else 1.
    fn rope(
        &self,
        file: &Path,
        arch: Arch,
        max_position: usize,
    ) -> Result<(f64, RopeScaling, f64), ModelError> {
        let (params, pname) = match (&self.rope_parameters, &self.rope_scaling) {
            (Some(p), _) => (Some(p), "rope_parameters"),
            (None, Some(s)) => (Some(s), "rope_scaling"),
            (None, None) => (None, "rope_scaling"),
        };
        let theta = match params.and_then(|p| p.rope_theta) {
            Some(t) => positive(file, "rope_parameters.rope_theta", Some(t))?,
            None => positive(file, "rope_theta", self.rope_theta)?,
        };
        let Some(p) = params else {
            return Ok((theta, RopeScaling::None, 1.0));
        };
        let (kind, kind_field) = match (&p.rope_type, &p.legacy_type) {
            (Some(t), _) => (Some(t.as_str()), "rope_type"),
            (None, Some(t)) => (Some(t.as_str()), "type"),
            (None, None) => (None, "rope_type"),
        };
        let scaling = match kind {
            None | Some("default") => RopeScaling::None,
            Some("yarn") if arch == Arch::DeepseekV3 => {
                let (scaling, softmax) = crate::config_mla::yarn(file, pname, p, max_position)?;
                return Ok((theta, scaling, softmax));
            }
            Some("llama3") => {
                let f = |name: &str, v: Option<f64>| positive(file, &format!("{pname}.{name}"), v);
                let factor = f("factor", p.factor)?;
                let low = f("low_freq_factor", p.low_freq_factor)?;
                let high = f("high_freq_factor", p.high_freq_factor)?;
                if high <= low {
                    return Err(ModelError::field(
                        file,
                        format!("{pname}.high_freq_factor"),
                        format!("a number greater than low_freq_factor ({low})"),
                        high,
                    ));
                }
                let orig_field = format!("{pname}.original_max_position_embeddings");
                let orig = match p.original_max_position_embeddings {
                    None => return Err(ModelError::missing(file, orig_field, Count::EXPECTED)),
                    Some(Count(0)) => {
                        return Err(ModelError::field(file, orig_field, Count::EXPECTED, 0))
                    }
                    Some(Count(n)) => n,
                };
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position: orig,
                }
            }
            Some(other) => {
                let expected = match arch {
                    Arch::DeepseekV3 => "\"default\", \"llama3\" or \"yarn\"",
                    _ => "\"default\" or \"llama3\"",
                };
                return Err(ModelError::field(
                    file,
                    format!("{pname}.{kind_field}"),
                    expected,
                    format!("\"{other}\""),
                ));
            }
        };
        Ok((theta, scaling, 1.0))
    }

    /// Kimi-K2.5's multimodal wrapper (`KimiK25ForConditionalGeneration`, `kimi_k25`).
    fn is_kimi_k25(&self) -> bool {
        let named = self
            .architectures
            .as_ref()
            .is_some_and(|a| a.iter().any(|n| n == KIMI_K25_ARCH));
        named || (self.architectures.is_none() && self.model_type.as_deref() == Some("kimi_k25"))
    }

    /// The text model of Kimi-K2.5: `text_config` resolved as DeepSeek-V3 (errors name
    /// `text_config.<field>`), weights under `language_model.`; the vision tower and
    /// projector are not lowered. The outer dtype applies when the text config has none.
    fn resolve_kimi_k25(&self, file: &Path) -> Result<ModelSpec, ModelError> {
        let Some(text) = &self.text_config else {
            return Err(ModelError::missing(
                file,
                "text_config",
                "the text model's config (an object)",
            ));
        };
        let mut text = (**text).clone();
        if text.architectures.is_none() && text.model_type.is_none() {
            text.model_type = Some("kimi_k2".into());
        }
        if text.dtype.is_none() && text.torch_dtype.is_none() {
            text.dtype.clone_from(&self.dtype);
            text.torch_dtype.clone_from(&self.torch_dtype);
        }
        let mut spec = text.resolve(file).map_err(|e| match e {
            ModelError::Field {
                file,
                field,
                expected,
                found,
            } => ModelError::Field {
                file,
                field: format!("text_config.{field}"),
                expected,
                found,
            },
            other => other,
        })?;
        if spec.arch != Arch::DeepseekV3 {
            return Err(ModelError::field(
                file,
                "text_config.model_type",
                "\"kimi_k2\" or \"deepseek_v3\"",
                spec.arch.model_type(),
            ));
        }
        spec.weight_prefix = KIMI_K25_TEXT_PREFIX.into();
        if spec.quant.scheme == crate::quant::QuantScheme::None {
            spec.quant.scheme = crate::quant::resolve_scheme(
                file,
                "quantization_config",
                self.quantization_config.as_ref(),
            )?;
        }
        Ok(spec)
    }

    fn dtype(&self, file: &Path) -> Result<DType, ModelError> {
        let parse = |field: &str, s: &str| -> Result<DType, ModelError> {
            match s {
                "bfloat16" => Ok(DType::BF16),
                "float16" | "half" => Ok(DType::F16),
                "float32" | "float" => Ok(DType::F32),
                _ => Err(ModelError::field(
                    file,
                    field,
                    "\"bfloat16\", \"float16\" or \"float32\"",
                    format!("\"{s}\""),
                )),
            }
        };
        match (&self.dtype, &self.torch_dtype) {
            (Some(d), Some(t)) => {
                let (d, t) = (parse("dtype", d)?, parse("torch_dtype", t)?);
                if d != t {
                    return Err(ModelError::field(
                        file,
                        "torch_dtype",
                        format!("the same dtype as field \"dtype\" ({d})"),
                        t,
                    ));
                }
                Ok(d)
            }
            (Some(d), None) => parse("dtype", d),
            (None, Some(t)) => parse("torch_dtype", t),
            (None, None) => Err(ModelError::missing(
                file,
                "torch_dtype",
                "\"bfloat16\", \"float16\" or \"float32\" (or field \"dtype\")",
            )),
        }
    }

    /// Features the dense lowering does not implement: an error rather than wrong numbers.
    fn check_unsupported(&self, file: &Path, arch: Arch) -> Result<(), ModelError> {
        let must_be_false = [
            ("attention_bias", self.attention_bias),
            ("mlp_bias", self.mlp_bias),
            ("use_sliding_window", self.use_sliding_window),
        ];
        for (field, v) in must_be_false {
            if v == Some(true) {
                return Err(ModelError::field(
                    file,
                    field,
                    format!("false or absent (unsupported for {})", arch.hf_name()),
                    true,
                ));
            }
        }
        if let Some(act) = &self.hidden_act {
            if act != "silu" {
                return Err(ModelError::field(
                    file,
                    "hidden_act",
                    "\"silu\"",
                    format!("\"{act}\""),
                ));
            }
        }
        Ok(())
    }
}

fn positive(file: &Path, field: &str, v: Option<f64>) -> Result<f64, ModelError> {
    match v {
        None => Err(ModelError::missing(file, field, "a positive number")),
        Some(x) if x > 0.0 && x.is_finite() => Ok(x),
        Some(x) => Err(ModelError::field(file, field, "a positive number", x)),
    }
}
