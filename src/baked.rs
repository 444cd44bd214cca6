//! The engine `build.rs` baked into this binary (the embedded default, or the spec named by
//! `SPECC_SPEC` at build time): its manifest and cubins, read like an engine directory.

use std::path::Path;

use anyhow::Result;
use specc_ir::engine::{Engine, EngineError};

mod generated {
    include!(concat!(env!("OUT_DIR"), "/embedded_engine.rs"));
}

/// What build.rs baked, in a few lines (`specc compile` does not print it).
pub use generated::SUMMARY;

/// The baked engine, checked like one read from disk; `None` when the build could not bake
/// one (its reason is in [`SUMMARY`]).
pub fn engine() -> Result<Option<Engine>> {
    let Some(json) = generated::ENGINE_JSON else {
        return Ok(None);
    };
    let e = Engine::from_json(json, Path::new("(baked engine)/engine.json"), |file| {
        generated::CUBINS
            .iter()
            .find(|(f, _)| *f == file)
            .map(|(_, b)| b.to_vec())
            .ok_or_else(|| EngineError {
                path: Path::new("(baked engine)").join(file),
                what: "not baked into this binary".into(),
            })
    })?;
    Ok(Some(e))
}
