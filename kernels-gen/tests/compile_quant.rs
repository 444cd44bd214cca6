//! The quantised kernels (`gemv_q` over int4 / fp8 weights read as stored, the generic
//! `dequantize`, quantised per-token `moe_experts` and the grouped experts over quantised
//! stacks): generated for every case of
//! `quant_cases`, compiled by NVRTC for sm_90a, sm_100a and sm_120 with no register
//! spills; snapshots of the generated text; the kernels refuse what they do not cover.
//!
//! Compilation skips with a printed reason when NVRTC is absent, unless
//! `SPECC_REQUIRE_NVRTC=1`.

mod quant_cases;

use quant_cases::{int4, params, Kind};
use specc_kernels_gen::abi::Dtype;
use specc_kernels_gen::gemv_quant::{gemv_quant, quant_tiling};
use specc_kernels_gen::quant::QuantFormat;
use specc_kernels_gen::{Arch, Nvrtc};

#[test]
fn quantised_kernels_compile_for_every_arch_without_spills() {
    // `SPECC_QUANT_CASES=TEXT`: only the cases whose label contains TEXT (device runs).
    let only = std::env::var("SPECC_QUANT_CASES").unwrap_or_default();
    let mut cases = quant_cases::all();
    cases.retain(|(label, _)| label.contains(&only));
    let Some(nvrtc) = Nvrtc::or_skip() else {
        return;
    };
    let mut failures = Vec::new();
    for (label, k) in &cases {
        for arch in Arch::ALL {
            match nvrtc.compile(k, arch) {
                Ok(c) => {
                    let spills = c.stats.spill_stores + c.stats.spill_loads;
                    println!(
                        "{label:<56} {arch:<8} regs {:>3} spill B {spills:>4}  {}",
                        c.stats.registers, k.name
                    );
                    // Known: ptxas for sm_100a spills a few bytes in the 64-row f32 tile
                    // with 8-element fp8 loads (K = 200); f32 activations are the test
                    // fixtures' dtype, bf16 the deployed one. Printed, not failed.
                    // ptxas for sm_120 spills a few words of the tensor-core int4 experts
                    // in 128-byte stages at their 168 registers (3 blocks an SM), which
                    // sm_90a and sm_100a hold (`int4_tensor_core_experts_fit_every_arch`
                    // bounds it).
                    // A few words of other f32-activation GEMVs spill too (24 bytes
                    // for sm_90a at int4 group 8, K = 40; 16 for sm_100a at fp8, M = 6;
                    // session 51).
                    let f32_few = label.starts_with("gemv_q") && label.contains(" f32 M=");
                    // Pipelined CUDA-core expert tilings (`-p`) spill on sm_100a /
                    // sm_120, which is why `choose::moe` picks them for sm_90a only.
                    let pipelined = label.contains("-p ") && arch != Arch::Sm90a;
                    let known = (arch == Arch::Sm100a && label.contains("f32 M=64"))
                        || (arch == Arch::Sm120 && label.contains(" mma "))
                        || (f32_few && spills <= 32)
                        || pipelined;
                    if spills > 0 && known {
                        println!("KNOWN SPILL {label} [{arch}]: {spills} bytes");
                    } else if spills > 0 {
                        failures.push(format!("{label} [{arch}]: {spills} spill bytes"));
                    }
                }
                Err(e) => failures.push(format!("{label} [{arch}]: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn snap(label: &str, file: &str) {
    let (_, k) = quant_cases::all()
        .into_iter()
        .find(|(l, _)| l == label)
        .unwrap_or_else(|| panic!("no case `{label}`"));
    let description = format!("{label}; launch {:?}", k.launch);
    insta::with_settings!({ description => description, omit_expression => true }, {
        insta::assert_snapshot!(file, k.kernel);
    });
}

#[test]
fn snapshots_of_the_quantised_kernels() {
    snap(
        "gemv_q int4g32 GateUp K=7168 N=2048 bf16 M=1",
        "gemv_q_int4_gate_up_m1",
    );
    snap(
        "gemv_q int4g32 Residual K=2048 N=7168 bf16 M=6",
        "gemv_q_int4_residual_m6",
    );
    snap(
        "gemv_q fp8e4m3 Residual K=200 N=160 f32 M=2",
        "gemv_q_fp8_residual_odd_k",
    );
    snap("moe_experts int4g32", "moe_experts_int4");
    snap("dequantize fp8e4m3", "dequantize_fp8");
    snap(
        "moe_grouped kimi T=16 moe_gate_up_int4g32",
        "moe_gate_up_int4_kimi",
    );
    snap(
        "moe_grouped kimi T=16 moe_down_int4g32",
        "moe_down_int4_kimi",
    );
    snap(
        "moe_grouped kimi g2d4u2-p T=1 moe_down_int4g32",
        "moe_down_int4_kimi_pipelined",
    );
    snap(
        "moe_grouped fixture fp8 T=16 moe_gate_up_fp8e4m3",
        "moe_gate_up_fp8_fixture",
    );
    snap(
        "moe_grouped kimi mma T=16 moe_gate_up_int4g32",
        "moe_gate_up_int4_mma_kimi",
    );
    snap(
        "moe_grouped kimi mma T=16 moe_down_int4g32",
        "moe_down_int4_mma_kimi",
    );
    snap(
        "moe_grouped kimi T=16 moe_dispatch_bf16",
        "moe_dispatch_kimi",
    );
    snap("moe_grouped kimi T=16 moe_combine_bf16", "moe_combine_kimi");
}

/// The grouped experts over quantised stacks read each used expert's stored bytes (int4 /
/// fp8 16-byte loads at these shapes) and scales in its own block column: one grid slot per
/// expert a token may use, never more than the pairs.
#[test]
fn grouped_quantised_experts_read_the_stored_bytes() {
    use quant_cases::grouped::shapes;
    use specc_kernels_gen::generic::moe_grouped::ExpertMatmul;
    for c in shapes() {
        let (label, w, shape) = (&c.label, c.w, c.shape);
        let ks = c.case().kernels();
        let names: Vec<&str> = ks.iter().map(|k| k.name.as_str()).collect();
        let Some(fmt) = QuantFormat::of(w) else {
            continue;
        };
        let load = match (fmt, c.matmul) {
            (_, ExpertMatmul::Int4TensorCores(_)) => "cp_async16_at<0>(dst + wdst0 + 0, src0, ok);",
            (QuantFormat::Int4 { .. }, _) => "ld_stream_words<V / 2>(w",
            (QuantFormat::Fp8Block, _) => "ld_stream_fp8<V>(w",
        };
        for (k, family) in ks
            .iter()
            .zip(["moe_dispatch", "moe_gate_up", "moe_down", "moe_combine"])
        {
            assert!(k.name.starts_with(family), "{label}: {names:?}");
        }
        for k in &ks[1..3] {
            assert!(k.name.contains(&fmt.name()), "{label}: {}", k.name);
            assert!(k.kernel.contains(load), "{label}: {}", k.name);
            let slots = shape.experts.min(shape.pairs()) as u32;
            assert_eq!(
                k.launch.grid[1],
                specc_kernels_gen::abi::Extent::Fixed(slots),
                "{label}"
            );
        }
    }
}

/// The grouped kernels refuse, with a typed reason, what they do not take: scales of the
/// wrong shape, stacks of mixed dtypes, integer activations.
#[test]
fn grouped_quantised_experts_refuse_what_they_do_not_cover() {
    use quant_cases::grouped::shapes;
    use specc_kernels_gen::generic::moe_grouped::{supported, Unsupported};
    let c = shapes().remove(0).case();
    assert_eq!(supported(&c.ops[0], &c.ops[2..], &c.out), Ok(()));
    let mut bad = c.ops.clone();
    bad[5].dims[2] += 1;
    assert!(matches!(
        supported(&bad[0], &bad[2..], &c.out),
        Err(Unsupported::Quant(_))
    ));
    let mut mixed = c.ops.clone();
    mixed[4].dtype = specc_ir::DType::Fp8E4M3;
    assert!(matches!(
        supported(&mixed[0], &mixed[2..], &c.out),
        Err(Unsupported::Weights(_))
    ));
    let mut ints = c.out.clone();
    ints.dtype = specc_ir::DType::I32;
    assert!(matches!(
        supported(&c.ops[0], &c.ops[2..], &ints),
        Err(Unsupported::Activations(_))
    ));
    assert!(matches!(
        supported(&c.ops[0], &c.ops[2..5], &c.out),
        Err(Unsupported::Weights(_))
    ));
}

/// Every weight byte is read once per row tile: one row tile covers up to 64 rows, and the
/// loads are 8 (int4) / 16 (fp8) bytes where K allows.
#[test]
fn one_pass_over_the_weights_per_row_tile() {
    for rows in quant_cases::ROWS {
        let (p, q) = params(int4(), Dtype::BF16, rows, 7168, 2048, Kind::Store);
        let k = gemv_quant(&p, &q).unwrap();
        assert_eq!(k.launch.grid[1], p.rows.extent(1, rows), "M={rows}");
        assert!(k.kernel.contains("ld_stream_int4<VW>"), "{}", k.kernel);
        assert_eq!(quant_tiling(&p, &q).vec, 16);
    }
    let (p, q) = params(QuantFormat::Fp8Block, Dtype::BF16, 1, 136, 128, Kind::Store);
    assert_eq!(quant_tiling(&p, &q).vec, 8);
}

/// What the kernels do not cover is a typed error, not a wrong kernel.
#[test]
fn quantised_kernels_refuse_what_they_do_not_cover() {
    let (mut p, mut q) = params(int4(), Dtype::BF16, 1, 7168, 2048, Kind::Store);
    q.format = QuantFormat::Int4 { group: 48 };
    p.k = 7176;
    let e = gemv_quant(&p, &q).unwrap_err().to_string();
    assert!(e.contains("multiple of 8 and of the int4 group"), "{e}");
    let (p, mut q) = params(
        QuantFormat::Fp8Block,
        Dtype::BF16,
        1,
        7168,
        2048,
        Kind::Store,
    );
    q.scale_dtype = Dtype::BF16;
    let e = gemv_quant(&p, &q).unwrap_err().to_string();
    assert!(e.contains("fp8 block scales must be f32"), "{e}");
    let (p, mut q) = params(int4(), Dtype::BF16, 1, 7168, 2048, Kind::GateUp);
    q.scales = specc_kernels_gen::gemv::GemvWeights::Single(specc_kernels_gen::Loc::table(2));
    let e = gemv_quant(&p, &q).unwrap_err().to_string();
    assert!(e.contains("shape of the weights"), "{e}");
    // A CUDA-core expert tiling outside what the emitters take is refused by name.
    use specc_kernels_gen::generic::moe_grouped::{moe_grouped, CoreTiling, ExpertMatmul};
    let bad = CoreTiling::new(2, 16, 2, true);
    let shape = specc_kernels_gen::generic::moe_grouped::MoeGroupedShape {
        tokens: 1,
        experts: 8,
        hidden: 64,
        ffn: 32,
        top_k: 2,
    };
    let c = quant_cases::grouped::case_with(
        ExpertMatmul::CudaCores(bad),
        specc_ir::DType::Int4Group { group: 32 },
        specc_ir::DType::BF16,
        specc_ir::DType::F32,
        shape,
    );
    let o = &c.ops;
    let e = moe_grouped(shape, c.matmul, &o[0], &o[1], &o[2..], &c.out, &c.scratch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("g2d16u2-p") && e.contains("matmul"), "{e}");
}

/// The tensor-core int4 expert kernels at Kimi-K2.5's shapes (T = 1..16, every tiling) and a
/// small one: every arch compiles them within the registers their launch bounds allow
/// (`65536 / (threads · blocks an SM)`, at most 255), with no spill on sm_90a and sm_100a
/// and at most a few words on sm_120, with no static shared memory (the rings are the launch's
/// dynamic shared memory, `Int4MmaTiling::smem_bytes`).
#[test]
fn int4_tensor_core_experts_fit_every_arch() {
    use quant_cases::grouped::shapes;
    use specc_kernels_gen::generic::moe_grouped::{ExpertMatmul, Int4MmaGeometry};
    /// Spilled bytes (stores + loads) a tiling may have on an arch (see below).
    const MAX_SPILL_BYTES: u64 = 64;
    let Some(nvrtc) = Nvrtc::or_skip() else {
        return;
    };
    let mut failures = Vec::new();
    for c in shapes() {
        let ExpertMatmul::Int4TensorCores(tl) = c.matmul else {
            continue;
        };
        let threads = 32 * tl.warps;
        let max_regs = (65536 / (threads * tl.blocks_per_sm())).min(255) as u64;
        for k in &c.case().kernels()[1..3] {
            assert_eq!(k.launch.smem_bytes as u64, tl.smem_bytes(), "{}", k.name);
            assert_eq!(k.launch.block[0], threads, "{}", k.name);
            for arch in Arch::ALL {
                match nvrtc.compile(k, arch) {
                    Ok(r) => {
                        let s = &r.stats;
                        println!(
                            "{:<22} {:<28} {arch:<8} regs {:>3} spill {} {} smem {} + {}",
                            c.label,
                            k.name,
                            s.registers,
                            s.spill_stores,
                            s.spill_loads,
                            s.smem_bytes,
                            tl.smem_bytes()
                        );
                        // ptxas fills the registers the launch bounds allow with the
                        // unrolled stage: on sm_120 the 128-byte stages spill a few words
                        // at 168 registers, never more; sm_90a (the device) and sm_100a
                        // none.
                        let spill = (s.spill_stores + s.spill_loads) as u64;
                        let spill_limit = if arch == Arch::Sm120 {
                            MAX_SPILL_BYTES
                        } else {
                            0
                        };
                        if spill > spill_limit || s.registers as u64 > max_regs {
                            failures.push(format!("{} {} [{arch}]: {s:?}", c.label, k.name));
                        }
                        assert_eq!(s.smem_bytes, 0, "{}", k.name);
                    }
                    Err(e) => failures.push(format!("{} {} [{arch}]: {e}", c.label, k.name)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
