use super::print::{fmt_f64, parse_f64};
use super::{parse, print};
use crate::op::{B, CTX, T};
use crate::{
    verify, AttnMask, BinaryOp, DType, Dim, Graph, IrError, MoeScoring, Op, ReduceOp, RopeScaling,
    RopeStyle, Shape, TensorType, UnaryOp, ValueId,
};

fn ty(dtype: DType, dims: &[Dim]) -> TensorType {
    TensorType::new(dtype, dims.iter().copied())
}

fn s(n: u64) -> Dim {
    Dim::Static(n)
}

/// Position of `op`'s variant in `Op`; the exhaustive match makes a new variant a compile
/// error here until [`every_op_graph`] covers it.
fn variant(op: &Op) -> usize {
    match op {
        Op::Input { .. } => 0,
        Op::Weight { .. } => 1,
        Op::State { .. } => 2,
        Op::Fill { .. } => 3,
        Op::Iota { .. } => 4,
        Op::Binary(_) => 5,
        Op::Unary(_) => 6,
        Op::SiluMul => 7,
        Op::Cast { .. } => 8,
        Op::Select => 9,
        Op::Reshape { .. } => 10,
        Op::Slice { .. } => 11,
        Op::Concat { .. } => 12,
        Op::Gather { .. } => 13,
        Op::Reduce(_) => 14,
        Op::Argmax => 15,
        Op::TopK { .. } => 16,
        Op::Softmax => 17,
        Op::Embedding => 18,
        Op::RmsNorm { .. } => 19,
        Op::MatMul => 20,
        Op::Rope { .. } => 21,
        Op::KvWrite => 22,
        Op::Attention { .. } => 23,
        Op::Sample => 24,
        Op::RandomUniform { .. } => 25,
        Op::AcceptChain => 26,
        Op::MoeRoute { .. } => 27,
        Op::MoeExperts => 28,
        Op::AllReduce => 29,
        Op::Copy => 30,
        Op::Assign => 31,
        Op::TreeBuild { .. } => 32,
        Op::TreeAccept { .. } => 33,
        Op::KvMove => 34,
        Op::TreeSelect { .. } => 35,
        Op::TopPThreshold => 36,
        Op::HeadMatMul { .. } => 37,
        Op::MlaAttention { .. } => 38,
        Op::Dequantize { .. } => 39,
        Op::TopKThreshold => 40,
    }
}
const VARIANTS: usize = 41;

/// A type-correct graph using every op, every op kind and every attribute enum value.
fn every_op_graph() -> Result<Graph, IrError> {
    let mut g = Graph::new("every_op");
    let tokens = g.input("tokens", ty(DType::I32, &[B, T]))?;
    let pos = g.input("positions", ty(DType::I32, &[B, T]))?;
    let x = g.input("x \"quoted\"\n\\ name", ty(DType::F32, &[B, T, s(64)]))?;
    let y = g.input("y", ty(DType::F32, &[B, T, s(64)]))?;
    let row = g.weight("row", ty(DType::F32, &[s(64)]))?;
    let neg_inf = g.add(
        Op::Fill {
            value: f64::NEG_INFINITY,
            ty: ty(DType::F32, &[B, T, s(64)]),
        },
        &[],
    )?;
    g.add(
        Op::Fill {
            value: 1.0 / 3.0,
            ty: ty(DType::BF16, &[]),
        },
        &[],
    )?;
    g.add(
        Op::Iota {
            axis: 1,
            ty: ty(DType::I64, &[B, T]),
        },
        &[],
    )?;

    // Elementwise: every binary (full and broadcast rhs), every unary, cast, select.
    let mut bools = Vec::new();
    for b in BinaryOp::ALL {
        let r = g.add(Op::Binary(b), &[x, y])?;
        g.add(Op::Binary(b), &[x, row])?;
        if b.is_comparison() {
            bools.push(r);
        }
    }
    for u in UnaryOp::ALL {
        g.add(
            Op::Unary(u),
            &[if u == UnaryOp::Not { bools[0] } else { x }],
        )?;
    }
    let sm = g.add(Op::SiluMul, &[x, y])?;
    let xb = g.add(Op::Cast { to: DType::BF16 }, &[sm])?;
    let sel = g.add(Op::Select, &[bools[1], x, neg_inf])?;

    // Layout.
    let heads = g.add(
        Op::Reshape {
            shape: Shape(vec![B, T, s(4), s(16)]),
        },
        &[sel],
    )?;
    let half = g.add(
        Op::Slice {
            axis: 2,
            start: 32,
            len: 32,
        },
        &[x],
    )?;
    g.add(Op::Concat { axis: 2 }, &[half, half, half])?;
    let top = g.add(Op::TopK { k: 8 }, &[x])?;
    g.add(Op::Gather { axis: 2 }, &[x, top])?;
    for r in ReduceOp::ALL {
        g.add(Op::Reduce(r), &[x])?;
    }
    g.add(Op::Argmax, &[x])?;
    let probs = g.add(Op::Softmax, &[x])?;

    // Model ops: embedding, norm, matmul in bf16 / fp8 / int4.
    let table = g.weight(
        "model.embed_tokens.weight",
        ty(DType::BF16, &[s(512), s(128)]),
    )?;
    let h = g.add(Op::Embedding, &[table, tokens])?;
    let norm_w = g.weight("norm.weight", ty(DType::BF16, &[s(128)]))?;
    let h = g.add(Op::RmsNorm { eps: 1e-5 }, &[h, norm_w])?;
    let w = g.weight("w.bf16", ty(DType::BF16, &[s(256), s(128)]))?;
    let w8 = g.weight("w.fp8", ty(DType::Fp8E4M3, &[s(256), s(128)]))?;
    let w8s = g.weight("w.fp8.scale", ty(DType::F32, &[s(2), s(1)]))?;
    let w4 = g.weight(
        "w.int4",
        ty(DType::Int4Group { group: 32 }, &[s(256), s(128)]),
    )?;
    let w4s = g.weight("w.int4.scale", ty(DType::BF16, &[s(256), s(4)]))?;
    let q = g.add(Op::MatMul, &[h, w])?;
    g.add(Op::MatMul, &[h, w8, w8s])?;
    g.add(Op::MatMul, &[h, w4, w4s])?;
    g.add(Op::Dequantize { to: DType::BF16 }, &[w8, w8s])?;
    g.add(Op::Dequantize { to: DType::F32 }, &[w4, w4s])?;

    // Rope in every scaling and style, kv cache, both attention masks.
    let q = g.add(
        Op::Reshape {
            shape: Shape(vec![B, T, s(4), s(64)]),
        },
        &[q],
    )?;
    let scalings = [
        (RopeScaling::None, RopeStyle::Half),
        (
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            },
            RopeStyle::Half,
        ),
        (
            RopeScaling::Yarn {
                factor: 40.0,
                original_max_position: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: 0.1 + 1.0,
            },
            RopeStyle::Interleaved,
        ),
    ];
    let mut q_rot = q;
    for (scaling, style) in scalings {
        q_rot = g.add(
            Op::Rope {
                theta: 500000.0,
                scaling,
                style,
                rotary_dim: 32,
            },
            &[q_rot, pos],
        )?;
    }
    let kv_ty = ty(DType::BF16, &[B, CTX, s(2), s(64)]);
    let k_cache = g.state("k_cache", kv_ty.clone())?;
    let v_cache = g.state("v_cache", kv_ty)?;
    let k_new = g.input("k_new", ty(DType::BF16, &[B, T, s(2), s(64)]))?;
    let k1 = g.add(Op::KvWrite, &[k_cache, k_new, pos])?;
    let k2 = g.add(Op::KvWrite, &[k1, k_new, pos])?;
    let v0 = g.add(Op::KvWrite, &[v_cache, k_new, pos])?;
    let v_same = g.add(Op::Copy, &[v0])?;
    let v1 = g.add(Op::Assign, &[v0, v_same])?;
    let scale = 0.125;
    let causal = g.add(
        Op::Attention {
            scale,
            mask: AttnMask::Causal,
        },
        &[q_rot, k2, v1, pos],
    )?;
    let prefix = g.input("prefix_len", ty(DType::I32, &[B]))?;
    let anc = g.input("ancestors", ty(DType::I64, &[B, T]))?;
    g.add(
        Op::Attention {
            scale: 1e-30,
            mask: AttnMask::Tree,
        },
        &[q_rot, k2, v1, pos, prefix, anc],
    )?;

    // Sampling and acceptance.
    let counter = g.input("counter", ty(DType::I64, &[B, T]))?;
    let u = g.add(Op::RandomUniform { seed: u64::MAX }, &[counter])?;
    let sampled = g.add(Op::Sample, &[probs, u])?;
    let row_p = g.add(Op::Reduce(ReduceOp::Max), &[probs])?;
    g.add(Op::TopPThreshold, &[probs, row_p])?;
    let row_k = g.input("row_k", ty(DType::I32, &[B, T]))?;
    g.add(Op::TopKThreshold, &[probs, row_k])?;
    let draft = g.input("draft", ty(DType::I32, &[B, s(4)]))?;
    let target = g.input("target", ty(DType::I64, &[B, s(5)]))?;
    let accepted = g.add(Op::AcceptChain, &[draft, target])?;
    let tree_lp = g.input("tree_logp", ty(DType::F32, &[B, s(3), s(4)]))?;
    let tree_ids = g.input("tree_ids", ty(DType::I32, &[B, s(3), s(4)]))?;
    let tree_root = g.input("tree_root", ty(DType::I32, &[B]))?;
    let tree = g.add(
        Op::TreeBuild { budget: 70 },
        &[tree_lp, tree_ids, tree_root],
    )?;
    let tree_target = g.input("tree_target", ty(DType::I32, &[B, s(70)]))?;
    g.add(Op::TreeAccept { max_depth: 3 }, &[tree, tree_target])?;
    let sel_scores = g.input("sel_scores", ty(DType::F32, &[B, s(20)]))?;
    let sel_tokens = g.input("sel_tokens", ty(DType::I32, &[B, s(20)]))?;
    let sel_parents = g.input("sel_parents", ty(DType::I32, &[B, s(20)]))?;
    g.add(
        Op::TreeSelect { nodes: 9 },
        &[sel_scores, sel_tokens, sel_parents, tree_root],
    )?;
    let anc2 = g.input("ancestors2", ty(DType::I64, &[B, T, s(2)]))?;
    g.add(
        Op::Attention {
            scale: 0.5,
            mask: AttnMask::Tree,
        },
        &[q_rot, k2, v1, pos, prefix, anc2],
    )?;

    // Multi-head latent attention: absorption, both masks, back to values.
    let q_nope = g.input("q_nope", ty(DType::BF16, &[B, T, s(4), s(16)]))?;
    let q_pe = g.input("q_pe", ty(DType::BF16, &[B, T, s(4), s(8)]))?;
    let w_uk = g.weight("w_uk", ty(DType::BF16, &[s(4), s(16), s(32)]))?;
    let w_uv = g.weight("w_uv", ty(DType::BF16, &[s(4), s(16), s(32)]))?;
    let q_lat = g.add(Op::HeadMatMul { trans_w: false }, &[q_nope, w_uk])?;
    let lat_cache = g.state("lat_cache", ty(DType::BF16, &[B, CTX, s(1), s(32)]))?;
    let pe_cache = g.state("pe_cache", ty(DType::BF16, &[B, CTX, s(1), s(8)]))?;
    let mla = g.add(
        Op::MlaAttention {
            scale: 0.25,
            mask: AttnMask::Causal,
        },
        &[q_lat, q_pe, lat_cache, pe_cache, pos],
    )?;
    g.add(
        Op::MlaAttention {
            scale: 0.25,
            mask: AttnMask::Tree,
        },
        &[q_lat, q_pe, lat_cache, pe_cache, pos, prefix, anc2],
    )?;
    let mla_v = g.add(Op::HeadMatMul { trans_w: true }, &[mla, w_uv])?;
    g.set_output("mla", mla_v);

    // MoE, both scorings, with and without bias.
    let logits = g.input("router_logits", ty(DType::F32, &[B, T, s(16)]))?;
    let bias = g.weight("router.bias", ty(DType::F32, &[s(16)]))?;
    let route = |scoring, norm| Op::MoeRoute {
        top_k: 4,
        scoring,
        n_group: 4,
        topk_group: 2,
        norm_topk_prob: norm,
        scaling: 2.5,
    };
    let gates = g.add(route(MoeScoring::Sigmoid, true), &[logits, bias])?;
    g.add(route(MoeScoring::Softmax, false), &[logits])?;
    let wg = g.weight("experts.gate", ty(DType::BF16, &[s(16), s(32), s(128)]))?;
    let wu = g.weight("experts.up", ty(DType::BF16, &[s(16), s(32), s(128)]))?;
    let wd = g.weight("experts.down", ty(DType::BF16, &[s(16), s(128), s(32)]))?;
    let moe = g.add(Op::MoeExperts, &[h, gates, wg, wu, wd])?;
    let moe = g.add(Op::AllReduce, &[moe])?;
    let out = g.add(Op::Copy, &[moe])?;
    // Tree commit: after every read of the cache.
    let mv_src = g.input("move_src", ty(DType::I32, &[B, s(4)]))?;
    let mv_dst = g.input("move_dst", ty(DType::I64, &[B, s(4)]))?;
    g.add(Op::KvMove, &[k2, mv_src, mv_dst])?;

    g.set_output("hidden", out);
    g.set_output("attn", causal);
    g.set_output("heads", heads);
    g.set_output("xb", xb);
    g.set_output("sampled", sampled);
    g.set_output("accepted \u{1b}", accepted);
    Ok(g)
}

#[test]
fn every_op_round_trips() -> Result<(), IrError> {
    let g = every_op_graph()?;
    verify(&g)?;
    let mut seen = [false; VARIANTS];
    for (_, n) in g.nodes() {
        seen[variant(&n.op)] = true;
    }
    let missing: Vec<usize> = (0..VARIANTS).filter(|&i| !seen[i]).collect();
    assert!(missing.is_empty(), "op variants not covered: {missing:?}");

    let text = print(&g);
    let back = parse(&text)?;
    assert_eq!(back, g, "parse(print(g)) != g; text:\n{text}");
    assert_eq!(print(&back), text);
    Ok(())
}

#[test]
fn graph_names_round_trip() -> Result<(), IrError> {
    for name in ["", "llama_decode", "llama-3.2 1B", "3b", "é"] {
        let g = Graph::new(name);
        assert_eq!(parse(&print(&g))?, g, "name {name:?}");
    }
    Ok(())
}

#[test]
fn floats_round_trip_bit_exactly() -> Result<(), IrError> {
    let xs = [
        1e-5,
        0.1,
        1.0 / 3.0,
        500000.0,
        1e-30,
        0.0,
        -0.0,
        1e300,
        f64::MIN_POSITIVE,
        5e-324,
        f64::MAX,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::from_bits(0xfff0_0000_0000_0001),
    ];
    for x in xs {
        let text = fmt_f64(x);
        let back = parse_f64(&text).unwrap_or_else(|| panic!("`{text}` does not parse"));
        assert_eq!(back.to_bits(), x.to_bits(), "{x:?} printed as `{text}`");

        // And through a whole graph, as a fill value and an rmsnorm eps.
        let mut g = Graph::new("f");
        let t = ty(DType::F32, &[s(4)]);
        let v = g.add(Op::Fill { value: x, ty: t }, &[])?;
        let w = g.weight("w", ty(DType::F32, &[s(4)]))?;
        g.add(Op::RmsNorm { eps: x }, &[v, w])?;
        let back = parse(&print(&g))?;
        let bits = |g: &Graph| -> Vec<u64> {
            g.nodes()
                .filter_map(|(_, n)| match n.op {
                    Op::Fill { value, .. } => Some(value.to_bits()),
                    Op::RmsNorm { eps } => Some(eps.to_bits()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(bits(&back), vec![x.to_bits(); 2], "{x:?}");
    }
    assert_eq!(fmt_f64(1e-5), "1e-5");
    assert_eq!(fmt_f64(500000.0), "500000.0");
    Ok(())
}

/// A small decode step: embedding, norm, one projection, rope, cache write, attention.
fn small_graph() -> Result<Graph, IrError> {
    let mut g = Graph::new("tiny_decode");
    let tokens = g.input("tokens", ty(DType::I32, &[B, T]))?;
    let pos = g.input("positions", ty(DType::I32, &[B, T]))?;
    let table = g.weight(
        "model.embed_tokens.weight",
        ty(DType::BF16, &[s(512), s(128)]),
    )?;
    let h = g.add(Op::Embedding, &[table, tokens])?;
    let nw = g.weight("model.norm.weight", ty(DType::BF16, &[s(128)]))?;
    let h = g.add(Op::RmsNorm { eps: 1e-5 }, &[h, nw])?;
    let wq = g.weight("q_proj.weight", ty(DType::BF16, &[s(128), s(128)]))?;
    let q = g.add(Op::MatMul, &[h, wq])?;
    let q = g.add(
        Op::Reshape {
            shape: Shape(vec![B, T, s(2), s(64)]),
        },
        &[q],
    )?;
    let q = g.add(
        Op::Rope {
            theta: 10000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            },
            style: RopeStyle::Half,
            rotary_dim: 64,
        },
        &[q, pos],
    )?;
    let cache = g.state("layers.0.k_cache", ty(DType::BF16, &[B, CTX, s(2), s(64)]))?;
    let k = g.add(Op::KvWrite, &[cache, q, pos])?;
    let o = g.add(
        Op::Attention {
            scale: 0.125,
            mask: AttnMask::Causal,
        },
        &[q, k, k, pos],
    )?;
    g.set_output("attn", o);
    Ok(g)
}

#[test]
fn small_graph_snapshot() -> Result<(), IrError> {
    let g = small_graph()?;
    let text = print(&g);
    insta::assert_snapshot!(text);
    assert_eq!(parse(&text)?, g);
    Ok(())
}

#[test]
fn comments_and_blank_lines_are_ignored() -> Result<(), IrError> {
    let src = "// header comment\n\ngraph g { // trailing\n  %0 = input \"a // not a comment\" : f32[4]\n\n  output \"o\" = %0 // done\n}\n// after\n";
    let g = parse(src)?;
    assert_eq!(g.find_leaf("a // not a comment"), Some(ValueId(0)));
    assert_eq!(g.output("o"), Some(ValueId(0)));
    Ok(())
}

/// Parses `src`, expecting an error on `line` whose message contains `needle`.
#[track_caller]
fn parse_err(src: &str, line: usize, needle: &str) {
    match parse(src) {
        Ok(g) => panic!("parsed, want an error on line {line}:\n{}", print(&g)),
        Err(IrError::Parse { line: got, msg }) => {
            assert_eq!(got, line, "wrong line for `{msg}`");
            assert!(msg.contains(needle), "message `{msg}` lacks `{needle}`");
        }
        Err(e) => panic!("not a parse error: {e}"),
    }
}

/// A graph header, an f32 input `%0`, then `body`, then `}`; `body` starts on line 3.
fn with_body(body: &str) -> String {
    format!("graph g {{\n  %0 = input \"x\" : f32[B,4]\n{body}}}\n")
}

#[test]
fn parse_errors_name_line_and_cause() {
    parse_err(
        &with_body("  %1 = frobnicate %0 : f32[B,4]\n"),
        3,
        "unknown op `frobnicate`",
    );
    parse_err(
        &with_body("  %1 = copy %0 : f33[B,4]\n"),
        3,
        "bad type: unknown dtype `f33`",
    );
    parse_err(
        &with_body("  %1 = copy %0 : f32[B,x]\n"),
        3,
        "bad type: bad dim `x`",
    );
    parse_err(
        &with_body("  %1 = copy %0 : f32[B,4\n"),
        3,
        "expected `,`, found end of line",
    );
    parse_err(
        &with_body("  %1 = copy %7 : f32[B,4]\n"),
        3,
        "undefined value %7",
    );
    parse_err(
        &with_body("  %1 = copy %1 : f32[B,4]\n"),
        3,
        "undefined value %1",
    );
    parse_err(
        &with_body("  %1 = copy %0 : f32[B,4]\n  %1 = copy %0 : f32[B,4]\n"),
        4,
        "duplicate id %1, already defined on line 3",
    );
    parse_err(
        &with_body("  %0 = copy %0 : f32[B,4]\n"),
        3,
        "duplicate id %0",
    );
    parse_err(
        &with_body("  %2 = copy %0 : f32[B,4]\n"),
        3,
        "ids must be dense 0..n in order, expected %1",
    );
    parse_err(
        &with_body("  %1 = copy %0 : bf16[B,4]\n"),
        3,
        "type bf16[B,4] is wrong: copy gives f32[B,4]",
    );
    parse_err(
        &with_body("  %1 = add %0 : f32[B,4]\n"),
        3,
        "add takes Exact(2) operands, got 1",
    );
    parse_err(
        &with_body("  %1 = rmsnorm %0, %0 : f32[B,4]\n"),
        3,
        "`rmsnorm` needs attribute `eps`",
    );
    parse_err(
        &with_body("  %1 = topk{k=2, j=1} %0 : i32[B,2]\n"),
        3,
        "unknown attribute `j` for `topk`",
    );
    parse_err(
        &with_body("  %1 = topk{k=2, k=1} %0 : i32[B,2]\n"),
        3,
        "duplicate attribute `k`",
    );
    parse_err(
        &with_body("  %1 = topk{k=-2} %0 : i32[B,2]\n"),
        3,
        "attribute `k` of `topk`: expected an unsigned integer, got `-2`",
    );
    parse_err(
        &with_body("  %1 = attention{scale=1.0, mask=dense} %0 : f32[B,4]\n"),
        3,
        "expected one of causal, tree, got `dense`",
    );
    parse_err(
        &with_body("  %1 = cast{to=f32} %0 : f32[B,4]\n  %2 = copy \"n\" %0 : f32[B,4]\n"),
        4,
        "`copy` takes no name",
    );
    parse_err(
        &with_body("  %1 = weight : f32[4]\n"),
        3,
        "`weight` needs a quoted name",
    );
    parse_err(
        &with_body("  %1 = input \"x : f32[4]\n"),
        3,
        "unterminated string",
    );
    parse_err(
        &with_body("  %1 = input \"x\\q\" : f32[4]\n"),
        3,
        "unknown escape `\\q`",
    );
    parse_err(
        &with_body("  %1 = copy %0 : f32[B,4] %0\n"),
        3,
        "unexpected `%0` at end of line",
    );
    parse_err(
        &with_body("  output \"o\" = %3\n"),
        3,
        "undefined value %3 for output `o`",
    );
    parse_err(
        &with_body("  output \"o\" = %0\n  output \"o\" = %0\n"),
        4,
        "duplicate output name `o`",
    );
    parse_err(&with_body("  ret %0\n"), 3, "expected `%N = ...`");
    parse_err(
        "\n\nmodule g {\n}\n",
        3,
        "expected `graph NAME {`, found `module`",
    );
    parse_err("", 1, "found end of input");
    parse_err(
        "graph g {\n  %0 = input \"x\" : f32[4]\n",
        2,
        "missing the closing `}`",
    );
    parse_err(
        "graph g {\n}\n%0 = input \"x\" : f32[4]\n",
        3,
        "after the closing `}`",
    );
    parse_err(
        &with_body("  %1 = copy %0 : f32[B,4] ;\n"),
        3,
        "unexpected character `;`",
    );
}

#[test]
fn verifier_errors_name_the_line() {
    // Rule 4: duplicate input names.
    parse_err(
        &with_body("  %1 = input \"x\" : f32[B,4]\n"),
        3,
        "duplicate input name `x`",
    );
    // Rule 5: kv_write cache must be a state.
    parse_err(
        &with_body(concat!(
            "  %1 = input \"c\" : f32[B,Ctx,1,4]\n",
            "  %2 = input \"v\" : f32[B,T,1,4]\n",
            "  %3 = input \"p\" : i32[B,T]\n",
            "  %4 = kv_write %1, %2, %3 : f32[B,Ctx,1,4]\n",
        )),
        6,
        "not a state or an in-place result",
    );
}
