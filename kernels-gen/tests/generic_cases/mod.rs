//! Fixtures of the generic family: every supported op at representative shapes of the
//! speculative step (B = 4 sequences, K = 4 drafts so T = 5, vocabularies up to Llama-3's
//! 128256), each with the values its parity test feeds (edge cases included: NaN, ties,
//! out-of-range ids, duplicate KV slots, i64 extremes) and the tolerance it is held to.

#![allow(dead_code)]

use specc_ir::interp::{run, Env, Tensor};
use specc_ir::{Bindings, DType, Dim, Graph, Op, TensorType};
use specc_kernels_gen::abi::Loc;
use specc_kernels_gen::generic::TensorArg;

mod list;
mod moe;
pub use list::cases;
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
