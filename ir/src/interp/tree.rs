//! Draft trees: `tree_build` (DDTree's best-first expansion over rank paths),
//! `tree_select` (EAGLE-2/3: the best candidates of a dynamic tree) and `tree_accept` (the
//! greedy walk). The op docs in `op.rs` are the specification.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::tensor::Tensor;
use super::util::{f32s, i64s, OpResult, Out};
use crate::op::tree_words;

/// A candidate node: (parent node, rank) at `depth`, with its score.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    score: f32,
    parent: usize,
    rank: usize,
    depth: usize,
}

/// NaN ranks as -inf.
fn key(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

impl Candidate {
    /// The op's strict total order: higher score, then lower parent, then lower rank is
    /// better (`Greater` = popped first from a max-heap).
    fn order(&self, o: &Candidate) -> Ordering {
        key(self.score)
            .partial_cmp(&key(o.score))
            .unwrap_or(Ordering::Equal)
            .then(o.parent.cmp(&self.parent))
            .then(o.rank.cmp(&self.rank))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, o: &Self) -> bool {
        self.order(o) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Candidate {
    fn cmp(&self, o: &Self) -> Ordering {
        self.order(o)
    }
}

/// One sequence's tree: rows `[token, parent, depth, words..]` of `3 + W` values.
fn build_one(lp: &[f32], ids: &[i64], root: i64, l: usize, k: usize, n: usize) -> Vec<i64> {
    let w = tree_words(n as u64) as usize;
    let cols = 3 + w;
    let mut rows = vec![0i64; n * cols];
    let mut score = vec![0f32; n];
    let set_bit = |row: &mut [i64], i: usize| row[3 + i / 64] |= (1u64 << (i % 64)) as i64;
    rows[0] = root;
    rows[1] = -1;
    set_bit(&mut rows[..cols], 0);
    let mut heap = BinaryHeap::new();
    if l > 0 && k > 0 {
        heap.push(Candidate {
            score: lp[0],
            parent: 0,
            rank: 0,
            depth: 1,
        });
    }
    let mut count = 1;
    while count < n {
        let Some(c) = heap.pop() else { break };
        let i = count;
        count += 1;
        let at = (c.depth - 1) * k + c.rank;
        let (parent_row, row) = rows.split_at_mut(i * cols);
        let parent_row = &parent_row[c.parent * cols..][..cols];
        let row = &mut row[..cols];
        row[0] = ids[at];
        row[1] = c.parent as i64;
        row[2] = c.depth as i64;
        row[3..].copy_from_slice(&parent_row[3..]);
        set_bit(row, i);
        score[i] = c.score;
        if c.rank + 1 < k {
            heap.push(Candidate {
                score: score[c.parent] + lp[at + 1],
                rank: c.rank + 1,
                ..c
            });
        }
        if c.depth < l {
            heap.push(Candidate {
                score: score[i] + lp[c.depth * k],
                parent: i,
                rank: 0,
                depth: c.depth + 1,
            });
        }
    }
    for i in count..n {
        let row = &mut rows[i * cols..][..cols];
        row[0] = root;
        row[1] = -1;
        set_bit(row, i);
    }
    rows
}

pub(crate) fn tree_build(
    logp: &Tensor,
    ids: &Tensor,
    root: &Tensor,
    budget: usize,
    out: &Out,
) -> OpResult {
    let lp = f32s(logp, "tree_build log-probs")?;
    let iv = i64s(ids, "tree_build ids")?;
    let rv = i64s(root, "tree_build root")?;
    let (b, l, k) = (logp.shape[0], logp.shape[1], logp.shape[2]);
    let mut res = Vec::with_capacity(b * budget * (3 + tree_words(budget as u64) as usize));
    for bi in 0..b {
        let per = l * k;
        res.extend(build_one(
            &lp[bi * per..][..per],
            &iv[bi * per..][..per],
            rv[bi],
            l,
            k,
            budget,
        ));
    }
    Ok(out.i64(res))
}

/// One sequence of `tree_select`: rows `[token, parent, depth, words..]` of `3 + W` values.
fn select_one(sc: &[f32], tok: &[i64], par: &[i64], root: i64, n: usize) -> Vec<i64> {
    let c = sc.len();
    let cols = 3 + tree_words(n as u64) as usize;
    let mut order: Vec<usize> = (0..c).collect();
    // Best first: higher key, then lower index (a strict total order).
    order.sort_by(|&x, &y| {
        key(sc[y])
            .partial_cmp(&key(sc[x]))
            .unwrap_or(Ordering::Equal)
            .then(x.cmp(&y))
    });
    let mut selected = vec![false; c];
    for &i in order.iter().take((n - 1).min(c)) {
        selected[i] = true;
    }
    let mut rows = vec![0i64; n * cols];
    let set_bit = |row: &mut [i64], i: usize| row[3 + i / 64] |= (1u64 << (i % 64)) as i64;
    let mut node_of = vec![-1i64; c];
    let mut count = 0;
    for i in 0..n {
        // Root and padding rows: [root, -1, 0, bit i].
        let row = &mut rows[i * cols..][..cols];
        row[0] = root;
        row[1] = -1;
        set_bit(row, i);
    }
    for ci in (0..c).filter(|&ci| selected[ci]) {
        count += 1;
        let i = count;
        node_of[ci] = i as i64;
        let p = par[ci];
        let parent = if p < 0 {
            0
        } else if (p as usize) < ci && selected[p as usize] {
            node_of[p as usize]
        } else {
            -1
        };
        let (before, row) = rows.split_at_mut(i * cols);
        let row = &mut row[..cols];
        row[0] = tok[ci];
        row[1] = parent;
        if parent >= 0 {
            let prow = &before[parent as usize * cols..][..cols];
            row[2] = prow[2] + 1;
            row[3..].copy_from_slice(&prow[3..]);
        }
        set_bit(row, i);
    }
    rows
}

pub(crate) fn tree_select(
    scores: &Tensor,
    tokens: &Tensor,
    parents: &Tensor,
    root: &Tensor,
    nodes: usize,
    out: &Out,
) -> OpResult {
    let sc = f32s(scores, "tree_select scores")?;
    let tv = i64s(tokens, "tree_select tokens")?;
    let pv = i64s(parents, "tree_select parents")?;
    let rv = i64s(root, "tree_select root")?;
    let (b, c) = (scores.shape[0], scores.shape[1]);
    let mut res = Vec::with_capacity(b * nodes * (3 + tree_words(nodes as u64) as usize));
    for bi in 0..b {
        res.extend(select_one(
            &sc[bi * c..][..c],
            &tv[bi * c..][..c],
            &pv[bi * c..][..c],
            rv[bi],
            nodes,
        ));
    }
    Ok(out.i64(res))
}

pub(crate) fn tree_accept(tree: &Tensor, target: &Tensor, max_depth: usize, out: &Out) -> OpResult {
    let tv = i64s(tree, "tree_accept tree")?;
    let gv = i64s(target, "tree_accept target")?;
    let (b, n, cols) = (tree.shape[0], tree.shape[1], tree.shape[2]);
    let mut res = Vec::with_capacity(b * (max_depth + 3));
    for bi in 0..b {
        let node = |i: usize| &tv[(bi * n + i) * cols..][..cols];
        let want = |i: usize| gv[bi * n + i];
        let mut path = vec![0usize];
        while path.len() <= max_depth {
            let cur = *path.last().expect("the root is on the path");
            let next = (1..n).find(|&j| node(j)[1] == cur as i64 && node(j)[0] == want(cur));
            match next {
                Some(j) => path.push(j),
                None => break,
            }
        }
        let last = *path.last().expect("the root is on the path");
        res.push(path.len() as i64 - 1);
        res.push(want(last));
        res.extend((0..=max_depth).map(|i| *path.get(i).unwrap_or(&last) as i64));
    }
    Ok(out.i64(res))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::op::Op;
    use crate::DType;

    fn build(lp: &[f32], ids: &[i64], root: &[i64], shape: [usize; 3], budget: u64) -> Vec<i64> {
        let lp = tf(DType::F32, &shape, lp);
        let ids = ti(DType::I32, &shape, ids);
        let root = ti(DType::I32, &[shape[0]], root);
        let r = run_op(Op::TreeBuild { budget }, vec![lp, ids, root]);
        assert_eq!(r.dtype, DType::I64);
        r.as_i64().unwrap().to_vec()
    }

    /// L = 2 depths, K = 2. Depth 1: tokens 10 (lp -0.5), 11 (-1.0); depth 2: tokens 20
    /// (-0.25), 21 (-2.0). Scores: node 1 = 10 (-0.5); then candidates 11 (-1.0) and
    /// 10→20 (-0.75): node 2 = 20 under node 1 (-0.75); then 11 (-1.0) vs 10→21 (-2.5):
    /// node 3 = 11 (-1.0); then 11→20 (-1.25) vs 10→21: node 4 = 20 under node 3.
    #[test]
    fn tree_build_best_first_by_hand() {
        let lp = [-0.5, -1.0, -0.25, -2.0];
        let ids = [10, 11, 20, 21];
        let got = build(&lp, &ids, &[7], [1, 2, 2], 5);
        #[rustfmt::skip]
        let want = [
            7, -1, 0, 0b1,
            10, 0, 1, 0b11,
            20, 1, 2, 0b111,
            11, 0, 1, 0b1001,
            20, 3, 2, 0b11001,
        ];
        assert_eq!(got, want);
    }

    /// Equal scores: the lower parent wins, then the lower rank. Two depths, all
    /// log-probs 0: node 1 = (0, r0); candidates (0, r1) and (1, r0) tie → parent 0 first.
    #[test]
    fn tree_build_ties_and_padding() {
        let lp = [0.0, 0.0, 0.0, 0.0];
        let ids = [1, 2, 3, 4];
        let got = build(&lp, &ids, &[9], [1, 2, 2], 8);
        let rows: Vec<&[i64]> = got.chunks(4).collect();
        // Order: (0, r0) = node 1, (0, r1) = node 2, then the children of node 1 (ranks 0,
        // 1), then those of node 2. 1 + 2 + 4 = 7 nodes exist; node 7 is padding.
        assert_eq!(&rows[1][..3], &[1, 0, 1]);
        assert_eq!(&rows[2][..3], &[2, 0, 1]);
        assert_eq!(&rows[3][..3], &[3, 1, 2]);
        assert_eq!(&rows[4][..3], &[4, 1, 2]);
        assert_eq!(&rows[5][..3], &[3, 2, 2]);
        assert_eq!(&rows[6][..3], &[4, 2, 2]);
        assert_eq!(rows[6][3], 0b1000101);
        assert_eq!(rows[7], &[9, -1, 0, 1 << 7]);
    }

    /// 70 nodes need two ancestor words: a chain (K = 1) of depth 69 sets bits 0..=i.
    #[test]
    fn tree_build_multi_word_masks() {
        let l = 69;
        let lp = vec![-1.0f32; l];
        let ids: Vec<i64> = (0..l as i64).map(|i| 100 + i).collect();
        let got = build(&lp, &ids, &[5], [1, l, 1], 70);
        assert_eq!(got.len(), 70 * 5);
        let row = |i: usize| &got[i * 5..][..5];
        assert_eq!(row(69)[..3], [168, 68, 69]);
        assert_eq!(row(69)[3], -1, "bits 0..64 all set");
        assert_eq!(row(69)[4], 0b11_1111, "bits 64..=69");
        assert_eq!(row(63)[3], -1);
        assert_eq!(row(63)[4], 0);
        assert_eq!(row(64)[4], 1);
    }

    fn select(sc: &[f32], tok: &[i64], par: &[i64], root: i64, nodes: u64) -> Vec<i64> {
        let c = sc.len();
        let r = run_op(
            Op::TreeSelect { nodes },
            vec![
                tf(DType::F32, &[1, c], sc),
                ti(DType::I32, &[1, c], tok),
                ti(DType::I64, &[1, c], par),
                ti(DType::I32, &[1], &[root]),
            ],
        );
        assert_eq!(r.dtype, DType::I64);
        r.as_i64().unwrap().to_vec()
    }

    /// Candidates (EAGLE layout, topk 2): depth 1 = c0 (-0.1), c1 (-0.9); depth 2 = the
    /// children of c0: c2 (-0.3), c3 (-0.2), and of c1: c4 (-1.0), c5 (-2.0). The best 4:
    /// c0, c3, c2, c1 → nodes 1..=4 in index order c0, c1, c2, c3.
    #[test]
    fn tree_select_best_by_score_in_index_order() {
        let sc = [-0.1, -0.9, -0.3, -0.2, -1.0, -2.0];
        let tok = [10, 11, 20, 21, 22, 23];
        let par = [-1, -1, 0, 0, 1, 1];
        let got = select(&sc, &tok, &par, 7, 5);
        #[rustfmt::skip]
        let want = [
            7, -1, 0, 0b1,
            10, 0, 1, 0b11,
            11, 0, 1, 0b101,
            20, 1, 2, 0b1011,
            21, 1, 2, 0b10011,
        ];
        assert_eq!(got, want);
        // Fewer candidates than nodes: padding rows after them.
        let got = select(&sc[..2], &tok[..2], &par[..2], 7, 4);
        assert_eq!(&got[8..], &[11, 0, 1, 0b101, 7, -1, 0, 0b1000]);
    }

    /// Ties go to the lower index, NaN ranks as -inf, and a child whose parent was not
    /// selected (a score above its parent's) is detached; its child hangs below it.
    #[test]
    fn tree_select_ties_nan_and_detached() {
        let sc = [0.0, 0.0, f32::NAN, 0.5, 0.5, -1.0];
        let tok = [1, 2, 3, 4, 5, 6];
        // c3's parent c2 (NaN) is not selected; c4's parent is c3; c5 under c0.
        let par = [-1, -1, 1, 2, 3, 0];
        let got = select(&sc, &tok, &par, 9, 6);
        let rows: Vec<&[i64]> = got.chunks(4).collect();
        // Order: c3, c4 (0.5, lower index first), c0, c1 (0.0), c5 (-1.0); c2 left out.
        assert_eq!(rows[1], &[1, 0, 1, 0b11]);
        assert_eq!(rows[2], &[2, 0, 1, 0b101]);
        assert_eq!(rows[3], &[4, -1, 0, 0b1000], "c3 detached");
        assert_eq!(rows[4], &[5, 3, 1, 0b11000], "c4 below the detached c3");
        assert_eq!(rows[5], &[6, 1, 2, 0b100011]);
    }

    /// 100 nodes (two ancestor words) from a chain of candidates.
    #[test]
    fn tree_select_multi_word() {
        let c = 120;
        let sc: Vec<f32> = (0..c).map(|i| -(i as f32)).collect();
        let tok: Vec<i64> = (0..c as i64).map(|i| 100 + i).collect();
        let par: Vec<i64> = (0..c as i64).map(|i| i - 1).collect();
        let got = select(&sc, &tok, &par, 5, 100);
        let row = |i: usize| &got[i * 5..][..5];
        assert_eq!(row(99)[..3], [198, 98, 99]);
        assert_eq!(row(99)[3], -1);
        assert_eq!(row(99)[4], (1i64 << 36) - 1);
    }

    fn accept(tree: &[i64], n: usize, target: &[i64], max_depth: u64) -> Vec<i64> {
        let t = ti(DType::I64, &[tree.len() / (n * 4), n, 4], tree);
        let g = ti(DType::I32, &[target.len() / n, n], target);
        let r = run_op(Op::TreeAccept { max_depth }, vec![t, g]);
        assert_eq!(r.dtype, DType::I32);
        r.as_i64().unwrap().to_vec()
    }

    #[test]
    fn tree_accept_walks_matching_children() {
        // The tree of `tree_build_best_first_by_hand`: 0 → {1: 10, 3: 11}, 1 → {2: 20},
        // 3 → {4: 20}.
        #[rustfmt::skip]
        let tree = [
            7, -1, 0, 1,   10, 0, 1, 3,   20, 1, 2, 7,   11, 0, 1, 9,   20, 3, 2, 25,
        ];
        // Target argmax at nodes: root → 11, node 3 → 20, node 4 → 99 (bonus).
        let got = accept(&tree, 5, &[11, 0, 0, 20, 99], 2);
        assert_eq!(got, vec![2, 99, 0, 3, 4]);
        // Root → 10, node 1 → 5 (no child 5): a = 1, bonus 5, path [0, 1, 1].
        let got = accept(&tree, 5, &[10, 5, 0, 0, 0], 2);
        assert_eq!(got, vec![1, 5, 0, 1, 1]);
        // Nothing matches: a = 0, bonus = target at the root.
        let got = accept(&tree, 5, &[42, 0, 0, 0, 0], 2);
        assert_eq!(got, vec![0, 42, 0, 0, 0]);
        // max_depth clamps the walk.
        let got = accept(&tree, 5, &[11, 0, 0, 20, 99], 1);
        assert_eq!(got, vec![1, 20, 0, 3]);
        // Padding nodes (parent -1) are never reached even when their token matches.
        let pad = [7, -1, 0, 1, 8, -1, 0, 2];
        assert_eq!(accept(&pad, 2, &[8, 0], 1), vec![0, 8, 0, 0]);
    }

    #[test]
    fn kv_move_in_order_with_clamps() {
        use super::super::attention::kv_move;
        // cache [1, 4, 1, 1] = [0, 1, 2, 3]; moves 2→1, then 9 (clamped to 3)→2, then a
        // negative src: nothing.
        let mut c = tf(DType::F32, &[1, 4, 1, 1], &[0.0, 1.0, 2.0, 3.0]);
        let src = ti(DType::I32, &[1, 3], &[2, 9, -1]);
        let dst = ti(DType::I32, &[1, 3], &[1, 2, 0]);
        kv_move(&mut c, &src, &dst).unwrap();
        assert_eq!(c.as_f32().unwrap(), &[0.0, 2.0, 3.0, 3.0]);
        // In order: 1→0 gives [1, 1, 2, 3], 2→1 gives [1, 2, 2, 3], and 0→3 copies the
        // already moved row 0.
        let mut c = tf(DType::F32, &[1, 4, 1, 1], &[0.0, 1.0, 2.0, 3.0]);
        let src = ti(DType::I32, &[1, 3], &[1, 2, 0]);
        let dst = ti(DType::I32, &[1, 3], &[0, 1, 3]);
        kv_move(&mut c, &src, &dst).unwrap();
        assert_eq!(c.as_f32().unwrap(), &[1.0, 2.0, 2.0, 1.0]);
    }
}
