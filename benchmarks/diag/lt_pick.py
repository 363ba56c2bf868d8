"""The cuBLASLt linear's candidate pick (kernel_src/linear_cublaslt/algo_pick.h), measured: a 2-D x at
the three widths, both projections, with a bias, no activation or tanh GELU, over M.

Routes, each under CUDA-graph replay (one graph calling it once per weight set, the sets together at
least 4x L2, so every call reads its weight from DRAM; GPU µs per call):

  lt       ops.linear_lt(out, x, w, b, act, None)   this project's cuBLASLt call, with the pick of this
                                                    process ($FUSED_GEGLU_LT_CANDIDATES: 1, the
                                                    default, is the heuristic's first; 4 times the first 4)
  aten     F.linear(x, w, b) (+ F.gelu)             ATen's addmm (cuBLASLt with its own query)
  wgrad    ops.linear_lt_bwd_weight(dw, db, g, x)   the weight and bias gradient (BGRADB), with --wgrad
  aten_wg  g.t() @ x, g.sum(0)                      ATen's, with --wgrad

Run once per setting, then compare (the plan cache is per process, so the setting is per process):

  FUSED_GEGLU_LT_CANDIDATES=1 python3 benchmarks/diag/lt_pick.py --out DIR --tag first
  FUSED_GEGLU_LT_CANDIDATES=4 FUSED_GEGLU_LT_LOG=1 python3 benchmarks/diag/lt_pick.py --out DIR --tag timed
  python3 benchmarks/diag/lt_pick.py --compare DIR/lt-pick-first.json DIR/lt-pick-timed.json

Outputs are checked against float64. Not the product benchmark (benchmarks/compare.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def stats(ts: list[float]) -> dict:
    ts = sorted(ts)
    return {"median_us": statistics.median(ts), "p20_us": ts[len(ts) // 5], "p80_us": ts[4 * len(ts) // 5]}


def routes_for(ops, act: int, wgrad: bool):
    def lt(x, w, b, g):
        out = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)
        ops.linear_lt(out, x, w, b, act, None)
        return out

    def aten(x, w, b, g):
        y = F.linear(x, w, b)
        return y if act == 0 else F.gelu(y, approximate="tanh")

    def lt_wg(x, w, b, g):
        dw, db = torch.empty_like(w), torch.empty_like(b)
        ops.linear_lt_bwd_weight(dw, db, g, x)
        return dw, db

    def aten_wg(x, w, b, g):
        return g.t() @ x, g.sum(0)

    r = {"lt": lt, "aten": aten}
    if wgrad:
        r.update({"wgrad": lt_wg, "aten_wg": aten_wg})
    return r


def rel_err(out, ref) -> float:
    if isinstance(out, tuple):
        return max(rel_err(o, r) for o, r in zip(out, ref))
    return ((out.double() - ref).norm() / ref.norm()).item()


def measure(args) -> None:
    from _diag import copy_gbs, load_kernel, projection_weight_sets, save_results
    from decode_pdl import graph_of, time_replays

    k = load_kernel()
    ops = getattr(torch.ops, k.OPS_ID)
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    copy_rate = copy_gbs(dev)
    rows = {}
    for shape in args.shapes.split(","):
        for proj in args.projections.split(","):
            kk, n, _, ws = projection_weight_sets(shape, proj, dev, dt)
            nsets = len(ws)
            for m in (int(v) for v in args.tokens.split(",")):
                sets = [(torch.randn(m, kk, device=dev, dtype=dt), w, b, torch.randn(m, n, device=dev, dtype=dt))
                        for w, b in ws]
                for act_name in args.activations.split(","):
                    act = 0 if act_name == "none" else 1
                    key = f"{shape}/{proj}/M{m}/{act_name}"
                    row = {"K": kk, "N": n, "M": m, "n_sets": nsets, "routes": {}}
                    fns = routes_for(ops, act, args.wgrad and act == 0)
                    graphs = {}
                    for r, fn in fns.items():
                        before = list(ops.linear_lt_plan_stats())
                        graphs[r], outs = graph_of(fn, sets)
                        after = list(ops.linear_lt_plan_stats())
                        refs = []
                        for x, w, b, g in sets:
                            if r in ("wgrad", "aten_wg"):
                                refs.append((g.double().t() @ x.double(), g.double().sum(0)))
                            else:
                                y = F.linear(x.double(), w.double(), b.double())
                                refs.append(y if act == 0 else F.gelu(y, approximate="tanh"))
                        row["routes"][r] = {"rel_err": max(rel_err(o, ref) for o, ref in zip(outs, refs)),
                                            "graph": [], "plan_stats_delta": [a - b_ for a, b_ in zip(after, before)]}
                    names = list(graphs)
                    for rnd in range(args.rounds):
                        for r in (names if rnd % 2 == 0 else names[::-1]):
                            row["routes"][r]["graph"] += [t / nsets for t in time_replays(graphs[r], args.reps)]
                    for r in names:
                        row["routes"][r]["graph"] = stats(row["routes"][r]["graph"])
                    del graphs
                    rows[key] = row
                    cells = " ".join(f"{r}={row['routes'][r]['graph']['median_us']:.1f}" for r in names)
                    bad = [r for r in names if row["routes"][r]["rel_err"] > 2e-2]
                    print(f"{key:32s} {cells}{'  ERROR ' + str(bad) if bad else ''}", flush=True)
                    save_results(args.out, f"lt-pick-{args.tag}.json", rows, copy_rate, args)
                del sets
            del ws
            torch.cuda.empty_cache()
    print("plan stats [plans, timed, from bucket, not the first, one candidate, candidates asked for]:",
          list(ops.linear_lt_plan_stats()))


def _rows(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["rows"]


def compare(first_path: str, timed_path: str) -> None:
    """Per case: ATen, the heuristic's first, the timed pick; the pick's ratio to each (below 1 is faster),
    and whether the timed process ran another algorithm than the first (its plan counters). Then, for the
    cases that kept the first (what one kernel's time varies between processes) and those that did not,
    how many moved by more than 3 %. Reads the .json or the stored .json.gz."""
    first, timed = _rows(first_path), _rows(timed_path)
    print(f"{'case':32s} {'aten':>8s} {'first':>8s} {'timed':>8s} {'t/first':>8s} {'t/aten':>8s} {'f/aten':>8s}  pick")
    kept, moved = [], []
    for route, base in (("lt", "aten"), ("wgrad", "aten_wg")):
        for key in timed:
            if key not in first or route not in timed[key]["routes"]:
                continue
            a = statistics.median([first[key]["routes"][base]["graph"]["median_us"],
                                   timed[key]["routes"][base]["graph"]["median_us"]])
            f = first[key]["routes"][route]["graph"]["median_us"]
            t = timed[key]["routes"][route]["graph"]["median_us"]
            other = timed[key]["routes"][route]["plan_stats_delta"][3] > 0  # [3]: plans not on the first
            (moved if other else kept).append(t / f)
            label = key if route == "lt" else key + " wgrad"
            print(f"{label:32s} {a:8.1f} {f:8.1f} {t:8.1f} {t / f:8.3f} {t / a:8.3f} {f / a:8.3f}  "
                  f"{'other' if other else 'first'}")
    for name, ratios in (("kept the first", kept), ("picked another", moved)):
        if ratios:
            print(f"{name}: {len(ratios)} cases, timed/first median {statistics.median(ratios):.3f}, "
                  f"< 0.97: {sum(r < 0.97 for r in ratios)}, > 1.03: {sum(r > 1.03 for r in ratios)}, "
                  f"range {min(ratios):.3f}-{max(ratios):.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    p.add_argument("--tag", default="run")
    p.add_argument("--shapes", default="gemma3-1b,gemma-2b,gemma2-9b")
    p.add_argument("--projections", default="gate,down", help="gate: K=H, N=I; down: K=I, N=H")
    p.add_argument("--tokens", default="16,64,128,192,256,384,512,1024,2048,8192")
    p.add_argument("--activations", default="none,gelu_tanh")
    p.add_argument("--wgrad", action="store_true", help="also the weight gradient (no-activation rows)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--compare", nargs=2, metavar=("FIRST_JSON", "TIMED_JSON"))
    args = p.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        if not args.out:
            p.error("--out is required to measure")
        measure(args)


if __name__ == "__main__":
    main()
