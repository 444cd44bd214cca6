//! CPU interpreter: the definition of every op.
//!
//! [`run`] executes a graph node by node over concrete tensors. Each op's semantics are the
//! text in `op.rs`; the files here implement exactly that text, and GPU kernels are tested
//! against them.
//!
//! # Storage
//! A [`Tensor`] holds floats as f32 values already rounded to its dtype, and ints / bools
//! (0/1) as i64. Weights arrive the same way: `bf16` / `f16` / `fp8e4m3` weights as
//! [`Data::F32`] holding the decoded values, with `dtype` recording the checkpoint type.
//! `int4g<G>` weights are [`Data::I64`] holding the unpacked values `q` in `-8..=7` with shape
//! `[N, K]` (nibble `i` of packed word `j` is column `8j + i`, `q = u - 8`); their scales are
//! the matmul's third operand `[N, K/G]`, and `W[n, k] = q[n, k] · scale[n, k / G]`.
//!
//! # Numerics
//! All float math is f32 on values of the operand dtypes; `R` below rounds an f32 to the
//! result dtype: bf16 and f16 round to nearest even (via `half`; overflow gives ±inf),
//! fp8e4m3 rounds to nearest even and saturates to ±448, f32 is exact, NaN stays NaN.
//! Reductions named "dot order" use 8 interleaved f32 partial sums combined pairwise, then
//! the tail (`util::dot`); GPU kernels may sum in another order and are compared with a
//! tolerance.
//!
//! | op | arithmetic | rounding |
//! |----|------------|----------|
//! | binary, unary | one f32 operation; `silu(x) = x / (1 + exp(-x))`, `sigmoid(x) = 1 / (1 + exp(-x))`; float max/min ignore NaN, float rem is `fmod`; int ops wrap, int rem is `rem_euclid`, int `x / 0 = x % 0 = 0` | `R` once; comparisons give bool |
//! | silu_mul | `silu(g)` in f32 | `R(R(silu(g)) · u)` (HF: `act_fn(gate) * up`) |
//! | cast | float → int truncates toward 0, saturating, NaN → 0; float → bool `x != 0`; int → i32 wraps | float results `R(f32(x))` |
//! | reduce_sum / reduce_max | f32, dot order / max ignoring NaN | `R` once |
//! | softmax | `exp(x - max) / Σ` (sum in dot order); all-`-inf` row → zeros | f32 result |
//! | rmsnorm | `inv = 1 / sqrt(Σx² / N + eps)` in f32, Σ in dot order | `R(R(x · inv) · w)` (HF Llama: normalise in f32, cast to the input dtype, then multiply by the weight) |
//! | matmul | weight dequantised per element in f32 (`fp8 · scale[n/128, k/128]`, `q · scale[n, k/G]`), dot product in dot order | `R` once |
//! | dequantize | as matmul's weight | `R` once, to `to` |
//! | rope | inverse frequencies as HF's f32 steps ([`rope_inv_freq`]); `angle = f32(pos) · f`; cos/sin in f64 → f32, `· mscale` | `c = R(cos)`, `s = R(sin)`, then `R(R(a·c) - R(b·s))`, `R(R(b·c) + R(a·s))` (HF `q * cos + rotate_half(q) * sin` in the activation dtype) |
//! | attention | scores `dot(q, k) · scale` (dot order), softmax with max subtracted, `Σ p·v` in f32 in slot order, divided by `Σ p` at the end; no allowed slot → zeros | `R` once |
//! | head_matmul | per head, dot products in dot order | `R` once |
//! | mla_attention | scores `(dot(q_lat, c) + dot(q_pe, pe)) · scale`, then as attention with the latent cache as values | `R` once |
//! | kv_write, assign, gather, slice, concat, reshape, embedding, copy, select | copies | none |
//! | moe_route | f32 throughout (see `moe.rs`) | f32 result |
//! | moe_experts | per expert: gate/up/down as matmul (quantised weights dequantised as matmul's), activation as silu_mul; gate-weighted sum of expert outputs in f32, experts in index order | `R` per expert matmul and `R` of the final sum |
//! | argmax, topk, sample, accept_chain | exact (NaN ranks lowest, ties to the lower index); sample's running sum is sequential f32 | i32 results |
//! | tree_build, tree_accept, tree_select | exact: scores are one f32 add per node (parent score + log-prob), ranked as documented on the op | i64 / i32 results |
//! | kv_move | copies, in order | none |
//! | top_p_threshold | sort descending, masses summed in f64 (see `spec_ops.rs`) | an element of the row |
//! | random_uniform | `splitmix64(seed ^ counter) >> 40` over `2^24` | exact |
//! | all_reduce | identity (one rank) | none |
//!
//! HF transformers on the CPU performs these roundings step for step, except that its
//! reductions sum in other orders and its `pow`, `cos`, `sin` and `exp` come from SLEEF
//! while the interpreter uses the platform libm (`pow`, `cos`, `sin` in f64 rounded to f32):
//! results can differ by an ulp before rounding to the activation dtype.
//!
//! # Execution
//! [`run`] verifies the graph, then evaluates nodes in order. A value is dropped after its
//! last use unless it is a graph output or belongs to a state chain (a `state` and the
//! in-place ops over it, `kv_write` and `assign`). An in-place op moves its state operand
//! (the verifier guarantees nothing reads it afterwards) and writes into it. When the run
//! ends, successfully or not, the last version of every state chain is stored back into
//! [`Env::states`].

mod attention;
mod elementwise;
mod matmul;
mod mla;
mod moe;
mod nn;
mod pool;
pub mod profile;
mod rope;
mod shape_ops;
mod spec_ops;
pub use spec_ops::SAMPLE_BLOCK;
mod tensor;
mod tree;
mod util;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;

use std::collections::HashMap;

pub use matmul::one_row_tiles_pending;
pub use pool::{threads, THREADS_VAR};
pub use rope::rope_inv_freq;
pub use spec_ops::splitmix64;
pub use tensor::{round_fp8e4m3, round_slice, round_to, wrap_int, Data, Tensor, FP8E4M3_MAX};

use crate::{Bindings, DType, Dim, Graph, IrError, Node, Op, ValueId};
use util::{OpResult, Out};

/// Read-only access to weights by checkpoint tensor name.
pub trait WeightSource {
    fn weight(&self, name: &str) -> Option<&Tensor>;
}

impl WeightSource for HashMap<String, Tensor> {
    fn weight(&self, name: &str) -> Option<&Tensor> {
        self.get(name)
    }
}

/// Everything a run reads and the persistent state it updates.
pub struct Env<'a> {
    /// Sizes of the bucket dims `B`, `T`, `Ctx` for this run.
    pub bind: Bindings,
    pub inputs: HashMap<String, Tensor>,
    pub weights: &'a dyn WeightSource,
    /// Persistent buffers by state name (KV caches, ...); updated by the run.
    pub states: &'a mut HashMap<String, Tensor>,
}

/// A value during a run: computed, or borrowed from the inputs or weights.
enum Val<'v> {
    Own(Tensor),
    Ref(&'v Tensor),
}

impl Val<'_> {
    fn get(&self) -> &Tensor {
        match self {
            Val::Own(t) => t,
            Val::Ref(t) => t,
        }
    }
}

/// Runs every node in order; returns the graph outputs by name. `State` nodes read
/// `states[name]` (created as zeros of the resolved type if absent); `kv_write` updates the
/// state tensor in place (so after the run `states` holds the new KV cache). Inputs, weights
/// and existing states are checked against the node's resolved type (dtype and shape) with
/// [`IrError::Interp`] naming the value, the expected and the found type.
pub fn run(g: &Graph, env: &mut Env) -> Result<HashMap<String, Tensor>, IrError> {
    crate::verify(g)?;
    run_verified(g, env)
}

/// [`run`] without verifying `g` first: for a graph that passed [`crate::verify`] and has
/// not changed since (the CPU backend verifies each step graph once, then runs it every
/// step). An unverified graph may make this panic instead of returning an error.
pub fn run_verified(g: &Graph, env: &mut Env) -> Result<HashMap<String, Tensor>, IrError> {
    let mut m = Machine::new(g);
    let res = m.exec(g, &env.bind, &env.inputs, env.weights, env.states);
    let outputs = res.map(|()| {
        g.outputs()
            .iter()
            .map(|(name, v)| (name.clone(), m.value(*v).clone()))
            .collect()
    });
    m.store_states(env.states);
    outputs
}

/// Per-run bookkeeping.
struct Machine<'v> {
    vals: Vec<Option<Val<'v>>>,
    /// Index of the last node reading each value.
    last_use: Vec<Option<usize>>,
    /// Graph outputs are kept to the end.
    keep: Vec<bool>,
    /// For a value in a state chain, its index in `chains`.
    chain_of: Vec<Option<usize>>,
    /// `(state name, latest version)` per state chain.
    chains: Vec<(String, ValueId)>,
}

impl<'v> Machine<'v> {
    fn new(g: &Graph) -> Self {
        let n = g.len();
        let mut last_use = vec![None; n];
        for (id, node) in g.nodes() {
            for a in &node.args {
                last_use[a.index()] = Some(id.index());
            }
        }
        let mut keep = vec![false; n];
        for (_, v) in g.outputs() {
            keep[v.index()] = true;
        }
        Machine {
            vals: (0..n).map(|_| None).collect(),
            last_use,
            keep,
            chain_of: vec![None; n],
            chains: Vec::new(),
        }
    }

    fn value(&self, v: ValueId) -> &Tensor {
        self.vals[v.index()]
            .as_ref()
            .expect("verified graph: operands are computed before use and kept until then")
            .get()
    }

    fn exec(
        &mut self,
        g: &Graph,
        bind: &Bindings,
        inputs: &'v HashMap<String, Tensor>,
        weights: &'v dyn WeightSource,
        states: &mut HashMap<String, Tensor>,
    ) -> Result<(), IrError> {
        for (id, node) in g.nodes() {
            let out = resolve(id, node, bind)?;
            let val = match &node.op {
                Op::Input { name, .. } => {
                    let t = inputs
                        .get(name)
                        .ok_or_else(|| IrError::Interp(format!("input `{name}` not given")))?;
                    check_leaf("input", name, t, &out)?;
                    Val::Ref(t)
                }
                Op::Weight { name, .. } => {
                    let t = weights
                        .weight(name)
                        .ok_or_else(|| IrError::Interp(format!("weight `{name}` not found")))?;
                    check_leaf("weight", name, t, &out)?;
                    Val::Ref(t)
                }
                Op::State { name, .. } => {
                    if let Some(t) = states.get(name) {
                        check_leaf("state", name, t, &out)?;
                    }
                    let t = states
                        .remove(name)
                        .unwrap_or_else(|| tensor::Tensor::zeros(out.dtype, out.shape.clone()));
                    self.chain_of[id.index()] = Some(self.chains.len());
                    self.chains.push((name.clone(), id));
                    Val::Own(t)
                }
                Op::KvWrite | Op::KvMove | Op::Assign => {
                    self.in_place(id, node)?;
                    continue;
                }
                op => {
                    let args: Vec<&Tensor> = node.args.iter().map(|&a| self.value(a)).collect();
                    let start = profile::enabled().then(std::time::Instant::now);
                    let t = eval(op, &args, &out).map_err(|msg| node_err(id, op, msg))?;
                    if let Some(start) = start {
                        let rows = out.shape.iter().rev().skip(1).product::<usize>();
                        profile::record(op.info().name, rows, start.elapsed());
                    }
                    check_result(id, op, &t, &out)?;
                    Val::Own(t)
                }
            };
            self.vals[id.index()] = Some(val);
            self.free_after(id, node);
        }
        Ok(())
    }

    /// `kv_write` / `assign`: moves the state operand into this node and writes into it.
    fn in_place(&mut self, id: ValueId, node: &Node) -> Result<(), IrError> {
        let c = node.args[0];
        let chain = self.chain_of[c.index()].expect("verified: the target is a state chain");
        let shared = self.keep[c.index()] || node.args[1..].contains(&c);
        let mut cache = if shared {
            self.value(c).clone()
        } else {
            match self.vals[c.index()].take() {
                Some(Val::Own(t)) => t,
                _ => unreachable!("state chain values are owned and not yet moved"),
            }
        };
        let res = match node.op {
            Op::KvWrite => attention::kv_write(
                &mut cache,
                self.value(node.args[1]),
                self.value(node.args[2]),
            ),
            Op::KvMove => attention::kv_move(
                &mut cache,
                self.value(node.args[1]),
                self.value(node.args[2]),
            ),
            _ => attention::assign(&mut cache, self.value(node.args[1])),
        };
        // Stored even on error: the checks precede any write, so it is the old cache.
        self.vals[id.index()] = Some(Val::Own(cache));
        self.chain_of[id.index()] = Some(chain);
        self.chains[chain].1 = id;
        res.map_err(|msg| node_err(id, &node.op, msg))?;
        self.free_after(id, node);
        Ok(())
    }

    /// Drops operands whose last use is `id` (not outputs, not state chains).
    fn free_after(&mut self, id: ValueId, node: &Node) {
        for a in &node.args {
            let i = a.index();
            if self.last_use[i] == Some(id.index()) && !self.keep[i] && self.chain_of[i].is_none() {
                self.vals[i] = None;
            }
        }
    }

    /// Moves the latest version of every state chain into `states`.
    fn store_states(&mut self, states: &mut HashMap<String, Tensor>) {
        for (name, v) in std::mem::take(&mut self.chains) {
            if let Some(Val::Own(t)) = self.vals[v.index()].take() {
                states.insert(name, t);
            }
        }
    }
}

fn node_err(id: ValueId, op: &Op, msg: String) -> IrError {
    IrError::Interp(format!("{id} = {}: {msg}", op.info().name))
}

/// The node's type with bucket dims bound.
fn resolve(id: ValueId, node: &Node, bind: &Bindings) -> Result<Out, IrError> {
    let shape = node
        .ty
        .shape
        .dims()
        .iter()
        .map(|d| match d.resolve(bind) {
            Some(n) => Ok(n as usize),
            None => Err(match d {
                Dim::Bucket(b) => IrError::Interp(format!(
                    "{id} = {}: bucket dim {b} of {} is not bound",
                    node.op.info().name,
                    node.ty
                )),
                Dim::Static(_) => unreachable!("static dims always resolve"),
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Out {
        dtype: node.ty.dtype,
        shape,
    })
}

fn check_leaf(kind: &str, name: &str, t: &Tensor, out: &Out) -> Result<(), IrError> {
    if t.dtype != out.dtype || t.shape != out.shape {
        return Err(IrError::Interp(format!(
            "{kind} `{name}`: expected {}{:?}, found {}{:?}",
            out.dtype, out.shape, t.dtype, t.shape
        )));
    }
    t.check_storage()
        .map_err(|msg| IrError::Interp(format!("{kind} `{name}`: {msg}")))
}

/// Guards the interpreter itself: every op must produce its inferred type.
fn check_result(id: ValueId, op: &Op, t: &Tensor, out: &Out) -> Result<(), IrError> {
    if t.dtype != out.dtype || t.shape != out.shape {
        return Err(node_err(
            id,
            op,
            format!(
                "interpreter produced {t}, expected {}{:?}",
                out.dtype, out.shape
            ),
        ));
    }
    t.check_storage().map_err(|msg| node_err(id, op, msg))
}

/// Evaluates a non-leaf, non-`kv_write` op.
fn eval(op: &Op, a: &[&Tensor], out: &Out) -> OpResult {
    use crate::op::Op::*;
    match op {
        Fill { value, .. } => elementwise::fill(*value, out),
        Iota { axis, .. } => elementwise::iota(*axis, out),
        Binary(b) => elementwise::binary(*b, a[0], a[1], out),
        Unary(u) => elementwise::unary(*u, a[0], out),
        SiluMul => elementwise::silu_mul(a[0], a[1], out),
        Cast { .. } => elementwise::cast(a[0], out),
        Select => elementwise::select(a[0], a[1], a[2], out),
        Reshape { .. } => shape_ops::reshape(a[0], out),
        Slice { axis, start, len } => {
            shape_ops::slice(a[0], *axis, *start as usize, *len as usize, out)
        }
        Concat { axis } => shape_ops::concat(a, *axis, out),
        Gather { axis } => shape_ops::gather(a[0], a[1], *axis, out),
        Reduce(r) => nn::reduce(*r, a[0], out),
        Argmax => nn::argmax(a[0], out),
        TopK { k } => nn::topk(a[0], *k as usize, out),
        Softmax => nn::softmax(a[0], out),
        Embedding => shape_ops::embedding(a[0], a[1], out),
        RmsNorm { eps } => nn::rmsnorm(a[0], a[1], *eps, out),
        MatMul => matmul::matmul(a[0], a[1], a.get(2).copied(), out),
        Dequantize { .. } => matmul::dequantize(a[0], a[1], out),
        Rope {
            theta,
            scaling,
            style,
            rotary_dim,
        } => rope::rope(
            a[0],
            a[1],
            *theta,
            scaling,
            *style,
            *rotary_dim as usize,
            out,
        ),
        Attention { scale, mask } => attention::attention(a, *scale, *mask, out),
        HeadMatMul { trans_w } => mla::head_matmul(a[0], a[1], *trans_w, out),
        MlaAttention { scale, mask } => mla::mla_attention(a, *scale, *mask, out),
        Sample => spec_ops::sample(a[0], a[1], out),
        TopPThreshold => spec_ops::top_p_threshold(a[0], a[1], out),
        TopKThreshold => spec_ops::top_k_threshold(a[0], a[1], out),
        RandomUniform { seed } => spec_ops::random_uniform(a[0], *seed, out),
        AcceptChain => spec_ops::accept_chain(a[0], a[1], out),
        TreeBuild { budget } => tree::tree_build(a[0], a[1], a[2], *budget as usize, out),
        TreeAccept { max_depth } => tree::tree_accept(a[0], a[1], *max_depth as usize, out),
        TreeSelect { nodes } => tree::tree_select(a[0], a[1], a[2], a[3], *nodes as usize, out),
        MoeRoute {
            top_k,
            scoring,
            n_group,
            topk_group,
            norm_topk_prob,
            scaling,
        } => moe::moe_route(
            a[0],
            a.get(1).copied(),
            moe::Route {
                top_k: *top_k as usize,
                scoring: *scoring,
                n_group: *n_group as usize,
                topk_group: *topk_group as usize,
                norm_topk_prob: *norm_topk_prob,
                scaling: *scaling,
            },
            out,
        ),
        MoeExperts => moe::moe_experts(a, out),
        AllReduce | Copy => Ok(a[0].clone()),
        Input { .. } | Weight { .. } | State { .. } | KvWrite | KvMove | Assign => {
            unreachable!("leaves and in-place ops are handled by Machine::exec")
        }
    }
}

/// Evaluates one compute node on given operand values (no leaves, no in-place ops): the
/// building block of executors that keep values elsewhere (the memory-plan checker runs a
/// scheduled plan over a byte arena with it).
pub fn eval_node(
    id: ValueId,
    node: &Node,
    args: &[&Tensor],
    bind: &Bindings,
) -> Result<Tensor, IrError> {
    let out = resolve(id, node, bind)?;
    let t = eval(&node.op, args, &out).map_err(|msg| node_err(id, &node.op, msg))?;
    check_result(id, &node.op, &t, &out)?;
    Ok(t)
}

/// `dequantize` of a stored weight `w` (int4 groups or fp8 blocks) with its `scale`, to
/// `to`: what the op computes, for a runtime that derives a weight once at upload.
pub fn dequantize_weight(w: &Tensor, scale: &Tensor, to: DType) -> Result<Tensor, String> {
    if w.shape.len() != 2 {
        return Err(format!(
            "dequantize: a 2-D weight, found shape {:?}",
            w.shape
        ));
    }
    let out = Out {
        dtype: to,
        shape: w.shape.clone(),
    };
    matmul::dequantize(w, scale, &out)
}

/// Applies an in-place node (`kv_write`, `assign`) to `state` with its other operands.
pub fn apply_in_place(
    id: ValueId,
    node: &Node,
    state: &mut Tensor,
    args: &[&Tensor],
) -> Result<(), IrError> {
    let res = match node.op {
        Op::KvWrite => attention::kv_write(state, args[0], args[1]),
        Op::KvMove => attention::kv_move(state, args[0], args[1]),
        Op::Assign => attention::assign(state, args[0]),
        _ => Err("not an in-place op".to_string()),
    };
    res.map_err(|msg| node_err(id, &node.op, msg))
}
