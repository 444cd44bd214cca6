use super::*;
use crate::abi::{Dtype, KernelBuilder};
use specc_ir::{BinaryOp, ReduceOp, UnaryOp};

fn arg(offset: u64, dtype: DType, dims: &[u64]) -> TensorArg {
    TensorArg::new(Loc::arena(offset), dtype, dims)
}

fn one(op: Op, inputs: &[TensorArg], out: &TensorArg) -> KernelSource {
    let mut ks = single(&op, inputs, out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ks.len(), 1);
    ks.remove(0)
}

#[test]
fn names_and_text_match_the_kernel_builder() {
    let launch = flat_launch(1000);
    let mut ours = Kernel::new("fam", DType::BF16);
    ours.body.line("int x = 1;");
    let mut theirs = KernelBuilder::new("fam", Dtype::BF16);
    theirs.body.line("int x = 1;");
    let (a, b) = (ours.finish(launch), theirs.finish(launch));
    assert_eq!(a.name, b.name);
    assert_eq!(a.kernel, b.kernel);
    assert!(a.source.starts_with(PRELUDE) && a.source.contains(GENERIC_PRELUDE));
    assert!(a.source.ends_with(&a.kernel));
}

#[test]
fn bool_kernels_are_named_bool() {
    let k = one(
        Op::Unary(UnaryOp::Not),
        &[arg(0, DType::Bool, &[4, 3])],
        &arg(256, DType::Bool, &[4, 3]),
    );
    assert!(k.name.starts_with("not_bool_"), "{}", k.name);
    assert!(k.kernel.contains("const b8* x"), "{}", k.kernel);
}

#[test]
fn binary_broadcasts_a_suffix() {
    let a = arg(0, DType::I32, &[4, 5]);
    let k = one(
        Op::Binary(BinaryOp::Rem),
        &[a.clone(), arg(256, DType::I32, &[5])],
        &arg(512, DType::I32, &[4, 5]),
    );
    assert!(k.kernel.contains("b[e % 5ll]"), "{}", k.kernel);
    assert!(k.kernel.contains("irem_euclid(va, vb)"), "{}", k.kernel);
    let k = one(
        Op::Binary(BinaryOp::Lt),
        &[a.clone(), arg(256, DType::I32, &[])],
        &arg(512, DType::Bool, &[4, 5]),
    );
    assert!(k.kernel.contains("b[0]"), "{}", k.kernel);
    assert!(k.name.starts_with("lt_i32_"), "{}", k.name);
}

#[test]
fn copies_use_the_widest_aligned_unit() {
    assert_eq!(unit_bytes(&[64, 256, 0]), 16);
    assert_eq!(unit_bytes(&[12, 256]), 4);
    assert_eq!(unit_bytes(&[3]), 1);
    let k = one(
        Op::Copy,
        &[arg(0, DType::BF16, &[8, 64])],
        &arg(1024, DType::BF16, &[8, 64]),
    );
    assert!(k.kernel.contains("uint4"), "{}", k.kernel);
    assert_eq!(k.launch.block, [64, 1, 1]);
}

#[test]
fn literals_cover_every_value() {
    assert_eq!(f32_expr(0.5), "0.5f");
    assert_eq!(f32_expr(f32::NEG_INFINITY), "__int_as_float(0xff800000)");
    assert_eq!(i64_lit(-3), "-3ll");
    assert_eq!(i64_lit(i64::MIN), "SPECC_I64_MIN");
}

#[test]
fn unsupported_ops_are_typed_errors() {
    let x = arg(0, DType::BF16, &[2, 8]);
    for op in [
        Op::AllReduce,
        Op::Input {
            name: "x".into(),
            ty: x.ty(),
        },
    ] {
        match single(&op, std::slice::from_ref(&x), &x) {
            Err(Error::Unsupported { op: name, .. }) => assert_eq!(name, op.info().name),
            other => panic!("{op:?}: expected Unsupported, got {other:?}"),
        }
    }
    let fp8 = arg(0, DType::Fp8E4M3, &[2, 8]);
    assert!(matches!(
        single(&Op::Copy, std::slice::from_ref(&fp8), &fp8),
        Err(Error::Unsupported { .. })
    ));
    let w = arg(256, DType::Fp8E4M3, &[4, 8]);
    let s = arg(512, DType::F32, &[1, 1]);
    assert!(matches!(
        single(
            &Op::MatMul,
            &[x.clone(), w, s],
            &arg(1024, DType::BF16, &[2, 4])
        ),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn invalid_types_name_the_field() {
    let field = |r: Result<Vec<KernelSource>, Error>| match r {
        Err(Error::Param { field, .. }) => field,
        other => panic!("expected a parameter error, got {other:?}"),
    };
    let x = arg(0, DType::F32, &[2, 8]);
    // Wrong result shape.
    assert_eq!(
        field(single(
            &Op::Reduce(ReduceOp::Sum),
            std::slice::from_ref(&x),
            &arg(256, DType::F32, &[2, 8])
        )),
        "output"
    );
    // Shape rule of the operands.
    assert_eq!(
        field(single(
            &Op::Binary(BinaryOp::Add),
            &[x.clone(), arg(256, DType::F32, &[3])],
            &x
        )),
        "inputs"
    );
    // Arity.
    assert_eq!(field(single(&Op::Copy, &[], &x)), "inputs");
    // In-place ops write where the state is.
    assert_eq!(
        field(single(
            &Op::Assign,
            &[x.clone(), arg(256, DType::F32, &[2, 8])],
            &arg(512, DType::F32, &[2, 8])
        )),
        "output"
    );
    // A leaf's bucket dims match any size, its static dims must agree.
    let fill = |dims: &[u64]| {
        single(
            &Op::Fill {
                value: 1.0,
                ty: TensorType::new(DType::I32, [specc_ir::op::B, Dim::Static(3)]),
            },
            &[],
            &arg(0, DType::I32, dims),
        )
    };
    assert!(fill(&[7, 3]).is_ok());
    assert_eq!(field(fill(&[7, 4])), "output");
}

/// Row kernels do not depend on the row count: only the grid does.
#[test]
fn generation_is_deterministic_and_row_count_free() {
    let gen = |rows: u64| {
        one(
            Op::Softmax,
            &[arg(0, DType::BF16, &[rows, 100])],
            &arg(4096, DType::F32, &[rows, 100]),
        )
    };
    assert_eq!(gen(4), gen(4));
    assert_eq!(gen(4).kernel, gen(5).kernel);
    assert_ne!(gen(4).launch, gen(5).launch);
    assert_eq!(gen(4).launch.block, [32, 1, 1]);
}
