#!/usr/bin/env python3
"""Soak of `specc serve` (standard library only): starts the server, sends every prompt
once alone (greedy references), then N requests from C concurrent clients (streamed and
whole, random budgets and stop strings), checks each reply equals its lone text cut at the
same budget, and that /metrics is back at idle (no lane in use, no KV in use, nothing
running or waiting). Prints throughput and the end state; exits non-zero on a mismatch.

  serve_soak.py --bin .gpu/specc --requests 200 --concurrency 16 -- --backend cuda --spec models/default/spec.lanes8.toml

--ids N: N prompts of token ids (32-95 ids inside every Llama-3 vocabulary) instead of the
code prompts, for targets without a tokenizer (`--random-weights` shapes). With nvidia-smi
present, the device memory in use is printed after the lone references and at the end.
"""
import argparse, json, random, shutil, subprocess, sys, threading, time, urllib.request

PROMPTS = ["def __init__(self", "import os\n", "class Queue:", "    return ", "for i in range(",
           "def parse(", '"""Return the', "if __name__ ==", "raise ValueError(", "with open(",
           "try:\n    ", "self.", "def __repr__(self):", "from collections import", "while True:",
           "    def close(self):"]


def post(base, body, timeout):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read().decode()
    if not body.get("stream"):
        v = json.loads(raw)
        return v["choices"][0]["text"], v["usage"]["completion_tokens"]
    text, n = "", None
    events = [e[len("data: "):] for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]", raw[-200:]
    for e in events[:-1]:
        v = json.loads(e)
        if v.get("usage"):
            n = v["usage"]["completion_tokens"]
        for c in v["choices"]:
            text += c.get("text") or ""
    return text, n


def gpu_memory_mib():
    """Device memory in use (MiB) per nvidia-smi, or None without it."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name.split("{")[0] + ("{" + name.split("{", 1)[1] if "position" in name or "finished_reason" in name else "")] = float(value)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=".gpu/specc")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--timeout", type=float, default=540, help="seconds for the whole soak")
    ap.add_argument("--ids", type=int, default=0, help="token-id prompts instead of text")
    ap.add_argument("--id-range", default="1000,100000", help="token ids drawn from LO,HI")
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    proc = subprocess.Popen([a.bin, "serve", "--port", "0", *a.serve_args],
                            stderr=subprocess.PIPE, text=True)
    base = None
    t0 = time.time()
    for line in proc.stderr:
        sys.stderr.write(line)
        if "on http://" in line:
            base = "http://" + line.split("on http://")[1].split()[0]
            break
    if base is None:
        sys.exit("the server exited before listening")
    threading.Thread(target=lambda: [sys.stderr.write(l) for l in proc.stderr], daemon=True).start()
    print(f"server up in {time.time() - t0:.1f} s at {base}")
    deadline = time.time() + a.timeout
    try:
        r = random.Random(11)
        lo, hi = map(int, a.id_range.split(","))
        prompts = ([[r.randrange(lo, hi) for _ in range(32 + r.randrange(64))] for _ in range(a.ids)]
                   if a.ids else PROMPTS)
        key = lambda p: json.dumps(p)
        alone = {}
        for p in prompts:
            alone[key(p)] = post(base, {"prompt": p, "max_tokens": a.max_tokens, "ignore_eos": True}, 120)[0]
        rng = random.Random(7)
        jobs = []
        for i in range(a.requests):
            p = rng.choice(prompts)
            jobs.append({"prompt": p, "max_tokens": a.max_tokens, "ignore_eos": True,
                         "stream": rng.random() < 0.5, "stream_options": {"include_usage": True}})
        bad, done, tokens = [], [0], [0]
        lock = threading.Lock()

        def client(mine):
            for j in mine:
                if time.time() > deadline:
                    return
                text, n = post(base, j, 300)
                with lock:
                    done[0] += 1
                    tokens[0] += n or 0
                    if text != alone[key(j["prompt"])]:
                        bad.append((j["prompt"], text, alone[key(j["prompt"])]))
        def run(batch):
            threads = [threading.Thread(target=client, args=(batch[c::a.concurrency],))
                       for c in range(a.concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        # A warm-up fifth puts every lane to use (its first prefills capture their graphs);
        # the device memory after it is the idle value the end must come back to.
        warm = max(2 * a.concurrency, a.requests // 5)
        run(jobs[:warm])
        time.sleep(0.5)
        mem0 = gpu_memory_mib()
        done_warm, tokens_warm = done[0], tokens[0]
        t1 = time.time()
        run(jobs[warm:])
        dt = time.time() - t1
        time.sleep(0.5)
        m = metrics(base)
        idle = {k: m[k] for k in ["specc:lanes_in_use", "vllm:num_requests_running",
                                  "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]}
        timed = tokens[0] - tokens_warm
        print(f"{done[0]}/{a.requests} requests; after {done_warm} warm-up ones, {timed} tokens in "
              f"{dt:.1f} s: {timed / dt:.1f} tok/s at concurrency {a.concurrency}")
        drafts = m.get("vllm:spec_decode_num_drafts_total", 0)
        if drafts:
            acc = m["vllm:spec_decode_num_accepted_tokens_total"]
            print(f"mean acceptance length {1 + acc / drafts:.2f} over {drafts:.0f} drafts")
        print(f"at the end: {idle}; steps {m['specc:steps_total']:.0f}")
        mem1 = gpu_memory_mib()
        if mem0 is not None:
            print(f"device memory in use: {mem0} MiB after the warm-up, {mem1} MiB at the end")
        ok = not bad and done[0] == a.requests and all(v == 0 for v in idle.values())
        ok = ok and (mem0 is None or mem1 == mem0)
        for p, got, want in bad[:3]:
            print(f"MISMATCH {p!r}: batched {got!r} vs alone {want!r}")
        print("PASS" if ok else "FAIL")
        sys.exit(0 if ok else 1)
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
