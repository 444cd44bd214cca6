//! Bakes the default engine into the `specc` binary: the embedded model's graphs (prefill,
//! plain decode step, and the speculative step of its `spec.toml`) go through codegen and
//! kernel generation here, and — when NVRTC is found at build time — every kernel is compiled
//! to an sm_90a cubin that the binary carries, so the CUDA backend starts without compiling.
//! `SPECC_SPEC=<spec.toml>` bakes another target/draft the same way (the spec's `target` key
//! names the target directory). Without NVRTC the binary still builds: it then compiles the
//! kernels at first run and caches them on disk. `SPECC_BAKE_CUBINS=0` skips NVRTC here.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use specc_ir::{Bindings, Graph};
use specc_kernels_gen::plan::plan_kernels;
use specc_kernels_gen::{Arch, KernelSource, Nvrtc};
use specc_models::spec_bundle::{DECODE_RING, MIN_PREFILL_T};
use specc_models::spec_step::{lower_decode_step, lower_target_prefill, StepShape};
use specc_models::{Acceptance, Method, Model, SpecBundle, SpecConfig};

/// The arch baked into the binary (the device the project runs on); others compile at run time.
const BAKED_ARCH: Arch = Arch::Sm90a;

type Baked = (Vec<KernelSource>, String);

fn graphs(spec_file: &Path) -> Result<Vec<(String, Graph, Bindings)>, String> {
    let cfg = SpecConfig::from_file(spec_file).map_err(|e| e.to_string())?;
    let target_dir = cfg
        .target
        .clone()
        .unwrap_or_else(|| spec_file.parent().unwrap_or(Path::new(".")).to_path_buf());
    println!(
        "cargo:rerun-if-changed={}",
        target_dir.join("config.json").display()
    );
    let model = Model::open(&target_dir).map_err(|e| e.to_string())?;
    let ctx = cfg.max_context.unwrap_or(model.spec().max_position as u64);
    let mut out = Vec::new();
    let plain = StepShape {
        num_steps: 0,
        ring: DECODE_RING,
        acceptance: Acceptance::Greedy,
    };
    let prefill = lower_target_prefill(model.spec(), &[]).map_err(|e| e.to_string())?;
    let decode = lower_decode_step(model.spec(), &plain).map_err(|e| e.to_string())?;
    let bundle = match cfg.method {
        Method::None => None,
        _ => Some(SpecBundle::open(&model, &cfg).map_err(|e| e.to_string())?),
    };
    if let Some(d) = &cfg.draft {
        println!("cargo:rerun-if-changed={}", d.join("config.json").display());
    }
    for &b in &cfg.batch_buckets {
        let b = b as u64;
        let pre = Bindings::new(b, MIN_PREFILL_T as u64, ctx);
        let step = Bindings::new(b, 1, ctx);
        out.push((format!("prefill B={b}"), prefill.clone(), pre.clone()));
        out.push((format!("decode step B={b}"), decode.clone(), step.clone()));
        if let Some(bu) = &bundle {
            out.push((format!("spec step B={b}"), bu.step.clone(), step));
            out.push((
                format!("spec target prefill B={b}"),
                bu.target_prefill.clone(),
                pre.clone(),
            ));
            out.push((
                format!("draft prefill B={b}"),
                bu.draft_prefill.clone(),
                pre,
            ));
        }
    }
    Ok(out)
}

fn bake(spec_file: &Path) -> Result<Baked, String> {
    let mut kernels: Vec<KernelSource> = Vec::new();
    let mut summary = String::new();
    for (name, g, bind) in graphs(spec_file)? {
        let c = specc_codegen::compile(g, &[bind]).map_err(|e| format!("{name}: {e}"))?;
        let plan =
            plan_kernels(&c.graph, &c.groups, &c.plans[0]).map_err(|e| format!("{name}: {e}"))?;
        summary.push_str(&format!("{name}: {} launches\n", plan.launches.len()));
        for l in plan.launches {
            if !kernels.iter().any(|k| k.name == l.kernel.name) {
                kernels.push(l.kernel);
            }
        }
    }
    Ok((kernels, summary))
}

/// Compiles every kernel to a cubin in `dir` (2 threads per core of NVRTC work); returns the
/// names compiled, or why none were.
fn compile_cubins(kernels: &[KernelSource], dir: &Path) -> Result<Vec<String>, String> {
    if env::var("SPECC_BAKE_CUBINS").as_deref() == Ok("0") {
        return Err("SPECC_BAKE_CUBINS=0".into());
    }
    let nvrtc = Nvrtc::new().map_err(|e| e.to_string())?;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .max(1);
    let chunk = kernels.len().div_ceil(threads).max(1);
    let results: Vec<Result<Vec<String>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = kernels
            .chunks(chunk)
            .map(|ks| {
                let nvrtc = nvrtc.clone();
                s.spawn(move || {
                    let mut done = Vec::new();
                    for k in ks {
                        let c = nvrtc.compile(k, BAKED_ARCH).map_err(|e| e.to_string())?;
                        let path = dir.join(format!("{}.{}.cubin", k.name, BAKED_ARCH.name()));
                        fs::write(&path, &c.cubin).map_err(|e| e.to_string())?;
                        done.push(k.name.clone());
                    }
                    Ok(done)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("NVRTC thread panicked".into()))
            })
            .collect()
    });
    let mut names = Vec::new();
    for r in results {
        names.extend(r?);
    }
    Ok(names)
}

fn main() {
    let root =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=SPECC_SPEC");
    println!("cargo:rerun-if-env-changed=SPECC_BAKE_CUBINS");
    println!("cargo:rerun-if-changed=build.rs");
    let spec_file = env::var("SPECC_SPEC")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("models/default/spec.toml"));
    println!("cargo:rerun-if-changed={}", spec_file.display());
    let dir = out.join("kernels");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("OUT_DIR is writable");
    let mut table = String::from("pub static PREBUILT: &[(&str, &str, &[u8])] = &[\n");
    let summary = match bake(&spec_file) {
        Ok((kernels, mut summary)) => {
            for k in &kernels {
                fs::write(dir.join(format!("{}.cu", k.name)), &k.source)
                    .expect("OUT_DIR is writable");
            }
            match compile_cubins(&kernels, &dir) {
                Ok(names) => {
                    for n in &names {
                        let arch = BAKED_ARCH.name();
                        let path = dir.join(format!("{n}.{arch}.cubin"));
                        table.push_str(&format!(
                            "    ({n:?}, {arch:?}, include_bytes!({:?})),\n",
                            path.display().to_string()
                        ));
                    }
                    summary.push_str(&format!(
                        "{} kernels baked as {} cubins\n",
                        kernels.len(),
                        BAKED_ARCH.name()
                    ));
                }
                Err(why) => {
                    summary.push_str(&format!(
                        "{} kernels generated; cubins not baked ({why}): compiled at first run\n",
                        kernels.len()
                    ));
                }
            }
            summary
        }
        Err(e) => {
            println!("cargo:warning=specc: the default engine was not baked: {e}");
            format!("not baked: {e}\n")
        }
    };
    table.push_str("];\n");
    table.push_str(&format!(
        "pub static SUMMARY: &str = {:?};\n",
        format!("spec {}\n{summary}", spec_file.display())
    ));
    fs::write(out.join("embedded_engine.rs"), table).expect("OUT_DIR is writable");
}
