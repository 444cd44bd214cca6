//! Every graph the CUDA backend runs (prefills and step graphs of every method) goes through
//! the one build (`specc_codegen::build`: the pass pipeline, kernel choices, kernel
//! generation) into an engine whose plans are asserted on here as values: each fused
//! group's family and kernel choice ([`GroupCost`]), each launch's group, phase and
//! geometry. With NVRTC present every generated kernel also compiles for sm_90a, sm_100a
//! and sm_120 — no GPU needed; the compile test skips when NVRTC is absent unless
//! `SPECC_REQUIRE_NVRTC=1`.

use std::sync::OnceLock;

use specc_codegen::choose::gemm::{
    GEMM_MIN_COLUMNS, GEMM_MIN_ROWS, WGMMA_MIN_COLUMNS, WGMMA_MIN_ROWS,
};
use specc_codegen::choose::matmul::{NORM_FUSED_MAX_ROWS, ROPE_FUSED_MAX_ROWS};
use specc_codegen::{build, BuildOptions, Built, Compiled, Cubins, Epilogue, GroupKind};
use specc_ir::engine::choice::{
    EpilogueChoice, ExpertMatmul, Feed, MatmulChoice, MatmulCore, NormPlacement,
};
use specc_ir::engine::{
    Arch, BucketPlan, BuildInput, GraphRole, GroupCost, Launch, Phase, RoleGraph, StepContract,
    Target,
};
use specc_ir::{Bindings, BucketDim, DType, Graph, Op};
use specc_kernels_gen::Nvrtc;
use specc_models::methods::dflash::DFlashSpec;
use specc_models::methods::eagle3::Eagle3Spec;
use specc_models::methods::{
    lower_ddtree_step, lower_decode_step, lower_dflash_prefill, lower_dflash_step,
    lower_draft_model_step, lower_eagle3_prefill, lower_eagle3_step, lower_eagle3_tree_step,
    lower_target_prefill, StepShape, DRAFT_PREFIX,
};
use specc_models::{lower_dense_prefixed, Acceptance, Model, TreeKnobs};

mod common;
mod deepseek_drafters;

use common::{default_model, fixture, repo_path};

/// The fixtures' graphs: every method's step (greedy and sampled, B = 1 and 4), plain
/// decoding and the prefills.
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
            top_k: None,
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
        lower_target_prefill(target.spec(), &[], &Acceptance::Greedy).unwrap(),
        pre.clone(),
    ));
    out.push((
        "target prefill + taps".into(),
        lower_target_prefill(target.spec(), &eagle.taps, &Acceptance::Greedy).unwrap(),
        pre.clone(),
    ));
    out.push((
        "draft prefill".into(),
        lower_dense_prefixed(qwen.spec(), DRAFT_PREFIX, Phase::Draft).unwrap(),
        pre.clone(),
    ));
    out.push((
        "eagle3 prefill".into(),
        lower_eagle3_prefill(target.spec(), &eagle).unwrap(),
        pre.clone(),
    ));
    out.push((
        "target prefill + dflash taps".into(),
        lower_target_prefill(target.spec(), &dflash.taps, &Acceptance::Greedy).unwrap(),
        pre.clone(),
    ));
    out.push((
        "dflash prefill".into(),
        lower_dflash_prefill(target.spec(), &dflash).unwrap(),
        pre,
    ));
    out
}

/// What the CUDA backend generates for the embedded default (its spec's draft_model step, an
/// EAGLE-3 step with sampled acceptance, plain decoding, prefills) and for a Llama-3.1-8B shape.
fn shipped_graphs() -> Vec<(String, Graph, Bindings)> {
    let root = default_model();
    let dflt = Model::open(&root).unwrap();
    let cfg = specc_models::SpecConfig::from_file(&root.join("spec.toml")).unwrap();
    let bundle = specc_models::SpecBundle::open(&dflt, &cfg).unwrap();
    let eagle = Eagle3Spec::from_dir(&root.join("eagle3"), dflt.spec()).unwrap();
    let sample = StepShape {
        num_steps: 3,
        ring: 32,
        acceptance: Acceptance::Sample {
            temperature: 0.7,
            top_k: None,
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
    let cfg8b = repo_path("bench/configs/llama-3.1-8b/config.json");
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
            lower_target_prefill(dflt.spec(), &[], &Acceptance::Greedy).unwrap(),
            pre.clone(),
        ),
        (
            "llama-3.1-8b: decode step".into(),
            lower_decode_step(&spec8b, &plain).unwrap(),
            step,
        ),
        (
            "llama-3.1-8b: prefill".into(),
            lower_target_prefill(&spec8b, &[], &Acceptance::Greedy).unwrap(),
            pre,
        ),
    ]
}

/// The trained DFlash drafter's step graph (k = block_size − 1, greedy).
fn dflash_step(target: &Model) -> Graph {
    let root = default_model();
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
    let root = default_model();
    let text = format!(
        "method = \"ddtree\"\ndraft = \"{}\"\nbudget = 80\n{extra}",
        root.join("dflash").display()
    );
    let cfg = specc_models::SpecConfig::from_toml(&root.join("ddtree.toml"), &text).unwrap();
    specc_models::SpecBundle::open(target, &cfg).unwrap().step
}

/// The trained EAGLE-3 head as a draft tree (models/default/spec.eagle3-tree.toml).
fn eagle3_tree_step(target: &Model) -> Graph {
    let root = default_model();
    let cfg = specc_models::SpecConfig::from_file(&root.join("spec.eagle3-tree.toml")).unwrap();
    assert!(cfg.tree.is_some(), "topk > 1");
    specc_models::SpecBundle::open(target, &cfg).unwrap().step
}

/// Kernels only a DDTree step has: the tree ops, the tree commit, attention with
/// multi-word masks and RoPE with separate cache slots (`rope_kv`, or the q|k|v GEMV's
/// RoPE epilogue).
fn is_tree_family(family: &str) -> bool {
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
    .contains(&family)
}

/// The role a graph of these lists plays in an engine (by its name).
fn role_of(name: &str) -> GraphRole {
    if name.contains("decode step") {
        GraphRole::Decode
    } else if name.contains("step") {
        GraphRole::SpecStep
    } else if name.contains("target prefill +") {
        GraphRole::SpecTargetPrefill
    } else if name.contains("draft prefill")
        || name.contains("eagle3 prefill")
        || name.contains("dflash prefill")
    {
        GraphRole::DraftPrefill
    } else {
        GraphRole::Prefill
    }
}

/// One graph at its bucket: its name and the pass pipeline's output (the group kinds the
/// kernel choices are asserted against).
struct Case {
    name: String,
    compiled: Compiled,
}

/// The engine of a list of graphs (each at its one bucket) for `target`: `plans[i]` is
/// the plan of `cases[i]`.
struct Planned {
    target: Target,
    built: Built,
    cases: Vec<Case>,
}

fn input_of(list: &[(String, Graph, Bindings)]) -> BuildInput {
    BuildInput {
        architecture: "step_kernels".into(),
        max_context: list
            .iter()
            .map(|(_, _, b)| b.get(BucketDim::Ctx).unwrap_or(1))
            .max()
            .unwrap_or(1),
        graphs: list
            .iter()
            .map(|(name, g, bind)| RoleGraph {
                role: role_of(name),
                graph: g.clone(),
                buckets: vec![bind.clone()],
            })
            .collect(),
        plain: StepContract::plain(64),
        spec: None,
        spec_toml: None,
        acceptance: Acceptance::Greedy,
        checkpoints: Vec::new(),
        random_seed: None,
        synthetic_acceptance: None,
    }
}

impl Planned {
    fn build(list: Vec<(String, Graph, Bindings)>, target: Target) -> Planned {
        let opts = BuildOptions {
            cubins: Cubins::IfAvailable,
            ..BuildOptions::default()
        };
        let built = match build(input_of(&list), &target, &opts) {
            Ok(b) => b,
            Err(e) => {
                // Name the graph: the first that fails alone.
                for one in &list {
                    if let Err(e) = build(input_of(std::slice::from_ref(one)), &target, &opts) {
                        panic!("{}: {e}", one.0);
                    }
                }
                panic!("the graphs build alone but not together: {e}")
            }
        };
        let cases: Vec<Case> = list
            .into_iter()
            .map(|(name, g, bind)| {
                let compiled = specc_codegen::compile(g, std::slice::from_ref(&bind))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                Case { name, compiled }
            })
            .collect();
        assert_eq!(
            built.engine.plans.len(),
            cases.len(),
            "one plan per graph and bucket, in build order"
        );
        for (c, p) in cases.iter().zip(&built.engine.plans) {
            assert_eq!(p.role, role_of(&c.name), "{}", c.name);
            assert_eq!(
                p.groups.len(),
                c.compiled.groups.len(),
                "{}: one cost per fused group",
                c.name
            );
        }
        Planned {
            target,
            built,
            cases,
        }
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &Compiled, &BucketPlan)> {
        self.cases
            .iter()
            .zip(&self.built.engine.plans)
            .map(|(c, p)| (c.name.as_str(), &c.compiled, p))
    }

    fn plan(&self, name: &str) -> (&Compiled, &BucketPlan) {
        self.iter()
            .find(|(n, ..)| *n == name)
            .map(|(_, c, p)| (c, p))
            .unwrap_or_else(|| panic!("no graph {name:?}"))
    }

    fn kernel_name(&self, plan: &BucketPlan, i: usize) -> &str {
        &self.built.engine.kernels[plan.launches[i].kernel as usize].name
    }

    /// The kernel family of launch `i` of `plan` (kernels are named
    /// `{family}_{dtype}_{hash8}`).
    fn family(&self, plan: &BucketPlan, i: usize) -> &str {
        let name = self.kernel_name(plan, i);
        name.rsplitn(3, '_').last().unwrap_or(name)
    }

    /// The generated text of launch `i`'s kernel.
    fn text(&self, plan: &BucketPlan, i: usize) -> &str {
        &self.built.sources[plan.launches[i].kernel as usize].kernel
    }

    /// The launches of group `g` of `plan`, in order.
    fn group_launches(&self, plan: &BucketPlan, g: usize) -> Vec<usize> {
        (0..plan.launches.len())
            .filter(|&i| plan.launches[i].group as usize == g)
            .collect()
    }
}

/// The fixtures' graphs of every method, built for sm_90a.
fn every_graph() -> &'static Planned {
    static P: OnceLock<Planned> = OnceLock::new();
    P.get_or_init(|| Planned::build(graphs(), Target::for_archs(&[Arch::Sm90a])))
}

/// The embedded default's and the 8B shape's graphs, built for sm_90a.
fn shipped() -> &'static Planned {
    static P: OnceLock<Planned> = OnceLock::new();
    P.get_or_init(|| Planned::build(shipped_graphs(), Target::for_archs(&[Arch::Sm90a])))
}

/// Token rows of a matmul group's x at its plan's bucket.
fn rows_of(c: &Compiled, x: specc_ir::ValueId) -> usize {
    let dims = c.graph.ty(x).shape.resolve(&c.plans[0].bind).unwrap();
    dims.iter().product::<usize>() / dims.last().unwrap()
}

/// The kernel families a group's choice names, in launch order.
fn choice_families(cost: &GroupCost) -> Vec<&str> {
    cost.choice.families()
}

/// Which of `groups` groups run inside a chain launch (`chain_mixed_*`): from the chain's
/// own group up to the group of the launch after it (or the last group).
fn chained_groups(p: &Planned, plan: &BucketPlan, groups: usize) -> Vec<bool> {
    let mut chained = vec![false; groups];
    for (i, l) in plan.launches.iter().enumerate() {
        if p.family(plan, i) != "chain" {
            continue;
        }
        let end = plan
            .launches
            .get(i + 1)
            .map_or(groups, |next| next.group as usize);
        assert!(
            end > l.group as usize + 1,
            "a chain runs two groups or more"
        );
        for c in &mut chained[l.group as usize..end] {
            *c = true;
        }
    }
    chained
}

/// The matmul choice of group `g` of `plan` (a panic names the graph otherwise).
fn matmul_choice<'a>(name: &str, plan: &'a BucketPlan, g: usize) -> &'a MatmulChoice {
    plan.groups[g]
        .choice
        .matmul()
        .unwrap_or_else(|| panic!("{name}: group {g} is a matmul without a matmul choice"))
}

#[test]
fn every_graph_plans_to_kernels() {
    let p = every_graph();
    let smem = p.target.smem_per_block;
    for (name, c, plan) in p.iter() {
        assert!(!plan.launches.is_empty(), "{name}");
        // Launches in schedule order of their groups, with a geometry the target runs.
        let mut last = 0;
        for (i, l) in plan.launches.iter().enumerate() {
            assert!(l.group >= last, "{name}: launch {i} out of schedule order");
            last = l.group;
            assert!(
                l.grid.iter().chain(&l.block).all(|&d| d >= 1),
                "{name}: launch {i}: grid {:?} block {:?}",
                l.grid,
                l.block
            );
            let threads: u32 = l.block.iter().product();
            assert!(threads <= 1024, "{name}: launch {i}: {threads} threads");
            assert!(
                l.smem_bytes <= smem,
                "{name}: launch {i}: {} B of shared memory, the target allows {smem}",
                l.smem_bytes
            );
        }
        // Every group launched, alone or in a chain; its cost names the group's own family,
        // and its choice the families of its launches. A chain launch carries its first
        // group and runs the groups up to the next launch's: one-launch generic groups.
        let chained = chained_groups(p, plan, c.groups.len());
        for (g, (gr, cost)) in c.groups.iter().zip(&plan.groups).enumerate() {
            assert_eq!(cost.family, gr.family(&c.graph), "{name}: group {g}");
            let launched: Vec<&str> = p
                .group_launches(plan, g)
                .into_iter()
                .map(|i| p.family(plan, i))
                .collect();
            if chained[g] {
                assert!(
                    launched.is_empty() || launched == ["chain"],
                    "{name}: group {g} is chained but also launches {launched:?}"
                );
                assert_eq!(
                    choice_families(cost),
                    [cost.family.as_str()],
                    "{name}: group {g}: a chain member is one generic kernel"
                );
                continue;
            }
            assert!(
                !launched.is_empty(),
                "{name}: group {g} ({}) never launches",
                cost.family
            );
            assert_eq!(choice_families(cost), launched, "{name}: group {g}");
        }
        // Matmuls of more than NORM_FUSED_MAX_ROWS rows read x normalised by their own
        // rmsnorm launch; smaller row tiles fuse the norm. The kernels agree: no wide one
        // computes an RMS.
        let mut wide = 0;
        for (g, gr) in c.groups.iter().enumerate() {
            let GroupKind::MatMul { x, norm, .. } = &gr.kind else {
                continue;
            };
            let m = matmul_choice(name, plan, g);
            let rows = rows_of(c, *x);
            assert_eq!(m.rows as usize, rows, "{name}: group {g}");
            let want = match (norm.is_some(), rows > NORM_FUSED_MAX_ROWS as usize) {
                (false, _) => NormPlacement::None,
                (true, false) => NormPlacement::Prologue,
                (true, true) => NormPlacement::Separate,
            };
            assert_eq!(m.norm, want, "{name}: group {g}: {}", plan.groups[g].choice);
            if m.row_tile > NORM_FUSED_MAX_ROWS {
                wide += 1;
                for i in p.group_launches(plan, g) {
                    let fuses = p.family(plan, i).starts_with("gemv")
                        && p.text(plan, i).contains("inv_rms");
                    assert!(!fuses, "{name}: {} fuses a norm", p.kernel_name(plan, i));
                }
            }
        }
        if (name.starts_with("ddtree step") && name.contains("budget 80"))
            || name.contains("nodes 100")
        {
            assert!(
                wide > 0,
                "{name}: no matmul above {NORM_FUSED_MAX_ROWS} rows"
            );
        }
        eprintln!(
            "{name}: {} groups, {} launches, arena {} B",
            plan.groups.len(),
            plan.launches.len(),
            plan.arena_bytes
        );
    }
}

/// The dense graphs (prefill, decode) and the DDTree / EAGLE-3 tree steps of the embedded
/// default (tree ops, tree commit, multi-word attention masks, x staged by bulk copies)
/// built for every arch at once; the other speculative steps' kernels (the same families
/// at other shapes and offsets) for sm_90a only, which keeps a cold-cache CI run within
/// minutes.
fn every_arch() -> Planned {
    let list: Vec<_> = shipped_graphs()
        .into_iter()
        .filter(|(n, ..)| {
            n.contains("prefill")
                || n.contains("decode")
                || n == "default: ddtree step"
                || n == "default: eagle3 tree step"
        })
        .collect();
    Planned::build(list, Target::for_archs(&Arch::ALL))
}

/// Every module of `p` holds a cubin for every arch of its target, and every kernel its
/// ptxas figures for each.
fn assert_compiled(what: &str, p: &Planned) {
    let e = &p.built.engine;
    assert!(e.uncompiled.is_none(), "{what}: {:?}", e.uncompiled);
    assert!(!e.modules.is_empty(), "{what}: no modules");
    for (m, module) in e.modules.iter().enumerate() {
        for &arch in &p.target.archs {
            assert!(
                module.cubins.iter().any(|c| c.arch == arch && c.bytes > 0),
                "{what}: module {} has no {arch} cubin",
                module.name
            );
            assert!(e.cubin(m as u32, arch).is_some(), "{what}: {}", module.name);
        }
    }
    for k in &e.kernels {
        for &arch in &p.target.archs {
            assert!(
                k.stats.iter().any(|s| s.arch == arch),
                "{what}: kernel {} not compiled for {arch}",
                k.name
            );
        }
    }
    eprintln!(
        "{what}: {} kernels in {} modules for {:?}",
        e.kernels.len(),
        e.modules.len(),
        p.target.archs
    );
}

#[test]
fn every_step_kernel_compiles_for_every_arch() {
    if let Err(e) = Nvrtc::new() {
        if std::env::var("SPECC_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("NVRTC required but unavailable: {e}");
        }
        specc_ir::testing::skip(format!("{e} (source scripts/nvrtc-env.sh)"));
        return;
    }
    assert_compiled("shipped graphs (sm_90a)", shipped());
    let all = every_arch();
    assert_compiled("dense graphs and tree steps (every arch)", &all);
    // The tree steps' own kernels are among those compiled for every arch.
    for name in ["default: ddtree step", "default: eagle3 tree step"] {
        let (_, plan) = all.plan(name);
        let tree = (0..plan.launches.len())
            .filter(|&i| is_tree_family(all.family(plan, i)))
            .count();
        assert!(tree > 0, "{name}: no tree kernels");
    }
}

/// The embedded default's 80-node DDTree verify (81 rows: row tiles of 64) runs its wide
/// bf16 matmuls whose K is tiled by whole chunks with operands staged by the copy engine
/// (`Feed::Tma` or `Feed::XBulk`), the path the device tests of that step then exercise.
#[test]
fn default_tree_verify_stages_operands_by_the_copy_engine() {
    let p = shipped();
    let name = "default: ddtree step";
    let (c, plan) = p.plan(name);
    let copied = |f: Feed| matches!(f, Feed::Tma { .. } | Feed::XBulk { .. });
    let xbulk = |core: &MatmulCore| matches!(core, MatmulCore::TensorCores(t) if copied(t.feed));
    let staged: Vec<usize> = (0..c.groups.len())
        .filter(|&g| {
            let cores = plan.groups[g].choice.matmul().map(|m| m.cores.as_slice());
            cores.unwrap_or_default().iter().any(xbulk)
        })
        .collect();
    for &g in &staged {
        let GroupKind::MatMul { x, mats, .. } = &c.groups[g].kind else {
            panic!("{name}: group {g} stages x outside a matmul");
        };
        let (xd, wd) = (c.graph.ty(*x).dtype, c.graph.ty(mats[0].weight).dtype);
        assert_eq!((xd, wd), (DType::BF16, DType::BF16), "{name}: group {g}");
        assert!(
            rows_of(c, *x) > NORM_FUSED_MAX_ROWS as usize,
            "{name}: group {g}"
        );
        // The kernels the choice names are those that run.
        let bulk = p
            .group_launches(plan, g)
            .into_iter()
            .any(|i| p.family(plan, i) == "gemv_mma" && p.text(plan, i).contains("bulk_copy_g2s("));
        assert!(bulk, "{name}: group {g} chose copies its kernel lacks");
    }
    // q|k|v, o and gate/up of every target layer (K = hidden = 256) and the lm-head.
    let layers = 6;
    assert!(staged.len() > 3 * layers, "{name}: {} groups", staged.len());
}

#[test]
fn launches_are_tagged_with_their_part_of_the_step() {
    let p = every_graph();
    for (name, _, plan) in p.iter() {
        let count = |ph: Phase| plan.launches.iter().filter(|l| l.phase == ph).count();
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
        let attention = |l: &Launch| plan.groups[l.group as usize].family == "attention";
        for (i, l) in plan.launches.iter().enumerate() {
            if attention(l) {
                let k = p.kernel_name(plan, i);
                assert_ne!(l.phase, Phase::Bookkeeping, "{name}: {k}");
                if name.contains("decode") || name.starts_with("target prefill") {
                    assert_eq!(l.phase, Phase::Target, "{name}: {k}");
                }
            }
        }
        let attn_in = |ph: Phase| plan.launches.iter().any(|l| attention(l) && l.phase == ph);
        if name.contains("step") && !name.contains("decode") {
            assert!(attn_in(Phase::Draft) && attn_in(Phase::Target), "{name}");
        }
        if name.starts_with("draft prefill") {
            assert!(attn_in(Phase::Draft), "{name}: the draft's attention");
        }
    }
}

/// Matmul groups over two or more token rows with 16-bit weights of x's dtype run on tensor
/// cores: the tiled GEMM from `GEMM_MIN_ROWS` rows on weights of `GEMM_MIN_COLUMNS` columns,
/// the GEMV otherwise; so do single rows except
/// the normed single projection (qkv) and the lm-head's argmax (measured faster on CUDA
/// cores); f32 models stay on the CUDA-core one.
#[test]
fn matmuls_of_several_rows_run_on_tensor_cores() {
    let mut mma = 0;
    for p in [every_graph(), shipped()] {
        for (name, c, plan) in p.iter() {
            for (g, gr) in c.groups.iter().enumerate() {
                let GroupKind::MatMul {
                    x,
                    mats,
                    norm,
                    epilogue,
                    ..
                } = &gr.kind
                else {
                    continue;
                };
                let m = matmul_choice(name, plan, g);
                let rows = rows_of(c, *x);
                let (xd, wd) = (c.graph.ty(*x).dtype, c.graph.ty(mats[0].weight).dtype);
                let one_row_mma = !matches!(epilogue, Epilogue::LogitsArgmax { .. })
                    && (mats.len() == 2 || norm.is_none());
                let want_mma = (rows >= 2 || one_row_mma)
                    && xd == wd
                    && matches!(xd, DType::BF16 | DType::F16);
                let cols = c.graph.ty(mats[0].weight).shape.dims()[0].as_static();
                let want_gemm = want_mma
                    && rows >= GEMM_MIN_ROWS as usize
                    && cols.is_some_and(|n| n >= GEMM_MIN_COLUMNS as u64);
                for core in &m.cores {
                    assert_eq!(
                        matches!(
                            core,
                            MatmulCore::TensorCores(_) | MatmulCore::Gemm(_) | MatmulCore::Wgmma(_)
                        ),
                        want_mma,
                        "{name}: group {g} ({}) for {rows} rows of {xd} x {wd}",
                        plan.groups[g].choice
                    );
                    // The sm_90a wgmma GEMM only from its thresholds, on bf16; where it does
                    // not take the operands the tiled GEMM's own thresholds hold.
                    if matches!(core, MatmulCore::Wgmma(_)) {
                        assert!(
                            want_mma
                                && xd == DType::BF16
                                && rows >= WGMMA_MIN_ROWS as usize
                                && cols.is_some_and(|n| n >= WGMMA_MIN_COLUMNS as u64),
                            "{name}: group {g} ({}) wgmma for {rows} rows",
                            plan.groups[g].choice
                        );
                        mma += 1;
                        continue;
                    }
                    assert_eq!(
                        matches!(core, MatmulCore::Gemm(_)),
                        want_gemm,
                        "{name}: group {g} ({}) for {rows} rows",
                        plan.groups[g].choice
                    );
                    mma += want_mma as usize;
                }
            }
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
    let (mut fused, mut split) = (0, 0);
    let p = every_graph();
    for (name, c, plan) in p.iter() {
        for (g, gr) in c.groups.iter().enumerate() {
            let GroupKind::MatMul {
                x,
                norm,
                epilogue: Epilogue::RopeKvWrite(r),
                ..
            } = &gr.kind
            else {
                continue;
            };
            let rows = rows_of(c, *x);
            let m = matmul_choice(name, plan, g);
            let choice = &plan.groups[g].choice;
            // Wide tiles first normalise x with their own launch.
            if norm.is_some() && rows > NORM_FUSED_MAX_ROWS as usize {
                assert_eq!(
                    m.norm,
                    NormPlacement::Separate,
                    "{name}: group {g}: {choice}"
                );
            }
            let fuse = r.q_norm.is_none() && r.k_norm.is_none();
            if fuse && rows <= ROPE_FUSED_MAX_ROWS as usize {
                let want = EpilogueChoice::RopeKv { fused: true };
                assert_eq!(m.epilogue, want, "{name}: group {g}: {choice}");
                fused += 1;
            } else {
                let want = EpilogueChoice::RopeKv { fused: false };
                assert_eq!(m.epilogue, want, "{name}: group {g}: {choice}");
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

/// Whether NVRTC is usable (it must be under `SPECC_REQUIRE_NVRTC=1`), and the archs to
/// build for: every arch with it, sm_90a (planning only) without.
fn nvrtc_archs() -> (bool, &'static [Arch]) {
    let nvrtc = Nvrtc::new().is_ok();
    if !nvrtc && std::env::var("SPECC_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!("NVRTC required but unavailable");
    }
    (nvrtc, if nvrtc { &Arch::ALL } else { &[Arch::Sm90a] })
}

/// Head dims the split attention kernel once refused (96), or that tile no 16-wide mma
/// fragment (40): the decode step and prefill of a small Llama plan to kernels, attention
/// included, and (with NVRTC) compile for every arch. Their GPU results are checked against
/// the interpreter on the device (`gpu_e2e`'s `uncommon_head_dims_match_cpu`).
#[test]
fn uncommon_head_dims_plan_and_compile() {
    let plain = StepShape {
        num_steps: 0,
        ring: 64,
        acceptance: Acceptance::Greedy,
    };
    let mut list = Vec::new();
    for head_dim in [96u32, 80, 40] {
        let cfg = format!(
            r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": {head_dim},
            "num_hidden_layers": 2, "vocab_size": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 1024, "torch_dtype": "bfloat16"}}"#
        );
        let spec =
            specc_models::ModelSpec::from_json(std::path::Path::new("config.json"), &cfg).unwrap();
        list.push((
            format!("head_dim {head_dim}: decode step"),
            lower_decode_step(&spec, &plain).unwrap(),
            Bindings::new(4, 1, 256),
        ));
        list.push((
            format!("head_dim {head_dim}: prefill"),
            lower_target_prefill(&spec, &[], &Acceptance::Greedy).unwrap(),
            Bindings::new(1, 16, 256),
        ));
    }
    let (nvrtc, archs) = nvrtc_archs();
    let p = Planned::build(list, Target::for_archs(archs));
    for (name, _, plan) in p.iter() {
        let attention = (0..plan.launches.len())
            .filter(|&i| p.family(plan, i).starts_with("attn_"))
            .count();
        assert!(attention > 0, "{name}: no attention launch");
    }
    if nvrtc {
        assert_compiled("uncommon head dims (every arch)", &p);
    } else {
        specc_ir::testing::skip("NVRTC absent: planned only (source scripts/nvrtc-env.sh)");
    }
}

/// A DeepSeek-V3 target (MLA, MoE): its prefill, decode step and a draft_model step plan to
/// kernels (the generic MLA and MoE families among them) and, with NVRTC, compile for
/// every arch. Their GPU results are checked on the device (`tests/gpu_deepseek.rs`).
#[test]
fn deepseek_v3_steps_plan_and_compile() {
    let target = Model::open(fixture("deepseek_v3_qlora")).unwrap();
    let draft = Model::open(fixture("deepseek_v3_no_qlora")).unwrap();
    let shape = StepShape {
        num_steps: 3,
        ring: 32,
        acceptance: Acceptance::Greedy,
    };
    let plain = StepShape {
        num_steps: 0,
        ..shape.clone()
    };
    let list = vec![
        (
            "deepseek: decode step".to_string(),
            lower_decode_step(target.spec(), &plain).unwrap(),
            Bindings::new(4, 1, 256),
        ),
        (
            "deepseek: draft_model step".to_string(),
            lower_draft_model_step(target.spec(), draft.spec(), &shape).unwrap(),
            Bindings::new(4, 1, 256),
        ),
        (
            "deepseek: target prefill".to_string(),
            lower_target_prefill(target.spec(), &[], &Acceptance::Greedy).unwrap(),
            Bindings::new(1, 16, 256),
        ),
    ];
    let (nvrtc, archs) = nvrtc_archs();
    let p = Planned::build(list, Target::for_archs(archs));
    for (name, _, plan) in p.iter() {
        let families: Vec<&str> = (0..plan.launches.len())
            .map(|i| p.family(plan, i))
            .collect();
        let grouped_moe = ["moe_dispatch", "moe_gate_up", "moe_down", "moe_combine"];
        for f in ["mla_attention", "head_matmul", "moe_route"]
            .iter()
            .chain(&grouped_moe)
        {
            assert!(
                families.contains(f),
                "{name}: no {f} launch in {families:?}"
            );
        }
        // Every MLA layer's latent / rope-key write and query split are one launch each
        // (`fuse_mla`): no standalone rope or kv_write is left.
        let count = |f: &str| families.iter().filter(|&&x| x == f).count();
        assert!(count("mla_kv_write") > 0, "{name}: no fused MLA write");
        assert_eq!(count("mla_kv_write"), count("mla_q_split"), "{name}");
        assert_eq!(count("rope") + count("kv_write"), 0, "{name}: {families:?}");
    }
    // The q_lora target's q_a and kv_a are one stacked matmul whose two readers, q_b's
    // normed x and the latent write, read their columns in place: no slice is stored.
    for (name, c, _) in p.iter().filter(|(n, ..)| !n.contains("draft_model")) {
        let strided_x = c
            .groups
            .iter()
            .filter(|gr| {
                matches!(
                    gr.kind,
                    GroupKind::MatMul {
                        x_cols: Some(_),
                        ..
                    }
                )
            })
            .count();
        let kv_writes: Vec<_> = c
            .groups
            .iter()
            .filter_map(|gr| match &gr.kind {
                GroupKind::MlaKv(kv) => Some(kv.kva_cols),
                _ => None,
            })
            .collect();
        assert_eq!(kv_writes.len(), 3, "{name}: one latent write a layer");
        assert!(
            kv_writes.iter().all(|c| *c == Some(32)),
            "{name}: {kv_writes:?}"
        );
        assert_eq!(strided_x, 3, "{name}: q_b reads q_a's columns in place");
        let slices = c
            .groups
            .iter()
            .filter(|gr| match gr.kind {
                GroupKind::Single(v) => {
                    let n = c.graph.node(v);
                    matches!(n.op, Op::Slice { .. })
                        && matches!(c.graph.node(n.args[0]).op, Op::MatMul)
                }
                _ => false,
            })
            .count();
        assert_eq!(slices, 0, "{name}: a stored slice of a matmul");
    }
    if nvrtc {
        assert_compiled("deepseek-v3 steps (every arch)", &p);
    } else {
        specc_ir::testing::skip("NVRTC absent: planned only (source scripts/nvrtc-env.sh)");
    }
}

/// The bf16 DeepSeek-V3 fixture takes the fast MLA and MoE kernels: the tensor-core
/// attention tiles with their split combine (causal in decode and prefill, the tree mask in
/// an EAGLE-3 tree verify), the grouped experts, the staged head matmuls; every kernel
/// compiles for every arch. The GPU checks these against the interpreter and HF
/// (`tests/gpu_deepseek.rs`).
#[test]
fn deepseek_v3_bf16_takes_the_tensor_core_mla_and_grouped_moe() {
    let target = Model::open(fixture("deepseek_v3_bf16")).unwrap();
    let plain = StepShape {
        num_steps: 0,
        ring: 32,
        acceptance: Acceptance::Greedy,
    };
    let list = vec![
        (
            "deepseek bf16: decode step".to_string(),
            lower_decode_step(target.spec(), &plain).unwrap(),
            Bindings::new(4, 1, 256),
        ),
        (
            "deepseek bf16: target prefill".to_string(),
            lower_target_prefill(target.spec(), &[], &Acceptance::Greedy).unwrap(),
            Bindings::new(1, 16, 256),
        ),
        (
            "deepseek bf16: eagle3 tree step".to_string(),
            deepseek_eagle3_tree_step(&target),
            Bindings::new(2, 1, 256),
        ),
    ];
    let (nvrtc, archs) = nvrtc_archs();
    let p = Planned::build(list, Target::for_archs(archs));
    for (name, _, plan) in p.iter() {
        let families: Vec<&str> = (0..plan.launches.len())
            .map(|i| p.family(plan, i))
            .collect();
        for f in [
            "mla_tile",
            "mla_combine",
            "head_matmul",
            "moe_dispatch",
            "moe_gate_up",
            "moe_down",
            "moe_combine",
        ] {
            assert!(
                families.contains(&f),
                "{name}: no {f} launch in {families:?}"
            );
        }
        assert!(
            !families.contains(&"mla_attention") && !families.contains(&"moe_experts"),
            "{name}: a generic MLA/MoE kernel remains in {families:?}"
        );
        // The engine records what was chosen, not only the kernels it launches: the grouped
        // experts' matmul (bf16 stacks: the CUDA cores) over the bucket's tokens, and MLA's
        // capacity-fixed splits (256 slots: 2 of 128).
        let moe: Vec<_> = plan.groups.iter().filter_map(|g| g.choice.moe()).collect();
        assert!(!moe.is_empty(), "{name}: no grouped MoE choice recorded");
        for m in &moe {
            assert_eq!(m.matmul, ExpertMatmul::CUDA_CORES, "{name}");
            let rows = plan.bucket.b as u64 * plan.bucket.t as u64;
            // A tree step verifies every node of each sequence's tree, more than T a row.
            if name.contains("tree") {
                assert!(m.tokens > rows, "{name}: {m:?}");
            } else {
                assert_eq!(m.tokens, rows, "{name}");
            }
        }
        let mla: Vec<_> = plan.groups.iter().filter_map(|g| g.choice.mla()).collect();
        assert!(!mla.is_empty(), "{name}: no MLA choice recorded");
        assert!(mla.iter().all(|m| m.splits == 2), "{name}: {mla:?}");
        if name.contains("tree") {
            let tree = (0..plan.launches.len())
                .filter(|&i| p.family(plan, i) == "mla_tile")
                .any(|i| p.text(plan, i).contains("aw[u >> 6]"));
            assert!(tree, "{name}: no mla_tile launch with the tree mask");
        }
    }
    if nvrtc {
        assert_compiled("deepseek-v3 bf16 steps (every arch)", &p);
    } else {
        specc_ir::testing::skip("NVRTC absent: planned only (source scripts/nvrtc-env.sh)");
    }
}

/// An EAGLE-3 tree step (3 steps, top-4, 12 nodes) over a DeepSeek-V3 fixture target.
fn deepseek_eagle3_tree_step(target: &Model) -> Graph {
    let head = deepseek_drafters::eagle3_head_bf16("step_kernels_eagle3_bf16");
    let body = format!(
        "method = \"eagle3\"\ndraft = {head:?}\nnum_steps = 3\ntopk = 4\nnum_draft_tokens = 12\n"
    );
    let cfg =
        specc_models::SpecConfig::from_toml(&fixture("deepseek_v3_bf16").join("spec.toml"), &body)
            .unwrap();
    specc_models::SpecBundle::open(target, &cfg).unwrap().step
}

/// Quantised DeepSeek-V3 targets (int4 routed experts; fp8 Linears with partial edge
/// blocks) build for the GPU: their weights stay as stored (int4 / fp8 slots, never a
/// dequantised copy), the fp8 projections run `gemv_q`, the quantised experts the grouped
/// kernels reading nibbles / fp8 bytes and scales, MLA's fp8 `kv_b` the generic
/// `dequantize`; the plan's bytes count what is stored.
#[test]
fn quantised_deepseek_v3_builds_with_quantised_kernels() {
    let plain = StepShape {
        num_steps: 0,
        ring: 32,
        acceptance: Acceptance::Greedy,
    };
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
        let target = Model::open(fixture(name)).unwrap();
        let list = vec![(
            format!("{name}: decode step"),
            lower_decode_step(target.spec(), &plain).unwrap(),
            Bindings::new(1, 1, 64),
        )];
        let opts = BuildOptions {
            cubins: Cubins::IfAvailable,
            ..BuildOptions::default()
        };
        let built = build(input_of(&list), &Target::for_archs(&[Arch::Sm90a]), &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let names: Vec<&str> = built.sources.iter().map(|k| k.name.as_str()).collect();
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
        assert!(
            !names.iter().any(|n| n.starts_with("dequantize")),
            "{name}: fp8 kv_b is dequantised per step, not at upload: {names:?}"
        );
        let nvrtc = built.nvrtc_version.is_some();
        if !nvrtc {
            specc_ir::testing::skip("NVRTC absent: planned only (source scripts/nvrtc-env.sh)");
        }
    }
}

/// DeepSeek-V3 at MLA dims `mla_wgmma` takes (latent 128 + rope 64; the bf16 fixture's
/// config, random weights): planned for sm_90a, every MLA launch of the decode step and the
/// prefill is `mla_wgmma` + `mla_combine` (capacity 256: 2 splits; 2048: 16), none
/// `mla_tile`, with no cluster fold (opt-in: `SPECC_MLA_CLUSTER=1`); and (with NVRTC) the
/// plans compile. The device checks it against the interpreter and target
/// greedy (`gpu_parity_mla`, `gpu_deepseek`'s `mla_wgmma_dims_methods_are_exact`).
#[test]
fn deepseek_v3_wgmma_dims_take_mla_wgmma_on_sm90a() {
    let dir = tempfile::tempdir().unwrap();
    common::write_deepseek_wgmma_dims_config(dir.path());
    let target = Model::open_random(dir.path(), 7).unwrap();
    let plain = StepShape {
        num_steps: 0,
        ring: 32,
        acceptance: Acceptance::Greedy,
    };
    let list = vec![
        (
            "deepseek 128 + 64: decode step".to_string(),
            lower_decode_step(target.spec(), &plain).unwrap(),
            Bindings::new(4, 1, 256),
        ),
        (
            "deepseek 128 + 64: target prefill".to_string(),
            lower_target_prefill(target.spec(), &[], &Acceptance::Greedy).unwrap(),
            Bindings::new(1, 16, 256),
        ),
        (
            "deepseek 128 + 64: decode step at 2048".to_string(),
            lower_decode_step(target.spec(), &plain).unwrap(),
            Bindings::new(2, 1, 2048),
        ),
    ];
    let p = Planned::build(list, Target::for_archs(&[Arch::Sm90a]));
    for (name, _, plan) in p.iter() {
        let families: Vec<&str> = (0..plan.launches.len())
            .map(|i| p.family(plan, i))
            .collect();
        assert!(families.contains(&"mla_wgmma"), "{name}: {families:?}");
        assert!(!families.contains(&"mla_tile"), "{name}: {families:?}");
        let mla: Vec<_> = plan.groups.iter().filter_map(|g| g.choice.mla()).collect();
        assert!(
            !mla.is_empty() && mla.iter().all(|m| m.wgmma),
            "{name}: {mla:?}"
        );
        let splits = if name.ends_with("2048") { 16 } else { 2 };
        assert!(
            mla.iter().all(|m| (m.splits, m.cluster) == (splits, 1)),
            "{name}: {mla:?}"
        );
        assert!(families.contains(&"mla_combine"), "{name}: {families:?}");
    }
    if Nvrtc::new().is_ok() {
        assert_compiled("deepseek-v3 128 + 64 steps (sm_90a)", &p);
    } else {
        specc_ir::testing::skip("NVRTC absent: planned only (source scripts/nvrtc-env.sh)");
    }
}
