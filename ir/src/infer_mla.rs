//! Shape and dtype rules of the multi-head latent attention ops (`head_matmul`,
//! `mla_attention`; semantics in `op.rs`).

use crate::infer::{float, int, rank, same_dim, tt};
use crate::op::AttnMask;
use crate::{DType, Shape, TensorType};

type R = Result<TensorType, String>;

pub(crate) fn head_matmul(trans_w: bool, a: &[&TensorType]) -> R {
    let (x, w) = (a[0], a[1]);
    float(x, "head_matmul input")?;
    float(w, "head_matmul weight")?;
    rank(w, 3, "head_matmul weight")?;
    let r = x.shape.rank();
    if r < 2 {
        return Err(format!("head_matmul input must have rank >= 2, got {x}"));
    }
    let (h, k) = (x.shape.0[r - 2], x.shape.0[r - 1]);
    same_dim(
        h,
        w.shape.0[0],
        "head_matmul heads (x[..., H, K] vs w[H, ...])",
    )?;
    let (wk, wn) = if trans_w {
        (w.shape.0[2], w.shape.0[1])
    } else {
        (w.shape.0[1], w.shape.0[2])
    };
    same_dim(k, wk, "head_matmul reduction dim")?;
    Ok(tt(x.dtype, x.shape.with_last(wn)))
}

pub(crate) fn mla_attention(mask: AttnMask, a: &[&TensorType]) -> R {
    let (ql, qp, c, pe, pos) = (a[0], a[1], a[2], a[3], a[4]);
    for (t, what) in [
        (ql, "mla_attention q_lat"),
        (qp, "mla_attention q_pe"),
        (c, "mla_attention latent cache"),
        (pe, "mla_attention rope cache"),
    ] {
        rank(t, 4, what)?;
        float(t, what)?;
    }
    rank(pos, 2, "mla_attention positions")?;
    int(pos, "mla_attention positions")?;
    let (q, cs, ps) = (&ql.shape.0, &c.shape.0, &pe.shape.0);
    same_dim(q[0], qp.shape.0[0], "mla_attention batch (q_lat vs q_pe)")?;
    same_dim(q[1], qp.shape.0[1], "mla_attention tokens (q_lat vs q_pe)")?;
    same_dim(q[2], qp.shape.0[2], "mla_attention heads (q_lat vs q_pe)")?;
    same_dim(q[0], cs[0], "mla_attention batch (q vs cache)")?;
    same_dim(cs[0], ps[0], "mla_attention batch (latent vs rope cache)")?;
    same_dim(cs[1], ps[1], "mla_attention context (latent vs rope cache)")?;
    if cs[2].as_static() != Some(1) || ps[2].as_static() != Some(1) {
        return Err(format!(
            "mla_attention caches must have one head, got {c} and {pe}"
        ));
    }
    same_dim(q[3], cs[3], "mla_attention latent dim (q_lat vs cache)")?;
    same_dim(
        qp.shape.0[3],
        ps[3],
        "mla_attention rope dim (q_pe vs cache)",
    )?;
    same_dim(q[0], pos.shape.0[0], "mla_attention positions batch")?;
    same_dim(q[1], pos.shape.0[1], "mla_attention positions tokens")?;
    if mask == AttnMask::Tree {
        let (pl, anc) = (a[5], a[6]);
        int(pl, "mla_attention prefix_len")?;
        rank(pl, 1, "mla_attention prefix_len")?;
        same_dim(pl.shape.0[0], q[0], "mla_attention prefix_len batch")?;
        let words_ok = match anc.shape.rank() {
            2 => anc.shape == pos.shape,
            3 => {
                anc.shape.0[..2] == pos.shape.0[..]
                    && anc.shape.0[2].as_static().is_some_and(|w| w >= 1)
            }
            _ => false,
        };
        if anc.dtype != DType::I64 || !words_ok {
            return Err(format!(
                "mla_attention ancestors must be i64{} or that shape plus a static number \
                 of words, got {anc}",
                pos.shape
            ));
        }
    }
    Ok(tt(ql.dtype, Shape(q.clone())))
}
