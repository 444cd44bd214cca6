//! From codegen's launch plan to generated kernels: each fused group of one bucket becomes
//! one or more [`PlannedLaunch`]es with their sources, grids and bucket constants, plus the
//! table of buffers (`bufs` in the ABI) the kernels index.
//!
//! Invariants:
//! - arena offsets come from the memory plan; group-local scratch (GEMV argmax partials,
//!   split-K partial sums, attention split partials, the q/k/v product of layers whose
//!   RoPE runs in `rope_kv`) lives in one region after the planned arena, reused by every
//!   group (groups run one after another);
//! - between the planned arena and the scratch, [`SPLIT_COUNTERS`] `i32` split-K counters:
//!   zero when the arena is allocated (zeroed), and left zero by every kernel that uses
//!   them, so all split-K launches share them;
//! - table slot `i` is `slots[i]`: a checkpoint weight, a persistent state, or rows of
//!   several weights concatenated at upload (the fused q/k/v projection);
//! - each launch carries its own [`Bucket`]: inside a step graph an op's token count is its
//!   own (a draft forward over 2 tokens in a bucket whose T is 1), so `t` is read from the
//!   op's shape, not from the graph's bucket.

use std::collections::HashMap;

use specc_ir::engine::choice::{
    AttentionKernel, EpilogueChoice, KernelChoice, MatmulChoice, MatmulCore, MoeChoice,
    NormPlacement,
};
use specc_ir::engine::{ArenaLayout, Phase, Slot, Target};
use specc_ir::{
    AttnMask as IrMask, BucketDim, DType, Graph, Op, RopeScaling, RopeStyle as IrStyle, ValueId,
};
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::argmax::{argmax, ArgmaxInput, ArgmaxParams};
use specc_kernels_gen::attention::{self, AttentionParams, AttnMask};
use specc_kernels_gen::attention_mma::FusedCombine;
use specc_kernels_gen::chain::{chain, chainable};
use specc_kernels_gen::elementwise::{embedding, EmbeddingParams};
use specc_kernels_gen::gemv::{gemv_tiled, GemvParams, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::gemv_mma::{self, SplitScratch};
use specc_kernels_gen::gemv_quant::{gemv_quant_tiled, QuantWeights};
use specc_kernels_gen::generic::{mla_prep, moe_grouped, single, TensorArg};
use specc_kernels_gen::mla_tile;
use specc_kernels_gen::norm::{rmsnorm, RmsNormParams};
use specc_kernels_gen::qkv_rope::QkvRope;
use specc_kernels_gen::quant::QuantFormat;
use specc_kernels_gen::rope::{rope_kv, QkNorm, RopeKvParams, RopeStyle, RopeTable};
use specc_kernels_gen::Error;

use crate::choose;
use crate::{Epilogue, Group, GroupKind, Home, LaunchPlan, MatOut, MlaKv, MlaQ};

pub use choose::matmul::SPLIT_COUNTERS;

#[derive(Clone, Debug, PartialEq)]
pub struct PlannedLaunch {
    pub kernel: KernelSource,
    /// Bucket constants passed to this launch (and its grid).
    pub bucket: Bucket,
    /// Index of the group it computes, in schedule order.
    pub group: usize,
    /// Which part of a speculative step it belongs to (for timing breakdowns).
    pub phase: Phase,
}

/// The part of a step group `gr` computes for: the phase the lowering marked its anchor
/// node with (a matmul's first product, else the group's one node).
fn phase_of(g: &Graph, gr: &Group) -> Phase {
    let anchor = match &gr.kind {
        GroupKind::Single(v) => *v,
        GroupKind::MatMul { mats, .. } => mats[0].node,
        GroupKind::MlaKv(kv) => kv.c_cache_out,
        GroupKind::MlaQ(q) => q.q_pe,
    };
    g.phase_of(anchor)
}

#[derive(Clone, Debug, PartialEq)]
pub struct KernelPlan {
    pub bucket: Bucket,
    pub launches: Vec<PlannedLaunch>,
    pub slots: Vec<Slot>,
    /// Planned arena + scratch: the bytes the arena allocation needs.
    pub arena_bytes: u64,
    pub arena: ArenaLayout,
    /// Scratch bytes each group uses, in schedule order.
    pub scratch: Vec<u64>,
    /// Offsets of the graph's inputs and outputs in the arena (for host copies).
    pub io: Vec<(String, u64, u64)>,
    /// The kernel choice of each group, in schedule order.
    pub choices: Vec<KernelChoice>,
}

struct Ctx<'a> {
    g: &'a Graph,
    plan: &'a LaunchPlan,
    slots: Vec<Slot>,
    /// Index of each slot in `slots`, so handing out a slot costs O(1).
    slot_index: HashMap<Slot, u32>,
    scratch_base: u64,
    scratch_top: u64,
    scratch_max: u64,
    /// The split-K counter region (see the module docs).
    counters: Loc,
    /// The MoE statistics region and the next MoE layer's index in it.
    moe_stats: u64,
    moe_layer: u64,
    bucket: Bucket,
    target: &'a Target,
}

fn unsupported(op: &'static str, reason: String) -> Error {
    Error::Unsupported {
        family: "plan",
        op,
        reason,
    }
}

fn dtype(d: DType) -> Result<Dtype, Error> {
    Ok(match d {
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::F32 => Dtype::F32,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        other => return Err(unsupported("dtype", format!("{other} in a fused kernel"))),
    })
}

impl Ctx<'_> {
    fn slot(&mut self, s: Slot) -> u32 {
        if let Some(&i) = self.slot_index.get(&s) {
            return i;
        }
        let i = self.slots.len() as u32;
        self.slot_index.insert(s.clone(), i);
        self.slots.push(s);
        i
    }

    fn loc(&mut self, v: ValueId) -> Result<Loc, Error> {
        let home =
            self.plan.memory.homes.get(&v).cloned().ok_or_else(|| {
                unsupported("plan", format!("{v} has no home in the memory plan"))
            })?;
        Ok(match home {
            Home::Arena { offset, .. } => Loc::arena(offset),
            Home::Weight(name) => Loc::table(self.slot(Slot::Weight(name))),
            Home::WeightStack(names) => Loc::table(self.slot(Slot::ConcatRows(names))),
            Home::WeightBlocks(b) => Loc::table(self.slot(Slot::WeightBlocks(b))),
            Home::State(name) => Loc::table(self.slot(Slot::State(name))),
            Home::Const(bytes) => Loc::table(self.slot(Slot::Const(bytes))),
        })
    }

    fn dims(&self, v: ValueId) -> Result<Vec<u64>, Error> {
        self.g
            .ty(v)
            .shape
            .resolve(&self.plan.bind)
            .map(|d| d.into_iter().map(|x| x as u64).collect())
            .ok_or_else(|| unsupported("plan", format!("{v} has unbound dims")))
    }

    /// `v` as a 2-D `[numel / last, last]` view.
    fn view(&mut self, v: ValueId) -> Result<(View, u64, u64), Error> {
        let dims = self.dims(v)?;
        let last = *dims.last().unwrap_or(&1);
        let rows = dims.iter().product::<u64>() / last.max(1);
        let dt = dtype(self.g.ty(v).dtype)?;
        Ok((View::new(self.loc(v)?, dt, last), rows, last))
    }

    fn arg(&mut self, v: ValueId) -> Result<TensorArg, Error> {
        Ok(TensorArg {
            loc: self.loc(v)?,
            dtype: self.g.ty(v).dtype,
            dims: self.dims(v)?,
        })
    }

    /// Group-local scratch, 256-byte aligned.
    fn scratch(&mut self, bytes: u64) -> Loc {
        let at = self.scratch_top.next_multiple_of(256);
        self.scratch_top = at + bytes;
        self.scratch_max = self.scratch_max.max(self.scratch_top);
        Loc::arena(at)
    }

    /// The matmul kernel `core` for `p`, with the split-K scratch its tiling asks for over
    /// at most `rows` rows.
    fn matmul(
        &mut self,
        p: &GemvParams,
        core: &MatmulCore,
        rows: u32,
        q: Option<&QuantWeights>,
    ) -> Result<KernelSource, Error> {
        match (core, q) {
            (MatmulCore::Dequant(t), Some(q)) => gemv_quant_tiled(p, q, t),
            (MatmulCore::Dequant(_), None) | (_, Some(_)) => Err(unsupported(
                "plan",
                "quantised weights run on gemv_q only, with their scales".to_string(),
            )),
            (MatmulCore::CudaCores(t), None) => gemv_tiled(p, t),
            (MatmulCore::TensorCores(t), None) => {
                let split = gemv_mma::split_needs(p, t, rows).map(|needs| SplitScratch {
                    partials: self.scratch(needs.partial_bytes),
                    counters: self.counters,
                    tiles: needs.counters,
                });
                gemv_mma::gemv_mma_split(p, t, split)
            }
            (MatmulCore::Gemm(t), None) => specc_kernels_gen::gemm_mma::gemm_mma(p, t),
            (MatmulCore::Wgmma(t), None) => specc_kernels_gen::gemm_wgmma::gemm_wgmma(p, t),
        }
    }

    /// Bucket constants for an op whose tensors are `[B, t, ...]`.
    fn bucket_for(&self, v: ValueId) -> Result<Bucket, Error> {
        let d = self.dims(v)?;
        Ok(Bucket {
            b: self.bucket.b,
            t: d.get(1).copied().unwrap_or(1) as u32,
            ctx: self.bucket.ctx,
        })
    }
}

/// Generates every launch of one bucket's plan for `target` (kernels pick their work
/// splits from its facts, e.g. how many stages of operands to stage in shared memory).
pub fn plan_kernels(
    g: &Graph,
    groups: &[Group],
    plan: &LaunchPlan,
    target: &Target,
) -> Result<KernelPlan, Error> {
    let get = |d| plan.bind.get(d).unwrap_or(1) as u32;
    let bucket = Bucket {
        b: get(BucketDim::B),
        t: get(BucketDim::T),
        ctx: get(BucketDim::Ctx),
    };
    let counters = plan.memory.arena_bytes.next_multiple_of(256);
    let moe_stats = counters + SPLIT_COUNTERS as u64 * 4;
    let moe_layers = groups
        .iter()
        .filter(|gr| matches!(gr.kind, GroupKind::Single(v) if g.node(v).op == Op::MoeExperts))
        .count() as u64;
    let scratch_base = (moe_stats + 4 * moe_layers).next_multiple_of(256);
    let mut cx = Ctx {
        g,
        plan,
        slots: Vec::new(),
        slot_index: HashMap::new(),
        scratch_base,
        scratch_top: scratch_base,
        scratch_max: scratch_base,
        counters: Loc::arena(counters),
        moe_stats,
        moe_layer: 0,
        bucket,
        target,
    };
    let mut launches = Vec::new();
    let mut choices = Vec::with_capacity(groups.len());
    let mut scratch = Vec::with_capacity(groups.len());
    for (i, gr) in groups.iter().enumerate() {
        cx.scratch_top = cx.scratch_base;
        let phase = phase_of(g, gr);
        let (kernels, choice) = group_kernels(&mut cx, gr)?;
        choices.push(choice);
        scratch.push(cx.scratch_top - cx.scratch_base);
        for (kernel, b) in kernels {
            launches.push(PlannedLaunch {
                kernel,
                bucket: b,
                group: i,
                phase,
            });
        }
    }
    let launches = chain_runs(launches)?;
    let mut io = Vec::new();
    for (id, n) in g.nodes() {
        if let Op::Input { name, .. } = &n.op {
            if let Some(Home::Arena { offset, bytes }) = plan.memory.homes.get(&id) {
                io.push((name.clone(), *offset, *bytes));
            }
        }
    }
    for (name, v) in g.outputs() {
        if let Some(Home::Arena { offset, bytes }) = plan.memory.homes.get(v) {
            io.push((name.clone(), *offset, *bytes));
        }
    }
    Ok(KernelPlan {
        bucket,
        launches,
        slots: cx.slots,
        arena_bytes: cx.scratch_max.next_multiple_of(256),
        arena: ArenaLayout {
            values_bytes: plan.memory.arena_bytes,
            counters_offset: counters,
            counters_bytes: SPLIT_COUNTERS as u64 * 4,
            moe_stats_offset: moe_stats,
            moe_stats_count: moe_layers,
            scratch_offset: scratch_base,
            scratch_bytes: cx.scratch_max.next_multiple_of(256) - scratch_base,
        },
        scratch,
        io,
        choices,
    })
}

type Launches = Vec<(KernelSource, Bucket)>;

/// Runs of launches that [`choose::chain::joins`] accepts, each replaced by one launch of
/// their chain (attributed to the run's first group). Order is kept, so every value is still
/// written before it is read.
fn chain_runs(launches: Vec<PlannedLaunch>) -> Result<Vec<PlannedLaunch>, Error> {
    let mut out: Vec<PlannedLaunch> = Vec::with_capacity(launches.len());
    let mut run: Vec<PlannedLaunch> = Vec::new();
    let flush = |run: &mut Vec<PlannedLaunch>, out: &mut Vec<PlannedLaunch>| -> Result<(), Error> {
        if run.len() >= 2 {
            let members: Vec<&KernelSource> = run.iter().map(|l| &l.kernel).collect();
            let kernel = chain(&members)?;
            out.push(PlannedLaunch {
                kernel,
                ..run[0].clone()
            });
            run.clear();
        } else {
            out.append(run);
        }
        Ok(())
    };
    for l in launches {
        let joins = match run.first() {
            Some(f) => choose::chain::joins((&f.kernel, f.phase), (&l.kernel, l.phase)),
            None => true,
        };
        if !joins {
            flush(&mut run, &mut out)?;
        }
        if chainable(&l.kernel) {
            run.push(l);
        } else {
            flush(&mut run, &mut out)?;
            out.push(l);
        }
    }
    flush(&mut run, &mut out)?;
    Ok(out)
}

fn group_kernels(cx: &mut Ctx, gr: &Group) -> Result<(Launches, KernelChoice), Error> {
    match &gr.kind {
        GroupKind::Single(v) => single_kernels(cx, *v),
        GroupKind::MatMul {
            x,
            x_cols,
            norm,
            mats,
            epilogue,
        } => matmul_kernels(cx, *x, *x_cols, norm.as_ref(), mats, epilogue),
        GroupKind::MlaKv(kv) => mla_kv_kernels(cx, kv),
        GroupKind::MlaQ(q) => mla_q_kernels(cx, q),
    }
}

/// MLA's latent and rope key written to the caches: one `mla_kv_write` launch.
fn mla_kv_kernels(cx: &mut Ctx, kv: &MlaKv) -> Result<(Launches, KernelChoice), Error> {
    let b = cx.bucket_for(kv.kva).unwrap_or(cx.bucket);
    let rope = cx.g.node(kv.rope).op.clone();
    let mut kva = cx.arg(kv.kva)?;
    let kva_row_stride = *kva.dims.last().unwrap_or(&0);
    if let Some(c) = kv.kva_cols {
        // The latent and rope key: the last `L + R` columns from `c` of the stacked rows.
        let l_r = cx.dims(kv.c_cache_out)?[3] + cx.dims(kv.pe_cache_out)?[3];
        kva.loc = kva.loc.offset_by(c * kva.elem_bytes());
        if let Some(last) = kva.dims.last_mut() {
            *last = l_r;
        }
    }
    let k = mla_prep::mla_kv_write(&mla_prep::MlaKvWrite {
        kva: &kva,
        kva_row_stride,
        norm_weight: &cx.arg(kv.norm_weight)?,
        eps: kv.eps as f32,
        rope: &rope,
        positions: &cx.arg(kv.positions)?,
        slots: &cx.arg(kv.slots)?,
        c_cache: &cx.arg(kv.c_cache_out)?,
        pe_cache: &cx.arg(kv.pe_cache_out)?,
    })?;
    Ok(fixed(vec![(k, b)]))
}

/// MLA's query split into `q_nope` and the rotated `q_pe`: one `mla_q_split` launch.
fn mla_q_kernels(cx: &mut Ctx, q: &MlaQ) -> Result<(Launches, KernelChoice), Error> {
    let b = cx.bucket_for(q.q).unwrap_or(cx.bucket);
    let rope = cx.g.node(q.q_pe).op.clone();
    let k = mla_prep::mla_q_split(&mla_prep::MlaQSplit {
        q: &cx.arg(q.q)?,
        rope: &rope,
        positions: &cx.arg(q.positions)?,
        q_nope: &cx.arg(q.q_nope)?,
        q_pe: &cx.arg(q.q_pe)?,
    })?;
    Ok(fixed(vec![(k, b)]))
}

fn single_kernels(cx: &mut Ctx, v: ValueId) -> Result<(Launches, KernelChoice), Error> {
    let node = cx.g.node(v).clone();
    let b = cx.bucket_for(v).unwrap_or(cx.bucket);
    match &node.op {
        Op::Embedding if cx.g.ty(node.args[0]).dtype.is_float() => {
            let (out, rows, hidden) = cx.view(v)?;
            let table_dims = cx.dims(node.args[0])?;
            let p = EmbeddingParams {
                rows: Rows::Fixed(rows as u32),
                ids: cx.loc(node.args[1])?,
                ids_dtype: dtype(cx.g.ty(node.args[1]).dtype)?,
                table: cx.loc(node.args[0])?,
                table_dtype: dtype(cx.g.ty(node.args[0]).dtype)?,
                vocab: table_dims[0] as u32,
                hidden: hidden as u32,
                out,
            };
            Ok(fixed(vec![(embedding(&p)?, b)]))
        }
        Op::RmsNorm { eps } => {
            let dims = cx.dims(v)?;
            let dim = *dims.last().unwrap_or(&1);
            let rows = dims.iter().product::<u64>() / dim;
            let dt = dtype(cx.g.ty(v).dtype)?;
            let p = RmsNormParams {
                rows: Rows::Fixed(rows as u32),
                heads: 1,
                dim: dim as u32,
                x: View::new(cx.loc(node.args[0])?, dt, dim),
                out: View::new(cx.loc(v)?, dt, dim),
                weight: cx.loc(node.args[1])?,
                w_dtype: dtype(cx.g.ty(node.args[1]).dtype)?,
                eps: *eps as f32,
            };
            Ok(fixed(vec![(rmsnorm(&p)?, b)]))
        }
        Op::Attention { scale, mask } => attention_kernels(cx, v, &node.args, *scale, *mask),
        Op::MoeExperts => moe_kernels(cx, v, &node.args, b),
        Op::MlaAttention { scale, mask } => mla_kernels(cx, v, &node.args, *scale, *mask, b),
        op => {
            let inputs = node
                .args
                .iter()
                .map(|&a| cx.arg(a))
                .collect::<Result<Vec<_>, _>>()?;
            let out = cx.arg(v)?;
            Ok(fixed(
                single(op, &inputs, &out)?
                    .into_iter()
                    .map(|k| (k, b))
                    .collect(),
            ))
        }
    }
}

/// `moe_experts`: the grouped kernels where [`choose::moe::grouped`] takes the operands,
/// with their scratch; else the per-token generic kernel.
fn moe_kernels(
    cx: &mut Ctx,
    v: ValueId,
    args: &[ValueId],
    b: Bucket,
) -> Result<(Launches, KernelChoice), Error> {
    let ops = args
        .iter()
        .map(|&a| cx.arg(a))
        .collect::<Result<Vec<_>, _>>()?;
    let out = cx.arg(v)?;
    let stat = Loc::arena(cx.moe_stats + 4 * cx.moe_layer);
    cx.moe_layer += 1;
    let top_k = crate::cost::router_top_k(cx.g, args[1]);
    // What the grouped kernels refuse (a typed reason) runs per token.
    let Ok(shape) = choose::moe::grouped(&ops, &out, top_k) else {
        let ks = single(&Op::MoeExperts, &ops, &out)?;
        return Ok(fixed(ks.into_iter().map(|k| (k, b)).collect()));
    };
    let elem = out.dtype.size_bytes().unwrap_or(4) as u64;
    let [meta, pair_token, pair_gate, pair_of, act, y] =
        shape.scratch_bytes(elem).map(|n| cx.scratch(n));
    let scratch = moe_grouped::MoeScratch {
        stat,
        meta,
        pair_token,
        pair_gate,
        pair_of,
        act,
        y,
    };
    let matmul = choose::moe::expert_matmul(&ops, &out, cx.target);
    let ks = moe_grouped::moe_grouped(shape, matmul, &ops[0], &ops[1], &ops[2..], &out, &scratch)?;
    let choice = KernelChoice::Moe(MoeChoice {
        tokens: shape.tokens,
        experts: shape.experts,
        matmul,
    });
    Ok((ks.into_iter().map(|k| (k, b)).collect(), choice))
}

/// `mla_attention`: the tensor-core tiles where [`choose::mla::tiling`] takes the
/// shapes (their split partials in scratch), else the generic per-row kernel.
fn mla_kernels(
    cx: &mut Ctx,
    v: ValueId,
    args: &[ValueId],
    scale: f64,
    mask: IrMask,
    b: Bucket,
) -> Result<(Launches, KernelChoice), Error> {
    let ql = cx.arg(args[0])?;
    let qp = cx.arg(args[1])?;
    let c = cx.arg(args[2])?;
    let pe = cx.arg(args[3])?;
    let pos = cx.arg(args[4])?;
    let out = cx.arg(v)?;
    let same = [&qp, &c, &pe, &out].iter().all(|a| a.dtype == ql.dtype);
    let tile_mask = match mask {
        IrMask::Causal => Some(mla_tile::MlaMask::Causal),
        IrMask::Tree => {
            let anc = cx.arg(args[6])?;
            let pl = cx.arg(args[5])?;
            (anc.dtype == DType::I64 && anc.dims.len() == 3).then_some(mla_tile::MlaMask::Tree {
                prefix_len: pl.loc,
                prefix_dtype: pl.dtype,
                ancestors: anc.loc,
                words: anc.dims[2],
            })
        }
    };
    let mut p = mla_tile::MlaTileParams {
        batch: ql.dims[0],
        tokens: ql.dims[1],
        heads: ql.dims[2],
        latent: ql.dims[3],
        rope: qp.dims[3],
        ctx: c.dims[1],
        scale: scale as f32,
        dtype: ql.dtype,
        q_lat: ql.loc,
        q_pe: qp.loc,
        c_cache: c.loc,
        pe_cache: pe.loc,
        pos: pos.loc,
        pos_dtype: pos.dtype,
        mask: tile_mask.unwrap_or(mla_tile::MlaMask::Causal),
        out: out.loc,
        splits: 1,
        block_row_tiles: 1,
        stages: 2,
        wgmma: false,
        cluster: 1,
        p_single: false,
        ping_pong: false,
        partial_acc: out.loc,
        partial_ml: out.loc,
    };
    let tiling = if same && tile_mask.is_some() {
        choose::mla::tiling(&p, cx.target)
    } else {
        None
    };
    let Some(tiling) = tiling else {
        let inputs = args
            .iter()
            .map(|&a| cx.arg(a))
            .collect::<Result<Vec<_>, _>>()?;
        let ks = single(&Op::MlaAttention { scale, mask }, &inputs, &out)?;
        return Ok(fixed(ks.into_iter().map(|k| (k, b)).collect()));
    };
    p.splits = tiling.splits;
    p.block_row_tiles = tiling.block_row_tiles;
    p.stages = tiling.stages;
    p.wgmma = tiling.wgmma;
    p.cluster = tiling.cluster;
    if p.parts() > 1 {
        let (acc, ml) = p.partial_bytes(p.parts());
        p.partial_acc = cx.scratch(acc);
        p.partial_ml = cx.scratch(ml);
    }
    let ks = mla_tile::mla_tile(&p)?;
    Ok((
        ks.into_iter().map(|k| (k, b)).collect(),
        KernelChoice::Mla(tiling),
    ))
}

/// Launches of a kernel with nothing to choose, with their [`KernelChoice::Fixed`].
fn fixed(launches: Launches) -> (Launches, KernelChoice) {
    let families = launches
        .iter()
        .map(|(k, _)| k.family().to_string())
        .collect();
    (launches, KernelChoice::Fixed { families })
}

fn attention_kernels(
    cx: &mut Ctx,
    v: ValueId,
    args: &[ValueId],
    scale: f64,
    mask: IrMask,
) -> Result<(Launches, KernelChoice), Error> {
    let q = cx.dims(args[0])?;
    let kd = cx.dims(args[1])?;
    let vd = cx.dims(args[2])?;
    let (t, hq, d) = (q[1] as u32, q[2] as u32, q[3] as u32);
    let (hkv, dv) = (kd[2] as u32, vd[3] as u32);
    let qdt = dtype(cx.g.ty(args[0]).dtype)?;
    let mask = match mask {
        IrMask::Causal => AttnMask::Causal,
        IrMask::Tree => AttnMask::Tree {
            prefix_len: cx.loc(args[4])?,
            ancestors: cx.loc(args[5])?,
            // `ancestors` is [B, T] (one word) or [B, T, W].
            words: match cx.dims(args[5])?.as_slice() {
                [_, _, w] => *w as u32,
                _ => 1,
            },
        },
    };
    let mut p = AttentionParams {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        head_dim_v: dv,
        q: View::new(cx.loc(args[0])?, qdt, (hq * d) as u64),
        k_cache: cx.loc(args[1])?,
        v_cache: cx.loc(args[2])?,
        cache_dtype: dtype(cx.g.ty(args[1]).dtype)?,
        pos: cx.loc(args[3])?,
        pos_dtype: dtype(cx.g.ty(args[3]).dtype)?,
        mask,
        out: View::new(cx.loc(v)?, dtype(cx.g.ty(v).dtype)?, (hq * dv) as u64),
        scale: scale as f32,
        max_t: t,
        splits: 1,
        scratch: Loc::arena(0),
    };
    let choice = choose::attention::choose(&p, cx.bucket.b, t, cx.bucket.ctx, cx.target)
        .ok_or_else(|| unsupported("attention", "no tile fits the shared memory".into()))?;
    p.splits = choice.splits;
    let m = cx.bucket.b * t;
    p.scratch = cx.scratch(p.scratch_bytes(m));
    let b = Bucket {
        b: cx.bucket.b,
        t,
        ctx: cx.bucket.ctx,
    };
    let launches = match choice.kernel {
        AttentionKernel::TensorCores(tl) if choice.fused_combine => {
            let fc = FusedCombine {
                counters: cx.counters,
                tiles: SPLIT_COUNTERS,
            };
            vec![(attention::attention_tiles_fused(&p, tl, fc)?, b)]
        }
        kernel => {
            let k = match kernel {
                AttentionKernel::CudaCores(_) => attention::attention(&p)?,
                AttentionKernel::TensorCores(tl) => attention::attention_tiles_tiled(&p, tl)?,
            };
            vec![(k.split, b), (k.combine, b)]
        }
    };
    Ok((launches, KernelChoice::Attention(choice)))
}

fn inv_freq(op: &Op, rotary: u32) -> (Vec<f32>, f32, RopeStyle) {
    let Op::Rope {
        theta,
        scaling,
        style,
        ..
    } = op
    else {
        return (Vec::new(), 1.0, RopeStyle::Half);
    };
    let f = specc_ir::interp::rope_inv_freq(*theta, scaling, rotary as usize);
    let scale = match scaling {
        RopeScaling::Yarn { mscale, .. } => *mscale as f32,
        _ => 1.0,
    };
    let style = match style {
        IrStyle::Half => RopeStyle::Half,
        IrStyle::Interleaved => RopeStyle::Interleaved,
    };
    (f, scale, style)
}

fn matmul_kernels(
    cx: &mut Ctx,
    x: ValueId,
    x_cols: Option<u64>,
    norm: Option<&crate::NormPrologue>,
    mats: &[MatOut],
    epilogue: &Epilogue,
) -> Result<(Launches, KernelChoice), Error> {
    let (mut xv, rows, k) = match x_cols {
        Some(c) => {
            let (v, rows, _) = cx.view(x)?;
            (v.cols_from(c), rows, cx.dims(mats[0].weight)?[1])
        }
        None => cx.view(x)?,
    };
    let b = cx.bucket_for(x).unwrap_or(cx.bucket);
    // One row tile covers up to 64 rows: the weights stream once per tile.
    let row_tile = (rows as u32).clamp(1, specc_kernels_gen::gemv::MAX_ROW_TILE);
    let mut out = Vec::new();
    let mut prologue = match norm {
        Some(n) => Some(RmsNormPrologue {
            weight: cx.loc(n.weight)?,
            dtype: dtype(cx.g.ty(n.weight).dtype)?,
            eps: n.eps as f32,
        }),
        None => None,
    };
    let norm_at = choose::matmul::norm_placement(prologue.is_some(), row_tile);
    if let (NormPlacement::Separate, Some(nm)) = (norm_at, prologue) {
        // x is normalised once into scratch, the matmul reads the result.
        let normed = View::new(cx.scratch(rows * k * xv.dtype.size()), xv.dtype, k);
        let p = RmsNormParams {
            rows: Rows::Fixed(rows as u32),
            heads: 1,
            dim: k as u32,
            x: xv,
            out: normed,
            weight: nm.weight,
            w_dtype: nm.dtype,
            eps: nm.eps,
        };
        out.push((rmsnorm(&p)?, b));
        xv = normed;
        prologue = None;
    }
    // A quantised weight's `w_dtype` is not read (its format is in `QuantWeights`).
    let w_dtype = |cx: &Ctx, m: &MatOut| match m.scale {
        Some(_) => Ok(xv.dtype),
        None => dtype(cx.g.ty(m.weight).dtype),
    };
    let n_of = |cx: &Ctx, m: &MatOut| -> Result<u64, Error> { Ok(cx.dims(m.weight)?[0]) };
    let base =
        |cx: &mut Ctx, m: &MatOut, weights: GemvWeights, n: u64| -> Result<GemvParams, Error> {
            Ok(GemvParams {
                rows: Rows::Fixed(rows as u32),
                row_tile,
                k: k as u32,
                n: n as u32,
                x: xv,
                weights,
                w_dtype: w_dtype(cx, m)?,
                norm: prologue,
                residual: None,
                out: None,
                argmax_partials: None,
                rope: None,
            })
        };
    let target = cx.target;
    let mut cores = Vec::new();
    let mut core_of = |p: &GemvParams, q: Option<&QuantWeights>| {
        let c = match q {
            Some(q) => choose::matmul::quant_core(p, q),
            None => choose::matmul::core(p, rows as u32, target),
        };
        cores.push(c);
        c
    };
    let epilogue_choice = match epilogue {
        Epilogue::Store => {
            for m in mats {
                let n = n_of(cx, m)?;
                let w = cx.loc(m.weight)?;
                let q = quant_single(cx, m)?;
                let mut p = base(cx, m, GemvWeights::Single(w), n)?;
                p.out = Some(cx.view(m.node)?.0);
                let c = core_of(&p, q.as_ref());
                out.push((cx.matmul(&p, &c, rows as u32, q.as_ref())?, b));
            }
            EpilogueChoice::Store
        }
        Epilogue::ResidualAdd { residual, out: o } => {
            let m = &mats[0];
            let n = n_of(cx, m)?;
            let w = cx.loc(m.weight)?;
            let q = quant_single(cx, m)?;
            let mut p = base(cx, m, GemvWeights::Single(w), n)?;
            p.residual = Some(cx.view(*residual)?.0);
            p.out = Some(cx.view(*o)?.0);
            let c = core_of(&p, q.as_ref());
            out.push((cx.matmul(&p, &c, rows as u32, q.as_ref())?, b));
            EpilogueChoice::ResidualAdd
        }
        Epilogue::SiluMul { out: o } => {
            let (gate, up) = (cx.loc(mats[0].weight)?, cx.loc(mats[1].weight)?);
            let n = n_of(cx, &mats[0])?;
            let q = match (quant_single(cx, &mats[0])?, quant_single(cx, &mats[1])?) {
                (None, None) => None,
                (Some(g), Some(u)) if (g.format, g.scale_dtype) == (u.format, u.scale_dtype) => {
                    Some(QuantWeights {
                        scales: GemvWeights::GateUp {
                            gate: scale_loc(&g),
                            up: scale_loc(&u),
                        },
                        ..g
                    })
                }
                _ => {
                    return Err(unsupported(
                        "plan",
                        "gate and up projections stored in different formats".to_string(),
                    ))
                }
            };
            let mut p = base(cx, &mats[0], GemvWeights::GateUp { gate, up }, n)?;
            p.out = Some(cx.view(*o)?.0);
            let c = core_of(&p, q.as_ref());
            out.push((cx.matmul(&p, &c, rows as u32, q.as_ref())?, b));
            EpilogueChoice::SiluMul
        }
        Epilogue::LogitsArgmax { logits, argmax: am } => {
            let m = &mats[0];
            let n = n_of(cx, m)?;
            let w = cx.loc(m.weight)?;
            let q = quant_single(cx, m)?;
            let mut p = base(cx, m, GemvWeights::Single(w), n)?;
            // Logits only the fused argmax reads have no home: they go to scratch.
            p.out = Some(if cx.plan.memory.homes.contains_key(logits) {
                cx.view(*logits)?.0
            } else {
                let dt = dtype(cx.g.ty(*logits).dtype)?;
                View::new(cx.scratch(rows * n * dt.size()), dt, n)
            });
            let Some(a) = am else {
                let c = core_of(&p, q.as_ref());
                out.push((cx.matmul(&p, &c, rows as u32, q.as_ref())?, b));
                let choice = MatmulChoice {
                    rows: rows as u32,
                    row_tile,
                    cores,
                    norm: norm_at,
                    epilogue: EpilogueChoice::Logits,
                };
                return Ok((out, KernelChoice::Matmul(choice)));
            };
            // The kernel is chosen with its partials (they take shared memory), then the
            // partials are sized by that choice.
            p.argmax_partials = Some(Loc::arena(0));
            let c = core_of(&p, q.as_ref());
            let per_row = choose::matmul::partials_per_row(&p, &c);
            let loc = cx.scratch(rows * per_row as u64 * 8);
            p.argmax_partials = Some(loc);
            out.push((cx.matmul(&p, &c, rows as u32, q.as_ref())?, b));
            let ap = ArgmaxParams {
                rows: Rows::Fixed(rows as u32),
                input: ArgmaxInput::Partials {
                    loc,
                    count: per_row,
                },
                out: View::new(cx.loc(*a)?, Dtype::I32, 1),
            };
            out.push((argmax(&ap)?, b));
            EpilogueChoice::LogitsArgmax {
                partials_per_row: per_row,
            }
        }
        Epilogue::RopeKvWrite(r) => {
            // One GEMV over the stacked [q; k; v] weight.
            let names: Vec<String> = mats
                .iter()
                .map(|m| match cx.g.node(m.weight).op.leaf_name() {
                    Some(n) => Ok(n.to_string()),
                    None => Err(unsupported(
                        "plan",
                        "q/k/v weights must be checkpoint weights".to_string(),
                    )),
                })
                .collect::<Result<_, _>>()?;
            let ns: Vec<u64> = mats.iter().map(|m| n_of(cx, m)).collect::<Result<_, _>>()?;
            let n_total: u64 = ns.iter().sum();
            let q = quant_stacked(cx, mats, &ns)?;
            let slot = cx.slot(Slot::ConcatRows(names));
            let p = base(cx, &mats[0], GemvWeights::Single(Loc::table(slot)), n_total)?;
            let (kernels, c, ep) = qkv_rope_kernels(cx, p, rows, &ns, r, q.as_ref())?;
            cores.push(c);
            out.extend(kernels.into_iter().map(|k| (k, b)));
            ep
        }
    };
    let choice = MatmulChoice {
        rows: rows as u32,
        row_tile,
        cores,
        norm: norm_at,
        epilogue: epilogue_choice,
    };
    Ok((out, KernelChoice::Matmul(choice)))
}

/// The q|k|v projection `p` (no epilogue yet) with RoPE and the KV write, as
/// [`choose::matmul::rope_epilogue`] decides: one matmul with the
/// `specc_kernels_gen::qkv_rope` epilogue, or the matmul into scratch and `rope_kv`.
fn qkv_rope_kernels(
    cx: &mut Ctx,
    mut p: GemvParams,
    rows: u64,
    ns: &[u64],
    r: &crate::RopeKvWrite,
    q: Option<&QuantWeights>,
) -> Result<(Vec<KernelSource>, MatmulCore, EpilogueChoice), Error> {
    let (hd, hq, hkv) = (r.head_dim as u32, r.q_heads as u32, r.kv_heads as u32);
    let act = p.x.dtype;
    let rd = rotary_dim(&r.rope, hd);
    let (f, scale, style) = inv_freq(&r.rope, rd);
    // Locations in the order the table slots are handed out.
    let q_out = View::new(cx.loc(r.q_out)?, act, (hq * hd) as u64);
    let (k_cache, v_cache) = (cx.loc(r.k_cache_out)?, cx.loc(r.v_cache_out)?);
    let cache_dtype = dtype(cx.g.ty(r.k_cache_out).dtype)?;
    let (pos, pos_dtype) = (cx.loc(r.positions)?, dtype(cx.g.ty(r.positions).dtype)?);
    let slots = if r.slots == r.positions {
        None
    } else {
        Some((cx.loc(r.slots)?, dtype(cx.g.ty(r.slots).dtype)?))
    };
    let out = QkvRope {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: hd,
        q_out,
        k_cache,
        v_cache,
        cache_dtype,
        pos,
        pos_dtype,
        slots,
        rope: RopeTable {
            style,
            rotary_dim: rd,
            inv_freq: f,
            cos_sin_scale: scale,
        },
    };
    let head_norm = r.q_norm.is_some() || r.k_norm.is_some();
    let ep = choose::matmul::rope_epilogue(&p, hd, rd, head_norm, q.is_some());
    if ep == (EpilogueChoice::RopeKv { fused: true }) {
        p.rope = Some(out);
        let c = choose::matmul::core(&p, rows as u32, cx.target);
        return Ok((vec![cx.matmul(&p, &c, rows as u32, None)?], c, ep));
    }
    let n_total = p.n as u64;
    let qkv = cx.scratch(rows * n_total * act.size());
    let full = View::new(qkv, act, n_total);
    p.out = Some(full);
    let qk_norm = match (&r.q_norm, &r.k_norm) {
        (Some(qn), Some(kn)) => Some(QkNorm {
            q_weight: cx.loc(qn.weight)?,
            k_weight: cx.loc(kn.weight)?,
            dtype: dtype(cx.g.ty(qn.weight).dtype)?,
            eps: qn.eps as f32,
        }),
        _ => None,
    };
    let rp = RopeKvParams {
        out,
        head_dim_v: hd,
        q: full,
        k: full.cols_from(ns[0]),
        v: full.cols_from(ns[0] + ns[1]),
        qk_norm,
    };
    let c = match q {
        Some(q) => choose::matmul::quant_core(&p, q),
        None => choose::matmul::core(&p, rows as u32, cx.target),
    };
    let gemv = cx.matmul(&p, &c, rows as u32, q)?;
    Ok((vec![gemv, rope_kv(&rp)?], c, ep))
}

/// The stored format and scale of matmul `m`'s weight, when it is quantised.
fn quant_single(cx: &mut Ctx, m: &MatOut) -> Result<Option<QuantWeights>, Error> {
    let Some(s) = m.scale else { return Ok(None) };
    let wd = cx.g.ty(m.weight).dtype;
    let format = QuantFormat::of(wd)
        .ok_or_else(|| unsupported("plan", format!("a scale operand on a {wd} weight")))?;
    Ok(Some(QuantWeights {
        format,
        scales: GemvWeights::Single(cx.loc(s)?),
        scale_dtype: dtype(cx.g.ty(s).dtype)?,
    }))
}

fn scale_loc(q: &QuantWeights) -> Loc {
    match q.scales {
        GemvWeights::Single(l) | GemvWeights::GateUp { gate: l, .. } => l,
    }
}

/// The scales of the q|k|v weights stacked by rows (`ns` rows each), when they are
/// quantised: their scale weights stacked the same way, one slot. int4 scales have a row
/// per weight row; fp8 block rows stack only where every part is whole 128-row blocks.
fn quant_stacked(cx: &mut Ctx, mats: &[MatOut], ns: &[u64]) -> Result<Option<QuantWeights>, Error> {
    let qs = mats
        .iter()
        .map(|m| quant_single(cx, m))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = qs[0] else {
        if qs.iter().any(Option::is_some) {
            return Err(unsupported(
                "plan",
                "q/k/v stored in different formats".into(),
            ));
        }
        return Ok(None);
    };
    let same = qs
        .iter()
        .all(|q| q.is_some_and(|q| (q.format, q.scale_dtype) == (first.format, first.scale_dtype)));
    if !same {
        return Err(unsupported(
            "plan",
            "q/k/v stored in different formats".into(),
        ));
    }
    if first.format == QuantFormat::Fp8Block
        && ns.iter().any(|n| !n.is_multiple_of(specc_ir::FP8_BLOCK))
    {
        return Err(unsupported(
            "plan",
            "fp8 q/k/v projections whose rows are not whole 128-row scale blocks".into(),
        ));
    }
    let names = mats
        .iter()
        .map(|m| {
            m.scale
                .and_then(|s| cx.g.node(s).op.leaf_name().map(str::to_string))
                .ok_or_else(|| {
                    unsupported("plan", "q/k/v scales must be checkpoint weights".into())
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let slot = cx.slot(Slot::ConcatRows(names));
    Ok(Some(QuantWeights {
        scales: GemvWeights::Single(Loc::table(slot)),
        ..first
    }))
}

fn rotary_dim(op: &Op, head_dim: u32) -> u32 {
    match op {
        Op::Rope { rotary_dim, .. } => *rotary_dim as u32,
        _ => head_dim,
    }
}
