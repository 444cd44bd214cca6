//! Every graph the CUDA backend runs (prefills and step graphs of every method) goes through
//! codegen and kernel generation, and every generated kernel compiles with NVRTC for sm_90a,
//! sm_100a and sm_120 — no GPU needed. Skips when NVRTC is absent unless
//! `SPECC_REQUIRE_NVRTC=1`.

use std::path::{Path, PathBuf};

use specc_ir::{Bindings, Graph};
use specc_kernels_gen::plan::plan_kernels;
use specc_kernels_gen::{Arch, Nvrtc};
use specc_models::dflash::DFlashSpec;
use specc_models::eagle3::Eagle3Spec;
use specc_models::spec_step::{
    lower_ddtree_step, lower_decode_step, lower_dflash_prefill, lower_dflash_step,
    lower_draft_model_step, lower_eagle3_prefill, lower_eagle3_step, lower_eagle3_tree_step,
    lower_target_prefill, StepShape, DRAFT_PREFIX,
};
use specc_models::{lower_dense_prefixed, Acceptance, Model, TreeKnobs};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn graphs() -> Vec<(String, Graph, Bindings)> {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    let qwen = Model::open(fixture("qwen3_headdim")).unwrap();
    let eagle = Eagle3Spec::from_dir(&fixture("eagle3_random"), target.spec()).unwrap();
    // block_size 4: k = 3, the shape below.
    let dflash = DFlashSpec::from_dir(&fixture("dflash_random"), target.spec()).unwrap();
    let mut out = Vec::new();
    for acceptance in [
        Acceptance::Greedy,
        Acceptance::Sample {
            temperature: 0.7,
            top_p: 1.0,
            seed: 1,
        },
    ] {
        let shape = StepShape {
            num_steps: 3,
            ring: 32,
            acceptance: acceptance.clone(),
        };
        let tag = if acceptance == Acceptance::Greedy {
            "greedy"
        } else {
            "sample"
        };
        for lanes in [1, 4] {
            let bind = Bindings::new(lanes, 1, 128);
            out.push((
                format!("draft_model step {tag} B={lanes}"),
                lower_draft_model_step(target.spec(), qwen.spec(), &shape).unwrap(),
                bind.clone(),
            ));
            out.push((
                format!("eagle3 step {tag} B={lanes}"),
                lower_eagle3_step(target.spec(), &eagle, &shape).unwrap(),
                bind.clone(),
            ));
            out.push((
                format!("dflash step {tag} B={lanes}"),
                lower_dflash_step(target.spec(), &dflash, &shape).unwrap(),
                bind.clone(),
            ));
            // Sampled trees: one budget and one EAGLE-3 tree (the walk is DDTree's).
            let (budgets, eagle_trees): (&[u32], &[(u64, u32, u32)]) =
                if acceptance == Acceptance::Greedy {
                    (&[16, 80], &[(3, 2, 8), (10, 8, 100)])
                } else {
                    (&[80], &[(3, 2, 8)])
                };
            // 16 nodes (one ancestor word) and 80 (two words).
            for &budget in budgets {
                let tree = TreeKnobs { budget, topk: 4 };
                out.push((
                    format!("ddtree step {tag} budget {budget} B={lanes}"),
                    lower_ddtree_step(target.spec(), &dflash, &shape, tree).unwrap(),
                    bind.clone(),
                ));
            }
            // EAGLE-3 trees: topk 2 / 8 nodes (depth 3), and depth 10 topk 8 with 100
            // nodes (two ancestor words in verify and 72 draft rows in the head).
            for &(depth, topk, budget) in eagle_trees {
                let tree = TreeKnobs { budget, topk };
                let deep = StepShape {
                    num_steps: depth,
                    ..shape.clone()
                };
                out.push((
                    format!(
                        "eagle3 tree step {tag} depth {depth} topk {topk} nodes {budget} B={lanes}"
                    ),
                    lower_eagle3_tree_step(target.spec(), &eagle, &deep, tree).unwrap(),
                    bind.clone(),
                ));
            }
            let mut plain = shape.clone();
            plain.num_steps = 0;
            out.push((
                format!("decode step {tag} B={lanes}"),
                lower_decode_step(qwen.spec(), &plain).unwrap(),
                bind,
            ));
        }
    }
    let pre = Bindings::new(2, 16, 128);
    out.push((
        "target prefill".into(),
        lower_target_prefill(target.spec(), &[]).unwrap(),
        pre.clone(),
    ));
    out.push((
        "target prefill + taps".into(),
        lower_target_prefill(target.spec(), &eagle.taps).unwrap(),
        pre.clone(),
    ));
    out.push((
        "draft prefill".into(),
        lower_dense_prefixed(qwen.spec(), DRAFT_PREFIX).unwrap(),
        pre.clone(),
    ));
    out.push((
        "eagle3 prefill".into(),
        lower_eagle3_prefill(target.spec(), &eagle).unwrap(),
        pre.clone(),
    ));
    out.push((
        "target prefill + dflash taps".into(),
        lower_target_prefill(target.spec(), &dflash.taps).unwrap(),
        pre.clone(),
    ));
    out.push((
        "dflash prefill".into(),
        lower_dflash_prefill(target.spec(), &dflash).unwrap(),
        pre,
    ));
    out
}

/// The row tile a generated GEMV kernel states (`constexpr int MT = …;`).
fn row_tile_of(kernel: &str) -> Option<u32> {
    let rest = kernel.split("constexpr int MT = ").nth(1)?;
    rest.split(';').next()?.trim().parse().ok()
}

#[test]
fn every_graph_plans_to_kernels() {
    for (name, g, bind) in graphs() {
        let c = specc_codegen::compile(g, &[bind]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = plan_kernels(&c.graph, &c.groups, &c.plans[0]).unwrap_or_else(|e| {
            let text = specc_ir::text::print(&c.graph);
            let groups = specc_codegen::describe_groups(&c.graph, &c.groups);
            std::fs::write("/tmp/failed_plan.txt", format!("{text}\n{groups}")).ok();
            panic!("{name}: {e}")
        });
        assert!(!plan.launches.is_empty(), "{name}");
        // Matmuls of more than NORM_FUSED_MAX_ROWS rows (the 80- and 100-node tree verifies)
        // read x normalised by its own rmsnorm launch; smaller row tiles fuse the norm.
        let max = specc_kernels_gen::gemv_mma::NORM_FUSED_MAX_ROWS;
        let mut wide = 0;
        for l in plan
            .launches
            .iter()
            .filter(|l| l.kernel.name.starts_with("gemv"))
        {
            let mt = row_tile_of(&l.kernel.kernel).expect("gemv kernels state their row tile");
            if mt > max {
                wide += 1;
                assert!(
                    !l.kernel.kernel.contains("inv_rms"),
                    "{name}: {} fuses a norm",
                    l.kernel.name
                );
            }
        }
        if (name.starts_with("ddtree step") && name.contains("budget 80"))
            || name.contains("nodes 100")
        {
            assert!(wide > 0, "{name}: no matmul above {max} rows");
        }
        eprintln!(
            "{name}: {} groups, {} launches, arena {} B",
            c.groups.len(),
            plan.launches.len(),
            plan.arena_bytes
        );
    }
}

/// What the CUDA backend generates for the embedded default (its spec's draft_model step, an
/// EAGLE-3 step with sampled acceptance, plain decoding, prefills) and for a Llama-3.1-8B shape.
fn shipped_graphs() -> Vec<(String, Graph, Bindings)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dflt = Model::open(root.join("models/default")).unwrap();
    let cfg = specc_models::SpecConfig::from_file(&root.join("models/default/spec.toml")).unwrap();
    let bundle = specc_models::SpecBundle::open(&dflt, &cfg).unwrap();
    let eagle = Eagle3Spec::from_dir(&root.join("models/default/eagle3"), dflt.spec()).unwrap();
    let sample = StepShape {
        num_steps: 3,
        ring: 32,
        acceptance: Acceptance::Sample {
            temperature: 0.7,
            top_p: 1.0,
            seed: 1,
        },
    };
    let plain = StepShape {
        num_steps: 0,
        ring: 64,
        acceptance: Acceptance::Greedy,
    };
    let ctx = 1024;
    let step = Bindings::new(1, 1, ctx);
    let pre = Bindings::new(1, 16, ctx);
    let cfg8b = root.join("bench/configs/llama-3.1-8b/config.json");
    let spec8b = specc_models::ModelSpec::from_file(&cfg8b).unwrap();
    vec![
        (
            "default: spec step".into(),
            bundle.step.clone(),
            step.clone(),
        ),
        (
            "default: draft prefill".into(),
            bundle.draft_prefill.clone(),
            pre.clone(),
        ),
        (
            "default: eagle3 sampled step".into(),
            lower_eagle3_step(dflt.spec(), &eagle, &sample).unwrap(),
            step.clone(),
        ),
        (
            "default: eagle3 tree step".into(),
            eagle3_tree_step(&dflt),
            step.clone(),
        ),
        (
            "default: decode step".into(),
            lower_decode_step(dflt.spec(), &plain).unwrap(),
            step.clone(),
        ),
        (
            "default: dflash step".into(),
            dflash_step(&dflt),
            step.clone(),
        ),
        (
            "default: ddtree step".into(),
            ddtree_step(&dflt, ""),
            step.clone(),
        ),
        (
            "default: ddtree sampled step".into(),
            ddtree_step(
                &dflt,
                "[acceptance]\nmode = \"sample\"\ntemperature = 0.8\n",
            ),
            step.clone(),
        ),
        (
            "default: prefill".into(),
            lower_target_prefill(dflt.spec(), &[]).unwrap(),
            pre.clone(),
        ),
        (
            "llama-3.1-8b: decode step".into(),
            lower_decode_step(&spec8b, &plain).unwrap(),
            step,
        ),
        (
            "llama-3.1-8b: prefill".into(),
            lower_target_prefill(&spec8b, &[]).unwrap(),
            pre,
        ),
    ]
}

/// The trained DFlash drafter's step graph (k = block_size − 1, greedy).
fn dflash_step(target: &Model) -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/default");
    let text = format!(
        "method = \"dflash\"\ndraft = \"{}\"\n",
        root.join("dflash").display()
    );
    let cfg = specc_models::SpecConfig::from_toml(&root.join("dflash.toml"), &text).unwrap();
    specc_models::SpecBundle::open(target, &cfg).unwrap().step
}

/// The trained drafter as a DDTree step of 80 nodes (two ancestor words; greedy unless
/// `extra` holds an `[acceptance]` table).
fn ddtree_step(target: &Model, extra: &str) -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/default");
    let text = format!(
        "method = \"ddtree\"\ndraft = \"{}\"\nbudget = 80\n{extra}",
        root.join("dflash").display()
    );
    let cfg = specc_models::SpecConfig::from_toml(&root.join("ddtree.toml"), &text).unwrap();
    specc_models::SpecBundle::open(target, &cfg).unwrap().step
}

/// The trained EAGLE-3 head as a draft tree (models/default/spec.eagle3-tree.toml).
fn eagle3_tree_step(target: &Model) -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/default");
    let cfg = specc_models::SpecConfig::from_file(&root.join("spec.eagle3-tree.toml")).unwrap();
    assert!(cfg.tree.is_some(), "topk > 1");
    specc_models::SpecBundle::open(target, &cfg).unwrap().step
}

/// Kernels only a DDTree step has: the tree ops, the tree commit, attention with
/// multi-word masks and RoPE with separate cache slots (`rope_kv`, or the q|k|v GEMV's
/// RoPE epilogue).
fn tree_kernel(name: &str) -> bool {
    [
        "tree_build",
        "tree_select",
        "tree_accept",
        "kv_move",
        "attn_split",
        "attn_tile",
        "rope_kv",
        "gemv_rope",
        "gemv_mma_rope",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

#[test]
fn every_step_kernel_compiles_for_every_arch() {
    let nvrtc = match Nvrtc::new() {
        Ok(n) => n,
        Err(e) => {
            if std::env::var("SPECC_REQUIRE_NVRTC").as_deref() == Ok("1") {
                panic!("NVRTC required but unavailable: {e}");
            }
            eprintln!("SKIPPED: {e} (source scripts/nvrtc-env.sh)");
            return;
        }
    };
    let mut seen = std::collections::HashSet::new();
    let mut jobs = Vec::new();
    for (name, g, bind) in shipped_graphs() {
        let c = specc_codegen::compile(g, &[bind]).unwrap();
        let plan = plan_kernels(&c.graph, &c.groups, &c.plans[0]).unwrap();
        // Every arch for the dense graphs (prefill, decode); the speculative steps' extra
        // kernels (the same families at other shapes and offsets, ~900 of them) for the
        // device's sm_90a only, which keeps a cold-cache CI run within minutes.
        // The EAGLE-3 and DFlash steps only plan here (every_graph_plans_to_kernels): their
        // kernels are the same families as the draft_model step's at other offsets.
        let archs: &[Arch] = if name.contains("prefill") || name.contains("decode") {
            &Arch::ALL
        } else if name.contains("ddtree sampled") {
            // The draws at every tree node: the sampling kernels at the tree's shapes.
            &[Arch::Sm90a]
        } else if name.contains("eagle3") || name.contains("dflash") || name.contains("ddtree") {
            &[]
        } else {
            &[Arch::Sm90a]
        };
        for l in plan.launches {
            // The tree steps' own kernels (every arch); the rest as the DFlash step's.
            let tree_step = name.contains("ddtree") || name.contains("eagle3 tree");
            // Wide matmuls that stage x by bulk copies (mbarrier + cp.async.bulk PTX): every arch.
            let x_staged = l.kernel.kernel.contains("bulk_copy_g2s(");
            let archs = if (tree_step && tree_kernel(&l.kernel.name)) || x_staged {
                &Arch::ALL[..]
            } else {
                archs
            };
            for &arch in archs {
                if seen.insert((l.kernel.name.clone(), arch)) {
                    jobs.push((name.clone(), l.kernel.clone(), arch));
                }
            }
        }
    }
    // NVRTC programs are independent: compile on every core.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = jobs.len().div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for part in jobs.chunks(chunk) {
            let nvrtc = nvrtc.clone();
            sc.spawn(move || {
                for (name, k, arch) in part {
                    nvrtc
                        .compile(k, *arch)
                        .unwrap_or_else(|e| panic!("{name}: {} for {arch}: {e}", k.name));
                }
            });
        }
    });
    eprintln!(
        "{} NVRTC compiles (dense graphs for {:?}, the speculative steps for sm_90a)",
        jobs.len(),
        Arch::ALL
    );
}

/// The embedded default's 80-node DDTree verify (81 rows: row tiles of 64) runs its wide
/// bf16 matmuls whose K is tiled by whole chunks with x staged by bulk copies
/// (`gemv_mma::Feed::XBulk`), the path the device tests of that step then exercise.
#[test]
fn default_tree_verify_stages_x_by_bulk_copies() {
    let (name, g, bind) = shipped_graphs()
        .into_iter()
        .find(|(n, ..)| n == "default: ddtree step")
        .unwrap();
    let c = specc_codegen::compile(g, &[bind]).unwrap();
    let plan = plan_kernels(&c.graph, &c.groups, &c.plans[0]).unwrap();
    let staged: Vec<&str> = plan
        .launches
        .iter()
        .filter(|l| l.kernel.kernel.contains("bulk_copy_g2s("))
        .map(|l| l.kernel.name.as_str())
        .collect();
    assert!(
        staged.iter().all(|n| n.starts_with("gemv_mma_bf16")),
        "{name}: {staged:?}"
    );
    // q|k|v, o and gate/up of every target layer (K = hidden = 256) and the lm-head.
    let layers = 6;
    assert!(
        staged.len() > 3 * layers,
        "{name}: {} launches",
        staged.len()
    );
}

#[test]
fn launches_are_tagged_with_their_part_of_the_step() {
    use specc_kernels_gen::plan::Phase;
    for (name, g, bind) in graphs() {
        let c = specc_codegen::compile(g, &[bind]).unwrap();
        let plan = plan_kernels(&c.graph, &c.groups, &c.plans[0]).unwrap();
        let count = |p: Phase| plan.launches.iter().filter(|l| l.phase == p).count();
        let (d, t, b) = (
            count(Phase::Draft),
            count(Phase::Target),
            count(Phase::Bookkeeping),
        );
        if name.contains("step") || name.starts_with("target prefill") {
            assert!(t > 0, "{name}: no target kernels");
        }
        if name.contains("step") && !name.contains("decode") {
            assert!(
                d > 0 && b > 0,
                "{name}: draft {d}, target {t}, bookkeeping {b}"
            );
        }
        if name.contains("decode") || name.starts_with("target prefill") {
            assert_eq!(d, 0, "{name}");
        }
        // Attention belongs to the model whose q it reads, never to the bookkeeping.
        for l in &plan.launches {
            if l.kernel.name.starts_with("attn_") {
                assert_ne!(l.phase, Phase::Bookkeeping, "{name}: {}", l.kernel.name);
                if name.contains("decode") || name.starts_with("target prefill") {
                    assert_eq!(l.phase, Phase::Target, "{name}: {}", l.kernel.name);
                }
            }
        }
        let attn_in = |p: Phase| {
            plan.launches
                .iter()
                .any(|l| l.kernel.name.starts_with("attn_") && l.phase == p)
        };
        if name.contains("step") && !name.contains("decode") {
            assert!(attn_in(Phase::Draft) && attn_in(Phase::Target), "{name}");
        }
        if name.starts_with("draft prefill") {
            assert!(attn_in(Phase::Draft), "{name}: the draft's attention");
        }
    }
}

/// Matmul groups over two or more token rows with 16-bit weights of x's dtype run on the
/// tensor-core GEMV; so do single rows except the normed single projection (qkv) and the
/// lm-head's argmax (measured faster on CUDA cores); f32 models stay on the CUDA-core one.
#[test]
fn matmuls_of_several_rows_run_on_tensor_cores() {
    use specc_codegen::GroupKind;
    let mut mma = 0;
    for (name, g, bind) in graphs().into_iter().chain(shipped_graphs()) {
        let c = specc_codegen::compile(g, std::slice::from_ref(&bind)).unwrap();
        let plan = plan_kernels(&c.graph, &c.groups, &c.plans[0]).unwrap();
        for l in &plan.launches {
            let GroupKind::MatMul {
                x,
                mats,
                norm,
                epilogue,
            } = &c.groups[l.group].kind
            else {
                continue;
            };
            if !l.kernel.name.starts_with("gemv") {
                continue; // the argmax / rope_kv launches of the group
            }
            let dims = c.graph.ty(*x).shape.resolve(&c.plans[0].bind).unwrap();
            let rows: usize = dims.iter().product::<usize>() / dims.last().unwrap();
            let (xd, wd) = (c.graph.ty(*x).dtype, c.graph.ty(mats[0].weight).dtype);
            let one_row_mma = !matches!(epilogue, specc_codegen::Epilogue::LogitsArgmax { .. })
                && (mats.len() == 2 || norm.is_none());
            let want_mma = (rows >= 2 || one_row_mma)
                && xd == wd
                && matches!(xd, specc_ir::DType::BF16 | specc_ir::DType::F16);
            assert_eq!(
                l.kernel.name.starts_with("gemv_mma_"),
                want_mma,
                "{name}: {} for {rows} rows of {xd} x {wd}",
                l.kernel.name
            );
            mma += want_mma as usize;
        }
    }
    assert!(mma > 0, "no graph has a multi-row bf16 matmul");
    eprintln!("{mma} tensor-core GEMV launches");
}

/// A one-row q|k|v group without per-head q/k norms (Llama decode) is ONE launch: the
/// GEMV with the RoPE + KV-write epilogue (`gemv_rope` / `gemv_mma_rope`). With Qwen3's
/// per-head norms, or more rows than `ROPE_FUSED_MAX_ROWS` (measured slower fused), it
/// stays two: the GEMV into scratch, then `rope_kv`.
#[test]
fn qkv_rope_is_one_launch_without_head_norms() {
    use specc_codegen::{Epilogue, GroupKind};
    let (mut fused, mut split) = (0, 0);
    for (name, g, bind) in graphs() {
        let c = specc_codegen::compile(g, std::slice::from_ref(&bind)).unwrap();
        let plan = plan_kernels(&c.graph, &c.groups, &c.plans[0]).unwrap();
        for (i, gr) in c.groups.iter().enumerate() {
            let GroupKind::MatMul {
                x,
                norm,
                epilogue: Epilogue::RopeKvWrite(r),
                ..
            } = &gr.kind
            else {
                continue;
            };
            let dims = c.graph.ty(*x).shape.resolve(&c.plans[0].bind).unwrap();
            let rows: usize = dims.iter().product::<usize>() / dims.last().unwrap();
            let mut names: Vec<&str> = plan
                .launches
                .iter()
                .filter(|l| l.group == i)
                .map(|l| l.kernel.name.as_str())
                .collect();
            // Wide tiles first normalise x with their own launch.
            if norm.is_some() && rows > specc_kernels_gen::gemv_mma::NORM_FUSED_MAX_ROWS as usize {
                assert!(
                    names[0].starts_with("rmsnorm_"),
                    "{name}: group {i}: {names:?}"
                );
                names.remove(0);
            }
            let max_rows = specc_kernels_gen::gemv_mma::ROPE_FUSED_MAX_ROWS as usize;
            if r.q_norm.is_none() && r.k_norm.is_none() && rows <= max_rows {
                assert!(
                    names.len() == 1
                        && (names[0].starts_with("gemv_rope_")
                            || names[0].starts_with("gemv_mma_rope_")),
                    "{name}: group {i}: {names:?}"
                );
                fused += 1;
            } else {
                assert!(
                    names.len() == 2 && names[1].starts_with("rope_kv_"),
                    "{name}: group {i}: {names:?}"
                );
                split += 1;
            }
        }
    }
    assert!(
        fused > 0 && split > 0,
        "fused {fused}, with head norms {split}"
    );
    eprintln!(
        "{fused} fused q|k|v groups, {split} with per-head norms or many rows on two kernels"
    );
}
