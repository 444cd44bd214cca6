//! The pass pipeline on the lowered embedded model and on a Llama-3.1-8B-shaped config.

use std::path::Path;

use specc_codegen::{compile, describe_groups, Compiled, Epilogue, GroupKind, Home};
use specc_ir::engine::{Arch, Target};
use specc_ir::{Bindings, Graph};
use specc_models::{lower_dense, ModelSpec};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn default_graph() -> Graph {
    let spec = ModelSpec::from_file(&root().join("models/default/config.json")).unwrap();
    lower_dense(&spec).unwrap()
}

fn llama8b_graph() -> Graph {
    let json = r#"{
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "max_position_embeddings": 131072, "tie_word_embeddings": false,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001
    }"#;
    let spec = ModelSpec::from_json(Path::new("llama8b/config.json"), json).unwrap();
    lower_dense(&spec).unwrap()
}

fn buckets() -> Vec<Bindings> {
    vec![
        Bindings::new(1, 1, 512),
        Bindings::new(1, 8, 512),
        Bindings::new(4, 1, 512),
    ]
}

fn family_counts(c: &Compiled) -> std::collections::BTreeMap<&'static str, usize> {
    let mut m = std::collections::BTreeMap::new();
    for gr in &c.groups {
        *m.entry(gr.family(&c.graph)).or_default() += 1;
    }
    m
}

#[test]
fn dense_layers_fuse_into_five_kernels_each() {
    let c = compile(default_graph(), &buckets()).unwrap();
    let layers = 6;
    let counts = family_counts(&c);
    assert_eq!(counts.get("gemv_qkv_rope"), Some(&layers), "{counts:?}");
    assert_eq!(counts.get("attention"), Some(&layers), "{counts:?}");
    assert_eq!(
        counts.get("gemv_residual"),
        Some(&(2 * layers)),
        "{counts:?}"
    );
    assert_eq!(counts.get("gemv_silu_mul"), Some(&layers), "{counts:?}");
    assert_eq!(counts.get("gemv_lm_head"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("embedding"), Some(&1), "{counts:?}");
    assert_eq!(
        c.groups.len(),
        5 * layers + 2,
        "{}",
        describe_groups(&c.graph, &c.groups)
    );
    // Every matmul group folded its rmsnorm, except the o/down projections which have none.
    for gr in &c.groups {
        if let GroupKind::MatMul { norm, epilogue, .. } = &gr.kind {
            let expect_norm = !matches!(epilogue, Epilogue::ResidualAdd { .. });
            assert_eq!(norm.is_some(), expect_norm, "{:?}", gr.kind);
        }
    }
    insta::assert_snapshot!("default_model_groups", describe_groups(&c.graph, &c.groups));
}

#[test]
fn memory_plan_reuses_the_arena_and_keeps_caches_in_state() {
    let c = compile(default_graph(), &buckets()).unwrap();
    for plan in &c.plans {
        assert!(plan.memory.arena_bytes > 0);
        assert!(
            plan.memory.arena_bytes <= plan.memory.unshared_bytes / 2,
            "arena {} vs unshared {}",
            plan.memory.arena_bytes,
            plan.memory.unshared_bytes
        );
        specc_codegen::check_memory(&plan.memory).unwrap();
        // KV caches are states: the kv_write results share their state's home.
        for (id, n) in c.graph.nodes() {
            if n.op == specc_ir::Op::KvWrite {
                assert!(matches!(plan.memory.homes[&id], Home::State(_)));
            }
        }
    }
}

#[test]
fn llama8b_plan_streams_the_weights_once() {
    let c = compile(llama8b_graph(), &[Bindings::new(1, 1, 1024)]).unwrap();
    let plan = &c.plans[0];
    let total = plan.total_cost();
    // All weights but the embedding table: 32 layers × 218 103 808 + lm_head 525 336 576
    // + norms, in bf16.
    let per_layer: u64 = 2 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096);
    // + the one embedding row gathered.
    let expect: u64 = 32 * per_layer + 2 * 128256 * 4096 + 2 * 4096 + 2 * 4096;
    assert_eq!(total.weight_bytes, expect);
    let h200 = Target::for_archs(&[Arch::Sm90a]);
    let us = total.roofline_us(h200.bytes_per_s as f64, h200.flops_per_s as f64);
    assert!((3400.0..3700.0).contains(&us), "roofline {us} us");
    let report = c.report(&h200);
    assert!(report.contains("gemv_qkv_rope"));
}

/// The physical floor of an 8B decode: the same weights (each read once), the live KV of
/// every layer (k and v, 8 heads of 128, bf16) and the one row written per layer; at a live
/// context below the capacity only the live slots count, and a batch of 4 reads the weights
/// once but four sequences' KV.
#[test]
fn llama8b_physical_floor_counts_weights_once_and_the_live_kv() {
    let bind = Bindings::new(1, 1, 1024);
    let c = compile(llama8b_graph(), std::slice::from_ref(&bind)).unwrap();
    let weights = c.plans[0].total_cost().weight_bytes;
    let slot: u64 = 32 * 2 * 8 * 128 * 2;
    let full = specc_codegen::physical_bytes(&c.graph, &bind, 1024);
    assert_eq!(full.weights, weights);
    assert_eq!(full.kv_read, 1024 * slot);
    assert_eq!(full.kv_written, slot);
    assert!(full.io > 0 && full.io < 1 << 20, "in/out {}", full.io);
    let live = specc_codegen::physical_bytes(&c.graph, &bind, 100);
    assert_eq!(live.kv_read, 100 * slot);
    let beyond = specc_codegen::physical_bytes(&c.graph, &bind, 1 << 20);
    assert_eq!(beyond.kv_read, full.kv_read, "capped at the capacity");
    let b4 = Bindings::new(4, 1, 1024);
    let c4 = compile(llama8b_graph(), std::slice::from_ref(&b4)).unwrap();
    let four = specc_codegen::physical_bytes(&c4.graph, &b4, 1024);
    // Four embedding rows instead of one; everything else once.
    assert_eq!(four.weights, full.weights + 3 * 2 * 4096);
    assert_eq!(four.kv_read, 4 * full.kv_read);
    assert_eq!(four.kv_written, 4 * full.kv_written);
}

#[test]
fn every_pass_is_timed() {
    let c = compile(default_graph(), &buckets()).unwrap();
    let names: Vec<&str> = c.timings.iter().map(|t| t.pass).collect();
    assert_eq!(
        names,
        ["verify", "dce", "fold", "fuse", "schedule", "memory", "launch"]
    );
}

/// Folding: `fill`, `iota` and pure functions of them form no group; each constant a group
/// reads has `Home::Const` holding the interpreter's bytes at that bucket; a constant that
/// is a graph output, or too large (a `Ctx` dim), still runs as a kernel.
#[test]
fn constants_fold_into_homes_with_the_interpreters_bytes() {
    use specc_ir::op::B;
    use specc_ir::{BinaryOp, BucketDim, DType, Dim, Op, TensorType};
    let i32_b = || TensorType::new(DType::I32, [B]);
    let mut g = Graph::new("folding");
    let x = g.input("x", i32_b()).unwrap();
    let seven = g
        .add(
            Op::Fill {
                value: 7.0,
                ty: i32_b(),
            },
            &[],
        )
        .unwrap();
    let idx = g
        .add(
            Op::Iota {
                axis: 0,
                ty: i32_b(),
            },
            &[],
        )
        .unwrap();
    let shifted = g.add(Op::Binary(BinaryOp::Add), &[idx, seven]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Mul), &[x, shifted]).unwrap();
    let wide = TensorType::new(DType::I32, [B, Dim::Bucket(BucketDim::Ctx)]);
    let big = g
        .add(
            Op::Fill {
                value: 1.0,
                ty: wide,
            },
            &[],
        )
        .unwrap();
    let shown = g
        .add(
            Op::Fill {
                value: 2.0,
                ty: i32_b(),
            },
            &[],
        )
        .unwrap();
    g.set_output("y", y);
    g.set_output("big", big);
    g.set_output("shown", shown);
    let c = compile(g, &[Bindings::new(3, 1, 4)]).unwrap();
    let folded: Vec<usize> = (0..c.graph.len()).filter(|&i| c.constants[i]).collect();
    assert_eq!(folded, vec![seven.index(), idx.index(), shifted.index()]);
    let families: Vec<&str> = c.groups.iter().map(|gr| gr.family(&c.graph)).collect();
    assert_eq!(
        families,
        ["mul", "fill", "fill"],
        "one launch per unfolded node"
    );
    let homes = &c.plans[0].memory.homes;
    // iota + 7 at B = 3, as little-endian i32.
    let want: Vec<u8> = [7i32, 8, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(homes[&shifted], Home::Const(want));
    // Constants read only by other constants are never materialised.
    assert!(!homes.contains_key(&seven) && !homes.contains_key(&idx));
    assert!(matches!(homes[&big], Home::Arena { .. }));
    assert!(matches!(homes[&shown], Home::Arena { .. }));
}

/// A DeepSeek-V3 graph (MLA attention, MoE layers) plans to kernels: in f32 the latent
/// attention is the generic kernel; the per-head absorption matmuls, the router and the
/// grouped experts (dispatch, gate/up, down, combine) have their own.
#[test]
fn deepseek_v3_plans_to_kernels() {
    let spec =
        ModelSpec::from_file(&root().join("tests/fixtures/deepseek_v3_qlora/config.json")).unwrap();
    let c = compile(lower_dense(&spec).unwrap(), &buckets()).unwrap();
    let target = Target::for_archs(&[Arch::Sm90a]);
    for p in &c.plans {
        let k = specc_codegen::kernels::plan_kernels(&c.graph, &c.groups, p, &target)
            .unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = k.launches.iter().map(|l| l.kernel.name.as_str()).collect();
        for family in [
            "mla_attention",
            "head_matmul",
            "moe_route",
            "moe_dispatch",
            "moe_gate_up",
            "moe_down",
            "moe_combine",
        ] {
            assert!(
                names.iter().any(|n| n.starts_with(family)),
                "no {family} kernel among {names:?}"
            );
        }
    }
}

/// Quantised DeepSeek-V3 fixtures (int4 routed experts; fp8 Linears with partial edge
/// blocks) plan to kernels that read the stored bytes (`gemv_q`, the grouped experts over
/// quantised stacks), fp8 `kv_b_proj` is dequantised once at upload (no `dequantize` kernel
/// runs per step), and the plan's cost counts what the kernels read: nibbles + scales for
/// int4, fp8 bytes + f32 block scales for fp8 (the upload-time `kv_b` slices at their 16-bit
/// size).
#[test]
fn quantised_deepseek_v3_plans_to_kernels() {
    let target = Target::for_archs(&[Arch::Sm90a]);
    for (name, must) in [
        (
            "deepseek_v3_int4",
            &[
                "moe_dispatch",
                "moe_gate_up_int4g32",
                "moe_down_int4g32",
                "moe_combine",
            ][..],
        ),
        (
            "deepseek_v3_fp8",
            &["gemv_q_fp8e4m3", "moe_gate_up_fp8e4m3", "moe_down_fp8e4m3"][..],
        ),
    ] {
        let model = specc_models::Model::open(root().join("tests/fixtures").join(name)).unwrap();
        let c = compile(lower_dense(model.spec()).unwrap(), &buckets()).unwrap();
        for p in &c.plans {
            let k = specc_codegen::kernels::plan_kernels(&c.graph, &c.groups, p, &target)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let names: Vec<&str> = k.launches.iter().map(|l| l.kernel.name.as_str()).collect();
            for m in must {
                assert!(
                    names.iter().any(|n| n.starts_with(m)),
                    "{name}: no {m} among {names:?}"
                );
            }
            assert!(
                !names.iter().any(|n| n.starts_with("moe_experts")),
                "{name}: the per-token experts remain in {names:?}"
            );
            // fp8 `kv_b_proj` is dequantised and sliced per head once, at upload.
            assert!(
                !names.iter().any(|n| n.starts_with("dequantize")),
                "{name}: a dequantize kernel runs every step: {names:?}"
            );
        }
        // Every weight's stored bytes, once: what the plan's weight bytes are made of.
        let bind = &c.plans[0].bind;
        let stored: u64 = c
            .graph
            .weights()
            .map(|(_, _, ty)| ty.bytes(bind).unwrap())
            .sum();
        let expanded: u64 = c
            .graph
            .weights()
            .map(|(_, _, ty)| {
                let n: u64 = ty
                    .shape
                    .resolve(bind)
                    .unwrap()
                    .iter()
                    .map(|&d| d as u64)
                    .product();
                match ty.dtype {
                    specc_ir::DType::Int4Group { .. } | specc_ir::DType::Fp8E4M3 => 2 * n,
                    _ => ty.bytes(bind).unwrap(),
                }
            })
            .sum();
        assert!(stored < expanded, "{name}: {stored} vs {expanded}");
        // One token reads the dense weights whole and top_k of E experts (and their scales):
        // the plan's weight bytes lie between that floor and all stored bytes, below a
        // bf16 expansion of the quantised tensors.
        let cost: u64 = c
            .groups
            .iter()
            .map(|gr| specc_codegen::group_cost(&c.graph, gr, bind).weight_bytes)
            .sum();
        eprintln!("{name}: plan weight bytes {cost}, stored {stored}, as bf16 {expanded}");
        assert!(
            cost <= stored,
            "{name}: the plan counts {cost} > stored {stored}"
        );
    }
}

/// A decode step's bookkeeping (positions, ring index, lengths: a few integers per op) runs
/// as chains: no two consecutive launches that could share one remain, each chain replaces
/// at least two one-block launches, and the step has far fewer launches than groups.
#[test]
fn decode_step_bookkeeping_runs_as_chains() {
    use specc_kernels_gen::chain::chainable;
    let spec = ModelSpec::from_file(&root().join("models/default/config.json")).unwrap();
    let (_, decode) = specc_models::methods::lower_plain_greedy(&spec, 64).unwrap();
    let c = compile(decode, &[Bindings::new(1, 1, 512)]).unwrap();
    let target = Target::for_archs(&[Arch::Sm90a]);
    let k =
        specc_codegen::kernels::plan_kernels(&c.graph, &c.groups, &c.plans[0], &target).unwrap();
    let chains = k
        .launches
        .iter()
        .filter(|l| l.kernel.family() == "chain")
        .count();
    assert!(chains >= 1, "no chain in the decode step");
    for w in k.launches.windows(2) {
        let joinable =
            chainable(&w[0].kernel) && chainable(&w[1].kernel) && w[0].phase == w[1].phase;
        assert!(
            !joinable,
            "{} and {} could share a chain",
            w[0].kernel.name, w[1].kernel.name
        );
    }
    let groups = c.groups.len();
    println!(
        "{groups} groups, {} launches, {chains} chains",
        k.launches.len()
    );
    assert!(
        k.launches.len() + 10 <= groups,
        "{} launches for {groups} groups",
        k.launches.len()
    );
}
