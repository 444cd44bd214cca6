//! Quantised DeepSeek-V3 targets on the CUDA backend: the int4 fixture (routed experts as
//! compressed-tensors `pack-quantized`, the layout of Kimi-K2-Thinking / K2.5) and the fp8
//! block fixture (every Linear but the router, partial edge blocks), their weights uploaded
//! as stored and dequantised inside the kernels (`gemv_q`, the generic `dequantize` and
//! quantised `moe_experts`). Checked against the CPU interpreter (logits and greedy tokens)
//! and HF transformers (the fixtures' logits over the exactly dequantised weights): plain
//! decoding and draft_model speculation (the target as its own draft) at B = 1 and 4, in
//! the one captured graph per step. The kernel-level check of the quantised GEMV at 1–64
//! rows is `kernels-gen/tests/gpu_quant_gemv.rs`. Run with `--features cuda`; without a driver
//! every test prints why it skipped and passes.

#![cfg(feature = "cuda")]

mod common;
mod gpu_common;

use gpu_common::{
    build_engine, build_logits_engine, drive, fixture, gpu, greedy_cpu, hf_reference, rel_l2,
    rel_l2_f32, session, spread_prompts,
};
use specc_models::{Model, SpecConfig};
use specc_runtime::DraftKind;

const FIXTURES: [&str; 2] = ["deepseek_v3_int4", "deepseek_v3_fp8"];

/// `b` prompts of different lengths inside the fixtures' 256-token vocabulary.
fn prompts(b: usize) -> Vec<Vec<u32>> {
    spread_prompts(b, 4, (41, 13, 5), 256)
}

/// Prefill logits: CUDA vs the HF logits stored with the fixture and vs the interpreter.
/// The fixtures are f32 (activations and products in f32 on both sides); the bound is
/// the bf16 one of `gpu_deepseek`, and the measured figures are printed.
#[test]
fn prefill_logits_match_hf_and_the_interpreter() {
    if !gpu() {
        return;
    }
    for name in FIXTURES {
        let target = Model::open(fixture(name)).unwrap();
        let (ids, want) = hf_reference(&fixture(name));
        let engine = build_logits_engine(&target, 256, None);
        let mut s = session(&engine, &target, None, 1);
        let got = s.prefill_logits(&ids).unwrap();
        assert_eq!(got.len(), want.len());
        let (_, cpu) = target.logits(&target.load_weights_f32(), &ids).unwrap();
        let (hf, interp) = (rel_l2(&got, &want), rel_l2_f32(&got, &cpu));
        eprintln!(
            "{name}: CUDA logits rel L2 vs HF transformers {hf:.2e}, vs the interpreter {interp:.2e}"
        );
        assert!(hf <= 2e-2, "{name}: rel L2 vs HF {hf}");
        assert!(interp <= 1e-2, "{name}: rel L2 vs the interpreter {interp}");
    }
}

/// Plain decoding at B = 1 and 4: the CUDA tokens equal the interpreter's greedy tokens,
/// one graph launch per step.
#[test]
fn decode_matches_cpu() {
    if !gpu() {
        return;
    }
    for name in FIXTURES {
        let target = Model::open(fixture(name)).unwrap();
        for b in [1usize, 4] {
            let ps = prompts(b);
            let (engine, _) = build_engine(&target, None, &[b as u32], 256);
            let mut s = session(&engine, &target, None, b);
            assert_eq!(s.contract().kind, DraftKind::None);
            let got = drive(&mut s, &ps, 24);
            for (lane, p) in ps.iter().enumerate() {
                assert_eq!(
                    got[lane],
                    greedy_cpu(&target, p, 24),
                    "{name} B={b} lane {lane}"
                );
            }
            assert_eq!(
                (s.engine.dev.counters().graph_launches() - s.prefill_replays()) as usize,
                s.stats.steps
            );
        }
        eprintln!("{name}: 24 tokens at B=1,4 match the CPU backend");
    }
}

/// draft_model with the quantised target as its own draft (full acceptance: every verify
/// row of the quantised kernels is used), B = 1 and 4: output equals the interpreter's
/// greedy tokens.
#[test]
fn draft_model_is_exact() {
    if !gpu() {
        return;
    }
    for name in FIXTURES {
        let dir = fixture(name);
        let target = Model::open(&dir).unwrap();
        let body = format!("method = \"draft_model\"\ndraft = {dir:?}\nnum_steps = 3\n");
        let cfg = SpecConfig::from_toml(&dir.join("spec.gpu.toml"), &body).unwrap();
        for lanes in [1usize, 4] {
            let (engine, bundle) = build_engine(&target, Some(&cfg), &[lanes as u32], 256);
            let bundle = bundle.unwrap();
            let mut s = session(&engine, &target, Some(&bundle), lanes);
            assert_eq!(s.contract().kind, DraftKind::Model);
            let ps = prompts(lanes);
            let got = drive(&mut s, &ps, 24);
            for (b, p) in ps.iter().enumerate() {
                assert_eq!(
                    got[b],
                    greedy_cpu(&target, p, 24),
                    "{name} B={lanes} lane {b}"
                );
            }
            let mean = s.stats.mean_accept_len();
            eprintln!("{name} self-draft k=3 B={lanes}: exact; mean acceptance {mean:.2}");
            assert!(mean > 3.0, "{name} B={lanes}: acceptance {mean}");
        }
    }
}
