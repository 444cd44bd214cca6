//! Every generic-family fixture (`generic_cases`: every supported op, edge values included)
//! run on the GPU and compared with the IR interpreter evaluating the same one-node graph:
//! bit-exact for integer, bool, data-movement, ranking and sampling results, within the
//! fixture's tolerance for float math. Needs `--features cuda`; skips with a message
//! without a CUDA driver or NVRTC.
//!
//! `cargo test -p specc-kernels-gen --features cuda --test gpu_generic -- --nocapture`

#![cfg(feature = "cuda")]

mod generic_cases;
mod gpu;

use generic_cases::{cases, lay_out, reference, Case, Rng, Tol};
use gpu::{Gpu, Mem};
use specc_ir::interp::Tensor;
use specc_ir::DType;
use specc_kernels_gen::abi::{Bucket, Loc};
use specc_kernels_gen::generic::single;

/// The bytes of `t` as the kernels store it (bool: one byte, 0 or 1).
fn encode(t: &Tensor) -> Vec<u8> {
    let mut out = Vec::new();
    match t.dtype {
        DType::BF16 | DType::F16 | DType::F32 => {
            for &v in t.as_f32().unwrap() {
                match t.dtype {
                    DType::BF16 => out.extend(half::bf16::from_f32(v).to_le_bytes()),
                    DType::F16 => out.extend(half::f16::from_f32(v).to_le_bytes()),
                    _ => out.extend(v.to_le_bytes()),
                }
            }
        }
        d => {
            for &v in t.as_i64().unwrap() {
                match d {
                    DType::I32 => out.extend((v as i32).to_le_bytes()),
                    DType::I64 => out.extend(v.to_le_bytes()),
                    _ => out.push(v as u8),
                }
            }
        }
    }
    out
}

/// Values decoded from device bytes.
enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

fn decode(dtype: DType, bytes: &[u8]) -> Result<Values, String> {
    Ok(match dtype {
        DType::BF16 => Values::F32(
            bytes
                .chunks(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        ),
        DType::F16 => Values::F32(
            bytes
                .chunks(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        ),
        DType::F32 => Values::F32(
            bytes
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        ),
        DType::I32 => Values::I64(
            bytes
                .chunks(4)
                .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64)
                .collect(),
        ),
        DType::I64 => Values::I64(
            bytes
                .chunks(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        ),
        DType::Bool => {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(format!("bool byte {i} is {}, not 0 or 1", bytes[i]));
            }
            Values::I64(bytes.iter().map(|&b| b as i64).collect())
        }
        other => return Err(format!("no decoding for {other}")),
    })
}

fn region(mem: &mut Mem, loc: Loc) -> &mut [u8] {
    match loc {
        Loc::Arena { offset } => &mut mem.arena[offset as usize..],
        Loc::Table { slot, offset } => &mut mem.bufs[slot as usize][offset as usize..],
        Loc::TensorMap(m) => region(mem, m.tensor()),
    }
}

/// Explicit mantissa bits of a float dtype.
fn mantissa(d: DType) -> i32 {
    match d {
        DType::BF16 => 7,
        DType::F16 => 10,
        _ => 23,
    }
}

/// Compares; returns a one-line summary, or the first mismatches.
fn compare(c: &Case, got: &Values, want: &Tensor) -> Result<String, String> {
    let mut bad = Vec::new();
    let mut exact = 0usize;
    let n = want.numel();
    match got {
        Values::I64(g) => {
            let w = want.as_i64().map_err(|e| e.to_string())?;
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                if g == w {
                    exact += 1;
                } else {
                    bad.push(format!("  [{i}] got {g}, want {w}"));
                }
            }
        }
        Values::F32(g) => {
            let w = want.as_f32().map_err(|e| e.to_string())?;
            let eps = 2f64.powi(-mantissa(c.out.0));
            let (rtol, atol) = match c.tol {
                Tol::Exact => (0.0, 0.0),
                Tol::Ulps(k) => (k * eps, k * eps * 1e-30),
                Tol::Math => {
                    let r = eps.max(4.0 * f64::from(f32::EPSILON));
                    (r, r * 1e-30)
                }
                Tol::Close { rtol, atol } => (rtol, atol),
            };
            for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
                let (gd, wd) = (g as f64, w as f64);
                if g == w || (g.is_nan() && w.is_nan()) {
                    exact += 1;
                } else if g.is_nan() || w.is_nan() || (gd - wd).abs() > rtol * wd.abs() + atol {
                    bad.push(format!(
                        "  [{i}] got {g:e}, want {w:e}, tol {:e}",
                        rtol * wd.abs() + atol
                    ));
                }
            }
        }
    }
    if bad.is_empty() {
        Ok(format!("{n} values, {exact} exact"))
    } else {
        Err(format!(
            "{} of {n} outside {:?}:\n{}",
            bad.len(),
            c.tol,
            bad.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
        ))
    }
}

fn check(gpu: &Gpu, index: usize, c: &Case) -> Result<String, String> {
    let mut rng = Rng::new(1000 + index as u64);
    let args: Vec<Tensor> = c.inputs.iter().map(|o| o.tensor(&mut rng)).collect();
    let want = reference(c, &args).map_err(|e| format!("interpreter: {e}"))?;
    let laid = lay_out(c);
    let kernels = single(&c.op, &laid.inputs, &laid.output).map_err(|e| e.to_string())?;
    let mut mem = Mem::new(laid.arena_bytes, &laid.buf_bytes);
    for (a, t) in laid.inputs.iter().zip(&args) {
        let bytes = encode(t);
        region(&mut mem, a.loc)[..bytes.len()].copy_from_slice(&bytes);
    }
    gpu.run(
        &mut mem,
        &kernels.iter().collect::<Vec<_>>(),
        Bucket { b: 1, t: 1, ctx: 1 },
    );
    let out = &laid.output;
    let len = out.numel() as usize * out.dtype.size_bytes().unwrap();
    let got = decode(out.dtype, &region(&mut mem, out.loc)[..len])?;
    compare(c, &got, &want).map(|s| format!("{s}  {}", kernels[0].name))
}

#[test]
fn generic_ops_match_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let all = cases();
    let mut failures = Vec::new();
    for (i, c) in all.iter().enumerate() {
        match check(&gpu, i, c) {
            Ok(s) => println!("ok   {:<52} {s}", c.label),
            Err(e) => {
                println!("FAIL {:<52} {e}", c.label);
                failures.push(format!("{}: {e}", c.label));
            }
        }
    }
    println!(
        "{} of {} fixtures agree with the interpreter",
        all.len() - failures.len(),
        all.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ from the interpreter:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

/// Device time per launch of every fixture's kernel (the mean of 200 launches after a
/// warm-up, inputs as in the parity test, through the kernel ABI's operand tables). Run
/// explicitly:
/// `cargo test -p specc-kernels-gen --features cuda --test gpu_generic -- --ignored --nocapture`
#[test]
#[ignore = "timing, not a check; run with --ignored on a GPU"]
fn generic_kernel_timings() {
    let Some(gpu) = Gpu::new() else { return };
    const REPS: usize = 200;
    println!("{:<52} {:>10}  kernel", "fixture", "us/launch");
    for (i, c) in cases().iter().enumerate() {
        let mut rng = Rng::new(1000 + i as u64);
        let laid = lay_out(c);
        let mut mem = Mem::new(laid.arena_bytes, &laid.buf_bytes);
        for (a, o) in laid.inputs.iter().zip(&c.inputs) {
            let bytes = encode(&o.tensor(&mut rng));
            region(&mut mem, a.loc)[..bytes.len()].copy_from_slice(&bytes);
        }
        let k = single(&c.op, &laid.inputs, &laid.output).unwrap().remove(0);
        let us = gpu.time(&mem, &[&k], Bucket { b: 1, t: 1, ctx: 1 }, 1, REPS);
        println!("{:<52} {us:>10.2}  {}", c.label, k.name);
    }
}
