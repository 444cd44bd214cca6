//! Fixtures of the generic family: every supported op at representative shapes of the
//! speculative step (B = 4 sequences, K = 4 drafts so T = 5, vocabularies up to Llama-3's
//! 128256), each with the values its parity test feeds (edge cases included: NaN, ties,
//! out-of-range ids, duplicate KV slots, i64 extremes) and the tolerance it is held to.

#![allow(dead_code)]

use specc_ir::interp::{run, Env, Tensor};
use specc_ir::op::{BinaryOp, ReduceOp, UnaryOp};
use specc_ir::{Bindings, DType, Dim, Graph, Op, TensorType};
use specc_kernels_gen::abi::Loc;
use specc_kernels_gen::generic::TensorArg;
use specc_kernels_gen::{Error, Nvrtc};
use std::collections::HashMap;

/// The values an operand is filled with.
#[derive(Clone, Debug)]
pub enum Values {
    /// Uniform in `[-s, s)`.
    Float(f64),
    /// Uniform in `(0, s]`.
    Positive(f64),
    /// Small integers `-3..=3` as floats, with NaN and -0.0 mixed in: ranking ties.
    Ties,
    /// Uniform in `[-4, 4)` with NaN, ±inf, ±0, 3e10 and 1e-30 mixed in.
    Special,
    /// Non-negative, about a third exact zeros (unnormalised probabilities).
    Probs,
    /// Uniform integers in `lo..=hi`.
    Int(i64, i64),
    /// The type's MIN, MAX, -1, 0, 1, 7 mixed with uniform integers in `-9..=9`.
    IntEdge,
    Bool,
    /// These values, repeated.
    List(Vec<f64>),
}

#[derive(Clone, Debug)]
pub struct Operand {
    pub dtype: DType,
    pub dims: Vec<u64>,
    pub values: Values,
    /// In the buffer table (a weight or a state) rather than the arena.
    pub table: bool,
    /// Extra bytes after the allocation's start: misaligns the tensor.
    pub pad: u64,
}

pub fn opd(dtype: DType, dims: &[u64], values: Values) -> Operand {
    Operand {
        dtype,
        dims: dims.to_vec(),
        values,
        table: false,
        pad: 0,
    }
}

impl Operand {
    pub fn table(mut self) -> Operand {
        self.table = true;
        self
    }

    pub fn pad(mut self, bytes: u64) -> Operand {
        self.pad = bytes;
        self
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.dims.iter().map(|&d| Dim::Static(d)))
    }

    /// The operand's values for a parity run.
    pub fn tensor(&self, rng: &mut Rng) -> Tensor {
        let n = self.numel();
        let shape: Vec<usize> = self.dims.iter().map(|&d| d as usize).collect();
        let d = self.dtype;
        let is_float = matches!(d, DType::BF16 | DType::F16 | DType::F32);
        if is_float {
            let v: Vec<f32> = (0..n).map(|i| float_value(&self.values, i, rng)).collect();
            Tensor::from_f32(d, shape, v)
        } else {
            let v: Vec<i64> = (0..n).map(|i| int_value(&self.values, d, i, rng)).collect();
            Tensor::from_i64(d, shape, v)
        }
    }
}

fn float_value(values: &Values, i: usize, rng: &mut Rng) -> f32 {
    match values {
        Values::Float(s) => rng.uniform(-s, *s) as f32,
        Values::Positive(s) => (s - rng.uniform(0.0, *s)) as f32,
        Values::Ties => match rng.below(16) {
            0 => f32::NAN,
            1 => -0.0,
            _ => rng.below(7) as f32 - 3.0,
        },
        Values::Special => {
            const S: [f32; 8] = [
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                3e10,
                -3e10,
                1e-30,
            ];
            if rng.below(3) == 0 {
                S[rng.below(S.len() as u64) as usize]
            } else {
                rng.uniform(-4.0, 4.0) as f32
            }
        }
        Values::Probs => {
            if rng.below(3) == 0 {
                0.0
            } else {
                rng.uniform(0.0, 1.0) as f32
            }
        }
        Values::List(v) => v[i % v.len()] as f32,
        Values::Int(lo, hi) => (lo + rng.below((hi - lo + 1) as u64) as i64) as f32,
        Values::IntEdge | Values::Bool => rng.below(2) as f32,
    }
}

fn int_value(values: &Values, d: DType, i: usize, rng: &mut Rng) -> i64 {
    match values {
        Values::Int(lo, hi) => lo.wrapping_add(rng.below(hi.abs_diff(*lo) + 1) as i64),
        Values::IntEdge => {
            let (min, max) = match d {
                DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                _ => (i64::MIN, i64::MAX),
            };
            let edge = [min, max, -1, 0, 1, 7];
            if rng.below(2) == 0 {
                edge[rng.below(edge.len() as u64) as usize]
            } else {
                rng.below(19) as i64 - 9
            }
        }
        Values::List(v) => v[i % v.len()] as i64,
        Values::Bool => rng.below(2) as i64,
        _ => float_value(values, i, rng) as i64,
    }
}

/// How closely a float result must match the interpreter.
#[derive(Clone, Copy, Debug)]
pub enum Tol {
    /// Equal (integers, bools, copies, exact float ops; ±0 and NaN payloads aside).
    Exact,
    /// `|got - want| <= k ulps of the result dtype · |want|`: one rounding that may flip.
    Ulps(f64),
    /// Transcendental f32 math (`expf` within 2 ulp of libm), then one rounding:
    /// `|got - want| <= max(1 ulp of the result dtype, 4 f32 ulps) · |want|`.
    Math,
    /// `|got - want| <= rtol · |want| + atol`: sums in another order.
    Close { rtol: f64, atol: f64 },
}

pub struct Case {
    pub label: String,
    pub op: Op,
    pub inputs: Vec<Operand>,
    pub out: (DType, Vec<u64>),
    pub tol: Tol,
}

fn case(label: &str, op: Op, inputs: Vec<Operand>, out: (DType, &[u64]), tol: Tol) -> Case {
    Case {
        label: label.to_string(),
        op,
        inputs,
        out: (out.0, out.1.to_vec()),
        tol,
    }
}

/// Locations for a case: arena operands 256-byte aligned (plus their pad), table operands
/// one slot each; an in-place op's result is its state operand.
pub struct Laid {
    pub inputs: Vec<TensorArg>,
    pub output: TensorArg,
    pub arena_bytes: u64,
    pub buf_bytes: Vec<u64>,
}

pub fn lay_out(c: &Case) -> Laid {
    let mut next = 0u64;
    let mut bufs = Vec::new();
    let mut place = |dtype: DType, dims: &[u64], table: bool, pad: u64| {
        let bytes = dims.iter().product::<u64>() * dtype.size_bytes().unwrap() as u64 + pad;
        let loc = if table {
            bufs.push(bytes.next_multiple_of(16));
            Loc::Table {
                slot: bufs.len() as u32 - 1,
                offset: pad,
            }
        } else {
            let at = next;
            next = (next + bytes).next_multiple_of(256);
            Loc::arena(at + pad)
        };
        TensorArg::new(loc, dtype, dims)
    };
    let inputs: Vec<TensorArg> = c
        .inputs
        .iter()
        .map(|o| place(o.dtype, &o.dims, o.table, o.pad))
        .collect();
    let output = if c.op.is_in_place() {
        TensorArg::new(inputs[0].loc, c.out.0, &c.out.1)
    } else {
        place(c.out.0, &c.out.1, false, 0)
    };
    Laid {
        inputs,
        output,
        arena_bytes: next.max(256),
        buf_bytes: bufs,
    }
}

/// The interpreter's result of `c.op` on `args`; an in-place op's first operand is a state.
pub fn reference(c: &Case, args: &[Tensor]) -> Result<Tensor, String> {
    let mut g = Graph::new("generic_case");
    let mut inputs = HashMap::new();
    let mut states = HashMap::new();
    let mut ids = Vec::new();
    for (i, (o, t)) in c.inputs.iter().zip(args).enumerate() {
        let name = format!("a{i}");
        let id = if i == 0 && c.op.is_in_place() {
            states.insert(name.clone(), t.clone());
            g.state(&name, o.ty())
        } else {
            inputs.insert(name.clone(), t.clone());
            g.input(&name, o.ty())
        };
        ids.push(id.map_err(|e| e.to_string())?);
    }
    let v = g.add(c.op.clone(), &ids).map_err(|e| e.to_string())?;
    g.set_output("out", v);
    let weights: HashMap<String, Tensor> = HashMap::new();
    let mut env = Env {
        bind: Bindings::default(),
        inputs,
        weights: &weights,
        states: &mut states,
    };
    let mut outs = run(&g, &mut env).map_err(|e| e.to_string())?;
    outs.remove("out").ok_or_else(|| "no output".to_string())
}

/// NVRTC, or `None` with a printed reason (a failure with `SPECC_REQUIRE_NVRTC=1`).
pub fn nvrtc_or_skip() -> Option<Nvrtc> {
    match Nvrtc::new() {
        Ok(n) => Some(n.with_cache_dir(None)),
        Err(e @ (Error::NvrtcUnavailable { .. } | Error::HeadersNotFound { .. })) => {
            if std::env::var("SPECC_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("SPECC_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}");
            }
            eprintln!("SKIPPED: {e} (source scripts/nvrtc-env.sh to enable)");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Deterministic pseudo-random numbers (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

const BF: DType = DType::BF16;
const F16: DType = DType::F16;
const F32: DType = DType::F32;
const I32: DType = DType::I32;
const I64: DType = DType::I64;
const BOOL: DType = DType::Bool;

/// Vocabulary of Llama 3.
pub const V_LLAMA3: u64 = 128256;

/// Every fixture.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    leaves_and_binary(&mut v);
    unary_cast_select(&mut v);
    movement(&mut v);
    rows(&mut v);
    v
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
            Tol::Close {
                rtol: if d == BF { 1.0 / 128.0 } else { 1e-5 },
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
}
