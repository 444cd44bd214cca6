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

use specc_kernels_gen::plan::plan_kernels;
use specc_kernels_gen::{Arch, KernelSource, Nvrtc};
use specc_models::spec_bundle::engine_graphs;
use specc_models::{Model, SpecConfig};

/// The arch baked into the binary (the device the project runs on); others compile at run time.
const BAKED_ARCH: Arch = Arch::Sm90a;

type Baked = (Vec<KernelSource>, String);

fn bake(spec_file: &Path) -> Result<Baked, String> {
    let cfg = SpecConfig::from_file(spec_file).map_err(|e| e.to_string())?;
    let target_dir = cfg
        .target
        .clone()
        .unwrap_or_else(|| spec_file.parent().unwrap_or(Path::new(".")).to_path_buf());
    println!(
        "cargo:rerun-if-changed={}",
        target_dir.join("config.json").display()
    );
    if let Some(d) = &cfg.draft {
        println!("cargo:rerun-if-changed={}", d.join("config.json").display());
    }
    let model = Model::open(&target_dir).map_err(|e| e.to_string())?;
    let ctx = cfg.max_context.unwrap_or(model.spec().max_position as u64);
    let mut kernels: Vec<KernelSource> = Vec::new();
    let mut summary = String::new();
    for eg in engine_graphs(&model, Some(&cfg), ctx, None).map_err(|e| e.to_string())? {
        let name = &eg.name;
        let c = specc_codegen::compile(eg.graph, &[eg.bind]).map_err(|e| format!("{name}: {e}"))?;
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

/// Compiles every kernel into NVRTC modules (one NVRTC worker per core), each a cubin
/// `{module}.{arch}.cubin` in `dir`; returns each module's name and the kernels it holds,
/// or why none were compiled.
fn compile_cubins(
    kernels: &[KernelSource],
    dir: &Path,
) -> Result<Vec<(String, Vec<String>)>, String> {
    if env::var("SPECC_BAKE_CUBINS").as_deref() == Ok("0") {
        return Err("SPECC_BAKE_CUBINS=0".into());
    }
    let nvrtc = Nvrtc::new().map_err(|e| e.to_string())?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let refs: Vec<&KernelSource> = kernels.iter().collect();
    let compiled = nvrtc
        .compile_many(&refs, &[BAKED_ARCH], threads)
        .map_err(|e| e.to_string())?;
    let mut modules = Vec::new();
    for m in compiled {
        let path = dir.join(format!("{}.{}.cubin", m.name, BAKED_ARCH.name()));
        fs::write(&path, &m.compiled.cubin).map_err(|e| e.to_string())?;
        modules.push((m.name, m.entries));
    }
    Ok(modules)
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
                Ok(modules) => {
                    // One static per module; every kernel it holds points at it (so the
                    // runtime loads each module once).
                    let arch = BAKED_ARCH.name();
                    let mut statics = String::new();
                    for (i, (module, entries)) in modules.iter().enumerate() {
                        let path = dir.join(format!("{module}.{arch}.cubin"));
                        statics.push_str(&format!(
                            "static MODULE_{i}: &[u8] = include_bytes!({:?});\n",
                            path.display().to_string()
                        ));
                        for e in entries {
                            table.push_str(&format!("    ({e:?}, {arch:?}, MODULE_{i}),\n"));
                        }
                    }
                    table.insert_str(0, &statics);
                    summary.push_str(&format!(
                        "{} kernels baked as {} {} cubins\n",
                        kernels.len(),
                        modules.len(),
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
