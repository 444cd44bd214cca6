"""Training / held-out corpus for the tiny family: the Python standard library's .py sources.

Same selection rule as scripts/make_default_model.py `corpus_files()` (stdlib dir from
`sysconfig.get_paths()["stdlib"]`, walk without `site-packages` and `__pycache__`, `.py` files in
sorted relative-path order, whole files until the byte limit is reached, non-UTF-8 files skipped),
with the byte limit as a parameter. The held-out set is the files that FOLLOW the training files in
the same order (whole files until `heldout_bytes`), so the two never overlap. Deterministic for a
given interpreter (the stdlib differs between Python versions: the README records the version and
a sha256 of the (path, text) stream).
"""
import hashlib
import os
import platform
import sysconfig


def stdlib_py_files():
    """(stdlib dir, sorted relative paths of its .py files), exactly as make_default_model.py."""
    stdlib = sysconfig.get_paths()["stdlib"]
    rels = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        for fn in filenames:
            if fn.endswith(".py"):
                rels.append(os.path.relpath(os.path.join(dirpath, fn), stdlib).replace(os.sep, "/"))
    rels.sort()
    return stdlib, rels


def _take(stdlib, rels, start, limit):
    """Whole UTF-8 files from rels[start:] until `limit` bytes are reached (the last file may go
    over, as in make_default_model.py). Returns (files, bytes, skipped, next index)."""
    out, total, skipped, i = [], 0, 0, start
    while i < len(rels) and total < limit:
        rel = rels[i]
        i += 1
        with open(os.path.join(stdlib, rel), "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        out.append((rel, text))
        total += len(data)
    return out, total, skipped, i


def stream_hash(files):
    h = hashlib.sha256()
    for rel, t in files:
        h.update(rel.encode() + b"\0" + t.encode("utf-8") + b"\0")
    return h.hexdigest()


def select(train_bytes, heldout_bytes):
    """Training files (the make_default_model rule with limit train_bytes) and held-out files
    (the following files, up to heldout_bytes). If the stdlib is too small for both, the held-out
    files are taken from the END of the list and the training set stops before them."""
    stdlib, rels = stdlib_py_files()
    train, tb, ts, nxt = _take(stdlib, rels, 0, train_bytes)
    held, hb, hs, _ = _take(stdlib, rels, nxt, heldout_bytes)
    if hb < heldout_bytes // 2:
        # not enough left after the training files: hold out the last files instead
        k = len(rels)
        size = 0
        while k > 0 and size < heldout_bytes:
            k -= 1
            size += os.path.getsize(os.path.join(stdlib, rels[k]))
        held, hb, hs, _ = _take(stdlib, rels, k, heldout_bytes)
        train, tb, ts, _ = _take(stdlib, rels[:k], 0, train_bytes)
    info = {
        "python": platform.python_version(),
        "stdlib": stdlib,
        "train_files": len(train),
        "train_bytes": tb,
        "train_first": train[0][0],
        "train_last": train[-1][0],
        "train_skipped_non_utf8": ts,
        "train_sha256": stream_hash(train),
        "heldout_files": len(held),
        "heldout_bytes": hb,
        "heldout_first": held[0][0] if held else None,
        "heldout_last": held[-1][0] if held else None,
        "heldout_sha256": stream_hash(held),
    }
    return train, held, info


def tokenize(tok, files, eos_id):
    """One flat id list: for each file, its tokens followed by EOS (file separator)."""
    encs = tok.encode_batch([t for _, t in files])
    ids = []
    for e in encs:
        ids.extend(e.ids)
        ids.append(eos_id)
    return ids
