//! How a warp of the grouped expert kernels streams its weight rows: per step of `32 · V`
//! columns each lane reads one 16-byte load (int4: 32 nibbles; fp8: 16 bytes; float: 16
//! bytes; narrower only where the rows or int4 groups ask for it) of each of its rows, and
//! issues the loads of `U` steps (a trip, [`super::CoreTiling`]'s `unroll`) before it
//! consumes any of them, so that `U · rows` independent loads are in flight per lane;
//! pipelined, the next trip's are issued before the current trip's are consumed.
//!
//! The weights are consumed in chunks of [`X_CHUNK`] columns: the chunk's activations of
//! every token of the pass (16 bytes of bf16 each) are loaded once and multiplied with every
//! row. Quantised loads carry one scale (int4 groups and fp8 blocks cover whole loads), so
//! the scale is applied once per load and row: `acc += s · Σ x·q` (fp8), and for int4 the
//! nibbles are read as `unit = 1 + u/16` (`int4_unit`, no float op) with
//! `acc += 16·s · (Σ x·unit − 1.5·Σ x)` — exactly `Σ x·(u − 8)·s` in real arithmetic.
//!
//! Batch invariance: a token's partial sums are one fixed sequence of f32 operations per lane
//! (columns in increasing order, the same chunks and steps), whatever the pass size `TB` or
//! the other tokens of the pass; the warp reduction is a fixed butterfly.

use super::{Stacks, NAMES};
use crate::quant::QuantFormat;
use crate::writer::{emit, Writer};

/// Columns of activations a lane converts at once (16 bytes of bf16; one int4 word).
const X_CHUNK: u64 = 8;

/// Elements per weight load of a quantised stack with rows of `k` columns: int4 32 (16
/// bytes), or 16 / 8 where `k` or the group is not a multiple (one scale per load); fp8 8
/// bytes (16 spilled on sm_90a at DeepSeek-V3's shapes), 4 where `k` asks for it. `None`:
/// int4 groups under 8 columns.
pub(super) fn quant_vec(format: QuantFormat, k: u64) -> Option<u64> {
    match format {
        QuantFormat::Int4 { group } => [32u64, 16, 8]
            .into_iter()
            .find(|&v| k.is_multiple_of(v) && (group as u64).is_multiple_of(v)),
        QuantFormat::Fp8Block => Some((format.vec(k) as u64).min(8)),
    }
}

/// Emits the K loop of a warp over its `RW` rows of stacks `mats` (`j` the position in
/// `mats`): `acc<j>[r][b] += Σ_i x_b[i] · w_r[i]` for the pass's `TB` tokens (`xrow[b]` the
/// activation row of `b`, valid where `b < nb`). Reads the constants `RW`, `V`, `U`,
/// `ROWS`, `TB` and `lane`, `j0`, the expert pointers `w?e` / `s?e`. `guard_rows`: the row
/// tiles overrun `ROWS`. A trip is `unroll` (`U`) steps: their loads are issued before any
/// is consumed; `pipelined`, the next trip's loads are issued (into a second set of
/// registers) before the current trip's are consumed.
pub(super) fn stream_rows(
    w: &mut Writer,
    st: &Stacks,
    mats: &[usize],
    k_dim: u64,
    xt: &str,
    guard_rows: bool,
    (unroll, pipelined): (u64, bool),
) {
    let v = st.vec(mats[0]);
    let trips = Trips {
        st,
        mats,
        guard_k: !k_dim.is_multiple_of(32 * v * unroll),
        guard_rows,
        raw: pipelined,
    };
    emit!(w, "constexpr long long K = {k_dim};");
    emit!(w, "constexpr int XC = {};", v.min(X_CHUNK));
    if pipelined {
        w.comment("Loads of the next trip are in flight while this trip's are consumed.");
        trips.declare(w, "n");
        trips.issue(w, "(long long)lane * V", "n");
    } else {
        w.comment("One trip: the loads of U steps of every row, then their products.");
    }
    w.line("#pragma unroll 1");
    w.for_block(
        "long long i0 = lane * V",
        "i0 < K",
        "i0 += 32 * V * U",
        |w| {
            trips.declare(w, "");
            if pipelined {
                trips.take(w);
                w.if_block("i0 + 32 * V * U < K", |w| {
                    trips.issue(w, "i0 + 32 * V * U", "n")
                });
            } else {
                trips.issue(w, "i0", "");
            }
            trips.consume(w, xt);
        },
    );
}

/// The loads of one warp's trips over stacks `mats`.
struct Trips<'a> {
    st: &'a Stacks<'a>,
    mats: &'a [usize],
    /// The last trip overruns K (its steps past K load nothing).
    guard_k: bool,
    /// The row tiles overrun `ROWS` (rows past it load zeros).
    guard_rows: bool,
    /// Scales are held as stored until consumed (pipelined trips).
    raw: bool,
}

impl Trips<'_> {
    /// A trip's registers, their names suffixed by `sfx`.
    fn declare(&self, w: &mut Writer, sfx: &str) {
        for (j, &m) in self.mats.iter().enumerate() {
            declare(w, self.st, m, &format!("{j}{sfx}"), self.raw);
        }
    }

    /// Issues the loads of the trip starting at column `base` into the registers suffixed
    /// `sfx`.
    fn issue(&self, w: &mut Writer, base: &str, sfx: &str) {
        let (st, mats) = (self.st, self.mats);
        w.for_unrolled("u", 0, "U", |w| {
            emit!(w, "const long long i = {base} + u * 32 * V;");
            w.for_unrolled("r", 0, "RW", |w| {
                let mut conds = Vec::new();
                if self.guard_k {
                    conds.push("i < K");
                }
                if self.guard_rows {
                    conds.push("j0 + r < ROWS");
                }
                let load_all = |w: &mut Writer| {
                    for (j, &m) in mats.iter().enumerate() {
                        load(w, st, m, &format!("{j}{sfx}"), self.raw);
                    }
                };
                if conds.is_empty() {
                    load_all(w);
                } else {
                    w.if_else(conds.join(" && "), load_all, |w| {
                        for (j, &m) in mats.iter().enumerate() {
                            zero(w, st, m, &format!("{j}{sfx}"), self.raw);
                        }
                    });
                }
            });
        });
    }

    /// Moves the next trip's registers into the current trip's.
    fn take(&self, w: &mut Writer) {
        for (j, &m) in self.mats.iter().enumerate() {
            let words = match self.st.format(m) {
                Some(QuantFormat::Int4 { .. }) => "V / 8",
                _ => "V",
            };
            w.for_unrolled("u", 0, "U", |w| {
                w.for_unrolled("r", 0, "RW", |w| {
                    emit!(
                        w,
                        "for (int v = 0; v < {words}; ++v) w{j}[u][r][v] = w{j}n[u][r][v];"
                    );
                    if self.st.format(m).is_some() {
                        emit!(w, "sc{j}[u][r] = sc{j}n[u][r];");
                    }
                });
            });
        }
    }

    /// The products of every step of the trip at `i0`.
    fn consume(&self, w: &mut Writer, xt: &str) {
        w.for_unrolled("u", 0, "U", |w| {
            w.line("const long long i = i0 + u * 32 * V;");
            if self.guard_k {
                w.if_block("i < K", |w| consume(w, self.st, self.mats, xt, self.raw));
            } else {
                consume(w, self.st, self.mats, xt, self.raw);
            }
        });
    }
}

/// This trip's registers of stack `m` (named `w<n>`, `sc<n>`): `[U][RW][V]` as f32 (float
/// and fp8 stacks, fp8 unscaled) or `[U][RW][V / 8]` int4 words, and `[U][RW]` scales: f32
/// (int4's times 16), or as stored where `raw` (converted where consumed, so no instruction
/// waits on a load the pipelined trip just issued; ptxas for sm_100a / sm_120 spills that
/// form, ≈ 1 KB a thread in `moe_down`, so it is chosen for sm_90a only).
fn declare(w: &mut Writer, st: &Stacks, m: usize, n: &str, raw: bool) {
    let sc = if raw { st.scale_c_type(m) } else { "float" };
    match st.format(m) {
        None => emit!(w, "float w{n}[U][RW][V];"),
        Some(QuantFormat::Int4 { .. }) => {
            emit!(w, "unsigned int w{n}[U][RW][V / 8];");
            emit!(w, "{sc} sc{n}[U][RW];");
        }
        Some(QuantFormat::Fp8Block) => {
            emit!(w, "float w{n}[U][RW][V];");
            emit!(w, "{sc} sc{n}[U][RW];");
        }
    }
}

/// Loads row `j0 + r`, columns `i .. i + V` of stack `m` (and its scale: int4's times 16,
/// or as stored where `raw`) into `w<n>[u][r]`, `sc<n>[u][r]`.
fn load(w: &mut Writer, st: &Stacks, m: usize, n: &str, raw: bool) {
    let nm = NAMES[m];
    let Some(fmt) = st.format(m) else {
        emit!(
            w,
            "ld_stream_vec<V, {}>(w{nm}e + (long long)(j0 + r) * K + i, w{n}[u][r]);",
            st.c_type(m)
        );
        return;
    };
    let k = st.k(m);
    let rb = fmt.row_bytes(k);
    let scale = if raw {
        fmt.scale_at(&format!("s{nm}e"), "j0 + r", "i", k)
    } else {
        fmt.scale_expr(&format!("s{nm}e"), "j0 + r", "i", k)
    };
    let int4_scale = if raw {
        scale.clone()
    } else {
        format!("16.0f * {scale}")
    };
    match fmt {
        QuantFormat::Int4 { .. } => {
            emit!(
                w,
                "ld_stream_words<V / 2>(w{nm}e + (long long)(j0 + r) * {rb} + i / 2, w{n}[u][r]);"
            );
            emit!(w, "sc{n}[u][r] = {int4_scale};");
        }
        QuantFormat::Fp8Block => {
            emit!(
                w,
                "ld_stream_fp8<V>(w{nm}e + (long long)(j0 + r) * {rb} + i, w{n}[u][r]);"
            );
            emit!(w, "sc{n}[u][r] = {scale};");
        }
    }
}

/// Zeros where a row or step is past the matrix (never stored, but never undefined).
fn zero(w: &mut Writer, st: &Stacks, m: usize, n: &str, raw: bool) {
    match st.format(m) {
        None => w.line(format_args!(
            "for (int v = 0; v < V; ++v) w{n}[u][r][v] = 0.0f;"
        )),
        Some(f) => {
            let (len, z) = match f {
                QuantFormat::Int4 { .. } => ("V / 8", "0u"),
                QuantFormat::Fp8Block => ("V", "0.0f"),
            };
            emit!(w, "for (int v = 0; v < {len}; ++v) w{n}[u][r][v] = {z};");
            if raw {
                emit!(w, "sc{n}[u][r] = from_f32<{}>(0.0f);", st.scale_c_type(m));
            } else {
                emit!(w, "sc{n}[u][r] = 0.0f;");
            }
        }
    }
}

/// The products of step `u` (columns `i .. i + V`) with the pass's activations.
fn consume(w: &mut Writer, st: &Stacks, mats: &[usize], xt: &str, raw: bool) {
    let fmt = st.format(mats[0]);
    let int4 = matches!(fmt, Some(QuantFormat::Int4 { .. }));
    let target = |j: usize| {
        if fmt.is_some() {
            format!("s{j}[r][b]")
        } else {
            format!("acc{j}[r][b]")
        }
    };
    if fmt.is_some() {
        for j in 0..mats.len() {
            emit!(w, "float s{j}[RW][TB] = {{}};");
        }
    }
    if int4 {
        w.line("float xs[TB] = {};");
    }
    w.for_unrolled("c", 0, "V / XC", |w| {
        w.line("float xv[TB][XC];");
        w.for_unrolled("b", 0, "TB", |w| {
            w.if_else(
                "b < nb",
                |w| emit!(w, "ld_vec<XC, {xt}>(xrow[b] + i + c * XC, xv[b]);"),
                |w| w.line("for (int e = 0; e < XC; ++e) xv[b][e] = 0.0f;"),
            );
        });
        if int4 {
            w.for_unrolled("b", 0, "TB", |w| {
                w.for_unrolled("e", 0, "XC", |w| w.line("xs[b] += xv[b][e];"));
            });
        }
        w.for_unrolled("r", 0, "RW", |w| {
            for j in 0..mats.len() {
                let t = target(j);
                w.for_unrolled("e", 0, "XC", |w| {
                    let wv = if int4 {
                        emit!(w, "const float f = int4_unit(w{j}[u][r][c], e);");
                        "f".to_string()
                    } else {
                        format!("w{j}[u][r][c * XC + e]")
                    };
                    w.for_unrolled("b", 0, "TB", |w| {
                        emit!(w, "{t} = fmaf(xv[b][e], {wv}, {t});");
                    });
                });
            }
        });
    });
    if fmt.is_some() {
        w.comment("One scale per load and row.");
        w.for_unrolled("r", 0, "RW", |w| {
            for j in 0..mats.len() {
                w.for_unrolled("b", 0, "TB", |w| {
                    let sum = if int4 {
                        format!("fmaf(-1.5f, xs[b], s{j}[r][b])")
                    } else {
                        format!("s{j}[r][b]")
                    };
                    let scale = match (raw, int4) {
                        (false, _) => format!("sc{j}[u][r]"),
                        (true, true) => format!("16.0f * to_f32(sc{j}[u][r])"),
                        (true, false) => format!("to_f32(sc{j}[u][r])"),
                    };
                    emit!(w, "acc{j}[r][b] = fmaf({scale}, {sum}, acc{j}[r][b]);");
                });
            }
        });
    }
}
