//! What every integration test shares: where the repository's files are (fixtures, the
//! embedded default, bench configs) and a step contract written out as data.
//!
//! Files are found relative to the working directory (`cargo test` runs a test binary in
//! the package root), or under `$SPECC_FIXTURES` when it is set (a directory holding
//! `tests/fixtures/` and `models/`, e.g. a copy of the repository on another machine);
//! only when the relative path does not exist does a test fall back to the directory it
//! was compiled in (`CARGO_MANIFEST_DIR`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use specc_ir::engine::{DraftKind, GraphRole, StepContract};

/// The override of the directory the tests' files are resolved against.
pub const FIXTURES_ENV: &str = "SPECC_FIXTURES";

/// `rel` (relative to the repository root: `tests/fixtures/llama_tied`, `models/default`,
/// `bench/configs/...`), resolved against `$SPECC_FIXTURES`, else the working directory,
/// else the directory the tests were compiled in. Always absolute.
pub fn repo_path(rel: impl AsRef<Path>) -> PathBuf {
    let rel = rel.as_ref();
    if let Some(base) = std::env::var_os(FIXTURES_ENV) {
        let base = PathBuf::from(base);
        let base = if base.is_absolute() {
            base
        } else {
            cwd().join(base)
        };
        return base.join(rel);
    }
    let here = cwd().join(rel);
    if here.exists() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn cwd() -> PathBuf {
    std::env::current_dir().expect("the tests run in a readable working directory")
}

/// A committed test checkpoint under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    repo_path(Path::new("tests/fixtures").join(name))
}

/// Writes `dir/config.json`: the bf16 DeepSeek-V3 fixture's config at the MLA dims
/// `mla_wgmma` takes (latent 128 + rope 64), for a model with random weights.
pub fn write_deepseek_wgmma_dims_config(dir: &Path) {
    let base = fixture("deepseek_v3_bf16").join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base).unwrap()).unwrap();
    for (k, v) in [
        ("kv_lora_rank", 128),
        ("qk_rope_head_dim", 64),
        ("qk_nope_head_dim", 32),
        ("qk_head_dim", 96),
        ("head_dim", 64),
        ("v_head_dim", 32),
    ] {
        cfg[k] = v.into();
    }
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

/// The embedded default family (`models/default/`).
pub fn default_model() -> PathBuf {
    repo_path("models/default")
}

/// A speculative contract of `kind` for hand-lowered graphs (the roles a bundle's
/// contract names): `num_steps` is the verify margin, `ring` the token ring per lane.
pub fn spec_contract(kind: DraftKind, num_steps: usize, ring: usize) -> StepContract {
    StepContract {
        method: "test".into(),
        label: format!("test {kind:?} num_steps={num_steps}"),
        kind,
        num_steps,
        ring,
        step: GraphRole::SpecStep,
        target_prefill: GraphRole::SpecTargetPrefill,
        draft_prefill: Some(GraphRole::DraftPrefill),
        variants: Vec::new(),
        greedy: Vec::new(),
        catch_up: None,
    }
}
