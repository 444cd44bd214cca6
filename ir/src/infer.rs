//! Shape and dtype rules, one arm per op (see the op docs in `op.rs`).

use crate::op::{AttnMask, BinaryOp, Op, UnaryOp};
use crate::{DType, Dim, Shape, TensorType};

type R = Result<TensorType, String>;

pub(crate) fn tt(dtype: DType, shape: Shape) -> TensorType {
    TensorType { dtype, shape }
}

pub(crate) fn rank(x: &TensorType, want: usize, what: &str) -> Result<(), String> {
    if x.shape.rank() != want {
        return Err(format!("{what} must have rank {want}, got {x}"));
    }
    Ok(())
}

pub(crate) fn int(x: &TensorType, what: &str) -> Result<(), String> {
    if !x.dtype.is_int() {
        return Err(format!("{what} must be i32 or i64, got {x}"));
    }
    Ok(())
}

pub(crate) fn float(x: &TensorType, what: &str) -> Result<(), String> {
    if !x.dtype.is_float() {
        return Err(format!("{what} must be a float type, got {x}"));
    }
    Ok(())
}

pub(crate) fn same_dim(a: Dim, b: Dim, what: &str) -> Result<(), String> {
    if a != b {
        return Err(format!("{what}: {a} != {b}"));
    }
    Ok(())
}

pub(crate) fn last(x: &TensorType, what: &str) -> Result<Dim, String> {
    x.shape
        .last()
        .ok_or_else(|| format!("{what} must have rank >= 1, got {x}"))
}

pub(crate) fn infer(op: &Op, a: &[&TensorType]) -> R {
    match op {
        Op::Input { ty, .. }
        | Op::Weight { ty, .. }
        | Op::State { ty, .. }
        | Op::Fill { ty, .. } => Ok(ty.clone()),
        Op::Iota { axis, ty } => {
            int(ty, "iota")?;
            if *axis >= ty.shape.rank() {
                return Err(format!("iota axis {axis} out of range for {ty}"));
            }
            Ok(ty.clone())
        }
        Op::Binary(b) => {
            let (x, y) = (a[0], a[1]);
            if x.dtype != y.dtype {
                return Err(format!("{} operands differ in dtype: {x} vs {y}", b.name()));
            }
            let xs = x.shape.dims();
            let ys = y.shape.dims();
            if ys.len() > xs.len() || xs[xs.len() - ys.len()..] != *ys {
                return Err(format!(
                    "{}: rhs shape must be a suffix of lhs shape: {x} vs {y}",
                    b.name()
                ));
            }
            let dtype = if b.is_comparison() {
                DType::Bool
            } else {
                if x.dtype == DType::Bool {
                    return Err(format!("{} on bool operands", b.name()));
                }
                x.dtype
            };
            if matches!(b, BinaryOp::Lt) && x.dtype == DType::Bool {
                return Err("lt on bool operands".into());
            }
            Ok(tt(dtype, x.shape.clone()))
        }
        Op::Unary(u) => {
            let x = a[0];
            match u {
                UnaryOp::Not if x.dtype != DType::Bool => Err(format!("not needs bool, got {x}")),
                UnaryOp::Neg | UnaryOp::Not => Ok(x.clone()),
                _ => {
                    float(x, u.name())?;
                    Ok(x.clone())
                }
            }
        }
        Op::SiluMul => {
            float(a[0], "silu_mul gate")?;
            if a[0] != a[1] {
                return Err(format!("silu_mul operands differ: {} vs {}", a[0], a[1]));
            }
            Ok(a[0].clone())
        }
        Op::Cast { to } => {
            if !to.is_activation() {
                return Err(format!("cannot cast to {to}"));
            }
            Ok(tt(*to, a[0].shape.clone()))
        }
        Op::Select => {
            if a[0].dtype != DType::Bool {
                return Err(format!("select condition must be bool, got {}", a[0]));
            }
            if a[1] != a[2] || a[0].shape != a[1].shape {
                return Err(format!(
                    "select operands must match: {} / {} / {}",
                    a[0], a[1], a[2]
                ));
            }
            Ok(a[1].clone())
        }
        Op::Reshape { shape } => {
            let (pa, ba) = a[0].shape.split_static();
            let (pb, bb) = shape.split_static();
            if pa != pb || ba != bb {
                return Err(format!("cannot reshape {} to {shape}", a[0]));
            }
            Ok(tt(a[0].dtype, shape.clone()))
        }
        Op::Slice { axis, start, len } => {
            let x = a[0];
            let d = *x
                .shape
                .dims()
                .get(*axis)
                .ok_or_else(|| format!("slice axis {axis} out of range for {x}"))?;
            let n = d
                .as_static()
                .ok_or_else(|| format!("slice axis {axis} of {x} is not static"))?;
            if start + len > n || *len == 0 {
                return Err(format!("slice {start}..{} out of 0..{n}", start + len));
            }
            let mut s = x.shape.0.clone();
            s[*axis] = Dim::Static(*len);
            Ok(tt(x.dtype, Shape(s)))
        }
        Op::Concat { axis } => {
            let x = a[0];
            if *axis >= x.shape.rank() {
                return Err(format!("concat axis {axis} out of range for {x}"));
            }
            let mut total = 0u64;
            for (i, y) in a.iter().enumerate() {
                if y.dtype != x.dtype || y.shape.rank() != x.shape.rank() {
                    return Err(format!("concat operand {i} ({y}) does not match {x}"));
                }
                for (k, (dy, dx)) in y.shape.dims().iter().zip(x.shape.dims()).enumerate() {
                    if k == *axis {
                        total += dy.as_static().ok_or_else(|| {
                            format!("concat axis {axis} of operand {i} ({y}) is not static")
                        })?;
                    } else if dy != dx {
                        return Err(format!("concat operand {i} ({y}) does not match {x}"));
                    }
                }
            }
            let mut s = x.shape.0.clone();
            s[*axis] = Dim::Static(total);
            Ok(tt(x.dtype, Shape(s)))
        }
        Op::Gather { axis } => {
            let (x, idx) = (a[0], a[1]);
            int(idx, "gather index")?;
            if *axis >= x.shape.rank() || idx.shape.rank() != x.shape.rank() {
                return Err(format!("gather axis {axis}: {x} indexed by {idx}"));
            }
            for (k, (dx, di)) in x.shape.dims().iter().zip(idx.shape.dims()).enumerate() {
                if k != *axis {
                    same_dim(*dx, *di, "gather dims")?;
                }
            }
            Ok(tt(x.dtype, idx.shape.clone()))
        }
        Op::Reduce(r) => {
            last(a[0], r.name())?;
            if a[0].dtype == DType::Bool {
                return Err(format!("{} on bool", r.name()));
            }
            Ok(tt(a[0].dtype, a[0].shape.drop_last()))
        }
        Op::Argmax => {
            last(a[0], "argmax")?;
            Ok(tt(DType::I32, a[0].shape.drop_last()))
        }
        Op::TopK { k } => {
            let n = last(a[0], "topk")?;
            if let Some(n) = n.as_static() {
                if *k == 0 || *k > n {
                    return Err(format!("topk k={k} out of 1..={n}"));
                }
            }
            Ok(tt(DType::I32, a[0].shape.with_last(Dim::Static(*k))))
        }
        Op::Softmax => {
            last(a[0], "softmax")?;
            float(a[0], "softmax")?;
            Ok(tt(DType::F32, a[0].shape.clone()))
        }
        Op::Embedding => {
            let (table, ids) = (a[0], a[1]);
            rank(table, 2, "embedding table")?;
            int(ids, "embedding ids")?;
            let mut s = ids.shape.0.clone();
            s.push(table.shape.0[1]);
            Ok(tt(table.dtype, Shape(s)))
        }
        Op::RmsNorm { .. } => {
            let (x, w) = (a[0], a[1]);
            float(x, "rmsnorm input")?;
            rank(w, 1, "rmsnorm weight")?;
            same_dim(last(x, "rmsnorm input")?, w.shape.0[0], "rmsnorm width")?;
            Ok(x.clone())
        }
        Op::MatMul => {
            let (x, w) = (a[0], a[1]);
            float(x, "matmul input")?;
            rank(w, 2, "matmul weight")?;
            let k = last(x, "matmul input")?;
            same_dim(
                k,
                w.shape.0[1],
                "matmul reduction dim (x[..., K] vs w[N, K])",
            )?;
            quant_scale(w, a.get(2).copied(), "matmul")?;
            Ok(tt(x.dtype, x.shape.with_last(w.shape.0[0])))
        }
        Op::Dequantize { to } => {
            let (w, scale) = (a[0], a[1]);
            rank(w, 2, "dequantize weight")?;
            if !matches!(w.dtype, DType::Fp8E4M3 | DType::Int4Group { .. }) {
                return Err(format!(
                    "dequantize needs an fp8e4m3 or int4g weight, got {w}"
                ));
            }
            if !to.is_float() || *to == DType::Fp8E4M3 {
                return Err(format!("dequantize to {to}: want bf16, f16 or f32"));
            }
            quant_scale(w, Some(scale), "dequantize")?;
            Ok(tt(*to, w.shape.clone()))
        }
        Op::Rope { rotary_dim, .. } => {
            let (x, pos) = (a[0], a[1]);
            rank(x, 4, "rope input")?;
            float(x, "rope input")?;
            int(pos, "rope positions")?;
            rank(pos, 2, "rope positions")?;
            same_dim(x.shape.0[0], pos.shape.0[0], "rope batch")?;
            same_dim(x.shape.0[1], pos.shape.0[1], "rope tokens")?;
            let d = x.shape.0[3]
                .as_static()
                .ok_or("rope head dim must be static")?;
            if *rotary_dim == 0 || *rotary_dim > d || rotary_dim % 2 != 0 {
                return Err(format!(
                    "rope rotary_dim {rotary_dim} invalid for head dim {d}"
                ));
            }
            Ok(x.clone())
        }
        Op::KvWrite => {
            let (cache, x, pos) = (a[0], a[1], a[2]);
            rank(cache, 4, "kv cache")?;
            rank(x, 4, "kv_write value")?;
            int(pos, "kv_write positions")?;
            rank(pos, 2, "kv_write positions")?;
            if cache.dtype != x.dtype {
                return Err(format!("kv_write dtype: cache {cache} vs value {x}"));
            }
            same_dim(cache.shape.0[0], x.shape.0[0], "kv_write batch")?;
            same_dim(cache.shape.0[2], x.shape.0[2], "kv_write heads")?;
            same_dim(cache.shape.0[3], x.shape.0[3], "kv_write head dim")?;
            same_dim(x.shape.0[0], pos.shape.0[0], "kv_write positions batch")?;
            same_dim(x.shape.0[1], pos.shape.0[1], "kv_write positions tokens")?;
            Ok(cache.clone())
        }
        Op::KvMove => {
            let (cache, src, dst) = (a[0], a[1], a[2]);
            if cache.shape.rank() < 2 {
                return Err(format!("kv_move cache must have rank >= 2, got {cache}"));
            }
            int(src, "kv_move src")?;
            int(dst, "kv_move dst")?;
            rank(src, 2, "kv_move src")?;
            if dst.shape != src.shape {
                return Err(format!("kv_move dst {dst} must match src {src}"));
            }
            same_dim(cache.shape.0[0], src.shape.0[0], "kv_move batch")?;
            Ok(cache.clone())
        }
        Op::Assign => {
            if a[0] != a[1] {
                return Err(format!("assign: value {} must match state {}", a[1], a[0]));
            }
            Ok(a[0].clone())
        }
        Op::Attention { mask, .. } => {
            let (q, k, v, pos) = (a[0], a[1], a[2], a[3]);
            rank(q, 4, "attention q")?;
            rank(k, 4, "attention k")?;
            rank(v, 4, "attention v")?;
            rank(pos, 2, "attention positions")?;
            int(pos, "attention positions")?;
            float(q, "attention q")?;
            same_dim(q.shape.0[0], k.shape.0[0], "attention batch (q vs k)")?;
            same_dim(k.shape.0[0], v.shape.0[0], "attention batch (k vs v)")?;
            same_dim(k.shape.0[1], v.shape.0[1], "attention context (k vs v)")?;
            same_dim(k.shape.0[2], v.shape.0[2], "attention kv heads (k vs v)")?;
            same_dim(q.shape.0[3], k.shape.0[3], "attention head dim (q vs k)")?;
            same_dim(q.shape.0[0], pos.shape.0[0], "attention positions batch")?;
            same_dim(q.shape.0[1], pos.shape.0[1], "attention positions tokens")?;
            if let (Some(hq), Some(hk)) = (q.shape.0[2].as_static(), k.shape.0[2].as_static()) {
                if hk == 0 || hq % hk != 0 {
                    return Err(format!(
                        "attention: {hq} q heads not a multiple of {hk} kv heads"
                    ));
                }
            }
            if *mask == AttnMask::Tree {
                let (pl, anc) = (a[4], a[5]);
                int(pl, "attention prefix_len")?;
                rank(pl, 1, "attention prefix_len")?;
                same_dim(pl.shape.0[0], q.shape.0[0], "attention prefix_len batch")?;
                let words_ok = match anc.shape.rank() {
                    2 => anc.shape == pos.shape,
                    3 => {
                        anc.shape.0[..2] == pos.shape.0[..]
                            && anc.shape.0[2].as_static().is_some_and(|w| w >= 1)
                    }
                    _ => false,
                };
                if anc.dtype != DType::I64 || !words_ok {
                    return Err(format!(
                        "attention ancestors must be i64{} or that shape plus a static \
                         number of words, got {anc}",
                        pos.shape
                    ));
                }
            }
            let mut s = q.shape.0.clone();
            s[3] = v.shape.0[3];
            Ok(tt(q.dtype, Shape(s)))
        }
        Op::HeadMatMul { trans_w } => crate::infer_mla::head_matmul(*trans_w, a),
        Op::MlaAttention { mask, .. } => crate::infer_mla::mla_attention(*mask, a),
        Op::Sample => {
            let (p, u) = (a[0], a[1]);
            if p.dtype != DType::F32 || u.dtype != DType::F32 {
                return Err(format!("sample takes f32 probs and uniforms, got {p}, {u}"));
            }
            last(p, "sample probs")?;
            if p.shape.drop_last() != u.shape {
                return Err(format!(
                    "sample: uniforms {u} must have shape of probs {p} minus last"
                ));
            }
            Ok(tt(DType::I32, u.shape.clone()))
        }
        Op::TopPThreshold => {
            let (x, p) = (a[0], a[1]);
            if x.dtype != DType::F32 || p.dtype != DType::F32 {
                return Err(format!(
                    "top_p_threshold takes f32 probs and f32 p, got {x}, {p}"
                ));
            }
            last(x, "top_p_threshold")?;
            if x.shape.drop_last() != p.shape {
                return Err(format!(
                    "top_p_threshold: p {p} must have the shape of probs {x} minus last"
                ));
            }
            Ok(tt(DType::F32, p.shape.clone()))
        }
        Op::TopKThreshold => {
            let (x, k) = (a[0], a[1]);
            if x.dtype != DType::F32 {
                return Err(format!("top_k_threshold takes f32 values, got {x}"));
            }
            int(k, "top_k_threshold k")?;
            last(x, "top_k_threshold")?;
            if x.shape.drop_last() != k.shape {
                return Err(format!(
                    "top_k_threshold: k {k} must have the shape of values {x} minus last"
                ));
            }
            Ok(tt(DType::F32, k.shape.clone()))
        }
        Op::RandomUniform { .. } => {
            if a[0].dtype != DType::I64 {
                return Err(format!("random_uniform counter must be i64, got {}", a[0]));
            }
            Ok(tt(DType::F32, a[0].shape.clone()))
        }
        Op::AcceptChain => {
            let (d, t) = (a[0], a[1]);
            int(d, "accept_chain draft")?;
            int(t, "accept_chain target")?;
            rank(d, 2, "accept_chain draft")?;
            rank(t, 2, "accept_chain target")?;
            same_dim(d.shape.0[0], t.shape.0[0], "accept_chain batch")?;
            match (d.shape.0[1].as_static(), t.shape.0[1].as_static()) {
                (Some(k), Some(k1)) if k1 == k + 1 => {}
                _ => {
                    return Err(format!(
                        "accept_chain needs draft [B,K], target [B,K+1]: {d}, {t}"
                    ))
                }
            }
            Ok(tt(DType::I32, Shape(vec![d.shape.0[0]])))
        }
        Op::TreeBuild { budget } => {
            let (lp, ids, root) = (a[0], a[1], a[2]);
            if lp.dtype != DType::F32 {
                return Err(format!("tree_build log-probs must be f32, got {lp}"));
            }
            rank(lp, 3, "tree_build log-probs")?;
            int(ids, "tree_build ids")?;
            int(root, "tree_build root")?;
            if ids.shape != lp.shape {
                return Err(format!(
                    "tree_build ids {ids} must have the log-probs' shape {lp}"
                ));
            }
            rank(root, 1, "tree_build root")?;
            same_dim(root.shape.0[0], lp.shape.0[0], "tree_build batch")?;
            if lp.shape.0[1].as_static().is_none() || lp.shape.0[2].as_static().is_none() {
                return Err(format!("tree_build depths and top-k must be static: {lp}"));
            }
            if !(2..=crate::op::MAX_TREE_NODES).contains(budget) {
                return Err(format!(
                    "tree_build budget {budget} out of 2..={}",
                    crate::op::MAX_TREE_NODES
                ));
            }
            let w = crate::op::tree_words(*budget);
            Ok(tt(
                DType::I64,
                Shape(vec![
                    lp.shape.0[0],
                    Dim::Static(*budget),
                    Dim::Static(3 + w),
                ]),
            ))
        }
        Op::TreeSelect { nodes } => {
            let (sc, tok, par, root) = (a[0], a[1], a[2], a[3]);
            if sc.dtype != DType::F32 {
                return Err(format!("tree_select scores must be f32, got {sc}"));
            }
            rank(sc, 2, "tree_select scores")?;
            int(tok, "tree_select tokens")?;
            int(par, "tree_select parents")?;
            int(root, "tree_select root")?;
            if tok.shape != sc.shape || par.shape != sc.shape {
                return Err(format!(
                    "tree_select tokens {tok} and parents {par} must have the scores' shape {sc}"
                ));
            }
            rank(root, 1, "tree_select root")?;
            same_dim(root.shape.0[0], sc.shape.0[0], "tree_select batch")?;
            match sc.shape.0[1].as_static() {
                Some(c) if (1..=crate::op::MAX_TREE_CANDIDATES).contains(&c) => {}
                _ => {
                    return Err(format!(
                        "tree_select candidates must be static, 1..={}: {sc}",
                        crate::op::MAX_TREE_CANDIDATES
                    ))
                }
            }
            if !(2..=crate::op::MAX_TREE_NODES).contains(nodes) {
                return Err(format!(
                    "tree_select nodes {nodes} out of 2..={}",
                    crate::op::MAX_TREE_NODES
                ));
            }
            let w = crate::op::tree_words(*nodes);
            Ok(tt(
                DType::I64,
                Shape(vec![sc.shape.0[0], Dim::Static(*nodes), Dim::Static(3 + w)]),
            ))
        }
        Op::TreeAccept { max_depth } => {
            let (tree, target) = (a[0], a[1]);
            rank(tree, 3, "tree_accept tree")?;
            if tree.dtype != DType::I64 {
                return Err(format!("tree_accept tree must be i64, got {tree}"));
            }
            int(target, "tree_accept target")?;
            rank(target, 2, "tree_accept target")?;
            let n = tree.shape.0[1].as_static();
            let cols = tree.shape.0[2].as_static();
            match (n, cols) {
                (Some(n), Some(c)) if n >= 1 && c == 3 + crate::op::tree_words(n) => {}
                _ => {
                    return Err(format!(
                        "tree_accept tree must be [B, N, 3 + ceil(N/64)], got {tree}"
                    ))
                }
            }
            same_dim(tree.shape.0[0], target.shape.0[0], "tree_accept batch")?;
            same_dim(tree.shape.0[1], target.shape.0[1], "tree_accept nodes")?;
            Ok(tt(
                DType::I32,
                Shape(vec![tree.shape.0[0], Dim::Static(max_depth + 3)]),
            ))
        }
        Op::MoeRoute {
            top_k,
            n_group,
            topk_group,
            ..
        } => {
            let l = a[0];
            float(l, "moe_route logits")?;
            let e = last(l, "moe_route logits")?
                .as_static()
                .ok_or("moe_route expert count must be static")?;
            if *top_k == 0 || *top_k > e || *n_group == 0 || e % n_group != 0 {
                return Err(format!(
                    "moe_route: top_k {top_k}, n_group {n_group} invalid for {e} experts"
                ));
            }
            if *topk_group == 0 || topk_group > n_group {
                return Err(format!(
                    "moe_route: topk_group {topk_group} not in 1..={n_group}"
                ));
            }
            if let Some(bias) = a.get(1) {
                if bias.shape != Shape(vec![Dim::Static(e)]) {
                    return Err(format!("moe_route bias must be [{e}], got {bias}"));
                }
            }
            Ok(tt(DType::F32, l.shape.clone()))
        }
        Op::MoeExperts => {
            let (x, g, wg, wu, wd) = (a[0], a[1], a[2], a[3], a[4]);
            float(x, "moe_experts input")?;
            rank(wg, 3, "moe_experts w_gate")?;
            if wu.shape != wg.shape {
                return Err(format!("moe_experts w_up {wu} must match w_gate {wg}"));
            }
            rank(wd, 3, "moe_experts w_down")?;
            let h = last(x, "moe_experts input")?;
            let (e, f) = (wg.shape.0[0], wg.shape.0[1]);
            same_dim(wg.shape.0[2], h, "moe_experts w_gate hidden")?;
            same_dim(wd.shape.0[0], e, "moe_experts w_down experts")?;
            same_dim(wd.shape.0[1], h, "moe_experts w_down hidden")?;
            same_dim(wd.shape.0[2], f, "moe_experts w_down ffn")?;
            if g.shape != x.shape.with_last(e) {
                return Err(format!(
                    "moe_experts gates {g} must be {}",
                    x.shape.with_last(e)
                ));
            }
            let quantised = matches!(wg.dtype, DType::Fp8E4M3 | DType::Int4Group { .. });
            if wu.dtype != wg.dtype || wd.dtype != wg.dtype {
                return Err(format!(
                    "moe_experts weights must share a dtype: {wg}, {wu}, {wd}"
                ));
            }
            match (quantised, a.len()) {
                (false, 5) => {}
                (true, 8) => {
                    for (w, s, what) in [
                        (wg, a[5], "moe_experts w_gate"),
                        (wu, a[6], "moe_experts w_up"),
                        (wd, a[7], "moe_experts w_down"),
                    ] {
                        expert_scale(w, s, what)?;
                    }
                }
                (true, _) => {
                    return Err(format!(
                        "moe_experts with {} weights needs 3 scale operands, got {}",
                        wg.dtype,
                        a.len() - 5
                    ))
                }
                (false, n) => {
                    return Err(format!(
                        "moe_experts scales given for {} weights ({} extra operands)",
                        wg.dtype,
                        n - 5
                    ))
                }
            }
            Ok(x.clone())
        }
        Op::AllReduce | Op::Copy => Ok(a[0].clone()),
    }
}

/// The scale shape a quantised weight `[rows, cols]` needs (static dims), or `None` for
/// unquantised dtypes: fp8 blocks `[ceil(rows/128), ceil(cols/128)]`, int4 groups
/// `[rows, ceil(cols/group)]` (the loader requires `group` to divide `cols`).
pub fn scale_shape(dtype: DType, rows: u64, cols: u64) -> Option<[u64; 2]> {
    match dtype {
        DType::Fp8E4M3 => Some([
            rows.div_ceil(crate::FP8_BLOCK),
            cols.div_ceil(crate::FP8_BLOCK),
        ]),
        DType::Int4Group { group } => Some([rows, cols.div_ceil(group as u64)]),
        _ => None,
    }
}

fn static_dims(t: &TensorType, what: &str) -> Result<Vec<u64>, String> {
    t.shape
        .dims()
        .iter()
        .map(|d| {
            d.as_static()
                .ok_or_else(|| format!("{what} {t} must be static"))
        })
        .collect()
}

/// A quantised 2-D weight has a float scale of [`scale_shape`]; others have none.
fn quant_scale(w: &TensorType, scale: Option<&TensorType>, op: &str) -> Result<(), String> {
    let quantised = matches!(w.dtype, DType::Fp8E4M3 | DType::Int4Group { .. });
    match (quantised, scale) {
        (false, None) => Ok(()),
        (false, Some(_)) => Err(format!("{op} scale given for {} weight", w.dtype)),
        (true, None) => Err(format!("{} weight needs a scale operand", w.dtype)),
        (true, Some(s)) => {
            let d = static_dims(w, &format!("{op} weight"))?;
            let want = scale_shape(w.dtype, d[0], d[1]).expect("quantised dtype");
            check_scale(w, s, &want, op)
        }
    }
}

/// A scale of stacked expert weights `[E, rows, cols]`: `[E, scale_shape(rows, cols)]`.
fn expert_scale(w: &TensorType, s: &TensorType, what: &str) -> Result<(), String> {
    let d = static_dims(w, what)?;
    let inner = scale_shape(w.dtype, d[1], d[2]).expect("quantised dtype");
    check_scale(w, s, &[d[0], inner[0], inner[1]], what)
}

fn check_scale(w: &TensorType, s: &TensorType, want: &[u64], op: &str) -> Result<(), String> {
    let fp8 = w.dtype == DType::Fp8E4M3;
    let dtype_ok = if fp8 {
        s.dtype == DType::F32
    } else {
        matches!(s.dtype, DType::BF16 | DType::F16 | DType::F32)
    };
    let shape_ok = s.shape.rank() == want.len()
        && s.shape
            .dims()
            .iter()
            .zip(want)
            .all(|(d, &n)| d.as_static() == Some(n));
    if !dtype_ok || !shape_ok {
        let dt = if fp8 { "f32" } else { "bf16, f16 or f32" };
        return Err(format!("{op} scale of {w} must be {dt} {want:?}, got {s}"));
    }
    Ok(())
}
