//! The closed operator set and its one metadata table.
//!
//! Every op documents its semantics here; `interp` implements exactly this text and is the
//! definition GPU kernels are tested against. Shapes below use `...` for any leading dims.
//! Unless noted, float math is f32 and the result is rounded to the result dtype.

use crate::{BucketDim, DType, Dim, Shape, TensorType};

/// RoPE frequency scaling (REFERENCE.md).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Llama-3 piecewise scaling of inverse frequencies.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position: u64,
    },
    /// YaRN (DeepSeek-V3 / Kimi-K2); `mscale` multiplies cos and sin.
    Yarn {
        factor: f64,
        original_max_position: u64,
        beta_fast: f64,
        beta_slow: f64,
        mscale: f64,
    },
}

/// Which elements a rotation pairs up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-NeoX / HF Llama "rotate half": pairs (i, i + d/2).
    Half,
    /// GPT-J / DeepSeek MLA: pairs (2i, 2i + 1).
    Interleaved,
}

/// Which cache slots a query may attend to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnMask {
    /// Query `(b, t)` attends slots `0..=pos[b, t]`.
    Causal,
    /// Query `(b, t)` attends slots `0..prefix_len[b]` and slot `prefix_len[b] + u` for every
    /// bit `u` (< min(T, 64·W)) set in its ancestor mask: `ancestors` is `i64[B, T]` (one
    /// word, W = 1) or `i64[B, T, W]` (bit `u` in word `u / 64`, bit `u % 64`). A block
    /// (DFlash) is a tree whose masks have every bit set; a chain is a tree whose node `t`
    /// has bits `0..=t`; a DDTree draft tree of up to 256 nodes uses W = ceil(T / 64).
    Tree,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    /// Remainder: `rem_euclid` for ints (never negative), `fmod` for floats; an integer
    /// remainder by zero is 0.
    Rem,
    /// Result is `bool`.
    Eq,
    /// Result is `bool`.
    Lt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Recip,
    Silu,
    Sigmoid,
    /// Logical not; operand and result are `bool`.
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// Expert scoring function of a MoE router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeScoring {
    Softmax,
    Sigmoid,
}

/// Operand count rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exact(usize),
    Range(usize, usize),
    AtLeast(usize),
}

impl Arity {
    pub fn admits(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::Range(lo, hi) => (lo..=hi).contains(&n),
            Arity::AtLeast(lo) => n >= lo,
        }
    }
}

/// Static facts about an op, the single metadata table.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    /// Mnemonic in the text form.
    pub name: &'static str,
    pub arity: Arity,
    /// No side effects: may be removed when unused, and recomputed or reordered freely.
    pub pure: bool,
    /// Output element `i` depends only on input elements `i` (after broadcasting).
    pub elementwise: bool,
}

/// One IR operation. Leaves (`Input`, `Weight`, `State`, `Fill`, `Iota`) carry their type;
/// every other op's type follows from its operands by [`Op::infer`].
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A per-step value the runtime writes before each replay (token ids, positions, ...).
    Input { name: String, ty: TensorType },
    /// A read-only parameter, named by its checkpoint tensor name.
    Weight { name: String, ty: TensorType },
    /// A persistent buffer that outlives a step (KV caches, hidden-state taps, ring buffers).
    State { name: String, ty: TensorType },
    /// A tensor with every element equal to `value`.
    Fill { value: f64, ty: TensorType },
    /// An integer tensor whose element is its index along `axis`.
    Iota { axis: usize, ty: TensorType },

    /// `(a[...], b[suffix of ...]) -> a-shaped`: `b` broadcasts over the leading dims of `a`
    /// (its shape must equal a suffix of `a`'s shape; rank 0 is a scalar).
    Binary(BinaryOp),
    /// `(x) -> x`-typed elementwise function.
    Unary(UnaryOp),
    /// `(gate, up) -> silu(gate) * up`, the SwiGLU activation.
    SiluMul,
    /// `(x) -> x` converted to `to` (floats to ints truncate toward zero; bool is 0/1).
    Cast { to: DType },
    /// `(cond bool, a, b) -> a`-typed, `cond ? a : b` elementwise (all the same shape).
    Select,

    /// `(x) -> x` viewed as `shape`; bucket dims must appear in the same order and the
    /// product of static dims must match.
    Reshape { shape: Shape },
    /// `(x) -> x[..., start..start+len, ...]` along a static `axis`.
    Slice { axis: usize, start: u64, len: u64 },
    /// `(x0, x1, ...) -> concatenation along axis`; all other dims equal.
    Concat { axis: usize },
    /// `(x, idx int) -> out[i] = x[i with i[axis] := clamp(idx[i], 0, n-1)]`: take along
    /// `axis`; `idx` has `x`'s rank and dims except at `axis`; the result has `idx`'s shape.
    Gather { axis: usize },

    /// `(x[..., n]) -> [...]` reduced over the last axis (f32 accumulation).
    Reduce(ReduceOp),
    /// `(x[..., n]) -> i32[...]`: index of the maximum; the lowest index wins ties.
    Argmax,
    /// `(x[..., n]) -> i32[..., k]`: indices of the `k` largest, largest first; ties by
    /// lower index.
    TopK { k: u64 },
    /// `(x[..., n]) -> f32[..., n]`: softmax over the last axis.
    Softmax,

    /// `(table[V, H], ids int[...]) -> table-dtype[..., H]`; ids clamped to `0..V`.
    Embedding,
    /// `(x[..., N], w[N]) -> x * rsqrt(mean(x^2) + eps) * w`; mean in f32.
    RmsNorm { eps: f64 },
    /// `(x[..., K], w[N, K], scale?) -> x-dtype[..., N]`: `x · wᵀ` with f32 accumulation.
    /// `scale` dequantises `w`: fp8 block `[ceil(N/128), ceil(K/128)]` f32 multiplied per
    /// 128×128 block (edge blocks partial); int4 groups `[N, K/group]` per group.
    MatMul,
    /// `(w[N, K] fp8e4m3 | int4g, scale) -> to[N, K]`: the weight dequantised exactly as
    /// `matmul` dequantises it (same scale rules), rounded to `to`. For quantised weights
    /// that are reshaped or sliced before use (MLA's `kv_b_proj`).
    Dequantize { to: DType },
    /// `(x[B, T, H, D], pos int[B, T]) -> x`: rotary embedding of the first `rotary_dim`
    /// features at positions `pos`; the rest pass through.
    Rope {
        theta: f64,
        scaling: RopeScaling,
        style: RopeStyle,
        rotary_dim: u64,
    },
    /// `(cache[B, Ctx, H, D], x[B, T, H, D], pos int[B, T]) -> cache`: writes `x[b, t]` into
    /// slot `clamp(pos[b, t], 0, Ctx-1)` in place. The result is the updated cache and
    /// aliases the operand, which must not be read afterwards (the verifier checks this).
    /// Negative `pos` means "padding lane": nothing is written. Any rank-4 state works as a
    /// row store (token ring buffers, tapped hidden states), not only KV caches.
    KvWrite,
    /// `(cache[B, Ctx, ...], src int[B, n], dst int[B, n]) -> cache`: for each sequence, in
    /// order of `i`, copies row `cache[b, min(src[b, i], Ctx-1)]` to row
    /// `cache[b, min(dst[b, i], Ctx-1)]` in place; a negative `src` or `dst` copies nothing.
    /// Aliases its operand like `kv_write`. Tree commit: the accepted path's rows move from
    /// their tree slots `prefix + node` to `prefix + depth` (in ascending depth, `dst ≤ src`
    /// and no later source is overwritten).
    KvMove,
    /// `(state, x) -> state`: overwrites the whole state with `x` (same type) in place; like
    /// `kv_write`, the result aliases the operand, which must not be read afterwards. This
    /// is how a step commits sequence lengths and pending tokens on device.
    Assign,
    /// `(q[B, T, Hq, D], k[B, Ctx, Hkv, D], v[B, Ctx, Hkv, Dv], pos int[B, T],
    ///   [prefix_len int[B], ancestors i64[B, T] or i64[B, T, W]]) -> q-dtype[B, T, Hq, Dv]`:
    /// softmax(scale · q·kᵀ over the slots `mask` allows) · v, with query head `h` reading
    /// kv head `h / (Hq / Hkv)` (GQA). The `Tree` mask takes the two extra operands.
    Attention { scale: f64, mask: AttnMask },
    /// `(x[..., H, K], w[H, K, N]) -> x-dtype[..., H, N]` (`trans_w` false: `x_h · w[h]`)
    /// or `(x[..., H, K], w[H, N, K])` (`trans_w` true: `x_h · w[h]ᵀ`): one matmul per head
    /// `h` with its own weight, f32 accumulation. MLA's weight absorption: `q_nope · W_UK`
    /// into the latent space, the latent attention output `· W_UVᵀ` out of it.
    HeadMatMul { trans_w: bool },
    /// `(q_lat[B, T, H, L], q_pe[B, T, H, R], c[B, Ctx, 1, L], pe[B, Ctx, 1, R], pos int[B, T],
    ///   [prefix_len int[B], ancestors i64[B, T] or i64[B, T, W]]) -> q_lat-dtype[B, T, H, L]`:
    /// multi-head latent attention in the absorbed form. Every head reads the one shared
    /// latent cache: score(s) = `scale · (q_lat·c[s] + q_pe·pe[s])`, softmax over the slots
    /// `mask` allows (as for `attention`), output `Σ p · c[s]` (still latent; `head_matmul`
    /// with W_UV maps it to values).
    MlaAttention { scale: f64, mask: AttnMask },

    /// `(probs f32[..., V], u f32[...]) -> i32[...]`: the smallest `i` with
    /// `cumsum(probs)[i] > u · sum(probs)` (inverse CDF), clamped to `V-1`.
    Sample,
    /// `(probs f32[..., V], p f32[...]) -> f32[...]`: the nucleus (top-p) threshold of each
    /// row, with the row's own `p` (per-lane sampling parameters live on the device). With
    /// `w = probs` where positive (NaN and negatives count as 0), `Z = Σ w` and
    /// `S(t) = Σ_{j: w_j > t} w_j`: the smallest `t ≥ 0` with `S(t) < p · Z`, which is an
    /// element of the row (`S` only changes at elements); 0 when `p · Z = 0` and when
    /// `p ≥ 1` or is NaN (nothing is cut). The elements `≥` it are the nucleus: the smallest
    /// set of the largest probabilities whose mass reaches `p · Z`, ties with its least
    /// element included. Sums to rounding (the interpreter adds in f64, kernels in f32).
    TopPThreshold,
    /// `(x f32[..., n], k int[...]) -> f32[...]`: the `k`-th largest element of each row
    /// with the row's own `k` (duplicates counted, NaN counting as −inf; −0 reads as +0);
    /// −inf when `k < 1` or `k ≥ n` (nothing is cut). The elements `≥` it are the top-k
    /// set with every tie of its least element (HF's `TopKLogitsWarper`).
    TopKThreshold,
    /// `(counter i64[...]) -> f32[...]` uniform in `[0, 1)`: `splitmix64(seed ^ counter)`,
    /// top 24 bits / 2^24. Counter-based, so a replay with the same counters repeats.
    RandomUniform { seed: u64 },
    /// `(draft int[B, K], target int[B, K+1]) -> i32[B]`: the number of leading positions
    /// where `draft[b, i] == target[b, i]`, in `0..=K` (greedy chain acceptance).
    AcceptChain,
    /// `(logp f32[B, L, K], ids int[B, L, K], root int[B]) -> i64[B, N, 3 + W]`, N = `budget`,
    /// W = ceil(N / 64): a DDTree draft tree, best-first over rank paths (REFERENCE.md).
    /// Row `d` of `logp` / `ids` is depth `d + 1`: its top-K log-probs (best first) and
    /// tokens. Node 0 is the root: token `root[b]`, depth 0, score 0. A candidate is
    /// (parent node p, rank r) at depth `depth(p) + 1`, with score `score(p) + logp[d-1][r]`
    /// (one f32 add; NaN counts as -inf). Starting from the candidate (0, 0), the best
    /// candidate becomes the next node, then its sibling (p, r + 1) if r + 1 < K and its
    /// first child (node, 0) if its depth < L become candidates. Best = highest score, then
    /// lowest parent index, then lowest rank (a strict total order, so the tree is unique).
    /// Per node `i` the row holds `[token, parent, depth, ancestor words…]`; ancestors =
    /// the parent's | bit `i`. When no candidate is left before N nodes, the remaining
    /// nodes are padding: token `root[b]`, parent −1, depth 0, ancestors = bit `i` only (no
    /// walk reaches them). Parents precede children, so `node ≥ depth` on every path.
    TreeBuild { budget: u64 },
    /// `(tree i64[B, N, 3 + W], target int[B, N]) -> i32[B, max_depth + 3]`: greedy tree
    /// acceptance. From the root, repeatedly move to the lowest-index node whose parent is
    /// the current node and whose token equals `target[b, current]`, at most `max_depth`
    /// times. Row: `[a, bonus, path_0 .. path_max_depth]`, `a` = accepted moves
    /// (0..=max_depth), bonus = `target[b, path_a]`, `path_i` = the node at depth `i` for
    /// `i ≤ a` (`path_0 = 0`) and `path_a` repeated after it.
    TreeAccept { max_depth: u64 },
    /// `(scores f32[B, C], tokens int[B, C], parents int[B, C], root int[B])
    /// -> i64[B, N, 3 + W]`, N = `nodes`, W = ceil(N / 64): an EAGLE-2/3 draft tree of the
    /// best `min(N − 1, C)` candidates, in `tree_build`'s row format. Candidate `c` has a
    /// cumulative score, a token and `parents[b, c]`, its parent's candidate index (< 0:
    /// the root). Best = highest score (NaN counts as -inf), then lowest index. Node 0 is
    /// the root (token `root[b]`, parent −1, depth 0, bit 0); nodes 1.. are the selected
    /// candidates in ascending candidate index. A node's parent is 0 when `parents < 0`,
    /// the parent's node when the parent candidate has a lower index and is selected, and
    /// otherwise −1 (detached: depth 0, no walk reaches it or its subtree); depth = the
    /// parent's + 1, ancestors = the parent's | bit `i`. Nodes past the selection are
    /// padding as in `tree_build`. When every candidate's score is ≤ its parent's and
    /// parents have lower indices, the selection is prefix-closed (nothing is detached).
    TreeSelect { nodes: u64 },
    /// `(logits[..., E], bias? f32[E]) -> f32[..., E]`: dense expert gates, zero for
    /// experts not selected. Scores `s` = softmax or sigmoid of logits (f32); groups of
    /// `E / n_group` experts ranked by their top-2 `s + bias` sum, the best `topk_group`
    /// kept; the `top_k` best `s + bias` chosen; gates = `s` at those (renormalised when
    /// `norm_topk_prob`) × `scaling`.
    MoeRoute {
        top_k: u64,
        scoring: MoeScoring,
        n_group: u64,
        topk_group: u64,
        norm_topk_prob: bool,
        scaling: f64,
    },
    /// `(x[..., H], gates f32[..., E], w_gate[E, F, H], w_up[E, F, H], w_down[E, H, F],
    ///  [s_gate, s_up, s_down]) -> x[..., H]`: `Σ_e gates[e] · down_e(silu(gate_e x) · up_e x)`
    /// over experts with a non-zero gate. With quantised (fp8e4m3 / int4g) expert weights
    /// the three scales follow, each with a leading `E` and otherwise as `matmul`'s scale of
    /// one expert's weight (fp8 `[E, ceil(rows/128), ceil(cols/128)]`, int4 `[E, rows,
    /// cols/group]`); each expert's weight is dequantised as `matmul` does.
    MoeExperts,
    /// `(x) -> x`: sum over the tensor-parallel group (identity with one rank).
    AllReduce,
    /// `(x) -> x`: a materialised copy.
    Copy,
}

impl Op {
    /// The metadata table: one row per op.
    pub fn info(&self) -> OpInfo {
        use Arity::*;
        let (name, arity, pure, elementwise) = match self {
            Op::Input { .. } => ("input", Exact(0), true, false),
            Op::Weight { .. } => ("weight", Exact(0), true, false),
            Op::State { .. } => ("state", Exact(0), false, false),
            Op::Fill { .. } => ("fill", Exact(0), true, false),
            Op::Iota { .. } => ("iota", Exact(0), true, false),
            Op::Binary(b) => (b.name(), Exact(2), true, true),
            Op::Unary(u) => (u.name(), Exact(1), true, true),
            Op::SiluMul => ("silu_mul", Exact(2), true, true),
            Op::Cast { .. } => ("cast", Exact(1), true, true),
            Op::Select => ("select", Exact(3), true, true),
            Op::Reshape { .. } => ("reshape", Exact(1), true, false),
            Op::Slice { .. } => ("slice", Exact(1), true, false),
            Op::Concat { .. } => ("concat", AtLeast(1), true, false),
            Op::Gather { .. } => ("gather", Exact(2), true, false),
            Op::Reduce(r) => (r.name(), Exact(1), true, false),
            Op::Argmax => ("argmax", Exact(1), true, false),
            Op::TopK { .. } => ("topk", Exact(1), true, false),
            Op::Softmax => ("softmax", Exact(1), true, false),
            Op::Embedding => ("embedding", Exact(2), true, false),
            Op::RmsNorm { .. } => ("rmsnorm", Exact(2), true, false),
            Op::MatMul => ("matmul", Range(2, 3), true, false),
            Op::Dequantize { .. } => ("dequantize", Exact(2), true, false),
            Op::Rope { .. } => ("rope", Exact(2), true, false),
            Op::KvWrite => ("kv_write", Exact(3), false, false),
            Op::KvMove => ("kv_move", Exact(3), false, false),
            Op::Assign => ("assign", Exact(2), false, false),
            Op::Attention { mask, .. } => (
                "attention",
                match mask {
                    AttnMask::Causal => Exact(4),
                    AttnMask::Tree => Exact(6),
                },
                true,
                false,
            ),
            Op::HeadMatMul { .. } => ("head_matmul", Exact(2), true, false),
            Op::MlaAttention { mask, .. } => (
                "mla_attention",
                match mask {
                    AttnMask::Causal => Exact(5),
                    AttnMask::Tree => Exact(7),
                },
                true,
                false,
            ),
            Op::Sample => ("sample", Exact(2), true, false),
            Op::TopPThreshold => ("top_p_threshold", Exact(2), true, false),
            Op::TopKThreshold => ("top_k_threshold", Exact(2), true, false),
            Op::RandomUniform { .. } => ("random_uniform", Exact(1), true, true),
            Op::AcceptChain => ("accept_chain", Exact(2), true, false),
            Op::TreeBuild { .. } => ("tree_build", Exact(3), true, false),
            Op::TreeAccept { .. } => ("tree_accept", Exact(2), true, false),
            Op::TreeSelect { .. } => ("tree_select", Exact(4), true, false),
            Op::MoeRoute { .. } => ("moe_route", Range(1, 2), true, false),
            Op::MoeExperts => ("moe_experts", Range(5, 8), true, false),
            Op::AllReduce => ("all_reduce", Exact(1), false, false),
            Op::Copy => ("copy", Exact(1), true, true),
        };
        OpInfo {
            name,
            arity,
            pure,
            elementwise,
        }
    }

    /// Ops whose result aliases their first operand, a state updated in place.
    pub fn is_in_place(&self) -> bool {
        matches!(self, Op::KvWrite | Op::KvMove | Op::Assign)
    }

    /// The type a leaf op declares, if this is a leaf.
    pub fn leaf_type(&self) -> Option<&TensorType> {
        match self {
            Op::Input { ty, .. }
            | Op::Weight { ty, .. }
            | Op::State { ty, .. }
            | Op::Fill { ty, .. }
            | Op::Iota { ty, .. } => Some(ty),
            _ => None,
        }
    }

    /// Name of a named leaf (input, weight, state).
    pub fn leaf_name(&self) -> Option<&str> {
        match self {
            Op::Input { name, .. } | Op::Weight { name, .. } | Op::State { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The shape and dtype rule: the result type for operands of types `args`, or a
    /// message saying which operand breaks which rule.
    pub fn infer(&self, args: &[&TensorType]) -> Result<TensorType, String> {
        let info = self.info();
        if !info.arity.admits(args.len()) {
            return Err(format!(
                "{} takes {:?} operands, got {}",
                info.name,
                info.arity,
                args.len()
            ));
        }
        crate::infer::infer(self, args)
    }
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 9] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Rem,
        BinaryOp::Eq,
        BinaryOp::Lt,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Rem => "rem",
            BinaryOp::Eq => "eq",
            BinaryOp::Lt => "lt",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Lt)
    }
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 8] = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Recip,
        UnaryOp::Silu,
        UnaryOp::Sigmoid,
        UnaryOp::Not,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Silu => "silu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Not => "not",
        }
    }
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Max];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Max => "reduce_max",
        }
    }
}

/// Shorthand used by shape rules and lowering.
pub fn dims(ds: &[Dim]) -> Shape {
    Shape(ds.to_vec())
}

/// `B`, `T`, `Ctx` as dims.
pub const B: Dim = Dim::Bucket(BucketDim::B);
pub const T: Dim = Dim::Bucket(BucketDim::T);
pub const CTX: Dim = Dim::Bucket(BucketDim::Ctx);

/// Ancestor-mask words of a tree of `nodes` nodes: `ceil(nodes / 64)`, at least 1.
pub fn tree_words(nodes: u64) -> u64 {
    nodes.div_ceil(64).max(1)
}

/// Largest `tree_build` budget (nodes per sequence).
pub const MAX_TREE_NODES: u64 = 256;

/// Most `tree_select` candidates per sequence (the CUDA kernel ranks them in shared memory).
pub const MAX_TREE_CANDIDATES: u64 = 4096;
