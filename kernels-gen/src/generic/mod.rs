//! The generic family: one kernel for any single IR op that the fused families leave over
//! (the small ops of the speculative step on `B×(k+1)` ints and `B×V` probabilities).
//!
//! [`single`] takes the op, its operands and its result as [`TensorArg`]s (location, IR
//! dtype, dims resolved for the bucket) and returns the kernels computing the op exactly as
//! `specc_ir::interp` does. Shapes are baked in, so a kernel serves the one bucket its dims
//! were resolved for, and its grid is fixed.
//!
//! # Storage
//! Row-major, contiguous. `bool` is one byte holding 0 or 1 (`DType::Bool` is 1 byte in the
//! memory plan); kernels read any non-zero byte as true and write 0 or 1. fp8 and packed
//! int4 tensors are the weights of `dequantize` and `moe_experts` only, read as stored
//! ([`crate::quant`]); anywhere else they are rejected ([`Error::Unsupported`]).
//!
//! # Numerics (each mirrors the interpreter, see `ir/src/interp/mod.rs`)
//! - Exact (bit for bit): every integer and bool op (i64 arithmetic, wrapping, `x / 0 = x % 0
//!   = 0`, Euclidean `rem`), casts, `fill`, `iota`, data movement (`copy`, `assign`,
//!   `slice`, `concat`, `gather`, `embedding`, `kv_write`, `select`), `argmax` and `topk`
//!   (NaN ranks as -inf, ties to the lower index), `reduce_max`, integer `reduce_sum`,
//!   `sample` (the interpreter's sequential f32 running sum, see `cuda/generic.cuh`),
//!   `random_uniform`, `accept_chain`, `tree_build` (f32 scores, one `__fadd_rn` per node),
//!   `tree_accept`, `tree_select` (f32 ranks, ties to the lower index), `kv_move`,
//!   `top_k_threshold` (an element of its row, found by exact counts), and
//!   float `add`/`sub`/`mul`/`div`/`max`/`min`/`rem`,
//!   `neg`, `sqrt`, `recip` (one IEEE operation, rounded once to the result dtype).
//! - To rounding: `exp`, `log`, `silu`, `sigmoid`, `silu_mul`, `softmax`, the scores of
//!   `moe_route` (CUDA's `expf` / `logf` are within 2 ulp of libm's; the router's sums,
//!   selection and gates are the interpreter's operations on those scores) and the float
//!   sums of `reduce_sum`, `softmax`, `rmsnorm`, `matmul`, which add in a fixed block-tree
//!   order instead of the interpreter's 8 interleaved partials (deterministic from run to
//!   run); `top_p_threshold` is an element of its row, the same one unless a partial mass
//!   lies within f32 rounding of `p · Z`.
//!
//! # Kernels
//! Elementwise ops and data movement run one thread per output element (or per 1–16-byte
//! unit of a contiguous copy), grid-stride; row ops (`reduce`, `argmax`, `topk`, `softmax`,
//! `top_p_threshold`, `top_k_threshold`) one block per row; `sample` and `moe_route` one
//! warp per row; `matmul` one warp per output column and 8 rows; `rmsnorm` is the
//! [`crate::norm`] family. A kernel is named `{op}_{dtype}_{hash8}` like every family
//! ([`crate::abi`]), with the IR dtype name in the middle so `bool` can appear; which dtype
//! characterises each op is listed at [`single`].

mod elementwise;
mod head_matmul;
mod mla;
pub mod mla_prep;
mod moe;
pub mod moe_grouped;
mod movement;
mod quant;
mod rows;
mod tree;

use crate::abi::{assemble_bounded, Extent, KernelSource, LaunchSpec, Loc, PRELUDE};
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;
use specc_ir::{DType, Dim, Op, TensorType};

/// The family name in errors.
const FAMILY: &str = "generic";

/// The hand-written helpers of this family, appended to the common prelude.
pub const GENERIC_PRELUDE: &str = include_str!("../../cuda/generic.cuh");

/// Blocks of a grid-stride kernel, at most; larger tensors loop. A bound on the grid, not a
/// device fact: several blocks per SM on every supported GPU, and the kernels are correct
/// at any grid (the loop covers what the grid does not).
const MAX_BLOCKS: u64 = 1024;

/// One operand or the result of an op.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorArg {
    pub loc: Loc,
    pub dtype: DType,
    /// Dims resolved for the bucket (row-major, contiguous); empty for a scalar.
    pub dims: Vec<u64>,
}

impl TensorArg {
    pub fn new(loc: Loc, dtype: DType, dims: &[u64]) -> TensorArg {
        TensorArg {
            loc,
            dtype,
            dims: dims.to_vec(),
        }
    }

    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes per element (`bool` is 1); 0 for packed formats, which are rejected first.
    pub fn elem_bytes(&self) -> u64 {
        self.dtype.size_bytes().unwrap_or(0) as u64
    }

    /// The last dim (1 for a scalar).
    fn last(&self) -> u64 {
        self.dims.last().copied().unwrap_or(1)
    }

    /// `(prod(dims[..axis]), dims[axis], prod(dims[axis+1..]))`.
    fn around(&self, axis: usize) -> (u64, u64, u64) {
        (
            self.dims[..axis].iter().product(),
            self.dims[axis],
            self.dims[axis + 1..].iter().product(),
        )
    }

    fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.dims.iter().map(|&d| Dim::Static(d)))
    }
}

/// Kernels (one, for every supported op) computing `op` on `inputs` into `output` exactly
/// as the interpreter does; the types must satisfy the op's shape and dtype rule.
///
/// Supported: `fill`, `iota`, every binary and unary op, `silu_mul`, `cast`, `select`,
/// `copy`, `reshape` (as a copy), `assign`, `kv_write` and `kv_move` (in place: `output` must
/// be at the state's location), `slice`, `concat`, `gather`, `embedding`, `reduce_sum`,
/// `reduce_max`, `argmax`, `topk`, `softmax`, `top_p_threshold`, `top_k_threshold`, `sample`,
/// `random_uniform`,
/// `accept_chain`,
/// `tree_build`, `tree_accept`, `tree_select`, `rmsnorm`,
/// `matmul` (plain float weights), a standalone `rope`, `head_matmul`, `mla_attention`, `moe_route`,
/// `moe_experts` (also with int4 / fp8 experts and their scales), `dequantize`. Leaves,
/// `attention` (its own family) and `all_reduce` give [`Error::Unsupported`].
///
/// The dtype in the kernel name: the result's for `fill`, `iota`, `silu_mul`, `cast` and
/// `random_uniform`; the weight's for `matmul`; the log-probs' (f32) for `tree_build`;
/// the scores' (f32) for `tree_select`;
/// otherwise the first data operand's (the
/// values of `select`, the table of `embedding`, the state of `kv_write` and `assign`).
pub fn single(
    op: &Op,
    inputs: &[TensorArg],
    output: &TensorArg,
) -> Result<Vec<KernelSource>, Error> {
    if let Some(reason) = unsupported(op) {
        return Err(unsupported_err(op, reason));
    }
    validate(op, inputs, output)?;
    let x = || &inputs[0];
    let k = match op {
        Op::Fill { value, .. } => elementwise::fill(*value, output)?,
        Op::Iota { axis, .. } => elementwise::iota(*axis, output),
        Op::Binary(b) => elementwise::binary(*b, x(), &inputs[1], output),
        Op::Unary(u) => elementwise::unary(*u, x(), output),
        Op::SiluMul => elementwise::silu_mul(x(), &inputs[1], output),
        Op::Cast { .. } => elementwise::cast(x(), output),
        Op::Select => elementwise::select(x(), &inputs[1], &inputs[2], output),
        Op::RandomUniform { seed } => elementwise::random_uniform(*seed, x(), output),
        Op::Copy | Op::Reshape { .. } => movement::copy(op.info().name, x(), output),
        Op::Assign => movement::copy("assign", &inputs[1], output),
        Op::Slice { axis, start, .. } => movement::slice(*axis, *start, x(), output),
        Op::Concat { axis } => movement::concat(*axis, inputs, output),
        Op::Gather { axis } => movement::gather(*axis, x(), &inputs[1], output),
        Op::Embedding => movement::embedding(x(), &inputs[1], output),
        Op::KvWrite => movement::kv_write(x(), &inputs[1], &inputs[2], output),
        Op::Reduce(r) => rows::reduce(*r, x(), output),
        Op::Argmax => rows::argmax(x(), output),
        Op::TopK { k } => rows::topk(*k, x(), output),
        Op::Softmax => rows::softmax(x(), output),
        Op::Sample => rows::sample(x(), &inputs[1], output)?,
        Op::TopPThreshold => rows::top_p_threshold(x(), &inputs[1], output),
        Op::TopKThreshold => rows::top_k_threshold(x(), &inputs[1], output),
        Op::AcceptChain => rows::accept_chain(x(), &inputs[1], output),
        Op::TreeBuild { budget } => tree::tree_build(*budget, x(), &inputs[1], &inputs[2], output),
        Op::TreeAccept { max_depth } => tree::tree_accept(*max_depth, x(), &inputs[1], output),
        Op::TreeSelect { nodes } => {
            tree::tree_select(*nodes, x(), &inputs[1], &inputs[2], &inputs[3], output)
        }
        Op::KvMove => tree::kv_move(x(), &inputs[1], &inputs[2], output),
        Op::RmsNorm { eps } => rows::rmsnorm(*eps, x(), &inputs[1], output)?,
        Op::MatMul => rows::matmul(x(), &inputs[1], output),
        Op::Rope { .. } => mla::rope(op, x(), &inputs[1], output)?,
        Op::HeadMatMul { trans_w } => head_matmul::head_matmul(*trans_w, x(), &inputs[1], output),
        Op::MlaAttention { scale, mask } => mla::mla_attention(*scale, *mask, inputs, output)?,
        Op::MoeRoute {
            top_k,
            scoring,
            n_group,
            topk_group,
            norm_topk_prob,
            scaling,
        } => {
            let route = moe::Route {
                top_k: *top_k,
                scoring: *scoring,
                n_group: *n_group,
                topk_group: *topk_group,
                norm_topk_prob: *norm_topk_prob,
                scaling: *scaling,
            };
            moe::moe_route(&route, x(), inputs.get(1), output)?
        }
        Op::MoeExperts => moe::moe_experts(x(), &inputs[1], &inputs[2..], output)?,
        Op::Dequantize { .. } => quant::dequantize(x(), &inputs[1], output)?,
        Op::Input { .. }
        | Op::Weight { .. }
        | Op::State { .. }
        | Op::Attention { .. }
        | Op::AllReduce => return Err(unsupported_err(op, unsupported(op).unwrap_or(""))),
    };
    Ok(vec![k])
}

/// Why `op` has no generic kernel, or `None` when it has one.
fn unsupported(op: &Op) -> Option<&'static str> {
    match op {
        Op::Input { .. } | Op::Weight { .. } | Op::State { .. } => {
            Some("a leaf is written by the runtime or loaded, not computed")
        }
        Op::Attention { .. } => Some("attention is the attention family"),
        Op::AllReduce => Some("a collective across ranks, not a kernel"),
        _ => None,
    }
}

fn unsupported_err(op: &Op, reason: &str) -> Error {
    Error::Unsupported {
        family: FAMILY,
        op: op.info().name,
        reason: reason.to_string(),
    }
}

/// Checks operand count, dtypes, the op's shape rule, in-place locations and sizes.
fn validate(op: &Op, inputs: &[TensorArg], output: &TensorArg) -> Result<(), Error> {
    let name = op.info().name;
    let arity = op.info().arity;
    if !arity.admits(inputs.len()) {
        return Err(Error::param(
            name,
            "inputs",
            format!("takes {arity:?} operands, got {}", inputs.len()),
        ));
    }
    if matches!(op, Op::MatMul) && inputs.len() == 3 {
        return Err(unsupported_err(
            op,
            "quantised weights (a scale operand); the gemv family handles them",
        ));
    }
    // Operands that may be stored quantised: the weights of `dequantize` and of
    // `moe_experts` with its scales.
    let stored = |i: usize| match op {
        Op::Dequantize { .. } => i == 0,
        Op::MoeExperts => inputs.len() == 8 && (2..=4).contains(&i),
        _ => false,
    };
    for (i, a) in inputs.iter().enumerate() {
        if stored(i) && matches!(a.dtype, DType::Fp8E4M3 | DType::Int4Group { .. }) {
            continue;
        }
        if !matches!(
            a.dtype,
            DType::BF16 | DType::F16 | DType::F32 | DType::I32 | DType::I64 | DType::Bool
        ) {
            return Err(unsupported_err(op, &format!("{} tensors", a.dtype)));
        }
    }
    if !is_float(output.dtype) && !output.dtype.is_int() && output.dtype != DType::Bool {
        return Err(unsupported_err(op, &format!("{} results", output.dtype)));
    }
    match op {
        Op::Reshape { .. } => {
            let x = &inputs[0];
            if x.dtype != output.dtype || x.numel() != output.numel() {
                return Err(Error::param(
                    name,
                    "output",
                    format!(
                        "cannot view {}{:?} as {}{:?}",
                        x.dtype, x.dims, output.dtype, output.dims
                    ),
                ));
            }
        }
        _ => {
            let tys: Vec<TensorType> = inputs.iter().map(TensorArg::ty).collect();
            let refs: Vec<&TensorType> = tys.iter().collect();
            let want = op
                .infer(&refs)
                .map_err(|m| Error::param(name, "inputs", m))?;
            if !fits(&want, output) {
                return Err(Error::param(
                    name,
                    "output",
                    format!("must be {want}, got {}{:?}", output.dtype, output.dims),
                ));
            }
        }
    }
    if op.is_in_place() && inputs[0].loc != output.loc {
        return Err(Error::param(
            name,
            "output",
            "must be at the state's location (the op updates the state in place)",
        ));
    }
    if let Some(a) = inputs.iter().chain([output]).find(|a| a.numel() == 0) {
        return Err(Error::param(
            name,
            "dims",
            format!("empty tensor {}{:?} has no kernel", a.dtype, a.dims),
        ));
    }
    if output.numel() > i32::MAX as u64 || inputs.iter().any(|a| a.last() > i32::MAX as u64) {
        return Err(Error::param(
            name,
            "dims",
            "too large for 32-bit row indices",
        ));
    }
    Ok(())
}

/// Whether `arg` has type `want`; bucket dims of a leaf's declared type match any size.
fn fits(want: &TensorType, arg: &TensorArg) -> bool {
    want.dtype == arg.dtype
        && want.shape.rank() == arg.dims.len()
        && want
            .shape
            .dims()
            .iter()
            .zip(&arg.dims)
            .all(|(d, &n)| d.as_static().is_none_or(|s| s == n))
}

// ---- element types in C++ ----

pub(crate) fn is_float(d: DType) -> bool {
    matches!(d, DType::BF16 | DType::F16 | DType::F32)
}

/// The C++ element type (`b8` for bool, from `cuda/generic.cuh`).
pub(crate) fn c_type(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F32 => "float",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::Bool => "b8",
        // Rejected by `validate`; a byte keeps printing total.
        DType::Fp8E4M3 | DType::Int4Group { .. } => "unsigned char",
    }
}

/// The C++ type values of `d` are computed in: `float` for floats, `long long` (the
/// interpreter's i64) for ints and bool.
pub(crate) fn value_type(d: DType) -> &'static str {
    if is_float(d) {
        "float"
    } else {
        "long long"
    }
}

/// `expr` (an element of `d`) as a value of [`value_type`].
pub(crate) fn load(d: DType, expr: &str) -> String {
    if is_float(d) {
        format!("to_f32({expr})")
    } else {
        format!("to_i64({expr})")
    }
}

/// A value of [`value_type`] stored as `d`: floats round to nearest even, i32 wraps, bool is
/// `!= 0`.
pub(crate) fn store(d: DType, value: &str) -> String {
    let t = c_type(d);
    if is_float(d) {
        format!("from_f32<{t}>({value})")
    } else {
        format!("from_i64<{t}>({value})")
    }
}

/// An unsigned C++ type of `bytes` (1, 2, 4, 8, 16) for raw copies.
pub(crate) fn raw_type(bytes: u64) -> &'static str {
    match bytes {
        1 => "unsigned char",
        2 => "unsigned short",
        4 => "unsigned int",
        8 => "unsigned long long",
        _ => "uint4",
    }
}

/// The widest copy unit (16, 8, 4, 2 or 1 bytes) dividing every byte count and offset.
pub(crate) fn unit_bytes(bytes: &[u64]) -> u64 {
    [16u64, 8, 4, 2]
        .into_iter()
        .find(|w| bytes.iter().all(|b| b % w == 0))
        .unwrap_or(1)
}

/// A C++ `float` expression equal to `x`, infinities and NaN included.
pub(crate) fn f32_expr(x: f32) -> String {
    if x.is_finite() {
        f32_lit(x)
    } else {
        format!("__int_as_float({:#010x})", x.to_bits())
    }
}

/// A C++ `long long` literal of `v`.
pub(crate) fn i64_lit(v: i64) -> String {
    if v == i64::MIN {
        "SPECC_I64_MIN".into()
    } else {
        format!("{v}ll")
    }
}

// ---- kernel assembly ----

/// A generic kernel under construction: like [`crate::abi::KernelBuilder`], but the dtype in
/// the name is an IR dtype (so `bool` can appear) and the module also carries
/// [`GENERIC_PRELUDE`]. Names and kernel text are otherwise the same as the builder's (a
/// unit test checks it).
pub(crate) struct Kernel {
    family: &'static str,
    dtype: DType,
    /// Module-scope declarations before the kernel (helpers of one family).
    pub items: Writer,
    /// The function body, written at depth 1.
    pub body: Writer,
}

impl Kernel {
    pub fn new(family: &'static str, dtype: DType) -> Kernel {
        Kernel {
            family,
            dtype,
            items: Writer::new(),
            body: Writer::at_depth(1),
        }
    }

    /// `const T* name = <arg's address>;` (`T*` when `mutable`), `T` the element type. Not
    /// `__restrict__`: the memory plan may put an elementwise result where an operand is.
    pub fn ptr(&mut self, name: &str, arg: &TensorArg, mutable: bool) {
        self.ptr_as(name, arg.loc, c_type(arg.dtype), mutable);
    }

    /// The same with any element type (raw copy units).
    pub fn ptr_as(&mut self, name: &str, loc: Loc, c_type: &str, mutable: bool) {
        let cv = if mutable { "" } else { "const " };
        emit!(
            self.body,
            "{cv}{c_type}* {name} = {};",
            loc.ptr_as(c_type, mutable)
        );
    }

    /// `for (e = thread; e < n; e += grid threads) { body }` over `long long e`.
    pub fn grid_stride(&mut self, n: u64, body: impl FnOnce(&mut Writer)) {
        self.body.for_block(
            "long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x",
            format_args!("e < {n}ll"),
            "e += (long long)gridDim.x * blockDim.x",
            body,
        );
    }

    pub fn finish(self, launch: LaunchSpec) -> KernelSource {
        self.finish_bounded(launch, None)
    }

    /// [`Kernel::finish`] for a body of [`Kernel::grid_stride`] loops only, over `n` units
    /// ([`flat_launch`]): marked [`KernelSource::grid_stride`], so it can be chained.
    pub fn finish_flat(self, n: u64) -> KernelSource {
        KernelSource {
            grid_stride: true,
            ..self.finish(flat_launch(n))
        }
    }

    /// [`Kernel::finish`] with a minimum of resident blocks per SM in the launch bounds.
    pub fn finish_bounded(self, launch: LaunchSpec, min_blocks: Option<u32>) -> KernelSource {
        let prelude = format!("{PRELUDE}\n{GENERIC_PRELUDE}");
        assemble_bounded(
            self.family,
            &self.dtype.to_string(),
            &self.items.finish(),
            "",
            &self.body.finish(),
            launch,
            &prelude,
            min_blocks,
        )
    }
}

/// One thread per unit of work over `n` units: blocks of up to 256 threads, at most
/// [`MAX_BLOCKS`] of them (the kernel loops with [`Kernel::grid_stride`]).
pub(crate) fn flat_launch(n: u64) -> LaunchSpec {
    let nt = n.next_multiple_of(32).clamp(32, 256);
    LaunchSpec {
        grid: [
            Extent::Fixed(n.div_ceil(nt).min(MAX_BLOCKS) as u32),
            Extent::Fixed(1),
            Extent::Fixed(1),
        ],
        block: [nt as u32, 1, 1],
        smem_bytes: 0,
    }
}

/// One block of `threads` per row.
pub(crate) fn row_launch(rows: u64, threads: u32) -> LaunchSpec {
    LaunchSpec {
        grid: [
            Extent::Fixed(rows as u32),
            Extent::Fixed(1),
            Extent::Fixed(1),
        ],
        block: [threads, 1, 1],
        smem_bytes: 0,
    }
}

/// Threads of a block reducing a row of `n` elements: a power of two in 32..=1024 giving
/// each thread at least 4 elements (one block holds a whole row, so long rows such as a
/// vocabulary need the whole block).
pub(crate) fn row_threads(n: u64) -> u32 {
    (n / 4).next_power_of_two().clamp(32, 1024) as u32
}

#[cfg(test)]
mod tests;
