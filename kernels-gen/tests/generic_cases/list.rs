//! The fixture list: every supported op at representative shapes, with its values and
//! tolerance.

use super::{case, opd, Case, Operand, Tol, Values};
use specc_ir::op::{BinaryOp, ReduceOp, UnaryOp};
use specc_ir::{DType, Dim, Op, TensorType};

const BF: DType = DType::BF16;
const F16: DType = DType::F16;
const F32: DType = DType::F32;
const I32: DType = DType::I32;
const I64: DType = DType::I64;
const BOOL: DType = DType::Bool;

/// Vocabulary of Llama 3.
const V_LLAMA3: u64 = 128256;

/// Every fixture.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    leaves_and_binary(&mut v);
    unary_cast_select(&mut v);
    movement(&mut v);
    rows(&mut v);
    trees(&mut v);
    super::moe::routes(&mut v);
    v
}

/// Draft trees: `tree_build` over random and special log-probs (NaN, ±inf, ties), at one and
/// four ancestor words; `tree_select` over random parents; `tree_accept` over a hand-built tree; `kv_move` with clamps,
/// negatives and chained moves.
fn trees(v: &mut Vec<Case>) {
    for (label, l, k, n, vals) in [
        (
            "tree_build [4,7,8] budget 64",
            7u64,
            8u64,
            64u64,
            Values::Float(3.0),
        ),
        (
            "tree_build [4,7,8] budget 256",
            7,
            8,
            256,
            Values::Float(3.0),
        ),
        (
            "tree_build [4,3,4] budget 70 special",
            3,
            4,
            70,
            Values::Special,
        ),
        (
            "tree_build [4,2,2] budget 16 ties (padding)",
            2,
            2,
            16,
            Values::Ties,
        ),
    ] {
        let words = n.div_ceil(64);
        v.push(case(
            label,
            Op::TreeBuild { budget: n },
            vec![
                opd(F32, &[4, l, k], vals),
                opd(I32, &[4, l, k], Values::Int(0, 511)),
                opd(I64, &[4], Values::Int(0, 511)),
            ],
            (I64, &[4, n, 3 + words]),
            Tol::Exact,
        ));
    }
    // tree_select: random parents (some after their child or unselected: detached nodes),
    // special scores, ties with fewer candidates than nodes (padding).
    for (label, c, n, vals) in [
        (
            "tree_select [4,60] nodes 16",
            60u64,
            16u64,
            Values::Float(3.0),
        ),
        (
            "tree_select [4,300] nodes 256 special",
            300,
            256,
            Values::Special,
        ),
        (
            "tree_select [4,20] nodes 64 ties (padding)",
            20,
            64,
            Values::Ties,
        ),
    ] {
        v.push(case(
            label,
            Op::TreeSelect { nodes: n },
            vec![
                opd(F32, &[4, c], vals),
                opd(I32, &[4, c], Values::Int(0, 511)),
                opd(I64, &[4, c], Values::Int(-1, c as i64 - 1)),
                opd(I32, &[4], Values::Int(0, 511)),
            ],
            (I64, &[4, n, 3 + n.div_ceil(64)]),
            Tol::Exact,
        ));
    }
    // The tree of the interpreter's unit test: 0 → {1: 10, 3: 11}, 1 → {2: 20}, 3 → {4: 20};
    // per lane targets at nodes: full path via 3, one step via 1, nothing, and a match
    // only on a padding-like node.
    #[rustfmt::skip]
    let tree = [
        7, -1, 0, 1,   10, 0, 1, 3,   20, 1, 2, 7,   11, 0, 1, 9,   20, 3, 2, 25,
    ];
    #[rustfmt::skip]
    let target = [
        11, 0, 0, 20, 99,
        10, 5, 0, 0, 0,
        42, 0, 0, 0, 0,
        20, 20, 20, 20, 20,
    ];
    v.push(case(
        "tree_accept [4,5,4] vs i32 [4,5]",
        Op::TreeAccept { max_depth: 3 },
        vec![
            opd(I64, &[4, 5, 4], Values::List(tree.map(f64::from).to_vec())),
            opd(I32, &[4, 5], Values::List(target.map(f64::from).to_vec())),
        ],
        (I32, &[4, 6]),
        Tol::Exact,
    ));
    // Per lane 4 moves: ascending path moves, a clamped slot, negatives, a chained move.
    #[rustfmt::skip]
    let src = [5, 9, 12, -1,   3, 99, 4, 2,   -1, -1, -1, -1,   1, 2, 0, 7];
    #[rustfmt::skip]
    let dst = [1, 2, 3, 4,     1, 2, -3, 0,   0, 1, 2, 3,       0, 1, 15, 40];
    for (d, row) in [(BF, vec![2u64, 8]), (I32, vec![1, 1]), (F32, vec![3, 5])] {
        let mut dims = vec![4u64, 16];
        dims.extend(&row);
        v.push(case(
            &format!("kv_move {d} {dims:?}"),
            Op::KvMove,
            vec![
                opd(d, &dims, Values::Float(1.0)).table(),
                opd(I32, &[4, 4], Values::List(src.map(f64::from).to_vec())),
                opd(I64, &[4, 4], Values::List(dst.map(f64::from).to_vec())),
            ],
            (d, &dims),
            Tol::Exact,
        ));
    }
}

fn leaves_and_binary(v: &mut Vec<Case>) {
    let fill = |value: f64, dtype: DType, dims: &[u64]| {
        case(
            &format!("fill {dtype} {value}"),
            Op::Fill {
                value,
                ty: TensorType::new(dtype, dims.iter().map(|&d| Dim::Static(d))),
            },
            vec![],
            (dtype, dims),
            Tol::Exact,
        )
    };
    v.push(fill(0.1, F32, &[4, 1000]));
    v.push(fill(0.1, BF, &[3, 7]));
    v.push(fill(1e6, F16, &[5]));
    v.push(fill(f64::NEG_INFINITY, F32, &[4, 5]));
    v.push(fill(-1.0, I32, &[4, 5]));
    v.push(fill(3e10, I32, &[4]));
    v.push(fill(-3.7, I64, &[4]));
    v.push(fill(2.0, BOOL, &[4, 5]));
    let iota = |axis: usize, dtype: DType, dims: &[u64]| {
        case(
            &format!("iota {dtype} axis {axis}"),
            Op::Iota {
                axis,
                ty: TensorType::new(dtype, dims.iter().map(|&d| Dim::Static(d))),
            },
            vec![],
            (dtype, dims),
            Tol::Exact,
        )
    };
    v.push(iota(1, I32, &[4, 5]));
    v.push(iota(1, I64, &[2, 3, 4]));
    v.push(iota(0, I32, &[6]));

    for op in BinaryOp::ALL {
        let out = |d: DType| if op.is_comparison() { BOOL } else { d };
        // f32 with NaN / inf / huge values, rhs broadcast over the leading dim.
        v.push(case(
            &format!("{} f32 [4,5,7] by [5,7]", op.name()),
            Op::Binary(op),
            vec![
                opd(F32, &[4, 5, 7], Values::Special),
                opd(F32, &[5, 7], Values::Special),
            ],
            (out(F32), &[4, 5, 7]),
            Tol::Exact,
        ));
        v.push(case(
            &format!("{} bf16 [6,33] by [33]", op.name()),
            Op::Binary(op),
            vec![
                opd(BF, &[6, 33], Values::Float(4.0)),
                opd(BF, &[33], Values::Ties),
            ],
            (out(BF), &[6, 33]),
            Tol::Exact,
        ));
        v.push(case(
            &format!("{} i32 [4,6] edges", op.name()),
            Op::Binary(op),
            vec![
                opd(I32, &[4, 6], Values::IntEdge),
                opd(I32, &[4, 6], Values::IntEdge),
            ],
            (out(I32), &[4, 6]),
            Tol::Exact,
        ));
        v.push(case(
            &format!("{} i64 [4,9] by [9] edges", op.name()),
            Op::Binary(op),
            vec![
                opd(I64, &[4, 9], Values::IntEdge),
                opd(I64, &[9], Values::IntEdge),
            ],
            (out(I64), &[4, 9]),
            Tol::Exact,
        ));
    }
    v.push(case(
        "rem i32 by scalar 7 (ring slots)",
        Op::Binary(BinaryOp::Rem),
        vec![
            opd(I32, &[4, 5], Values::Int(-20, 20)),
            opd(I32, &[], Values::List(vec![7.0])),
        ],
        (I32, &[4, 5]),
        Tol::Exact,
    ));
    v.push(case(
        "add f16 [3,10] by scalar",
        Op::Binary(BinaryOp::Add),
        vec![
            opd(F16, &[3, 10], Values::Float(100.0)),
            opd(F16, &[], Values::Float(100.0)),
        ],
        (F16, &[3, 10]),
        Tol::Exact,
    ));
    v.push(case(
        "eq bool [4,5]",
        Op::Binary(BinaryOp::Eq),
        vec![
            opd(BOOL, &[4, 5], Values::Bool),
            opd(BOOL, &[4, 5], Values::Bool),
        ],
        (BOOL, &[4, 5]),
        Tol::Exact,
    ));
}

fn unary_cast_select(v: &mut Vec<Case>) {
    for op in UnaryOp::ALL {
        if op == UnaryOp::Not {
            v.push(case(
                "not bool [4,5]",
                Op::Unary(op),
                vec![opd(BOOL, &[4, 5], Values::Bool)],
                (BOOL, &[4, 5]),
                Tol::Exact,
            ));
            continue;
        }
        let exact = matches!(op, UnaryOp::Neg | UnaryOp::Sqrt | UnaryOp::Recip);
        for (d, dims, vals) in [
            (F32, [4u64, 257], Values::Special),
            (BF, [3, 100], Values::Float(6.0)),
        ] {
            v.push(case(
                &format!("{} {d} {dims:?}", op.name()),
                Op::Unary(op),
                vec![opd(d, &dims, vals)],
                (d, &dims),
                if exact { Tol::Exact } else { Tol::Math },
            ));
        }
    }
    for d in [I32, I64] {
        v.push(case(
            &format!("neg {d} edges"),
            Op::Unary(UnaryOp::Neg),
            vec![opd(d, &[4, 6], Values::IntEdge)],
            (d, &[4, 6]),
            Tol::Exact,
        ));
    }
    for (d, dims) in [(BF, [4u64, 352]), (F32, [2, 100]), (F16, [3, 40])] {
        v.push(case(
            &format!("silu_mul {d} {dims:?}"),
            Op::SiluMul,
            vec![
                opd(d, &dims, Values::Float(6.0)),
                opd(d, &dims, Values::Float(3.0)),
            ],
            (d, &dims),
            Tol::Math,
        ));
    }
    let casts: [(DType, DType, Values); 16] = [
        (F32, I32, Values::Special),
        (F32, I64, Values::Special),
        (F32, BOOL, Values::Special),
        (F32, BF, Values::Special),
        (F32, F16, Values::Special),
        (BF, F32, Values::Float(100.0)),
        (BF, F16, Values::Special),
        (F16, I32, Values::Float(100.0)),
        (I64, BF, Values::IntEdge),
        (I64, F32, Values::IntEdge),
        (I64, I32, Values::IntEdge),
        (I32, I64, Values::IntEdge),
        (I32, BOOL, Values::IntEdge),
        (BOOL, I32, Values::Bool),
        (BOOL, F32, Values::Bool),
        (I32, F32, Values::IntEdge),
    ];
    for (from, to, vals) in casts {
        v.push(case(
            &format!("cast {from} -> {to}"),
            Op::Cast { to },
            vec![opd(from, &[4, 33], vals)],
            (to, &[4, 33]),
            Tol::Exact,
        ));
    }
    for (d, dims, vals) in [
        (I32, [4u64, 5], Values::IntEdge),
        (F32, [4, 512], Values::Special),
        (BOOL, [3, 7], Values::Bool),
        (I64, [4, 6], Values::IntEdge),
        (BF, [2, 9], Values::Float(1.0)),
    ] {
        v.push(case(
            &format!("select {d} {dims:?}"),
            Op::Select,
            vec![
                opd(BOOL, &dims, Values::Bool),
                opd(d, &dims, vals.clone()),
                opd(d, &dims, vals),
            ],
            (d, &dims),
            Tol::Exact,
        ));
    }
    v.push(case(
        "random_uniform [4,5]",
        Op::RandomUniform {
            seed: 0x5EED_1234_ABCD_0001,
        },
        vec![opd(I64, &[4, 5], Values::IntEdge)],
        (F32, &[4, 5]),
        Tol::Exact,
    ));
}

fn movement(v: &mut Vec<Case>) {
    let copy = |label: &str, x: Operand| {
        let dims = x.dims.clone();
        case(
            label,
            Op::Copy,
            vec![x.clone()],
            (x.dtype, &dims),
            Tol::Exact,
        )
    };
    v.push(copy(
        "copy bf16 [5,64] (16-byte units)",
        opd(BF, &[5, 64], Values::Special),
    ));
    v.push(copy(
        "copy i32 [3] misaligned",
        opd(I32, &[3], Values::IntEdge).pad(4),
    ));
    v.push(copy("copy bool [7]", opd(BOOL, &[7], Values::Bool).pad(1)));
    v.push(case(
        "reshape f32 [4,6] -> [24]",
        Op::Reshape {
            shape: specc_ir::Shape(vec![Dim::Static(24)]),
        },
        vec![opd(F32, &[4, 6], Values::Special)],
        (F32, &[24]),
        Tol::Exact,
    ));
    v.push(case(
        "assign i32 [4,5] state",
        Op::Assign,
        vec![
            opd(I32, &[4, 5], Values::IntEdge).table(),
            opd(I32, &[4, 5], Values::IntEdge),
        ],
        (I32, &[4, 5]),
        Tol::Exact,
    ));
    let slice = |x: Operand, axis: usize, start: u64, len: u64| {
        let mut dims = x.dims.clone();
        dims[axis] = len;
        case(
            &format!(
                "slice {} {:?} axis {axis} {start}..{}",
                x.dtype,
                x.dims,
                start + len
            ),
            Op::Slice { axis, start, len },
            vec![x.clone()],
            (x.dtype, &dims),
            Tol::Exact,
        )
    };
    v.push(slice(opd(F32, &[4, 5, 6], Values::Special), 1, 1, 3));
    v.push(slice(opd(I32, &[4, 5], Values::IntEdge), 1, 4, 1));
    v.push(slice(opd(BOOL, &[2, 9], Values::Bool), 1, 3, 5));
    v.push(slice(opd(BF, &[8, 128], Values::Special), 1, 64, 64));
    v.push(slice(opd(I64, &[6, 3], Values::IntEdge), 0, 2, 3));
    let concat = |axis: usize, xs: Vec<Operand>| {
        let mut dims = xs[0].dims.clone();
        dims[axis] = xs.iter().map(|x| x.dims[axis]).sum();
        let d = xs[0].dtype;
        case(
            &format!("concat {d} axis {axis} of {}", xs.len()),
            Op::Concat { axis },
            xs,
            (d, &dims),
            Tol::Exact,
        )
    };
    v.push(concat(
        1,
        vec![
            opd(I32, &[4, 1], Values::IntEdge),
            opd(I32, &[4, 3], Values::IntEdge),
            opd(I32, &[4, 1], Values::IntEdge),
        ],
    ));
    v.push(concat(
        0,
        vec![
            opd(F32, &[2, 3], Values::Special),
            opd(F32, &[1, 3], Values::Special),
        ],
    ));
    v.push(concat(
        2,
        vec![
            opd(BF, &[2, 3, 8], Values::Float(1.0)),
            opd(BF, &[2, 3, 16], Values::Float(1.0)),
        ],
    ));
    v.push(concat(
        1,
        (0..5).map(|_| opd(BOOL, &[4, 1], Values::Bool)).collect(),
    ));
    v.push(concat(
        1,
        vec![
            opd(F32, &[4, 512], Values::Probs),
            opd(F32, &[4, 512], Values::Probs),
        ],
    ));
    let gather = |x: Operand, axis: usize, idx: Operand| {
        let d = x.dtype;
        let dims = idx.dims.clone();
        case(
            &format!("gather {d} {:?} axis {axis} by {:?}", x.dims, idx.dims),
            Op::Gather { axis },
            vec![x, idx],
            (d, &dims),
            Tol::Exact,
        )
    };
    v.push(gather(
        opd(I32, &[4, 6], Values::IntEdge),
        1,
        opd(I64, &[4, 3], Values::Int(-3, 9)),
    ));
    v.push(gather(
        opd(F32, &[4, 5, 64], Values::Special),
        1,
        opd(I32, &[4, 1, 64], Values::Int(-1, 6)),
    ));
    v.push(gather(
        opd(BF, &[3, 4], Values::Float(1.0)),
        0,
        opd(I32, &[5, 4], Values::Int(-1, 4)),
    ));
    v.push(gather(
        opd(BOOL, &[2, 3, 4], Values::Bool),
        2,
        opd(I32, &[2, 3, 2], Values::Int(0, 3)),
    ));
    let ids = Values::List(vec![3.0, -5.0, 1e6, 63.0, 0.0, 17.0, 2.0]);
    for (d, h, vals) in [
        (BF, 128u64, Values::Float(1.0)),
        (F32, 3, Values::Special),
        (I64, 1, Values::IntEdge),
    ] {
        v.push(case(
            &format!("embedding {d} [64,{h}]"),
            Op::Embedding,
            vec![
                opd(d, &[64, h], vals).table(),
                opd(I32, &[2, 5], ids.clone()),
            ],
            (d, &[2, 5, h]),
            Tol::Exact,
        ));
    }
    // Positions: padding lanes (-1), a shared slot (3 twice: the later token wins), and
    // positions past the context (clamped to the last slot, twice).
    let pos = Values::List(vec![0.0, 3.0, 3.0, -1.0, 40.0, 5.0, 6.0, 99.0, 15.0, -7.0]);
    v.push(case(
        "kv_write bf16 cache [2,16,2,8]",
        Op::KvWrite,
        vec![
            opd(BF, &[2, 16, 2, 8], Values::Float(1.0)).table(),
            opd(BF, &[2, 5, 2, 8], Values::Float(1.0)),
            opd(I32, &[2, 5], pos.clone()),
        ],
        (BF, &[2, 16, 2, 8]),
        Tol::Exact,
    ));
    v.push(case(
        "kv_write i32 token ring [4,8,1,1]",
        Op::KvWrite,
        vec![
            opd(I32, &[4, 8, 1, 1], Values::IntEdge).table(),
            opd(I32, &[4, 5, 1, 1], Values::IntEdge),
            opd(I64, &[4, 5], pos.clone()),
        ],
        (I32, &[4, 8, 1, 1]),
        Tol::Exact,
    ));
    v.push(case(
        "kv_write f32 [2,16,1,3]",
        Op::KvWrite,
        vec![
            opd(F32, &[2, 16, 1, 3], Values::Special).table(),
            opd(F32, &[2, 5, 1, 3], Values::Special),
            opd(I32, &[2, 5], pos),
        ],
        (F32, &[2, 16, 1, 3]),
        Tol::Exact,
    ));
}

fn rows(v: &mut Vec<Case>) {
    let reduce = |op: ReduceOp, d: DType, dims: &[u64], vals: Values, tol: Tol| {
        let out = &dims[..dims.len() - 1];
        case(
            &format!("{} {d} {dims:?}", op.name()),
            Op::Reduce(op),
            vec![opd(d, dims, vals)],
            (d, out),
            tol,
        )
    };
    let sum_tol = Tol::Close {
        rtol: 1e-5,
        atol: 1e-4,
    };
    v.push(reduce(
        ReduceOp::Sum,
        F32,
        &[4, 1000],
        Values::Float(1.0),
        sum_tol,
    ));
    v.push(reduce(
        ReduceOp::Sum,
        BF,
        &[3, 37],
        Values::Float(1.0),
        Tol::Close {
            rtol: 1.0 / 128.0,
            atol: 1e-3,
        },
    ));
    v.push(reduce(
        ReduceOp::Max,
        BF,
        &[5, 33],
        Values::Special,
        Tol::Exact,
    ));
    v.push(reduce(
        ReduceOp::Max,
        F32,
        &[3, 8],
        Values::List(vec![f64::NAN]),
        Tol::Exact,
    ));
    v.push(reduce(
        ReduceOp::Sum,
        I32,
        &[4, 9],
        Values::IntEdge,
        Tol::Exact,
    ));
    v.push(reduce(
        ReduceOp::Sum,
        I64,
        &[4, 300],
        Values::IntEdge,
        Tol::Exact,
    ));
    v.push(reduce(
        ReduceOp::Max,
        I64,
        &[3, 5],
        Values::IntEdge,
        Tol::Exact,
    ));
    let rank_op = |op: Op, d: DType, dims: &[u64], vals: Values| {
        let mut out = dims[..dims.len() - 1].to_vec();
        if let Op::TopK { k } = op {
            out.push(k);
        }
        case(
            &format!("{} {d} {dims:?}", op.info().name),
            op,
            vec![opd(d, dims, vals)],
            (I32, &out),
            Tol::Exact,
        )
    };
    v.push(rank_op(Op::Argmax, F32, &[4, 1000], Values::Ties));
    v.push(rank_op(Op::Argmax, BF, &[5, 33], Values::Special));
    v.push(rank_op(Op::Argmax, I32, &[4, 7], Values::IntEdge));
    v.push(rank_op(Op::Argmax, BOOL, &[3, 9], Values::Bool));
    v.push(rank_op(
        Op::Argmax,
        F32,
        &[3, 4],
        Values::List(vec![f64::NAN, f64::NEG_INFINITY, f64::NAN, -1.0]),
    ));
    v.push(rank_op(
        Op::Argmax,
        F32,
        &[2, V_LLAMA3],
        Values::Float(10.0),
    ));
    v.push(rank_op(Op::TopK { k: 4 }, F32, &[4, 100], Values::Ties));
    v.push(rank_op(Op::TopK { k: 9 }, I64, &[3, 9], Values::IntEdge));
    v.push(rank_op(Op::TopK { k: 8 }, BF, &[2, 1000], Values::Special));
    // The interpreter's denominator adds 8 sequential partial sums of n/8 terms: its own
    // relative error grows like sqrt(n/8) f32 ulps (1.2e-5 seen at n = 128256), and every
    // element of a row shares it.
    let softmax = |d: DType, dims: &[u64], vals: Values| {
        let n = dims[dims.len() - 1] as f64;
        case(
            &format!("softmax {d} {dims:?}"),
            Op::Softmax,
            vec![opd(d, dims, vals)],
            (F32, dims),
            Tol::Close {
                rtol: 2e-6 + 16.0 * (n / 8.0).sqrt() * f64::from(f32::EPSILON),
                atol: 1e-9,
            },
        )
    };
    v.push(softmax(F32, &[4, 512], Values::Float(8.0)));
    v.push(softmax(BF, &[3, 1000], Values::Float(4.0)));
    v.push(softmax(
        F32,
        &[2, 6],
        Values::List(vec![f64::NEG_INFINITY, f64::NEG_INFINITY, 1.0]),
    ));
    v.push(softmax(F32, &[3, 5], Values::List(vec![f64::NEG_INFINITY])));
    v.push(softmax(F32, &[2, V_LLAMA3], Values::Float(10.0)));
    // u: 0 (skips leading zeros), u -> 1 (skips trailing zeros), 1 (clamps), and random.
    let us = Values::List(vec![0.0, 0.999_999_9, 1.0, 0.37]);
    for (vocab, probs) in [
        (512u64, Values::Probs),
        (300, Values::List(vec![0.0, 0.25, 0.0, 0.75, 0.0])),
        (7, Values::List(vec![0.0])),
        (V_LLAMA3, Values::Probs),
        (5000, Values::Float(1.0)),
        (600, Values::Special),
    ] {
        v.push(case(
            &format!("sample [4,{vocab}] {probs:?}"),
            Op::Sample,
            vec![opd(F32, &[4, vocab], probs), opd(F32, &[4], us.clone())],
            (I32, &[4]),
            Tol::Exact,
        ));
    }
    // The nucleus threshold is an element of its row: exact unless a partial mass lies
    // within f32 rounding of p · Z, which over a vocabulary-long row of random values can
    // pick a neighbouring element (values ~1/V apart).
    for (p, vocab, probs, tol) in [
        (0.9, 512u64, Values::Probs, Tol::Exact),
        (0.5, 300, Values::Special, Tol::Exact),
        (0.6, 8, Values::List(vec![0.25, 0.0, 0.25, 0.5]), Tol::Exact),
        (0.3, 7, Values::List(vec![0.0]), Tol::Exact),
        (1.0, 1000, Values::Positive(1.0), Tol::Exact),
        (
            0.95,
            V_LLAMA3,
            Values::Probs,
            Tol::Close {
                rtol: 0.0,
                atol: 1e-3,
            },
        ),
    ] {
        v.push(case(
            &format!("top_p_threshold p={p} [4,{vocab}] {probs:?}"),
            Op::TopPThreshold,
            vec![
                opd(F32, &[4, vocab], probs),
                opd(F32, &[4], Values::List(vec![p, p, p, p])),
            ],
            (F32, &[4]),
            tol,
        ));
    }
    // Each row its own p: one keeps everything (p = 1), one is cut.
    v.push(case(
        "top_p_threshold per-row p [4,512] Probs",
        Op::TopPThreshold,
        vec![
            opd(F32, &[4, 512], Values::Probs),
            opd(F32, &[4], Values::List(vec![1.0, 0.5, 0.9, 1.5])),
        ],
        (F32, &[4]),
        Tol::Exact,
    ));
    // The k-th largest is an element found by exact counts: every row exact, k per row
    // (k < 1 and k >= n cut nothing), ties, NaN and infinities included.
    for (vocab, xs, ks) in [
        (512u64, Values::Probs, vec![1.0, 7.0, 40.0, 511.0]),
        (300, Values::Special, vec![3.0, 0.0, 300.0, 150.0]),
        (
            8,
            Values::List(vec![0.5, -1.0, 0.5, 2.0]),
            vec![1.0, 2.0, 3.0, 4.0],
        ),
        (V_LLAMA3, Values::Float(4.0), vec![50.0, 1.0, -1.0, 1000.0]),
    ] {
        v.push(case(
            &format!("top_k_threshold [4,{vocab}] {xs:?} k={ks:?}"),
            Op::TopKThreshold,
            vec![opd(F32, &[4, vocab], xs), opd(I32, &[4], Values::List(ks))],
            (F32, &[4]),
            Tol::Exact,
        ));
    }
    // Rows: all K accepted; none (later matches do not count); 2; 3.
    v.push(case(
        "accept_chain i32 [4,4] vs i64 [4,5]",
        Op::AcceptChain,
        vec![
            opd(
                I32,
                &[4, 4],
                Values::List(
                    [5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9, 9, 1, 1, 1, 1]
                        .map(f64::from)
                        .to_vec(),
                ),
            ),
            opd(
                I64,
                &[4, 5],
                Values::List(
                    [5, 6, 7, 8, 0, 0, 2, 3, 4, 4, 9, 9, 8, 9, 9, 1, 1, 1, 2, 2]
                        .map(f64::from)
                        .to_vec(),
                ),
            ),
        ],
        (I32, &[4]),
        Tol::Exact,
    ));
    for (d, n, rows) in [(BF, 128u64, 4u64), (F32, 100, 3), (BF, 4096, 2)] {
        v.push(case(
            &format!("rmsnorm {d} [{rows},{n}]"),
            Op::RmsNorm { eps: 1e-5 },
            vec![
                opd(d, &[rows, n], Values::Float(3.0)),
                opd(d, &[n], Values::Float(2.0)).table(),
            ],
            (d, &[rows, n]),
            // bf16 rounds twice (x·inv_rms, then ·w): a last-bit difference in the block's
            // sum of squares can move both roundings, 2 ulps (2⁻⁶ relative near 1).
            Tol::Close {
                rtol: if d == BF { 1.0 / 64.0 } else { 1e-5 },
                atol: 1e-5,
            },
        ));
    }
    for (d, xdims, n) in [(BF, vec![5u64, 64], 48u64), (F32, vec![2, 3, 100], 33)] {
        let k = *xdims.last().unwrap();
        let mut out = xdims.clone();
        *out.last_mut().unwrap() = n;
        v.push(case(
            &format!("matmul {d} {xdims:?} x [{n},{k}]"),
            Op::MatMul,
            vec![
                opd(d, &xdims, Values::Float(1.0)),
                opd(d, &[n, k], Values::Float(1.0)).table(),
            ],
            (d, &out),
            Tol::Close {
                rtol: if d == BF { 1.0 / 128.0 } else { 1e-5 },
                atol: 1e-4,
            },
        ));
    }
    head_matmuls(v);
}

/// `head_matmul` at Kimi-K2's absorbed shapes (q·W_UK: `w[64, 128, 512]`; o·W_UV:
/// `w[64, 128, 512]` transposed) at 1, 8 and 11 rows (more than one pass of 8 rows), and at
/// small odd dims.
fn head_matmuls(v: &mut Vec<Case>) {
    for (d, rows, h, k, n, trans_w) in [
        (BF, 1u64, 64u64, 128u64, 512u64, false),
        (BF, 8, 64, 128, 512, false),
        (BF, 11, 64, 128, 512, false),
        (F32, 3, 4, 40, 36, false),
        (BF, 1, 64, 512, 128, true),
        (BF, 8, 64, 512, 128, true),
        (BF, 11, 64, 512, 128, true),
        (F32, 3, 4, 36, 20, true),
        (BF, 2, 3, 20, 13, false),
        (BF, 2, 3, 13, 20, true),
    ] {
        let w = if trans_w { [h, n, k] } else { [h, k, n] };
        v.push(case(
            &format!("head_matmul {d} [{rows},{h},{k}] x {w:?} trans_w {trans_w}"),
            Op::HeadMatMul { trans_w },
            vec![
                opd(d, &[rows, h, k], Values::Float(1.0)),
                opd(d, &w, Values::Float(1.0)).table(),
            ],
            (d, &[rows, h, n]),
            Tol::Close {
                rtol: if d == BF { 1.0 / 128.0 } else { 1e-5 },
                atol: if d == BF { 1e-2 } else { 1e-4 },
            },
        ));
    }
}
