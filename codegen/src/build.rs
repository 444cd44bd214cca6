//! The one build: a method's lowered graphs + a [`Target`] → an [`Engine`]. It is the only
//! place that runs the pass pipeline, chooses kernels, generates kernel text and compiles
//! cubins; `build.rs` (the binary's embedded engine), `specc compile` and in-memory runs all
//! call [`build`].

use std::collections::HashMap;
use std::time::Instant;

use specc_ir::engine::{
    sha256_hex, BucketPlan, BuildInput, Cubin, CubinRef, Engine, GraphText, GroupCost, IoRange,
    KernelInfo, KernelStats, Launch, ModuleInfo, PassTime, StateBuffer, Target, FORMAT_VERSION,
    SPECC_VERSION,
};
use specc_ir::{Bindings, BucketDim};
use specc_kernels_gen::{group_modules, KernelSource, Nvrtc, PtxasStats};

use crate::kernels::plan_kernels;
use crate::physical::{self, physical_bytes};
use crate::{compile, CodegenError};

/// Whether a build without NVRTC is an error or an engine without cubins (which runs on the
/// CPU backend only and says so when a GPU load is tried).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cubins {
    Require,
    IfAvailable,
    /// Plans and kernel sources only, NVRTC never runs (tests of plans and memory).
    Never,
}

/// What a build reports as it goes, for a progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildProgress {
    /// `done` of the `total` (graph, bucket) plans are made (passes, kernel choice and
    /// generation).
    Planned { done: usize, total: usize },
    /// NVRTC (or its on-disk cache) is compiling the `kernels` distinct kernels.
    Compiling { kernels: usize },
}

#[derive(Clone, Copy)]
pub struct BuildOptions<'a> {
    pub cubins: Cubins,
    /// NVRTC workers.
    pub threads: usize,
    /// Called as the build proceeds (from the calling thread).
    pub progress: Option<&'a dyn Fn(BuildProgress)>,
}

impl Default for BuildOptions<'_> {
    fn default() -> Self {
        BuildOptions {
            cubins: Cubins::IfAvailable,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            progress: None,
        }
    }
}

/// An engine and what the build learned on the way.
pub struct Built {
    pub engine: Engine,
    /// Every distinct kernel's source, in [`Engine::kernels`] order.
    pub sources: Vec<KernelSource>,
    /// Seconds in passes + kernel generation, and in NVRTC (or its cache).
    pub plan_s: f64,
    pub nvrtc_s: f64,
    /// Modules NVRTC took from its on-disk cache.
    pub cached_modules: usize,
    /// The NVRTC version, when it ran.
    pub nvrtc_version: Option<(i32, i32)>,
}

fn bucket_of(bind: &Bindings) -> specc_ir::engine::abi::Bucket {
    let get = |d| bind.get(d).unwrap_or(1) as u32;
    specc_ir::engine::abi::Bucket {
        b: get(BucketDim::B),
        t: get(BucketDim::T),
        ctx: get(BucketDim::Ctx),
    }
}

/// Builds the engine of `input` for `target`.
pub fn build(
    input: BuildInput,
    target: &Target,
    opts: &BuildOptions,
) -> Result<Built, CodegenError> {
    let t_plan = Instant::now();
    let mut graphs = Vec::new();
    let mut plans = Vec::new();
    let mut states: Vec<StateBuffer> = Vec::new();
    let mut sources: Vec<KernelSource> = Vec::new();
    let mut index: HashMap<String, u32> = HashMap::new();
    let report = |p| {
        if let Some(f) = opts.progress {
            f(p)
        }
    };
    let total = match target.has_kernels() {
        true => input.graphs.iter().map(|rg| rg.buckets.len()).sum(),
        false => 0,
    };
    for rg in input.graphs {
        graphs.push(GraphText {
            role: rg.role,
            ir: specc_ir::text::print(&rg.graph),
        });
        for bind in &rg.buckets {
            for (_, name, ty) in rg.graph.states() {
                let bytes = ty.bytes(bind).ok_or_else(|| CodegenError::Unbound {
                    value: specc_ir::ValueId(0),
                    ty: ty.to_string(),
                })?;
                match states.iter_mut().find(|s| s.name == name) {
                    Some(s) => s.bytes = s.bytes.max(bytes),
                    None => states.push(StateBuffer {
                        name: name.to_string(),
                        bytes,
                    }),
                }
            }
        }
        if !target.has_kernels() {
            continue;
        }
        let c = compile(rg.graph, &rg.buckets)?;
        let passes: Vec<PassTime> = c
            .timings
            .iter()
            .map(|p| PassTime {
                pass: p.pass.to_string(),
                micros: p.micros as u64,
            })
            .collect();
        for lp in &c.plans {
            // kernels: each group's choice (the one selection module), then its kernels.
            let t = Instant::now();
            let kp = plan_kernels(&c.graph, &c.groups, lp, target).map_err(|source| {
                CodegenError::Kernels {
                    graph: format!("{} B={}", rg.role, bucket_of(&lp.bind).b),
                    source,
                }
            })?;
            let mut passes = passes.clone();
            passes.push(PassTime {
                pass: "kernels".to_string(),
                micros: t.elapsed().as_micros() as u64,
            });
            if crate::dump_requested("kernels") {
                eprintln!("--- kernel choices: {} at {:?} ---", rg.role, kp.bucket);
                for (g, choice) in kp.choices.iter().enumerate() {
                    eprintln!("g{g:<4} {choice}");
                }
            }
            let mut launches = Vec::with_capacity(kp.launches.len());
            for l in kp.launches {
                let k = &l.kernel;
                let id = *index.entry(k.name.clone()).or_insert_with(|| {
                    sources.push(k.clone());
                    sources.len() as u32 - 1
                });
                let geo = k.launch.resolve(&l.bucket);
                launches.push(Launch {
                    kernel: id,
                    grid: geo.grid,
                    block: geo.block,
                    smem_bytes: geo.smem_bytes,
                    operands: k.operands.clone(),
                    bucket: l.bucket,
                    group: l.group as u32,
                    phase: l.phase,
                });
            }
            let groups = lp
                .launches
                .iter()
                .map(|gl| GroupCost {
                    family: gl.family.to_string(),
                    choice: kp.choices[gl.group.0 as usize].clone(),
                    scratch_bytes: kp.scratch[gl.group.0 as usize],
                    weight_bytes: gl.cost.weight_bytes,
                    act_bytes: gl.cost.act_bytes,
                    flops: gl.cost.flops,
                })
                .collect();
            plans.push(BucketPlan {
                role: rg.role,
                bucket: kp.bucket,
                launches,
                slots: kp.slots,
                arena_bytes: kp.arena_bytes,
                arena: kp.arena,
                io: kp
                    .io
                    .into_iter()
                    .map(|(name, offset, bytes)| IoRange {
                        name,
                        offset,
                        bytes,
                    })
                    .collect(),
                groups,
                passes,
                physical: physical_bytes(&c.graph, &lp.bind, physical::capacity(&lp.bind)),
            });
            report(BuildProgress::Planned {
                done: plans.len(),
                total,
            });
        }
    }
    let plan_s = t_plan.elapsed().as_secs_f64();
    let mut kernels: Vec<KernelInfo> = sources
        .iter()
        .map(|k| KernelInfo {
            name: k.name.clone(),
            module: 0,
            stats: Vec::new(),
        })
        .collect();
    let mut modules: Vec<ModuleInfo> = Vec::new();
    let mut cubins = Vec::new();
    let mut uncompiled = None;
    let mut nvrtc_s = 0.0;
    let mut cached_modules = 0;
    let mut nvrtc_version = None;
    if !sources.is_empty() {
        // `Err(None)`: NVRTC was not asked for.
        let nvrtc = match opts.cubins {
            Cubins::Never => Err(None),
            Cubins::Require | Cubins::IfAvailable => Nvrtc::new().map_err(Some),
        };
        match nvrtc {
            Err(e) if opts.cubins != Cubins::Require => {
                uncompiled = Some(e.map_or_else(
                    || "not compiled: the build was asked for plans only".to_string(),
                    |e| e.to_string(),
                ));
                // The modules NVRTC would have compiled, without cubins: every kernel still
                // names an existing module.
                let refs: Vec<&KernelSource> = sources.iter().collect();
                for m in group_modules(&refs, opts.threads) {
                    for e in &m.entries {
                        kernels[index[e] as usize].module = modules.len() as u32;
                    }
                    modules.push(ModuleInfo {
                        name: m.name,
                        cubins: Vec::new(),
                    });
                }
            }
            Err(e) => {
                let e = e.expect("a build that requires cubins runs NVRTC");
                return Err(CodegenError::Nvrtc(e));
            }
            Ok(nvrtc) => {
                report(BuildProgress::Compiling {
                    kernels: sources.len(),
                });
                nvrtc_version = Some(nvrtc.version());
                let t = Instant::now();
                let refs: Vec<&KernelSource> = sources.iter().collect();
                let compiled = nvrtc
                    .compile_many(&refs, &target.archs, opts.threads)
                    .map_err(CodegenError::Nvrtc)?;
                nvrtc_s = t.elapsed().as_secs_f64();
                for m in compiled {
                    let at = match modules.iter().position(|x| x.name == m.name) {
                        Some(i) => i,
                        None => {
                            modules.push(ModuleInfo {
                                name: m.name.clone(),
                                cubins: Vec::new(),
                            });
                            modules.len() - 1
                        }
                    };
                    let arch = m.compiled.arch;
                    cached_modules += m.compiled.cached as usize;
                    for e in &m.entries {
                        let k = &mut kernels[index[e] as usize];
                        k.module = at as u32;
                        let s = PtxasStats::parse_entry(&m.compiled.log, e);
                        k.stats.push(KernelStats {
                            arch,
                            registers: s.registers,
                            spill_stores: s.spill_stores,
                            spill_loads: s.spill_loads,
                            stack_bytes: s.stack_bytes,
                            smem_bytes: s.smem_bytes,
                        });
                    }
                    modules[at].cubins.push(CubinRef {
                        arch,
                        file: format!("kernels/{}.{}.cubin", m.name, arch.name()),
                        sha256: sha256_hex(&m.compiled.cubin),
                        bytes: m.compiled.cubin.len() as u64,
                    });
                    cubins.push(Cubin {
                        module: at as u32,
                        arch,
                        bytes: m.compiled.cubin,
                    });
                }
            }
        }
    }
    let engine = Engine {
        format_version: FORMAT_VERSION,
        specc_version: SPECC_VERSION.to_string(),
        architecture: input.architecture,
        target: target.clone(),
        max_context: input.max_context,
        plain: input.plain,
        spec: input.spec,
        spec_toml: input.spec_toml,
        acceptance: input.acceptance,
        checkpoints: input.checkpoints,
        random_seed: input.random_seed,
        synthetic_acceptance: input.synthetic_acceptance,
        graphs,
        plans,
        states,
        kernels,
        modules,
        uncompiled,
        ranks: Vec::new(),
        cubins,
    };
    Ok(Built {
        engine,
        sources,
        plan_s,
        nvrtc_s,
        cached_modules,
        nvrtc_version,
    })
}
