//! The MLA tiles (`mla_tile` + `mla_combine`) as codegen plans them, compiled by NVRTC for
//! every supported architecture at Kimi-K2 dims (64 heads, 512 + 64) and the DeepSeek-V3
//! fixture dims (4 heads, 32 + 8), decode and verify buckets, causal and tree masks: no
//! spills, no local memory.
//!
//! Skips with a printed reason when NVRTC is absent, unless `SPECC_REQUIRE_NVRTC=1`.

mod mla_cases;

use mla_cases::{plan, Dims, FIXTURE, KIMI};
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
            for k in &pl.kernels {
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
                    }
                    Err(e) => failures.push(format!("{label} [{arch}] {}: {e}", k.name)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
