//! The one kernel ABI shared by every generated kernel.
//!
//! # Signature
//!
//! ```c
//! extern "C" __global__ void __launch_bounds__(NT)
//! {family}_{dtype}_{hash8}(void* const* __restrict__ ops, const StepConsts c);
//! ```
//!
//! - `ops`: this launch's *operand table*, a device array of device pointers: entry `i` is
//!   the address of the kernel's operand `i` ([`KernelSource::operands`], in order of first
//!   use in the source). An operand is a [`Loc`]: a byte offset in the step's arena (every
//!   activation and scratch buffer, placed by the static memory plan) or a byte offset in a
//!   *slot* (a weight or a persistent buffer such as a KV pool), or a [`Loc::TensorMap`] of such
//!   a tensor, whose entry points at a 128-byte TMA descriptor the host encodes for the launch's
//!   bucket ([`crate::tensor_map`]). The host resolves them per
//!   launch ([`KernelSource::operand_addresses`]). Every entry must be 16-byte aligned
//!   (vector widths are chosen from the locations' offsets, whose bases are 256-byte
//!   aligned). Weights are only read.
//! - `c`: the bucket constants of the launch ([`StepConsts`]: B, T, Ctx, M = B·T), passed by
//!   value. Kernels generated once serve every bucket whose sizes fit their static bounds
//!   (e.g. the GEMV row tile); the grid comes from [`LaunchSpec::resolve`] for the bucket.
//!
//! No placement is baked into a kernel: the 32 layers of a model run the same few kernels
//! with different operand tables, so an engine compiles each distinct shape once (compile
//! time and module count scale with the model's distinct shapes, not its depth). Parameter
//! order is fixed (table, constants) and no kernel takes other parameters, so one launch
//! helper and one argument layout serve all of them.
//!
//! Aliasing: an output may be the same buffer as an input when every element is read
//! before it is written by the same thread (in-place residual adds, rotated q over q); tensor
//! pointers are therefore not `__restrict__`. Scratch a family needs (GEMV argmax partials,
//! attention split partials) is an arena range its parameters name, sized by the family
//! (`partials_per_row`, `scratch_bytes`).
//!
//! # Programmatic dependent launch
//!
//! The runtime launches every generated kernel with programmatic stream serialization
//! (sm_90+), so its blocks may start while the previous kernel still runs. The function body
//! is therefore `prologue; pdl_enter(); body` ([`PDL_ENTER`], `cuda/common.cuh`): the
//! prologue computes indices, may read the pointer table (written only by the host) and
//! touches global memory only through L2 prefetches of weights; everything else comes after
//! the wait, which returns once the whole previous grid has completed and its writes are
//! visible. So no kernel reads an activation before its producer finished, nor overwrites an
//! arena range (the memory plan reuses offsets) that an earlier kernel may still read.
//!
//! # Names and sources
//!
//! A kernel is named `{family}_{dtype}_{hash8}`: the family (`gemv`, `rmsnorm`, ...), the
//! dtype that characterises it (each family documents which: the weight dtype of a GEMV,
//! the activation dtype elsewhere) and the first 8 hex digits of the SHA-256 of its
//! generated text without the name (module items, launch bound and function body, PDL
//! prologue included). The entry symbol equals the name (`extern "C"`, no mangling). Each
//! [`KernelSource`] is one self-contained module: the hand-written prelude (`cuda/*.cuh`)
//! followed by the kernel.
//!
//! # Layout conventions
//!
//! Tensors are row-major. A [`View`] addresses a 2-D `[rows, cols]` window: element `(r, i)`
//! is at `base + (r · row_stride + i) · sizeof(dtype)`; heads are column ranges
//! (`h · head_dim + d`), so Q/K/V slices of one fused QKV output are views of the same
//! buffer. KV caches are `[B, Ctx, H_kv, D]` with `Ctx` from `c.ctx`.

pub use specc_ir::engine::abi::{
    Bucket, Dtype, Extent, LaunchGeometry, LaunchSpec, Loc, Rows, TensorMap, Unit, OPERAND_MARK,
};

use crate::writer::Writer;
use sha2::{Digest, Sha256};

/// Replaces every operand placeholder of `texts` by `ops[i]`, numbering distinct locations in
/// order of first appearance; returns the rewritten texts and the operand list.
pub(crate) fn relocate(texts: &[&str]) -> (Vec<String>, Vec<Loc>) {
    let mut operands: Vec<Loc> = Vec::new();
    let out = texts
        .iter()
        .map(|text| {
            let mut out = String::with_capacity(text.len());
            let mut rest = *text;
            while let Some(at) = rest.find(OPERAND_MARK) {
                out.push_str(&rest[..at]);
                let args = &rest[at + OPERAND_MARK.len()..];
                let close = args.find(')').expect("operand placeholder is closed");
                let loc = Loc::parse_placeholder(&args[..close])
                    .unwrap_or_else(|| panic!("bad operand placeholder {}", &args[..close]));
                let i = match operands.iter().position(|&l| l == loc) {
                    Some(i) => i,
                    None => {
                        operands.push(loc);
                        operands.len() - 1
                    }
                };
                out.push_str(&format!("ops[{i}]"));
                rest = &args[close + 1..];
            }
            out.push_str(rest);
            out
        })
        .collect();
    (out, operands)
}

/// A 2-D row-major window `[rows, cols]` of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct View {
    pub loc: Loc,
    pub dtype: Dtype,
    /// Elements between the starts of consecutive rows (0 broadcasts one row to all).
    pub row_stride: u64,
}

impl View {
    pub fn new(loc: Loc, dtype: Dtype, row_stride: u64) -> View {
        View {
            loc,
            dtype,
            row_stride,
        }
    }

    /// The view of columns `start..` of this one.
    pub fn cols_from(self, start: u64) -> View {
        View {
            loc: self.loc.offset_by(start * self.dtype.size()),
            ..self
        }
    }

    /// Whether element `(r, i)` is aligned to `bytes` for every `r` and every `i` that is a
    /// multiple of `bytes / sizeof(dtype)`.
    pub fn aligned(self, bytes: u64) -> bool {
        self.loc.byte_offset().is_multiple_of(bytes)
            && (self.row_stride * self.dtype.size()).is_multiple_of(bytes)
    }
}

/// The widest vector (8, 4, 2 or 1 elements) such that `cols` is a multiple of it and every
/// view's rows and every extra location are aligned for it (at most 16 bytes are required:
/// wider vectors split into 16-byte accesses).
pub(crate) fn pick_vec(cols: u64, views: &[View], extra: &[(Loc, Dtype)]) -> u32 {
    [8u64, 4, 2, 1]
        .into_iter()
        .find(|&vw| {
            cols.is_multiple_of(vw)
                && views
                    .iter()
                    .all(|v| v.aligned((vw * v.dtype.size()).min(16)))
                && extra
                    .iter()
                    .all(|(l, d)| l.byte_offset() % (vw * d.size()).min(16) == 0)
        })
        .unwrap_or(1) as u32
}

/// The last kernel parameter; mirrors `struct StepConsts` in `cuda/common.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepConsts {
    pub b: i32,
    pub t: i32,
    pub ctx: i32,
    pub m: i32,
}

// SAFETY: `StepConsts` is `repr(C)`, `Copy`, has no padding and no pointers: its bytes are
// exactly the C struct the kernels take by value.
unsafe impl cudarc::driver::DeviceRepr for StepConsts {}

impl StepConsts {
    /// The constants of `bucket`.
    pub fn of(bucket: &Bucket) -> StepConsts {
        let [b, t, ctx, m] = bucket.consts();
        StepConsts { b, t, ctx, m }
    }
}

/// One generated kernel: a self-contained CUDA C++ module with one entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// `{family}_{dtype}_{hash8}`.
    pub name: String,
    /// The `extern "C"` symbol to load; equal to `name`.
    pub entry: String,
    /// The whole module: prelude + generated kernel.
    pub source: String,
    /// The generated part only (what snapshots record).
    pub kernel: String,
    pub launch: LaunchSpec,
    /// What `ops[i]` points to, for each `i`: the placement of this launch's operands. Two
    /// launches of the same kernel (same name and text) differ only here.
    pub operands: Vec<Loc>,
    /// The body is grid-stride loops over extents baked into the text and nothing else (no
    /// shared memory, no block-level synchronisation, no module items, no bucket constant
    /// read): it is correct at any grid and block size and in any bucket's launch, so
    /// [`crate::chain`] may run it inside another kernel's single block.
    pub grid_stride: bool,
}

impl KernelSource {
    /// The kernel's family: its name without the dtype and hash (`{family}_{dtype}_{hash8}`).
    pub fn family(&self) -> &str {
        self.name.rsplitn(3, '_').last().unwrap_or(&self.name)
    }

    /// The operand table of one launch: entry `i` = the address of `operands[i]`, given the
    /// arena's base address and each slot's base address. A [`Loc::TensorMap`] entry gets
    /// its tensor's address here; the caller must replace it by the address of the
    /// descriptor it encodes (the runtime's `encode_tensor_map`).
    pub fn operand_addresses(&self, arena: u64, slots: &[u64]) -> Vec<u64> {
        self.operands
            .iter()
            .map(|loc| resolve(*loc, arena, slots))
            .collect()
    }
}

/// The address of `loc` (of the tensor, for a tensor map) given the arena's and slots' bases.
fn resolve(loc: Loc, arena: u64, slots: &[u64]) -> u64 {
    match loc {
        Loc::Arena { offset } => arena + offset,
        Loc::Table { slot, offset } => slots[slot as usize] + offset,
        Loc::TensorMap(m) => resolve(m.tensor(), arena, slots),
    }
}

/// The kernel parameter list of the ABI.
pub const PARAMS: &str = "void* const* __restrict__ ops, const StepConsts c";

/// The hand-written device helpers prepended to every module.
pub const PRELUDE: &str = concat!(
    include_str!("../cuda/common.cuh"),
    "\n",
    include_str!("../cuda/vec.cuh"),
    "\n",
    include_str!("../cuda/reduce.cuh"),
    "\n",
    include_str!("../cuda/quant.cuh"),
);

/// The statement every generated kernel runs before its first access to global memory other
/// than weight prefetches: wait for the predecessor grid (programmatic dependent launch),
/// then let the successor's blocks launch. See `pdl_enter` in `cuda/common.cuh` for the
/// invariant that makes reused arena offsets safe.
pub const PDL_ENTER: &str = "pdl_enter();  // wait for earlier kernels (PDL), see common.cuh";

/// Assembles a kernel from its generated parts and names it.
pub(crate) struct KernelBuilder {
    pub family: &'static str,
    pub dtype: Dtype,
    /// Module-scope declarations before the kernel (tables, constants).
    pub items: Writer,
    /// Code run before [`PDL_ENTER`], at depth 1: it may compute indices and read the
    /// pointer table, and touch global memory only through `prefetch_l2` of weights.
    pub prologue: Writer,
    /// The function body after [`PDL_ENTER`], written at depth 1.
    pub body: Writer,
}

impl KernelBuilder {
    pub fn new(family: &'static str, dtype: Dtype) -> Self {
        KernelBuilder {
            family,
            dtype,
            items: Writer::new(),
            prologue: Writer::at_depth(1),
            body: Writer::at_depth(1),
        }
    }

    pub fn finish(self, launch: LaunchSpec) -> KernelSource {
        let dtype = self.dtype.name();
        self.finish_as(dtype, launch)
    }

    /// [`Self::finish`] with kernel attributes (launch bounds, cluster shape).
    pub fn finish_with(self, launch: LaunchSpec, attrs: KernelAttrs) -> KernelSource {
        assemble_with(
            self.family,
            self.dtype.name(),
            &self.items.finish(),
            &self.prologue.finish(),
            &self.body.finish(),
            launch,
            PRELUDE,
            attrs,
        )
    }

    /// [`Self::finish`] with `dtype` as the name's dtype part (a storage format such as
    /// `int4g32`, which is no [`Dtype`]).
    pub fn finish_as(self, dtype: &str, launch: LaunchSpec) -> KernelSource {
        assemble(
            self.family,
            dtype,
            &self.items.finish(),
            &self.prologue.finish(),
            &self.body.finish(),
            launch,
            PRELUDE,
        )
    }
}

/// Names and assembles a kernel: `prologue` (code before the PDL wait), [`PDL_ENTER`] and
/// `body`; relocates its operands (so placement is not part of the text), hashes module
/// items + launch bound + the whole function body, and prepends `prelude`.
pub(crate) fn assemble(
    family: &str,
    dtype: &str,
    items: &str,
    prologue: &str,
    body: &str,
    launch: LaunchSpec,
    prelude: &str,
) -> KernelSource {
    assemble_bounded(family, dtype, items, prologue, body, launch, prelude, None)
}

/// [`assemble`] with `__launch_bounds__(threads, min_blocks)` when `min_blocks` is set: ptxas
/// then keeps registers to what `min_blocks` blocks per SM allow (streaming kernels whose
/// loads in flight scale with the resident warps).
#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble_bounded(
    family: &str,
    dtype: &str,
    items: &str,
    prologue: &str,
    body: &str,
    launch: LaunchSpec,
    prelude: &str,
    min_blocks: Option<u32>,
) -> KernelSource {
    let attrs = KernelAttrs {
        min_blocks,
        cluster: None,
    };
    assemble_with(family, dtype, items, prologue, body, launch, prelude, attrs)
}

/// The kernel attributes beside its body: `__launch_bounds__`'s minimum blocks per SM and
/// `__cluster_dims__` (every launch, a plain `cuLaunchKernel` included, then runs its blocks
/// as thread-block clusters of that shape, which must divide the grid).
#[derive(Clone, Copy, Default)]
pub(crate) struct KernelAttrs {
    pub min_blocks: Option<u32>,
    pub cluster: Option<[u32; 3]>,
}

/// [`assemble`] with the attributes `attrs`, which also enter the kernel's hash.
#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble_with(
    family: &str,
    dtype: &str,
    items: &str,
    prologue: &str,
    body: &str,
    launch: LaunchSpec,
    prelude: &str,
    attrs: KernelAttrs,
) -> KernelSource {
    let mut inner = prologue.to_string();
    let mut enter = Writer::at_depth(1);
    enter.line(PDL_ENTER);
    inner.push_str(&enter.finish());
    inner.push_str(body);
    let body = inner.as_str();
    let (texts, operands) = relocate(&[items, body]);
    let (items, body) = (&texts[0], &texts[1]);
    let bound = launch.threads();
    let mut h = Sha256::new();
    h.update(items.as_bytes());
    h.update(bound.to_le_bytes());
    if let Some(m) = attrs.min_blocks {
        h.update(m.to_le_bytes());
    }
    if let Some(c) = attrs.cluster {
        h.update(b"cluster");
        for d in c {
            h.update(d.to_le_bytes());
        }
    }
    h.update(body.as_bytes());
    let digest = h.finalize();
    let hash8: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("{family}_{dtype}_{hash8}");
    let mut kernel = items.clone();
    if !kernel.is_empty() {
        kernel.push('\n');
    }
    let bounds = match attrs.min_blocks {
        Some(m) => format!("{bound}, {m}"),
        None => bound.to_string(),
    };
    let cluster = match attrs.cluster {
        Some([x, y, z]) => format!("__cluster_dims__({x}, {y}, {z}) "),
        None => String::new(),
    };
    kernel.push_str(&format!(
        "extern \"C\" __global__ void {cluster}__launch_bounds__({bounds})\n{name}({PARAMS}) {{\n"
    ));
    kernel.push_str(body);
    kernel.push_str("}\n");
    let source = format!("{prelude}\n// ---- generated ----\n{kernel}");
    KernelSource {
        entry: name.clone(),
        name,
        source,
        kernel,
        launch,
        operands,
        grid_stride: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_follow_the_bucket() {
        let bk = Bucket {
            b: 3,
            t: 5,
            ctx: 64,
        };
        assert_eq!(Rows::Tokens.extent(1, 4).eval(&bk), 4);
        assert_eq!(Rows::Seqs.extent(2, 1).eval(&bk), 6);
        assert_eq!(Rows::Fixed(10).extent(1, 3).eval(&bk), 4);
        assert_eq!(Rows::Tokens.extent_rounded(4, 2).eval(&bk), 4);
        assert_eq!(Rows::Tokens.extent_rounded(8, 2).eval(&bk), 2);
        assert_eq!(Rows::Seqs.extent_rounded(1, 4).eval(&bk), 4);
        assert_eq!(Rows::Fixed(10).extent_rounded(3, 2).eval(&bk), 4);
        assert_eq!(StepConsts::of(&bk).m, 15);
    }

    #[test]
    fn placeholders_round_trip_and_share_an_operand_per_map() {
        let x = TensorMap::of(Loc::arena(4096), Dtype::BF16, 4096, Rows::Tokens, 4096, 64);
        let w = TensorMap::of(
            Loc::table(3),
            Dtype::F16,
            4096,
            Rows::Fixed(6144),
            4096,
            128,
        );
        let text = format!(
            "{} {} {}",
            x.ptr_as("void", false),
            w.ptr_as("void", false),
            x.ptr_as("void", false)
        );
        let (out, ops) = relocate(&[&text]);
        assert_eq!(ops, vec![x, w]);
        assert!(
            out[0].contains("ops[0]") && out[0].contains("ops[1]") && !out[0].contains("ops[2]")
        );
    }

    #[test]
    fn names_hash_the_body() {
        let mk = |stmt: &str| {
            let mut k = KernelBuilder::new("fam", Dtype::BF16);
            k.body.line(stmt);
            k.finish(LaunchSpec {
                grid: [Extent::Fixed(1); 3],
                block: [32, 1, 1],
                smem_bytes: 0,
            })
        };
        let (a, b, a2) = (mk("int x = 1;"), mk("int x = 2;"), mk("int x = 1;"));
        assert!(a.name.starts_with("fam_bf16_") && a.name.len() == "fam_bf16_".len() + 8);
        assert_ne!(a.name, b.name);
        assert_eq!(a, a2);
        assert!(a.source.starts_with(PRELUDE));
        assert!(a
            .kernel
            .contains(&format!("{}(void* const* __restrict__ ops", a.name)));
    }

    #[test]
    fn placement_is_not_part_of_the_kernel() {
        let mk = |x: Loc, w: Loc| {
            let mut k = KernelBuilder::new("fam", Dtype::BF16);
            emit_ptrs(&mut k, x, w);
            k.finish(LaunchSpec {
                grid: [Extent::Fixed(1); 3],
                block: [32, 1, 1],
                smem_bytes: 0,
            })
        };
        let a = mk(Loc::arena(256), Loc::table(3));
        let b = mk(
            Loc::arena(4096),
            Loc::Table {
                slot: 9,
                offset: 64,
            },
        );
        assert_eq!(a.name, b.name, "same shape, other placement: one kernel");
        assert_eq!(a.kernel, b.kernel);
        assert!(!a.kernel.contains("@operand"), "{}", a.kernel);
        // x is used twice but is one operand; numbering follows first use.
        assert_eq!(a.operands, vec![Loc::arena(256), Loc::table(3)]);
        assert!(a.kernel.contains("reinterpret_cast<const bf16*>(ops[0])"));
        assert!(a.kernel.contains("reinterpret_cast<bf16*>(ops[1])"));
        assert_eq!(
            b.operand_addresses(
                1 << 20,
                &[0; 9].into_iter().chain([1 << 30]).collect::<Vec<_>>()
            ),
            vec![(1 << 20) + 4096, (1 << 30) + 64]
        );
    }

    fn emit_ptrs(k: &mut KernelBuilder, x: Loc, w: Loc) {
        k.body
            .line(format!("const bf16* x = {};", x.ptr(Dtype::BF16, false)));
        k.body
            .line(format!("bf16* w = {};", w.ptr(Dtype::BF16, true)));
        k.body
            .line(format!("const bf16* x2 = {};", x.ptr(Dtype::BF16, false)));
    }

    #[test]
    fn pdl_wait_comes_after_the_prologue_and_before_the_body() {
        let mut k = KernelBuilder::new("fam", Dtype::BF16);
        k.prologue.line("prefetch_l2(w);");
        k.body.line("int x = 1;");
        let src = k.finish(LaunchSpec {
            grid: [Extent::Fixed(1); 3],
            block: [32, 1, 1],
            smem_bytes: 0,
        });
        let at = |s: &str| src.kernel.find(s).unwrap_or_else(|| panic!("{s}"));
        assert!(at("prefetch_l2(w);") < at(PDL_ENTER));
        assert!(at(PDL_ENTER) < at("int x = 1;"));
        assert_eq!(src.kernel.matches("pdl_enter()").count(), 1);
    }
}
