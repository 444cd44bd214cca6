#!/usr/bin/env python3
"""Concurrency sweep figures: `specc bench-serve --json` files (a list of
{concurrency, output_tok_s, ttft_ms_p50, tpot_ms_p50, ...}, one object per level) turned
into an SVG line plot of output tok/s against concurrency (log-x, one line per config) and a
markdown table (tok/s per level, each config's ratio to the first, TTFT p50).

Usage: python3 bench/plot_sweep.py --svg OUT.svg [--md OUT.md] [--title T] [LABEL=]FILE.json...
A FILE without LABEL= is labelled by its name (sweep_ and .json dropped). The first file is
the baseline of the ratios (put plain decoding first). Standard library only.
"""

import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

COLOURS = ["#222222", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
DASHES = ["", "6,3", "2,2", "8,3,2,3", "4,4", "1,3", "10,4", "3,6"]
W, H = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 78, 230, 46, 58


def load(arg):
    label, sep, path = arg.rpartition("=")
    if not sep or not path:
        path = arg
        label = os.path.basename(arg)
        label = label[len("sweep_"):] if label.startswith("sweep_") else label
        label = label[: -len(".json")] if label.endswith(".json") else label
    with open(path) as f:
        levels = json.load(f)
    if not isinstance(levels, list) or not levels:
        sys.exit(f"{path}: expected a non-empty JSON list of bench-serve levels")
    for i, lv in enumerate(levels):
        for key in ("concurrency", "output_tok_s"):
            if not isinstance(lv.get(key), (int, float)):
                sys.exit(f"{path}: level {i}: expected a number in `{key}`, found {lv.get(key)!r}")
    return label, sorted(levels, key=lambda lv: lv["concurrency"])


def nice_step(span, ticks=5):
    """A 1/2/5 × 10^n step giving about `ticks` intervals over `span`."""
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def fmt(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def svg(series, title):
    concs = sorted({lv["concurrency"] for _, levels in series for lv in levels})
    ymax = max(lv["output_tok_s"] for _, levels in series for lv in levels) or 1.0
    step = nice_step(ymax)
    ytop = step * math.ceil(ymax / step)
    lo, hi = math.log(concs[0]), math.log(concs[-1])
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(c):
        return LEFT + (pw / 2 if hi == lo else (math.log(c) - lo) / (hi - lo) * pw)

    def y(v):
        return TOP + ph - v / ytop * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{LEFT + pw / 2}" y="24" text-anchor="middle" font-size="15">{escape(title)}</text>',
    ]
    for i in range(int(round(ytop / step)) + 1):
        v = i * step
        out.append(f'<line x1="{LEFT}" y1="{y(v):.1f}" x2="{LEFT + pw}" y2="{y(v):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
    for c in concs:
        out.append(f'<line x1="{x(c):.1f}" y1="{TOP}" x2="{x(c):.1f}" y2="{TOP + ph}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x(c):.1f}" y="{TOP + ph + 18}" text-anchor="middle">{c}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{H - 14}" text-anchor="middle">'
        "concurrency (requests in flight, log scale)</text>"
    )
    out.append(
        f'<text transform="translate(18 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
        "output tokens/s</text>"
    )
    for i, (label, levels) in enumerate(series):
        colour, dash = COLOURS[i % len(COLOURS)], DASHES[i % len(DASHES)]
        pts = " ".join(f"{x(lv['concurrency']):.1f},{y(lv['output_tok_s']):.1f}" for lv in levels)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr}/>')
        for lv in levels:
            out.append(
                f'<circle cx="{x(lv["concurrency"]):.1f}" cy="{y(lv["output_tok_s"]):.1f}" r="3" fill="{colour}"/>'
            )
        ly = TOP + 10 + 20 * i
        lx = LEFT + pw + 14
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 28}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash_attr}/>')
        out.append(f'<text x="{lx + 34}" y="{ly + 4}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def table(series):
    concs = sorted({lv["concurrency"] for _, levels in series for lv in levels})
    base = {lv["concurrency"]: lv["output_tok_s"] for lv in series[0][1]}
    head = "| config | " + " | ".join(f"c = {c}" for c in concs) + " | TTFT p50 ms (c = %d / %d) |" % (concs[0], concs[-1])
    rows = [head, "|---" * (len(concs) + 2) + "|"]
    for i, (label, levels) in enumerate(series):
        by = {lv["concurrency"]: lv for lv in levels}
        cells = []
        for c in concs:
            lv = by.get(c)
            if lv is None:
                cells.append("–")
                continue
            cell = fmt(lv["output_tok_s"])
            if i > 0 and base.get(c):
                cell += f" ({lv['output_tok_s'] / base[c]:.2f}×)"
            cells.append(cell)
        ttft = [by.get(c, {}).get("ttft_ms_p50") for c in (concs[0], concs[-1])]
        ttft_s = " / ".join("–" if t is None else f"{t:.1f}" for t in ttft)
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {ttft_s} |")
    return "\n".join(rows) + "\n\nOutput tok/s per concurrency; (×) against %s.\n" % series[0][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--svg", required=True, help="SVG file to write")
    ap.add_argument("--md", help="markdown table to write (also printed)")
    ap.add_argument("--title", default="specc serve: output tok/s vs concurrency")
    ap.add_argument("files", nargs="+", metavar="[LABEL=]FILE")
    a = ap.parse_args()
    series = [load(f) for f in a.files]
    with open(a.svg, "w") as f:
        f.write(svg(series, a.title))
    md = table(series)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    print(md, end="")


if __name__ == "__main__":
    main()
