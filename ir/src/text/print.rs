//! Printing a graph as text. Printing cannot fail; for a graph that passes
//! [`crate::verify`], [`super::parse`] reads the text back to an equal graph.

use std::fmt::{self, Write as _};

use super::lex::{is_ident, quote};
use crate::{AttnMask, Graph, MoeScoring, Node, Op, RopeScaling, RopeStyle, ValueId};

/// The text form of `g`, one node per line (see the grammar in [`super`]).
pub fn print(g: &Graph) -> String {
    g.to_string()
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph {} {{", name_text(&self.name))?;
        for (id, node) in self.nodes() {
            writeln!(f, "  {}", node_text(id, node))?;
        }
        for (name, v) in self.outputs() {
            writeln!(f, "  output {} = {v}", quote(name))?;
        }
        f.write_str("}\n")
    }
}

/// A graph name is printed bare when it lexes as an identifier, else quoted.
fn name_text(name: &str) -> String {
    if is_ident(name) {
        name.to_string()
    } else {
        quote(name)
    }
}

/// `%id = op{attrs} "leaf name" %a, %b : type`
fn node_text(id: ValueId, node: &Node) -> String {
    let mut s = format!("{id} = {}", op_text(&node.op));
    for (i, a) in node.args.iter().enumerate() {
        s.push_str(if i == 0 { " " } else { ", " });
        write!(s, "{a}").expect("writing to a String cannot fail");
    }
    write!(s, " : {}", node.ty).expect("writing to a String cannot fail");
    s
}

/// The op's mnemonic (from the metadata table), its attributes in a fixed key order, and
/// a named leaf's quoted name. Leaf types are not attributes: they are the line's type.
fn op_text(op: &Op) -> String {
    let name = op.info().name;
    let attrs: Vec<(&str, String)> = match op {
        Op::Input { name: n, .. } | Op::Weight { name: n, .. } | Op::State { name: n, .. } => {
            return format!("{name} {}", quote(n));
        }
        Op::Fill { value, .. } => vec![("value", fmt_f64(*value))],
        Op::Iota { axis, .. } => vec![("axis", axis.to_string())],
        Op::Binary(_)
        | Op::Unary(_)
        | Op::SiluMul
        | Op::Select
        | Op::Reduce(_)
        | Op::Argmax
        | Op::Softmax
        | Op::Embedding
        | Op::MatMul
        | Op::KvWrite
        | Op::KvMove
        | Op::Assign
        | Op::Sample
        | Op::TopPThreshold
        | Op::TopKThreshold
        | Op::AcceptChain
        | Op::MoeExperts
        | Op::AllReduce
        | Op::Copy => vec![],
        Op::Cast { to } | Op::Dequantize { to } => vec![("to", to.to_string())],
        Op::Reshape { shape } => vec![("shape", shape.to_string())],
        Op::Slice { axis, start, len } => vec![
            ("axis", axis.to_string()),
            ("start", start.to_string()),
            ("len", len.to_string()),
        ],
        Op::Concat { axis } | Op::Gather { axis } => vec![("axis", axis.to_string())],
        Op::TopK { k } => vec![("k", k.to_string())],
        Op::TreeBuild { budget } => vec![("budget", budget.to_string())],
        Op::TreeAccept { max_depth } => vec![("max_depth", max_depth.to_string())],
        Op::TreeSelect { nodes } => vec![("nodes", nodes.to_string())],
        Op::RmsNorm { eps } => vec![("eps", fmt_f64(*eps))],
        Op::Rope {
            theta,
            scaling,
            style,
            rotary_dim,
        } => vec![
            ("theta", fmt_f64(*theta)),
            ("scaling", scaling_text(scaling)),
            ("style", rope_style_name(*style).into()),
            ("rotary_dim", rotary_dim.to_string()),
        ],
        Op::Attention { scale, mask } => vec![
            ("scale", fmt_f64(*scale)),
            ("mask", attn_mask_name(*mask).into()),
        ],
        Op::HeadMatMul { trans_w } => vec![("trans_w", trans_w.to_string())],
        Op::MlaAttention { scale, mask } => vec![
            ("scale", fmt_f64(*scale)),
            ("mask", attn_mask_name(*mask).into()),
        ],
        Op::RandomUniform { seed } => vec![("seed", seed.to_string())],
        Op::MoeRoute {
            top_k,
            scoring,
            n_group,
            topk_group,
            norm_topk_prob,
            scaling,
        } => vec![
            ("top_k", top_k.to_string()),
            ("scoring", moe_scoring_name(*scoring).into()),
            ("n_group", n_group.to_string()),
            ("topk_group", topk_group.to_string()),
            ("norm_topk_prob", norm_topk_prob.to_string()),
            ("scaling", fmt_f64(*scaling)),
        ],
    };
    if attrs.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{}}}", attr_list(&attrs))
    }
}

/// `k=v, k=v`
fn attr_list(attrs: &[(&str, String)]) -> String {
    let items: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    items.join(", ")
}

/// `none`, `llama3(factor=.., low=.., high=.., orig=..)` or
/// `yarn(factor=.., orig=.., beta_fast=.., beta_slow=.., mscale=..)`.
fn scaling_text(s: &RopeScaling) -> String {
    match s {
        RopeScaling::None => "none".into(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => format!(
            "llama3({})",
            attr_list(&[
                ("factor", fmt_f64(*factor)),
                ("low", fmt_f64(*low_freq_factor)),
                ("high", fmt_f64(*high_freq_factor)),
                ("orig", original_max_position.to_string()),
            ])
        ),
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            mscale,
        } => format!(
            "yarn({})",
            attr_list(&[
                ("factor", fmt_f64(*factor)),
                ("orig", original_max_position.to_string()),
                ("beta_fast", fmt_f64(*beta_fast)),
                ("beta_slow", fmt_f64(*beta_slow)),
                ("mscale", fmt_f64(*mscale)),
            ])
        ),
    }
}

pub(super) const ROPE_STYLES: [RopeStyle; 2] = [RopeStyle::Half, RopeStyle::Interleaved];
pub(super) const ATTN_MASKS: [AttnMask; 2] = [AttnMask::Causal, AttnMask::Tree];
pub(super) const MOE_SCORINGS: [MoeScoring; 2] = [MoeScoring::Softmax, MoeScoring::Sigmoid];

pub(super) fn rope_style_name(s: RopeStyle) -> &'static str {
    match s {
        RopeStyle::Half => "half",
        RopeStyle::Interleaved => "interleaved",
    }
}

pub(super) fn attn_mask_name(m: AttnMask) -> &'static str {
    match m {
        AttnMask::Causal => "causal",
        AttnMask::Tree => "tree",
    }
}

pub(super) fn moe_scoring_name(s: MoeScoring) -> &'static str {
    match s {
        MoeScoring::Softmax => "softmax",
        MoeScoring::Sigmoid => "sigmoid",
    }
}

/// Bits of the NaN that `nan` reads as.
const CANONICAL_NAN: u64 = 0x7ff8_0000_0000_0000;

/// A float as text that [`super::parse`] reads back to the same bits: Rust's shortest
/// round-trip form (`1e-5`, `0.1`, `500000.0`, `-0.0`, `inf`, `-inf`); the canonical NaN
/// is `nan` and any other NaN `nan_0x<16 hex digits of its bits>`.
pub(super) fn fmt_f64(x: f64) -> String {
    if x.is_nan() {
        if x.to_bits() == CANONICAL_NAN {
            "nan".into()
        } else {
            format!("nan_0x{:016x}", x.to_bits())
        }
    } else {
        format!("{x:?}")
    }
}

/// Inverse of [`fmt_f64`]; also accepts any float Rust's `f64::from_str` accepts.
pub(super) fn parse_f64(s: &str) -> Option<f64> {
    if s == "nan" {
        return Some(f64::from_bits(CANONICAL_NAN));
    }
    if let Some(hex) = s.strip_prefix("nan_0x") {
        let x = f64::from_bits(u64::from_str_radix(hex, 16).ok()?);
        return x.is_nan().then_some(x);
    }
    s.parse::<f64>().ok()
}
