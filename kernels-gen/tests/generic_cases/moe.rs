//! `moe_route` fixtures: Kimi-K2 (384 experts, sigmoid + bias, top 8, normalised, one
//! group), DeepSeek-V3 (256 experts in 8 groups, 4 kept), softmax routers, one expert per
//! group (more groups than a warp's lanes), ties (equal logits rank the lower index first),
//! NaN and infinite logits, and 1, 3 and 16 tokens.

use super::{case, opd, Case, Tol, Values};
use specc_ir::op::MoeScoring;
use specc_ir::{DType, Op};

const BF: DType = DType::BF16;
const F32: DType = DType::F32;

/// Router parameters of a fixture.
struct Router {
    experts: u64,
    top_k: u64,
    scoring: MoeScoring,
    n_group: u64,
    topk_group: u64,
    norm: bool,
    scaling: f64,
}

const KIMI: Router = Router {
    experts: 384,
    top_k: 8,
    scoring: MoeScoring::Sigmoid,
    n_group: 1,
    topk_group: 1,
    norm: true,
    scaling: 2.827,
};

const DEEPSEEK: Router = Router {
    experts: 256,
    top_k: 8,
    scoring: MoeScoring::Sigmoid,
    n_group: 8,
    topk_group: 4,
    norm: true,
    scaling: 2.5,
};

/// The scores differ from the interpreter's by `expf`'s ulps (and the sums of them), the
/// selection not at all: a few f32 ulps of each gate.
const TOL: Tol = Tol::Close {
    rtol: 32.0 * f32::EPSILON as f64,
    atol: 1e-30,
};

fn route(
    label: &str,
    r: &Router,
    tokens: u64,
    logits: (DType, Values),
    bias: Option<Values>,
) -> Case {
    let e = r.experts;
    let mut inputs = vec![opd(logits.0, &[tokens, e], logits.1)];
    if let Some(b) = bias {
        inputs.push(opd(F32, &[e], b).table());
    }
    case(
        &format!("moe_route {label} E={e} T={tokens}"),
        Op::MoeRoute {
            top_k: r.top_k,
            scoring: r.scoring,
            n_group: r.n_group,
            topk_group: r.topk_group,
            norm_topk_prob: r.norm,
            scaling: r.scaling,
        },
        inputs,
        (F32, &[tokens, e]),
        TOL,
    )
}

pub(super) fn routes(v: &mut Vec<Case>) {
    let bias = || Some(Values::Float(0.1));
    for t in [1, 3, 16] {
        v.push(route("kimi", &KIMI, t, (F32, Values::Float(4.0)), bias()));
        let dt = if t == 3 { BF } else { F32 };
        v.push(route(
            "deepseek",
            &DEEPSEEK,
            t,
            (dt, Values::Float(4.0)),
            bias(),
        ));
    }
    v.push(route("kimi ties", &KIMI, 16, (F32, Values::Ties), None));
    v.push(route(
        "deepseek ties",
        &DEEPSEEK,
        16,
        (F32, Values::Ties),
        None,
    ));
    v.push(route(
        "kimi special",
        &KIMI,
        3,
        (F32, Values::Special),
        bias(),
    ));
    let softmax = Router {
        experts: 60,
        top_k: 4,
        scoring: MoeScoring::Softmax,
        n_group: 1,
        topk_group: 1,
        norm: false,
        scaling: 1.0,
    };
    v.push(route(
        "softmax",
        &softmax,
        16,
        (F32, Values::Float(3.0)),
        None,
    ));
    let per_expert = Router {
        experts: 64,
        top_k: 6,
        n_group: 64,
        topk_group: 40,
        norm: true,
        ..softmax
    };
    v.push(route(
        "softmax group per expert",
        &per_expert,
        3,
        (BF, Values::Float(3.0)),
        bias(),
    ));
    // Four rows of 8: ties and a NaN; all NaN but one; all -inf; ties at the top and -inf.
    let n = f64::NAN;
    let ninf = f64::NEG_INFINITY;
    let rows = Values::List(vec![
        0.5, -1.0, 2.0, 2.0, n, 0.0, 3.0, -0.0, //
        n, n, 1.0, n, n, n, n, n, //
        ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, //
        1.0, 2.0, 3.0, 4.0, 4.0, 0.0, -1.0, ninf,
    ]);
    for scoring in [MoeScoring::Sigmoid, MoeScoring::Softmax] {
        let r = Router {
            experts: 8,
            top_k: 3,
            scoring,
            n_group: 1,
            topk_group: 1,
            norm: true,
            scaling: 1.5,
        };
        v.push(route(
            &format!("{scoring:?} edge rows"),
            &r,
            4,
            (F32, rows.clone()),
            None,
        ));
    }
}
