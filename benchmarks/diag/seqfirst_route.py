"""A sequence-first x (``x[S, B, K].transpose(0, 1)``) at small and middle M: which inference route
of ``linear`` is fastest, per (B, S), width and activation.

Until the rule "linear_seqfirst" (policy_sm90.json) every such call ran cuBLASLt over the B strided
batches of x (``linear._batched_lt``): no copy of x, but each batch is its own GEMM, and at few rows
per batch each GEMM reads the whole weight. The other routes copy x to rows first (an [M, K] copy)
and read the weight once per row tile:

  batched     linear._batched_lt(x, w, b, activation)      B strided cuBLASLt batches (called directly:
                                                           backend="cuda" follows the rule too)
  rows+addmm  k.linear(x, w, b, backend="torch")           rows(x), ATen addmm (bias in the epilogue)
  rows+lt     k.linear(x.reshape(M, K), w, b, backend="cuda")   rows, 2-D cuBLASLt (BIAS / GELU_BIAS)
  triton      k.linear(x, w, b, backend="triton")          rows, the Triton GEMM (split-K at decode)
  auto        k.linear(x, w, b)                            whatever the policy picks
  eager       F.linear(x, w, b) (+ F.gelu)                 ATen's bmm, then the bias add

Two timings per route: ``graph`` (one CUDA graph calling it once per weight set, the sets together
at least 4x L2 so no call finds its weight in L2; GPU time per call) and ``eager`` (the calls issued
back to back with CUDA events around each: host time where the host is the bound). Routes are
interleaved per round; medians and p20-p80 over the rounds. Every output is checked against float64.
Not the product benchmark (benchmarks/compare.py).

  python3 benchmarks/diag/seqfirst_route.py --out DIR [--shapes gemma2-9b] [--bs 2x8,4x32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import SHAPES, copy_gbs, load_kernel, projection_weight_sets, save_results  # noqa: E402
from decode_pdl import graph_of, time_replays  # noqa: E402

ROUTES = ("batched", "rows+addmm", "rows+lt", "triton", "auto", "eager")
_APPROX = {"gelu_tanh": "tanh", "gelu": "none"}


def route_fn(k, route: str, activation: str):
    act = None if activation == "none" else activation

    def eager(x, w, b):
        y = F.linear(x, w, b)
        return y if act is None else F.gelu(y, approximate=_APPROX[act])

    def rows_lt(x, w, b):
        b_, s, kk = x.shape
        return k.linear(x.reshape(b_ * s, kk), w, b, activation=act, backend="cuda").view(b_, s, -1)

    linear_mod = importlib.import_module(k.__name__ + ".linear")
    fns = {"batched": lambda x, w, b: linear_mod._batched_lt(x, w, b, activation),
           "rows+addmm": lambda x, w, b: k.linear(x, w, b, activation=act, backend="torch"),
           "rows+lt": rows_lt,
           "triton": lambda x, w, b: k.linear(x, w, b, activation=act, backend="triton"),
           "auto": lambda x, w, b: k.linear(x, w, b, activation=act),
           "eager": eager}
    return fns[route]


def time_eager(fn, sets, reps: int) -> list[float]:
    """Per-call CUDA-event spans of calls issued back to back over the sets, ``reps`` passes."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps * len(sets))]
    torch.cuda.synchronize()
    it = iter(ev)
    for _ in range(reps):
        for s in sets:
            a, b = next(it)
            a.record()
            fn(*s)
            b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) * 1e3 for a, b in ev]


def stats(ts: list[float]) -> dict:
    ts = sorted(ts)
    return {"median_us": statistics.median(ts), "p20_us": ts[len(ts) // 5], "p80_us": ts[4 * len(ts) // 5]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--projections", default="gate,down", help="gate: K=H, N=I; down: K=I, N=H")
    p.add_argument("--bs", default="2x2,2x8,4x8,8x8,2x32,8x32,2x64,4x64,4x128,8x128,4x256",
                   help="BxS pairs (batches x rows per batch)")
    p.add_argument("--activations", default="none,gelu_tanh")
    p.add_argument("--routes", default=",".join(ROUTES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    k = load_kernel()
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    copy_rate = copy_gbs(dev)
    routes = args.routes.split(",")
    rows = {}
    for shape in args.shapes.split(","):
        for proj in args.projections.split(","):
            kk, n, wbytes, ws = projection_weight_sets(shape, proj, dev, dt)
            nsets = len(ws)
            for bs in args.bs.split(","):
                b_, s = (int(v) for v in bs.split("x"))
                xs = [torch.randn(s, b_, kk, device=dev, dtype=dt).transpose(0, 1) for _ in range(nsets)]
                sets = [(x, w, bias) for x, (w, bias) in zip(xs, ws)]
                for activation in args.activations.split(","):
                    refs = [F.linear(x.double(), w.double(), bias.double()) for x, w, bias in sets]
                    if activation != "none":
                        refs = [F.gelu(r, approximate=_APPROX[activation]) for r in refs]
                    key = f"{shape}/{proj}/B{b_}xS{s}/{activation}"
                    fns, graphs, row = {}, {}, {"K": kk, "N": n, "B": b_, "S": s, "M": b_ * s, "weight_mb": wbytes / 1e6,
                                                "n_sets": nsets, "floor_us": wbytes / (copy_rate * 1e3), "routes": {}}
                    for r in routes:
                        fns[r] = route_fn(k, r, activation)
                        try:
                            graphs[r], outs = graph_of(fns[r], sets)
                        except Exception as exc:  # a route a build lacks: say so and go on
                            row["routes"][r] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                            continue
                        err = max(((o.double() - ref).norm() / ref.norm()).item() for o, ref in zip(outs, refs))
                        row["routes"][r] = {"rel_err": err, "graph": [], "eager": []}
                        if r == "auto":
                            row["routes"][r]["backend_ran"] = k.last_backend("linear")
                    live = [r for r in routes if r in graphs]
                    for rnd in range(args.rounds):
                        for r in (live if rnd % 2 == 0 else live[::-1]):
                            row["routes"][r]["graph"] += [t / nsets for t in time_replays(graphs[r], args.reps)]
                            row["routes"][r]["eager"] += time_eager(fns[r], sets, max(1, args.reps // 2))
                    for r in live:
                        v = row["routes"][r]
                        v["graph"], v["eager"] = stats(v["graph"]), stats(v["eager"])
                    rows[key] = row
                    del graphs
                    line = " ".join(f"{r}={row['routes'][r]['graph']['median_us']:.1f}/{row['routes'][r]['eager']['median_us']:.1f}"
                                    for r in live)
                    print(f"{key:36s} floor {row['floor_us']:6.1f} | graph/eager µs: {line}", flush=True)
                    bad = [r for r in live if row["routes"][r]["rel_err"] > 1e-2]
                    if bad:
                        print(f"   ERROR above 1e-2: {bad}", flush=True)
                    save_results(args.out, "seqfirst-route.json", rows, copy_rate, args)  # kept if cut short
            del ws
            torch.cuda.empty_cache()
    # The short table: per case, the fastest route under graphs and without, and batched's ratio to it.
    print(f"\n{'case':36s} {'graph best':>18s} {'batched/best':>12s} {'eager best':>18s} {'batched/best':>12s}")
    for key, row in rows.items():
        rs = {r: v for r, v in row["routes"].items() if "graph" in v and r not in ("auto", "eager")}
        if not rs or "batched" not in rs:
            continue
        cells = []
        for mode in ("graph", "eager"):
            best = min(rs, key=lambda r: rs[r][mode]["median_us"])
            cells += [f"{best} {rs[best][mode]['median_us']:.1f}",
                      f"{rs['batched'][mode]['median_us'] / rs[best][mode]['median_us']:.2f}"]
        print(f"{key:36s} {cells[0]:>18s} {cells[1]:>12s} {cells[2]:>18s} {cells[3]:>12s}")


if __name__ == "__main__":
    main()
