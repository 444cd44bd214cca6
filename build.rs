//! Bakes the default engine into the `specc` binary: the embedded model (`models/default`,
//! with its `spec.toml`) goes through the one build (`engine_input`, then
//! `specc_codegen::build`) for an sm_90a target, and the engine's manifest and — when NVRTC
//! is found at build time — its cubins are written to `OUT_DIR` and included in the binary,
//! so the CUDA backend starts without compiling anything.
//!
//! `SPECC_SPEC=<spec.toml>` bakes another target/draft the same way (the spec's `target` key
//! names the target directory). `SPECC_BAKE_CUBINS=0` bakes a CPU-only engine (no kernels,
//! no NVRTC). Without NVRTC the binary still builds: its engine then has no cubins and a
//! CUDA run builds one in memory. When the build fails the binary carries no engine and
//! `SUMMARY` says why.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use specc_codegen::{build, BuildOptions, Built, Cubins};
use specc_ir::engine::{Arch, Engine, Target, ENGINE_FILE};
use specc_models::context::Context;
use specc_models::spec_bundle::{engine_input, EngineExtras};
use specc_models::{Model, SpecConfig};

/// The arch baked into the binary (the device the project runs on); other devices build
/// their engine in memory.
const BAKED_ARCH: Arch = Arch::Sm90a;

/// The name an engine gives the embedded default model's directory (the runtime maps it to
/// the materialised copy of the embedded model).
const EMBEDDED: &str = "embedded";

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// What was baked: the engine and its origin, for `SUMMARY`.
struct Baked {
    engine: Engine,
    summary: String,
}

fn bake(root: &Path, spec_file: &Path) -> Result<Baked, String> {
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
    // The CLI's rule: `specc run` with no model argument finds this engine as it would build it.
    let max_context = Context::choose(model.spec(), model.config_file(), None, Some(&cfg))
        .map_err(|e| e.to_string())?
        .tokens;
    // The embedded default's directories are named `embedded`, `embedded/draft`; any other
    // directory by its absolute path.
    let embedded = canonical(&root.join("models/default"));
    let dir_ref = |dir: &Path| -> PathBuf {
        let abs = canonical(dir);
        if abs == embedded {
            PathBuf::from(EMBEDDED)
        } else if abs == embedded.join("draft") {
            Path::new(EMBEDDED).join("draft")
        } else {
            abs
        }
    };
    let (input, _bundle) = engine_input(
        &model,
        Some(&cfg),
        max_context,
        None,
        &EngineExtras::default(),
        &dir_ref,
    )
    .map_err(|e| e.to_string())?;
    let target = if env::var("SPECC_BAKE_CUBINS").as_deref() == Ok("0") {
        Target::cpu()
    } else {
        Target::for_archs(&[BAKED_ARCH])
    };
    let opts = BuildOptions {
        cubins: Cubins::IfAvailable,
        ..BuildOptions::default()
    };
    let Built {
        engine,
        plan_s,
        nvrtc_s,
        cached_modules,
        ..
    } = build(input, &target, &opts).map_err(|e| e.to_string())?;
    // A changed checkpoint makes the baked engine refuse to load: rebuild when one changes.
    for c in &engine.checkpoints {
        let dir = if c.prefix.is_empty() {
            target_dir.clone()
        } else {
            cfg.draft.clone().unwrap_or_default()
        };
        for f in &c.files {
            println!("cargo:rerun-if-changed={}", dir.join(&f.name).display());
        }
    }

    let mut summary = String::new();
    let method = engine.spec.as_ref().unwrap_or(&engine.plain);
    let _ = writeln!(
        summary,
        "spec {} ({}), max context {}",
        spec_file.display(),
        method.label,
        engine.max_context
    );
    let launches: usize = engine.plans.iter().map(|p| p.launches.len()).sum();
    let _ = writeln!(
        summary,
        "{} graphs, {} plans, {launches} launches, {} kernels in {} modules ({plan_s:.2} s)",
        engine.graphs.len(),
        engine.plans.len(),
        engine.kernels.len(),
        engine.modules.len()
    );
    if !target.has_kernels() {
        let _ = writeln!(
            summary,
            "no kernels (SPECC_BAKE_CUBINS=0): a CUDA run builds its engine in memory"
        );
    } else if let Some(why) = &engine.uncompiled {
        let _ = writeln!(
            summary,
            "no cubins ({why}): a CUDA run builds its engine in memory"
        );
    } else {
        let _ = writeln!(
            summary,
            "{} {} cubins ({nvrtc_s:.1} s in NVRTC, {cached_modules} modules from its cache)",
            engine.cubins.len(),
            BAKED_ARCH.name()
        );
    }
    Ok(Baked { engine, summary })
}

/// Writes the manifest and every cubin under `dir`; returns the `CUBINS` entries (file as
/// the manifest lists it, path written).
fn write_engine(engine: &Engine, dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir.join("kernels")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = serde_json::to_string(engine).map_err(|e| format!("engine manifest: {e}"))?;
    let p = dir.join(ENGINE_FILE);
    fs::write(&p, json).map_err(|e| format!("{}: {e}", p.display()))?;
    let mut files = Vec::new();
    for c in &engine.cubins {
        let file = engine
            .cubin_file(c.module, c.arch)
            .ok_or_else(|| format!("module {} has a cubin the manifest does not list", c.module))?;
        let p = dir.join(file);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        fs::write(&p, &c.bytes).map_err(|e| format!("{}: {e}", p.display()))?;
        files.push((file.to_string(), p));
    }
    Ok(files)
}

fn main() {
    let root =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=SPECC_SPEC");
    println!("cargo:rerun-if-env-changed=SPECC_BAKE_CUBINS");
    // Whether NVRTC loads, and the headers it compiles with.
    for var in [
        "LD_LIBRARY_PATH",
        "SPECC_CUDA_INCLUDE",
        "CUDA_HOME",
        "CUDA_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let spec_file = env::var("SPECC_SPEC")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("models/default/spec.toml"));
    println!("cargo:rerun-if-changed={}", spec_file.display());

    let engine_dir = out.join("engine");
    let baked = bake(&root, &spec_file).and_then(|b| {
        let files = write_engine(&b.engine, &engine_dir)?;
        Ok((b, files))
    });
    let mut code = String::new();
    let summary = match baked {
        Ok((b, files)) => {
            let json = engine_dir.join(ENGINE_FILE);
            let _ = writeln!(
                code,
                "pub static ENGINE_JSON: Option<&str> = Some(include_str!({:?}));",
                json.display().to_string()
            );
            code.push_str("pub static CUBINS: &[(&str, &[u8])] = &[\n");
            for (file, path) in files {
                let _ = writeln!(
                    code,
                    "    ({file:?}, include_bytes!({:?})),",
                    path.display().to_string()
                );
            }
            code.push_str("];\n");
            b.summary
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&engine_dir);
            println!("cargo:warning=specc: the default engine was not baked: {e}");
            code.push_str("pub static ENGINE_JSON: Option<&str> = None;\n");
            code.push_str("pub static CUBINS: &[(&str, &[u8])] = &[];\n");
            format!("spec {}: no engine baked: {e}\n", spec_file.display())
        }
    };
    let _ = writeln!(code, "pub static SUMMARY: &str = {summary:?};");
    fs::write(out.join("embedded_engine.rs"), code).expect("OUT_DIR is writable");
}
