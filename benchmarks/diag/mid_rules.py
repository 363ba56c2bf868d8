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

``--forced`` proposes the ``geglu_mlp_sm90_forced`` rules instead: for ``backend="cuda"`` forced where
the ``geglu_mlp_sm90`` rules name no launch (``--policy``), per 128-row interval the launch with the
smallest worst ratio over the interval's measured M that those rules leave to cuBLAS + pointwise, next
to the op's own size heuristic (``HEURISTIC``), which is what a forced call ran before.
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


# The op's own tile choice when it is given none (pick_tile in kernel_src/gemm_sm90/geglu_gateup_sm90.cu):
# 128x256 cooperative when that makes at least one tile per SM (132 on the H200), else 128x128; swizzle 1.
SHAPE_HI = {"blog": (768, 3072), "gemma3-1b": (1152, 6912), "gemma-2b": (2048, 16384), "gemma2-9b": (3584, 14336)}


def heuristic(m: int, i: int, sm_count: int = 132) -> str:
    return "128x256/s1" if -(-m // 128) * -(-2 * i // 256) >= sm_count else "128x128/s1"


def first_match(rules: list, fallback: str, sizes: dict) -> str:
    """policy.first_match without importing torch (the same test: every bound holds and names a size)."""
    for rule in rules:
        if all(rule.get(f"min_{k}", 0) <= v <= rule.get(f"max_{k}", 1 << 62) for k, v in sizes.items()) \
                and all(key.partition("_")[2] in sizes for key in rule if key.startswith(("min_", "max_"))):
            return rule["backend"]
    return fallback


def forced_bands(per_m: dict, shape: str, auto_rules: list, step: int = 128) -> list:
    """(first M, last M, launch, its worst ratio, the heuristic's worst ratio) per ``step``-row
    interval, over the measured M where ``auto_rules`` name no launch under graphs."""
    h, i = SHAPE_HI[shape]
    out = []
    for k in sorted({(m - 1) // step for m in per_m}):
        pts = [m for m in sorted(per_m) if (m - 1) // step == k
               and first_match(auto_rules, "no", {"m": m, "h": h, "capturing": 1, "m_align": m & -m}) == "no"]
        if not pts:
            continue
        launches = set.intersection(*(set(per_m[m]) - {"cublas+pointwise"} for m in pts))
        worst = {ln: max(per_m[m][ln] for m in pts) for ln in launches}
        best = min(worst, key=worst.get)
        out.append((pts[0], pts[-1], best, worst[best], max(per_m[m][heuristic(m, i)] for m in pts)))
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
    p.add_argument("--forced", action="store_true",
                   help="propose geglu_mlp_sm90_forced rules (see the module docstring)")
    p.add_argument("--policy", default="torch-ext/fused_geglu/policy_sm90.json",
                   help="the policy whose geglu_mlp_sm90 rules --forced works around")
    args = p.parse_args()
    data = load_ratios(args.files, args.min_m, args.max_m, args.worst)  # cuBLAS + pointwise = 1
    if args.forced:
        auto_rules = json.load(open(args.policy))["geglu_mlp_sm90"]
        for shape, per_m in data.items():
            h_lo, h_hi = H_RANGE.get(shape, (0, 0))
            for first, last, ln, worst, heur in forced_bands(per_m, shape, auto_rules):
                k = (first - 1) // 128
                print(f"  rule: min_m {max(128 * k + 1, args.min_m)} max_m {min(128 * k + 128, args.max_m)} "
                      f"min_h {h_lo} max_h {h_hi} -> {ln} (measured M {first}..{last}: worst {worst:.3f} of "
                      f"cuBLAS + pointwise, the heuristic {heur:.3f})")
        return
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
