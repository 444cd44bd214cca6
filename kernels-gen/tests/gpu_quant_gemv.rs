//! The quantised GEMV (`gemv_q`: int4 groups with bf16 scales, fp8 blocks with f32 scales
//! and partial edge blocks) on the GPU against the IR interpreter's `matmul` with a scale
//! operand, at the row counts of decode, verify and trees (1, 2, 6, 16, 64), plain and with
//! the SwiGLU epilogue; the weights are uploaded as the checkpoint stores them.
//! Needs `--features cuda` and a device; skips with a message without a driver or NVRTC.

#![cfg(feature = "cuda")]

mod gpu;
mod quant_cases;

use gpu::quant::{scales, weight};
use gpu::{assert_close, bf16_tol, tensor, Gpu, Mem, Rng};
use quant_cases::{params, Kind, ROWS};
use specc_ir::Op;
use specc_kernels_gen::abi::{Bucket, Dtype, Loc};
use specc_kernels_gen::gemv::GemvWeights;
use specc_kernels_gen::gemv_quant::gemv_quant;
use specc_kernels_gen::quant::QuantFormat;

fn check(gpu: &Gpu, f: QuantFormat, k: usize, n: usize, kind: Kind) {
    let act = Dtype::BF16;
    for rows in ROWS {
        let label = format!("gemv_q {} {kind:?} K={k} N={n} M={rows}", f.name());
        let (p, q) = params(f, act, rows, k as u32, n as u32, kind);
        let kernel = gemv_quant(&p, &q).unwrap_or_else(|e| panic!("{label}: {e}"));
        let mut rng = Rng::new(rows as u64 * 31 + k as u64);
        let x = rng.vec(rows as usize * k, 1.0);
        let mats = if kind == Kind::GateUp { 2 } else { 1 };
        let ws: Vec<_> = (0..mats).map(|_| weight(f, n, k, &mut rng)).collect();
        let ss: Vec<_> = (0..mats).map(|_| scales(f, n, k, &mut rng)).collect();
        let (sdt, sshape, _) = &ss[0];
        let buf_bytes = [
            ws[0].0.len() as u64,
            ws[ws.len() - 1].0.len() as u64,
            (sshape[0] * sshape[1]) as u64 * sdt.size(),
            (sshape[0] * sshape[1]) as u64 * sdt.size(),
            k as u64 * act.size(),
        ];
        let out = p.out.unwrap();
        let arena = out.loc.byte_offset() + (rows as u64 * n as u64 * 4).next_multiple_of(256);
        let mut mem = Mem::new(arena, &buf_bytes);
        mem.put(p.x.loc, act, &x);
        let (wlocs, slocs) = match (p.weights, q.scales) {
            (GemvWeights::Single(w), GemvWeights::Single(s)) => (vec![w], vec![s]),
            (GemvWeights::GateUp { gate, up }, GemvWeights::GateUp { gate: sg, up: su }) => {
                (vec![gate, up], vec![sg, su])
            }
            _ => unreachable!(),
        };
        for i in 0..mats {
            let Loc::Table { slot, .. } = wlocs[i] else {
                unreachable!()
            };
            mem.bufs[slot as usize].copy_from_slice(&ws[i].0);
            mem.put(slocs[i], *sdt, &ss[i].2);
        }
        gpu.run(
            &mut mem,
            &[&kernel],
            Bucket {
                b: 1,
                t: rows,
                ctx: 1,
            },
        );
        let got = mem.get(out.loc, act, rows as usize * n);

        let mut r = gpu::Reference::new();
        let xv = r.input("x", tensor(act, &[rows as usize, k], &x));
        let prods: Vec<_> = (0..mats)
            .map(|i| {
                let w = r.input(&format!("w{i}"), ws[i].1.clone());
                let s = r.input(&format!("s{i}"), tensor(*sdt, sshape, &ss[i].2));
                r.op(Op::MatMul, &[xv, w, s])
            })
            .collect();
        let y = if mats == 2 {
            r.op(Op::SiluMul, &[prods[0], prods[1]])
        } else {
            prods[0]
        };
        let want = r.run(&[("y", y)]).remove("y").unwrap();
        let (rtol, atol) = bf16_tol(&want);
        assert_close(&label, &got, &want, rtol, atol);
    }
}

#[test]
fn int4_gemv_matches_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let i4 = QuantFormat::Int4 { group: 32 };
    check(&gpu, i4, 256, 96, Kind::Store);
    check(&gpu, i4, 512, 200, Kind::GateUp);
    check(&gpu, QuantFormat::Int4 { group: 8 }, 40, 24, Kind::Store);
}

#[test]
fn fp8_gemv_matches_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    // Partial edge blocks in both directions (160 rows, 200 columns), 8-element loads.
    check(&gpu, QuantFormat::Fp8Block, 200, 160, Kind::Store);
    check(&gpu, QuantFormat::Fp8Block, 256, 144, Kind::GateUp);
}
