//! The MLA tiles (`mla_tile` or, on sm_90a at Kimi-K2 dims, `mla_wgmma`, + `mla_combine`)
//! as codegen plans them, compiled by NVRTC for every supported architecture at Kimi-K2 dims
//! (64 heads, 512 + 64) and the DeepSeek-V3 fixture dims (4 heads, 32 + 8), decode and
//! verify buckets, causal and tree masks: no spills, no local memory, no serialized wgmma.
//!
//! Skips with a printed reason when NVRTC is absent, unless `SPECC_REQUIRE_NVRTC=1`.

mod mla_cases;

use mla_cases::{plan, Dims, FIXTURE, KIMI};
use specc_kernels_gen::mla_tile::MlaTileParams;
use specc_kernels_gen::mla_wgmma;
use specc_kernels_gen::{Arch, Nvrtc, Target};

const ARCHS: [Arch; 3] = [Arch::Sm90a, Arch::Sm100a, Arch::Sm120];

/// (label, dims, batch, tokens, ctx, tree).
fn cases() -> Vec<(String, Dims, u64, u64, u64, bool)> {
    let mut out = Vec::new();
    for (name, d) in [("kimi", KIMI), ("fixture", FIXTURE)] {
        for (b, t, ctx, tree) in [
            (1, 1, 8192, false),
            (8, 1, 8192, false),
            (1, 8, 8192, false),
            (3, 2, 1024, false),
            (1, 1, 100, false),
            (2, 4, 1024, true),
        ] {
            out.push((
                format!("{name} B={b} T={t} ctx={ctx} tree={tree}"),
                d,
                b,
                t,
                ctx,
                tree,
            ));
        }
    }
    out
}

#[test]
fn mla_tiles_compile_for_every_arch_without_spills() {
    let Some(nvrtc) = Nvrtc::or_skip() else {
        return;
    };
    let mut failures = Vec::new();
    for arch in ARCHS {
        let target = Target::for_archs(&[arch]);
        for (label, d, b, t, ctx, tree) in cases() {
            let Some(pl) = plan(d, b, t, ctx, tree, &target) else {
                failures.push(format!("{label} [{arch}]: the tiles do not take it"));
                continue;
            };
            // On sm_90a also the variants no plan chooses by default: the cluster fold
            // (`SPECC_MLA_CLUSTER=1`) and the warpgroups' ping-pong.
            let mut kernels = pl.kernels.clone();
            if pl.p.wgmma {
                for (cluster, ping_pong) in
                    [(mla_wgmma::cluster_for(pl.p.splits), false), (1, true)]
                {
                    let p = MlaTileParams {
                        cluster,
                        ping_pong,
                        ..pl.p
                    };
                    if (cluster, ping_pong) != (1, false) {
                        kernels.push(mla_wgmma::tile(&p).unwrap());
                    }
                }
            }
            for k in &kernels {
                match nvrtc.compile(k, arch) {
                    Ok(c) => {
                        let s = c.stats;
                        println!(
                            "{label:<36} {arch:<8} {:<12} splits {:>2} rows/block {:>2} stages {} smem {:>6} regs {:>3} spill {}",
                            k.family(),
                            pl.p.splits,
                            16 * pl.p.block_row_tiles,
                            pl.p.stages,
                            k.launch.smem_bytes,
                            s.registers,
                            s.spill_stores + s.spill_loads
                        );
                        if s.spill_stores + s.spill_loads > 0 || s.stack_bytes > 0 {
                            failures.push(format!("{label} [{arch}] {}: {s:?}", k.name));
                        }
                        // ptxas's C7514 note: the warpgroup mma batches would run one by one.
                        if c.log.contains("serialized") {
                            failures.push(format!(
                                "{label} [{arch}] {}: wgmma serialized: {}",
                                k.name, c.log
                            ));
                        }
                    }
                    Err(e) => failures.push(format!("{label} [{arch}] {}: {e}", k.name)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The fused latent / rope-key write and query split (`generic::mla_prep`) at Kimi-K2 and
/// fixture dims, decode and verify rows.
#[test]
fn mla_prep_kernels_compile_for_every_arch() {
    use specc_ir::op::{RopeScaling, RopeStyle};
    use specc_ir::{DType, Op};
    use specc_kernels_gen::abi::Loc;
    use specc_kernels_gen::generic::mla_prep::{mla_kv_write, mla_q_split, MlaKvWrite, MlaQSplit};
    use specc_kernels_gen::generic::TensorArg;
    let Some(nvrtc) = Nvrtc::or_skip() else {
        return;
    };
    let a = |slot: u32, dtype: DType, dims: &[u64]| TensorArg::new(Loc::table(slot), dtype, dims);
    let bf = DType::BF16;
    let mut failures = Vec::new();
    for (l, r, h, dn) in [(512u64, 64u64, 64u64, 128u64), (32, 8, 4, 16)] {
        let rope = Op::Rope {
            theta: 50_000.0,
            scaling: RopeScaling::None,
            style: RopeStyle::Interleaved,
            rotary_dim: r,
        };
        for (b, t) in [(1u64, 1u64), (8, 8)] {
            let kv = mla_kv_write(&MlaKvWrite {
                kva: &a(0, bf, &[b, t, l + r]),
                // Verify rows read kva as columns of the stacked q_a|kv_a product.
                kva_row_stride: if b == 8 { 1536 + l + r } else { l + r },
                norm_weight: &a(1, bf, &[l]),
                eps: 1e-6,
                rope: &rope,
                positions: &a(2, DType::I32, &[b, t]),
                slots: &a(3, DType::I32, &[b, t]),
                c_cache: &a(4, bf, &[b, 1024, 1, l]),
                pe_cache: &a(5, bf, &[b, 1024, 1, r]),
            })
            .unwrap();
            let q = mla_q_split(&MlaQSplit {
                q: &a(0, bf, &[b, t, h, dn + r]),
                rope: &rope,
                positions: &a(1, DType::I32, &[b, t]),
                q_nope: &a(2, bf, &[b, t, h, dn]),
                q_pe: &a(3, bf, &[b, t, h, r]),
            })
            .unwrap();
            for k in [kv, q] {
                for arch in ARCHS {
                    match nvrtc.compile(&k, arch) {
                        Ok(c) if c.stats.spill_stores + c.stats.spill_loads == 0 => {}
                        Ok(c) => failures.push(format!("{} [{arch}]: {:?}", k.name, c.stats)),
                        Err(e) => failures.push(format!("{} [{arch}]: {e}", k.name)),
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
