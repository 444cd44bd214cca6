//! Draft-tree ops: `tree_build` (one block per sequence; thread 0 runs the best-first
//! expansion over a heap in shared memory, `tree_push` / `tree_pop` in `cuda/generic.cuh`),
//! `tree_select` (one block per sequence; each thread ranks its candidates against all C,
//! then thread 0 lays the selected ones out in index order),
//! `tree_accept` (one thread per sequence walks the tree) and `kv_move` (one thread per
//! 1–16-byte unit of a cache row and sequence, moving that unit of every listed row in
//! order, so each unit sees the moves exactly as the interpreter's sequential loop does).

use super::{flat_launch, load, raw_type, row_launch, unit_bytes, Kernel, TensorArg};
use crate::abi::KernelSource;
use crate::writer::emit;
use specc_ir::op::tree_words;

/// Best-first expansion into `budget` nodes per sequence, exactly as the interpreter.
pub(super) fn tree_build(
    budget: u64,
    logp: &TensorArg,
    ids: &TensorArg,
    root: &TensorArg,
    out: &TensorArg,
) -> KernelSource {
    let (b, l, kk) = (logp.dims[0], logp.dims[1], logp.dims[2]);
    let n = budget;
    let words = tree_words(n);
    let mut k = Kernel::new("tree_build", logp.dtype);
    k.ptr("lp_all", logp, false);
    k.ptr("ids_all", ids, false);
    k.ptr("roots", root, false);
    k.ptr("y_all", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int L = {l}, K = {kk}, N = {n}, W = {words}, C = 3 + W;"
    );
    w.comment("Each pop pushes at most two candidates: the heap never exceeds N + 1.");
    w.line("__shared__ TreeCand heap[N + 2];");
    w.line("__shared__ float score[N];");
    w.line("if (threadIdx.x != 0) return;");
    w.line("const long long b = blockIdx.x;");
    w.line("const float* lp = lp_all + b * (L * K);");
    emit!(
        w,
        "const {}* ids = ids_all + b * (L * K);",
        super::c_type(ids.dtype)
    );
    w.line("long long* y = y_all + b * (N * C);");
    emit!(
        w,
        "const long long root = {};",
        load(root.dtype, "roots[b]")
    );
    w.line("for (int i = 0; i < N * C; ++i) y[i] = 0;");
    w.line("y[0] = root;");
    w.line("y[1] = -1;");
    w.line("y[3] = 1;");
    w.line("score[0] = 0.0f;");
    w.line("int hn = 0, count = 1;");
    w.line("if (L > 0 && K > 0) tree_push(heap, hn, TreeCand{lp[0], 0, 0, 1});");
    w.while_block("count < N && hn > 0", |w| {
        w.line("const TreeCand c = tree_pop(heap, hn);");
        w.line("const int i = count++;");
        w.line("const int at = (c.d - 1) * K + c.r;");
        w.line("long long* row = y + (long long)i * C;");
        w.line("const long long* prow = y + (long long)c.p * C;");
        emit!(w, "row[0] = {};", load(ids.dtype, "ids[at]"));
        w.line("row[1] = c.p;");
        w.line("row[2] = c.d;");
        w.line("for (int j = 0; j < W; ++j) row[3 + j] = prow[3 + j];");
        w.line("row[3 + i / 64] |= (long long)(1ull << (i % 64));");
        w.line("score[i] = c.s;");
        w.if_block("c.r + 1 < K", |w| {
            w.line(
                "tree_push(heap, hn, TreeCand{__fadd_rn(score[c.p], lp[at + 1]), c.p, c.r + 1, c.d});",
            );
        });
        w.if_block("c.d < L", |w| {
            w.line("tree_push(heap, hn, TreeCand{__fadd_rn(score[i], lp[c.d * K]), i, 0, c.d + 1});");
        });
    });
    w.comment("padding: unreachable nodes (parent -1) that attend only themselves");
    w.for_block("int i = count", "i < N", "++i", |w| {
        w.line("long long* row = y + (long long)i * C;");
        w.line("row[0] = root;");
        w.line("row[1] = -1;");
        w.line("row[3 + i / 64] = (long long)(1ull << (i % 64));");
    });
    k.finish(row_launch(b, 32))
}

/// The best `min(N − 1, C)` candidates per sequence as a tree, exactly as the interpreter.
pub(super) fn tree_select(
    nodes: u64,
    scores: &TensorArg,
    tokens: &TensorArg,
    parents: &TensorArg,
    root: &TensorArg,
    out: &TensorArg,
) -> KernelSource {
    let (b, c) = (scores.dims[0], scores.dims[1]);
    let n = nodes;
    let words = tree_words(n);
    let mut k = Kernel::new("tree_select", scores.dtype);
    k.ptr("sc_all", scores, false);
    k.ptr("tok_all", tokens, false);
    k.ptr("par_all", parents, false);
    k.ptr("roots", root, false);
    k.ptr("y_all", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int CN = {c}, N = {n}, W = {words}, COLS = 3 + W, S = N - 1 < CN ? N - 1 : CN;"
    );
    w.comment("node_of[c]: c's node once laid out; first 1 (selected) or 0 (not).");
    w.line("__shared__ int node_of[CN];");
    w.line("const long long b = blockIdx.x;");
    w.line("const float* sc = sc_all + b * CN;");
    w.for_block("int c = threadIdx.x", "c < CN", "c += blockDim.x", |w| {
        w.line("const float kc = rank_key(sc[c]);");
        w.line("int r = 0;");
        w.for_block("int j = 0", "j < CN", "++j", |w| {
            w.line("const float kj = rank_key(sc[j]);");
            w.line("r += (kj > kc || (kj == kc && j < c)) ? 1 : 0;");
        });
        w.line("node_of[c] = r < S ? 1 : 0;");
    });
    w.line("__syncthreads();");
    w.line("if (threadIdx.x != 0) return;");
    emit!(
        w,
        "const {}* tok = tok_all + b * CN;",
        super::c_type(tokens.dtype)
    );
    emit!(
        w,
        "const {}* par = par_all + b * CN;",
        super::c_type(parents.dtype)
    );
    w.line("long long* y = y_all + b * (N * COLS);");
    emit!(
        w,
        "const long long root = {};",
        load(root.dtype, "roots[b]")
    );
    w.comment("root and padding rows: [root, -1, 0, bit i]");
    w.for_block("int i = 0", "i < N", "++i", |w| {
        w.line("long long* row = y + (long long)i * COLS;");
        w.line("row[0] = root;");
        w.line("row[1] = -1;");
        w.line("row[2] = 0;");
        w.line("for (int j = 0; j < W; ++j) row[3 + j] = 0;");
        w.line("row[3 + i / 64] = (long long)(1ull << (i % 64));");
    });
    w.line("int count = 0;");
    w.for_block("int c = 0", "c < CN", "++c", |w| {
        w.if_block("node_of[c] == 0", |w| {
            w.line("node_of[c] = -1;");
            w.line("continue;");
        });
        w.line("const int i = ++count;");
        w.line("node_of[c] = i;");
        emit!(w, "const long long p = {};", load(parents.dtype, "par[c]"));
        w.line("const long long parent = p < 0 ? 0 : (p < c && node_of[p] > 0 ? node_of[p] : -1);");
        w.line("long long* row = y + (long long)i * COLS;");
        emit!(w, "row[0] = {};", load(tokens.dtype, "tok[c]"));
        w.line("row[1] = parent;");
        w.if_block("parent >= 0", |w| {
            w.line("const long long* prow = y + parent * COLS;");
            w.line("row[2] = prow[2] + 1;");
            w.line("for (int j = 0; j < W; ++j) row[3 + j] = prow[3 + j];");
            w.line("row[3 + i / 64] |= (long long)(1ull << (i % 64));");
        });
    });
    k.finish(row_launch(b, 256))
}

/// The greedy walk per sequence: `[a, bonus, path_0 .. path_D]`.
pub(super) fn tree_accept(
    max_depth: u64,
    tree: &TensorArg,
    target: &TensorArg,
    out: &TensorArg,
) -> KernelSource {
    let (b, n, cols) = (tree.dims[0], tree.dims[1], tree.dims[2]);
    let mut k = Kernel::new("tree_accept", tree.dtype);
    k.ptr("tree", tree, false);
    k.ptr("tgt", target, false);
    k.ptr("y", out, true);
    let oc = max_depth + 3;
    k.grid_stride(b, |w| {
        emit!(
            w,
            "constexpr long long N = {n}, C = {cols}, D = {max_depth}, OC = {oc};"
        );
        w.line("const long long* tr = tree + e * N * C;");
        w.line("int* row = y + e * OC;");
        w.line("long long cur = 0;");
        w.line("int a = 0;");
        w.line("row[2] = 0;");
        w.while_block("a < D", |w| {
            emit!(
                w,
                "const long long want = {};",
                load(target.dtype, "tgt[e * N + cur]")
            );
            w.line("long long next = -1;");
            w.for_block("long long j = 1", "j < N", "++j", |w| {
                w.if_block("tr[j * C + 1] == cur && tr[j * C] == want", |w| {
                    w.line("next = j;");
                    w.line("break;");
                });
            });
            w.if_block("next < 0", |w| w.line("break;"));
            w.line("cur = next;");
            w.line("++a;");
            w.line("row[2 + a] = (int)cur;");
        });
        w.line("row[0] = a;");
        emit!(
            w,
            "row[1] = (int){};",
            load(target.dtype, "tgt[e * N + cur]")
        );
        w.line("for (long long i = a + 1; i <= D; ++i) row[2 + i] = (int)cur;");
    });
    k.finish(flat_launch(b))
}

/// Row moves `src[b, i] → dst[b, i]` in order of `i`, in place in the cache.
pub(super) fn kv_move(
    cache: &TensorArg,
    src: &TensorArg,
    dst: &TensorArg,
    out: &TensorArg,
) -> KernelSource {
    let (b, ctx) = (cache.dims[0], cache.dims[1]);
    let row_bytes = cache.dims[2..].iter().product::<u64>() * cache.elem_bytes();
    let w = unit_bytes(&[row_bytes, out.loc.byte_offset()]);
    let row = row_bytes / w;
    let n = src.dims[1];
    let last = ctx - 1;
    let mut k = Kernel::new("kv_move", cache.dtype);
    k.ptr("src", src, false);
    k.ptr("dst", dst, false);
    k.ptr_as("y", out.loc, raw_type(w), true);
    k.grid_stride(b * row, |w| {
        emit!(w, "const long long b = e / {row}ll, u = e % {row}ll;");
        w.for_block("long long i = 0", format_args!("i < {n}ll"), "++i", |w| {
            emit!(
                w,
                "const long long s = {};",
                load(src.dtype, &format!("src[b * {n}ll + i]"))
            );
            emit!(
                w,
                "const long long d = {};",
                load(dst.dtype, &format!("dst[b * {n}ll + i]"))
            );
            w.if_block("s < 0 || d < 0", |w| w.line("continue;"));
            emit!(w, "const long long ss = s < {last}ll ? s : {last}ll;");
            emit!(w, "const long long dd = d < {last}ll ? d : {last}ll;");
            emit!(
                w,
                "y[(b * {ctx}ll + dd) * {row}ll + u] = y[(b * {ctx}ll + ss) * {row}ll + u];"
            );
        });
    });
    k.finish(flat_launch(b * row))
}
