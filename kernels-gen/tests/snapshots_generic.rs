//! Golden files of generic-family kernels (the generated part; `cuda/generic.cuh` is
//! hand-written). Re-bless with
//! `INSTA_UPDATE=always cargo test -p specc-kernels-gen --test snapshots_generic`.

mod generic_cases;

use generic_cases::{cases, lay_out};
use specc_kernels_gen::generic::single;

fn snap(label: &str, file: &str) {
    let c = cases()
        .into_iter()
        .find(|c| c.label == label)
        .unwrap_or_else(|| panic!("no fixture `{label}`"));
    let laid = lay_out(&c);
    let mut ks = single(&c.op, &laid.inputs, &laid.output).unwrap();
    assert_eq!(ks.len(), 1);
    let k = ks.remove(0);
    let description = format!("{label}; launch {:?}", k.launch);
    insta::with_settings!({ description => description, omit_expression => true }, {
        insta::assert_snapshot!(file, k.kernel);
    });
}

#[test]
fn rem_broadcast_scalar() {
    snap("rem i32 by scalar 7 (ring slots)", "rem_i32_scalar");
}

#[test]
fn cast_f32_to_i32() {
    snap("cast f32 -> i32", "cast_f32_i32");
}

#[test]
fn concat_three() {
    snap("concat i32 axis 1 of 3", "concat_i32_axis1");
}

#[test]
fn gather_clamped() {
    snap("gather i32 [4, 6] axis 1 by [4, 3]", "gather_i32_axis1");
}

#[test]
fn kv_write_token_ring() {
    snap("kv_write i32 token ring [4,8,1,1]", "kv_write_token_ring");
}

#[test]
fn topk_ties() {
    snap("topk f32 [4, 100]", "topk_f32");
}

#[test]
fn softmax_rows() {
    snap("softmax f32 [4, 512]", "softmax_f32");
}

#[test]
fn sample_inverse_cdf() {
    snap("sample [4,512] Probs", "sample_f32");
}

#[test]
fn moe_route_kimi() {
    snap("moe_route kimi E=384 T=1", "moe_route_kimi");
}

#[test]
fn moe_route_grouped() {
    snap("moe_route deepseek E=256 T=3", "moe_route_deepseek");
}

#[test]
fn moe_route_softmax() {
    snap("moe_route softmax E=60 T=16", "moe_route_softmax");
}
