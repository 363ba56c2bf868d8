"""Propose ``geglu_mlp_sm90`` rules for M = 65..1023 from ``kernel_probe.py --sections decode`` results.

    python benchmarks/diag/mid_rules.py benchmarks/results/kernel-probe-grid-h200-*.json [more.json ...]

Reads the graph-replay rows (GPU time of one whole inference call: ``sm90 <launch>`` against
``cublas+pointwise``), pools several files by each case's median ratio to cuBLAS + pointwise in its own
file (``--worst``: its largest, so a launch holds a point only where it held it in every run), and
prints per shape and M
the fastest launch and its time relative to cuBLAS + pointwise. Then, per shape, it grows bands of
consecutive measured M over which one launch stays within ``--margin`` of cuBLAS + pointwise at
every point (the launch with the best worst-case ratio), and prints them as rules: a size between
two measured points belongs to the band of both, otherwise the band ends halfway. Where no launch
holds, the band is ``no`` (cuBLAS + pointwise). ``--step 128`` instead ends every band at a multiple of
128 (a 128-row tile's time is flat between them; see ``step_bands``), which is how the rules since
ddfd9b5 were drawn (``--worst --step 128`` over the five probe files policy_sm90.json cites). It
proposes; policy_sm90.json is edited by hand (or by a script), citing the files.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

# The benchmark shapes' H, and the H range a rule derived from each covers (the ranges of the
# existing M >= 1024 rules in policy_sm90.json).
H_RANGE = {"blog": (768, 1151), "gemma3-1b": (1152, 1535), "gemma-2b": (1536, 2048), "gemma2-9b": (2049, 4096)}


def load(paths: list[str], lo: int, hi: int, pool=statistics.median) -> dict:
    """{shape: {M: {impl: pooled us}}} of the graph rows with lo <= M <= hi (``pool``: how the
    files' values of one case combine; median by default)."""
    samples: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in paths:
        for r in json.load(open(path))["rows"]:
            if r.get("section") == "decode" and r.get("mode") == "graph" and "us" in r and lo <= r["M"] <= hi:
                impl = r["impl"]
                if impl == "cublas+pointwise" or impl.startswith("sm90 "):
                    samples[r["shape"]][r["M"]][impl.removeprefix("sm90 ")].append(r["us"])
    return {s: {m: {i: pool(v) for i, v in d.items()} for m, d in ms.items()}
            for s, ms in samples.items()}


def load_ratios(paths: list[str], lo: int, hi: int, worst: bool) -> dict:
    """As :func:`load`, each launch as its time over cuBLAS + pointwise's in the same file; with
    ``worst`` a case takes its largest ratio over the files (a launch holds a point only if it held
    it in every run that measured it), else the median."""
    ratios: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in paths:
        per = load([path], lo, hi)
        for s, ms in per.items():
            for m, d in ms.items():
                for i, t in d.items():
                    ratios[s][m][i].append(t / d["cublas+pointwise"])
    pool = max if worst else statistics.median
    return {s: {m: {i: pool(v) for i, v in d.items()} for m, d in ms.items()} for s, ms in ratios.items()}


def bands(per_m: dict, margin: float) -> list[tuple[int, int, str, float]]:
    """Greedy left-to-right bands of measured M: (first M, last M, launch, worst ratio to cuBLAS)."""
    ms = sorted(per_m)
    out: list = []
    k = 0
    while k < len(ms):
        best = None
        for j in range(len(ms) - 1, k - 1, -1):  # the longest run from ms[k] one launch holds
            span = ms[k:j + 1]
            launches = set.intersection(*(set(per_m[m]) - {"cublas+pointwise"} for m in span))
            worst = {ln: max(per_m[m][ln] / per_m[m]["cublas+pointwise"] for m in span) for ln in launches}
            ok = {ln: w for ln, w in worst.items() if w <= margin}
            if ok:
                ln = min(ok, key=ok.get)
                best = (ms[k], ms[j], ln, ok[ln])
                break
        if best is None:
            out.append((ms[k], ms[k], "no", 1.0))
            k += 1
        else:
            out.append(best)
            k = ms.index(best[1]) + 1
    merged: list = []
    for b in out:  # adjacent "no" points are one band
        if merged and b[2] == "no" and merged[-1][2] == "no":
            merged[-1] = (merged[-1][0], b[1], "no", 1.0)
        else:
            merged.append(b)
    return merged


def step_bands(per_m: dict, margin: float, step: int) -> list[tuple[int, int, str, float]]:
    """Bands that never cross a multiple of ``step`` (the CUTLASS tiles' row count). A 128-row tile
    launch does the same work for every M in (step * (k - 1), step * k] (the rows past M are TMA
    zero fill), so its time is flat there while cuBLAS + pointwise's grows with M: within each such
    interval a launch holds from the lowest measured M at and above which it held every measured
    point up to the interval's top. Below that, and in intervals whose top it loses, ``no``."""
    out = []
    for k in sorted({(m - 1) // step for m in per_m}):
        pts = sorted(m for m in per_m if (m - 1) // step == k)
        best = None
        for i in range(len(pts)):  # the longest suffix of the interval's points one launch holds
            span = pts[i:]
            launches = set.intersection(*(set(per_m[m]) - {"cublas+pointwise"} for m in span))
            worst = {ln: max(per_m[m][ln] / per_m[m]["cublas+pointwise"] for m in span) for ln in launches}
            ok = {ln: w for ln, w in worst.items() if w <= margin}
            if ok:
                ln = min(ok, key=ok.get)
                best = (pts[i], ln, ok[ln])
                break
        top = min(step * (k + 1), pts[-1] if pts[-1] % step else step * (k + 1))
        if best is None:
            out.append((step * k + 1, top, "no", 1.0))
        else:
            if best[0] > step * k + 1:
                out.append((step * k + 1, best[0] - 1, "no", 1.0))
            out.append((best[0], top, best[1], best[2]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--min-m", type=int, default=65)
    p.add_argument("--max-m", type=int, default=1023)
    p.add_argument("--margin", type=float, default=1.0,
                   help="a launch holds a band if its time / cuBLAS + pointwise stays at or under this")
    p.add_argument("--worst", action="store_true",
                   help="pool the files by each case's worst ratio (a launch must hold a point in every run)")
    p.add_argument("--step", type=int, default=0,
                   help="bands end at multiples of this (128: the tiles' rows; see step_bands); 0: halfway rule")
    args = p.parse_args()
    data = load_ratios(args.files, args.min_m, args.max_m, args.worst)  # cuBLAS + pointwise = 1
    for shape, per_m in data.items():
        print(f"== {shape}")
        for m in sorted(per_m):
            cub = per_m[m]["cublas+pointwise"]
            ranked = sorted((t, ln) for ln, t in per_m[m].items() if ln != "cublas+pointwise")
            print(f"  M={m:5d} cuBLAS+pw {cub:5.3f}    | " +
                  " ".join(f"{ln} {t / cub:.3f}" for t, ln in ranked[:4]))
        if args.step:
            h_lo, h_hi = H_RANGE.get(shape, (0, 0))
            for lo, hi, ln, worst in step_bands(per_m, args.margin, args.step):
                if ln != "no":
                    print(f"  rule: min_m {max(lo, args.min_m)} max_m {min(hi, args.max_m)} min_h {h_lo} max_h {h_hi}"
                          f" -> {ln} (worst {worst:.3f} of cuBLAS + pointwise at the measured M in it)")
            continue
        ms = sorted(per_m)
        for first, last, ln, worst in bands(per_m, args.margin):
            i, j = ms.index(first), ms.index(last)
            lo = args.min_m if i == 0 else (ms[i - 1] + first) // 2 + 1
            hi = args.max_m if j == len(ms) - 1 else (last + ms[j + 1]) // 2
            h_lo, h_hi = H_RANGE.get(shape, (0, 0))
            print(f"  rule: min_m {lo} max_m {hi} min_h {h_lo} max_h {h_hi} -> {ln}"
                  f" (measured M {first}..{last}, worst {worst:.3f} of cuBLAS + pointwise)")


if __name__ == "__main__":
    main()
