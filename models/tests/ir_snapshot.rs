//! The IR text of the embedded default model after lowering, as a golden file
//! (re-bless with `INSTA_UPDATE=always cargo test -p specc-models --test ir_snapshot`).

use std::path::Path;

use specc_models::{lower_dense, ModelSpec};

#[test]
fn embedded_model_ir() {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("default/config.json");
    let spec = ModelSpec::from_file(&cfg).unwrap();
    let g = lower_dense(&spec).unwrap();
    let text = specc_ir::text::print(&g);
    // The text form round-trips on the real model too.
    assert_eq!(specc_ir::text::parse(&text).unwrap(), g);
    insta::assert_snapshot!("embedded_default_ir", text);
}
