//! Fused groups: the unit the kernel generator turns into launches.

use specc_ir::ValueId;

/// Index of a group in schedule order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u32);

/// RMSNorm computed in a matmul's prologue: `x * rsqrt(mean(x²) + eps) * weight`.
#[derive(Clone, Debug, PartialEq)]
pub struct NormPrologue {
    pub weight: ValueId,
    pub eps: f64,
    /// The IR rmsnorm node folded in.
    pub node: ValueId,
}

/// Per-head RMSNorm (Qwen3 q_norm / k_norm) applied before RoPE.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadNorm {
    pub weight: ValueId,
    pub eps: f64,
}

/// What happens to the matmul results before they are stored.
#[derive(Clone, Debug, PartialEq)]
pub enum Epilogue {
    /// Each `mats[i].out` is stored as computed.
    Store,
    /// `out = residual + mats[0]` (one matmul).
    ResidualAdd { residual: ValueId, out: ValueId },
    /// `out = silu(mats[0]) * mats[1]` (gate and up; the products are never stored).
    SiluMul { out: ValueId },
    /// `mats = [q, k, v]` viewed as heads of `head_dim`: optional per-head norms, RoPE on q
    /// and k at `positions`, q stored to `q_out`, k and v written into the caches in place
    /// (`k_cache_out` / `v_cache_out` are the IR kv_write results aliasing the states).
    RopeKvWrite(Box<RopeKvWrite>),
    /// `logits = f32(mats[0])` stored, and `argmax` of each row stored as i32 (`argmax`
    /// may be absent when the graph does not use it).
    LogitsArgmax {
        logits: ValueId,
        argmax: Option<ValueId>,
    },
}

/// The RoPE + KV-write epilogue of a q/k/v group (see [`Epilogue::RopeKvWrite`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeKvWrite {
    pub positions: ValueId,
    /// Cache slots of k and v: `positions` itself, or a tree's node slots.
    pub slots: ValueId,
    pub head_dim: u64,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub q_norm: Option<HeadNorm>,
    pub k_norm: Option<HeadNorm>,
    pub rope: specc_ir::Op,
    pub q_out: ValueId,
    pub k_cache_in: ValueId,
    pub v_cache_in: ValueId,
    pub k_cache_out: ValueId,
    pub v_cache_out: ValueId,
}

/// One matmul of a group: `x · weightᵀ` (+ optional dequant scale).
#[derive(Clone, Debug, PartialEq)]
pub struct MatOut {
    pub node: ValueId,
    pub weight: ValueId,
    pub scale: Option<ValueId>,
}

/// MLA's key/value preparation (`crate::fuse_mla`): the `kv_a_proj_with_mqa` result `kva`
/// `[B, T, L + R]` split into the latent, RMSNormed and written to `c_cache`, and the rope
/// key, rotated at `positions` and written to `pe_cache`, both at `slots`.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaKv {
    pub kva: ValueId,
    /// `Some(c)`: the latent and rope key are columns `c ..` of `kva`'s rows (its slice
    /// absorbed into the group: q_a and kv_a as one stacked product), else all of `kva`.
    pub kva_cols: Option<u64>,
    pub norm_weight: ValueId,
    pub eps: f64,
    /// The IR rope node (its op is the rotation).
    pub rope: ValueId,
    pub positions: ValueId,
    pub slots: ValueId,
    /// The IR kv_write results (aliasing the cache states).
    pub c_cache_out: ValueId,
    pub pe_cache_out: ValueId,
}

/// MLA's query split (`crate::fuse_mla`): `q` `[B, T, H, DN + DR]` into the copied `q_nope`
/// (a slice node) and the rotated `q_pe` (the rope node, at `positions`).
#[derive(Clone, Debug, PartialEq)]
pub struct MlaQ {
    pub q: ValueId,
    pub positions: ValueId,
    pub q_nope: ValueId,
    pub q_pe: ValueId,
}

#[derive(Clone, Debug, PartialEq)]
pub enum GroupKind {
    /// One IR node computed by its own kernel.
    Single(ValueId),
    /// Matmuls sharing the input `x` (read once), with an optional norm prologue and an
    /// epilogue.
    MatMul {
        x: ValueId,
        /// `Some(c)`: the matmuls read columns `c .. c + K` of `x`'s rows (a last-axis
        /// slice of `x` absorbed into the group, never stored), else all of `x`.
        x_cols: Option<u64>,
        norm: Option<NormPrologue>,
        mats: Vec<MatOut>,
        epilogue: Epilogue,
    },
    MlaKv(Box<MlaKv>),
    MlaQ(Box<MlaQ>),
}

/// A fused group. Invariants: `nodes` are the IR nodes it computes, in topological order;
/// `inputs` are the values it reads that other groups (or leaves) define; `outputs` are the
/// values it defines that are read outside it (or are graph outputs) and so need storage.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub kind: GroupKind,
    pub nodes: Vec<ValueId>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

impl Group {
    /// Kernel family name, the prefix of generated kernel names.
    pub fn family(&self, g: &specc_ir::Graph) -> &'static str {
        match &self.kind {
            GroupKind::Single(v) => g.node(*v).op.info().name,
            GroupKind::MatMul { epilogue, .. } => match epilogue {
                Epilogue::Store => "gemv",
                Epilogue::ResidualAdd { .. } => "gemv_residual",
                Epilogue::SiluMul { .. } => "gemv_silu_mul",
                Epilogue::RopeKvWrite { .. } => "gemv_qkv_rope",
                Epilogue::LogitsArgmax { .. } => "gemv_lm_head",
            },
            GroupKind::MlaKv(_) => "mla_kv_write",
            GroupKind::MlaQ(_) => "mla_q_split",
        }
    }
}
