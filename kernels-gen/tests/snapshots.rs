//! Golden files of generated kernels (the generated part; the prelude is hand-written).
//! Re-bless with `INSTA_UPDATE=always cargo test -p specc-kernels-gen --test snapshots`
//! (or `cargo insta review`) and read the diff.

mod common;

use specc_kernels_gen::abi::KernelSource;

fn tiny(label: &str) -> KernelSource {
    common::all_kernels(&common::TINY)
        .into_iter()
        .find(|(l, _)| l == label)
        .unwrap_or_else(|| panic!("no fixture `{label}`"))
        .1
}

fn snap(label: &str, file: &str) {
    let k = tiny(label);
    let description = format!("{label}; launch {:?}", k.launch);
    insta::with_settings!({ description => description, omit_expression => true }, {
        insta::assert_snapshot!(file, k.kernel);
    });
}

#[test]
fn gemv_gate_up_rmsnorm_silu() {
    snap(
        "gemv gate_up +rmsnorm +silu_mul",
        "gemv_gate_up_rmsnorm_silu",
    );
}

#[test]
fn gemv_lm_head_argmax() {
    snap("gemv lm_head +rmsnorm +argmax", "gemv_lm_head_argmax");
}

#[test]
fn gemv_residual() {
    snap("gemv o_proj +residual", "gemv_o_proj_residual");
}

#[test]
fn gemv_mma_gate_up_rmsnorm_silu() {
    snap(
        "gemv_mma gate_up +rmsnorm +silu_mul",
        "gemv_mma_gate_up_rmsnorm_silu",
    );
}

#[test]
fn gemv_mma_lm_head_argmax() {
    snap(
        "gemv_mma lm_head +rmsnorm +argmax",
        "gemv_mma_lm_head_argmax",
    );
}

#[test]
fn gemv_mma_residual_row_tile_64() {
    snap(
        "gemv_mma down +residual (row tile 64)",
        "gemv_mma_down_residual_row_tile_64",
    );
}

/// The tensor-map feed (`Feed::Tma`): producer warp, ring, `ldmatrix` fragments, split-K.
#[test]
fn gemv_mma_tensor_map_row_tile_64() {
    let label = "gemv_mma o_proj +residual (row tile 64, tensor maps)";
    assert!(tiny(label).kernel.contains("tma_load_2d(st"), "{label}");
    snap(label, "gemv_mma_o_proj_residual_tensor_maps");
}

#[test]
fn rope_kv_qk_norm() {
    snap(
        "rope_kv +qk_norm (interleaved)",
        "rope_kv_qk_norm_interleaved",
    );
}

#[test]
fn gemv_qkv_rope_kv() {
    snap("gemv qkv +rmsnorm +rope_kv", "gemv_qkv_rmsnorm_rope_kv");
}

#[test]
fn gemv_mma_qkv_rope_kv() {
    snap(
        "gemv_mma qkv +rmsnorm +rope_kv (interleaved, slots)",
        "gemv_mma_qkv_rmsnorm_rope_kv_interleaved_slots",
    );
}

#[test]
fn attention_causal_split() {
    snap("attention causal: split", "attention_causal_split");
}

#[test]
fn attn_tile_tree() {
    snap("attn_tile tree (T<=64)", "attn_tile_tree");
}

#[test]
fn attention_combine() {
    snap("attention causal: combine", "attention_combine");
}

#[test]
fn rmsnorm_per_head() {
    snap("rmsnorm per head", "rmsnorm_per_head");
}

#[test]
fn embedding() {
    snap("embedding", "embedding");
}

#[test]
fn argmax_partials() {
    snap("argmax partials", "argmax_partials");
}

#[test]
fn silu_mul() {
    snap("silu_mul", "silu_mul");
}

/// Generation is deterministic: the same parameters give the same names and text.
#[test]
fn generation_is_deterministic() {
    let a = common::all_kernels(&common::LLAMA_8B);
    let b = common::all_kernels(&common::LLAMA_8B);
    assert_eq!(a, b);
    let mut names: Vec<_> = a.iter().map(|(_, k)| k.name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(
        names.len(),
        a.len(),
        "distinct fixtures must get distinct names"
    );
}

/// The sm_90a wgmma GEMM with the tile `choose::gemm::wgmma_tile` gives the 8B shapes at
/// 256 token rows: the gate/up pair with SwiGLU (two weight maps, two accumulators) and
/// the lm-head with argmax partials.
fn snap_wgmma(label: &str, file: &str, n: u32, gate_up: bool, argmax: bool) {
    use specc_kernels_gen::abi::{Dtype, Loc, Rows};
    use specc_kernels_gen::gemm_wgmma::gemm_wgmma;
    use specc_kernels_gen::gemv::test_projection;
    let mut p = test_projection(Rows::Tokens, 64, 4096, n, gate_up, Dtype::BF16);
    if argmax {
        p.out = None;
        p.argmax_partials = Some(Loc::arena(1 << 30));
    }
    let t = specc_codegen::choose::gemm::wgmma_tile(&p, 256, &common::target()).unwrap();
    let k = gemm_wgmma(&p, &t).unwrap();
    let description = format!("{label}; {t:?}; launch {:?}", k.launch);
    insta::with_settings!({ description => description, omit_expression => true }, {
        insta::assert_snapshot!(file, k.kernel);
    });
}

#[test]
fn gemm_wgmma_gate_up_silu() {
    snap_wgmma(
        "gemm_wgmma gate_up +silu_mul, 256 rows",
        "gemm_wgmma_gate_up_silu",
        14336,
        true,
        false,
    );
}

#[test]
fn gemm_wgmma_lm_head_argmax() {
    snap_wgmma(
        "gemm_wgmma lm_head +argmax, 256 rows",
        "gemm_wgmma_lm_head_argmax",
        128256,
        false,
        true,
    );
}
