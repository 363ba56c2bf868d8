"""Decode (M = 16) under CUDA-graph replay: the Triton gate+up -> down chain with and without
programmatic dependent launch, with its trigger first thing or after the main loop
(`triton_kernels/pdl.py`), and with the split-K slices summed by a reduction kernel or by the down GEMM's
last program per tile (`linear.FUSED_REDUCE_MAX_M`). Eager's graph is timed in the same rounds as the yardstick; `--profile`
adds the GPU time per kernel of each graph (torch.profiler), to show where a decode step goes.
(The measurements of 85f3c03 also varied an L2 prefetch of the down weight, since removed: pdl.py.)

Each variant is one graph of n calls over n weight sets (together at least 4x L2, so no call finds its
weights in L2 from the call before); CUDA events around each replay; variants interleaved per round;
median per call. Not the product benchmark (benchmarks/compare.py): it picks pdl.py's defaults.

  python3 benchmarks/diag/decode_pdl.py --out DIR [--rounds 7] [--tokens 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import L2_BYTES, SHAPES, copy_gbs, eager_mlp, environment, kernel_times, load_kernel  # noqa: E402

# name: (FUSED_GEGLU_PDL, pdl.TRIGGER_AT_START, split-K slices summed in the down GEMM)
VARIANTS = {
    "plain": ("0", False, False),
    "start": ("1", True, False),
    "end-separate": ("1", False, False),
    "end": ("1", False, True),
}


# Launch-config variants (PDL as shipped): fields replacing those of the tuned M=16 entries of
# configs_sm90.json for the shape, for finding better decode tiles in the same rounds.
CONFIG_VARIANTS = {
    "down-s2": {"linear_fwd": {"SPLIT_K": 2}},
    "down-s6": {"linear_fwd": {"SPLIT_K": 6}},
    "down-s8": {"linear_fwd": {"SPLIT_K": 8}},
    "down-bn32": {"linear_fwd": {"BLOCK_N": 32}},
    "gateup-bn32": {"gateup_fwd": {"BLOCK_N": 32}},
    "gateup-bn32+down-s8": {"gateup_fwd": {"BLOCK_N": 32}, "linear_fwd": {"SPLIT_K": 8}},
}


def configure(pdl, tk_linear, variant: str) -> None:
    flag, at_start, fused = VARIANTS.get(variant, ("1", False, True))
    os.environ["FUSED_GEGLU_PDL"] = flag
    pdl.TRIGGER_AT_START = at_start
    tk_linear.FUSED_REDUCE_MAX_M = 64 if fused else 0


def with_configs(cfgmod, tokens: int, h: int, i: int, variant: str):
    """Tuned-config overrides of `variant` for this shape, applied to configs_sm90.json's table in
    memory; returns the undo function."""
    table = cfgmod._load_json((9, 0))["tuned"]
    keys = {"gateup_fwd": f"M={tokens},N={i},K={h}", "linear_fwd": f"M={tokens},N={h},K={i}"}
    saved = []
    for kern, fields in CONFIG_VARIANTS.get(variant, {}).items():
        old = table[kern][keys[kern]]  # a frozen KernelConfig
        saved.append((kern, old))
        table[kern][keys[kern]] = dataclasses.replace(old, **fields)
    cfgmod._gpu_config.cache_clear()

    def undo():
        for kern, old in saved:
            table[kern][keys[kern]] = old
        cfgmod._gpu_config.cache_clear()
    return undo


def graph_of(fn, sets):
    """One CUDA graph calling fn on every set (compiled and warmed outside the capture)."""
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [fn(*s) for s in sets]
    g.replay()
    torch.cuda.synchronize()
    return g, outs


def time_replays(g, reps: int) -> list[float]:
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) * 1e3 for a, b in ev]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--variants", default=",".join(VARIANTS), help="of " + ",".join([*VARIANTS, *CONFIG_VARIANTS]))
    p.add_argument("--profile", action="store_true", help="also GPU time per kernel of each graph")
    args = p.parse_args()
    k = load_kernel()
    pdl = importlib.import_module(k.__name__ + ".triton_kernels.pdl")
    cfgmod = importlib.import_module(k.__name__ + ".triton_kernels.configs")
    tk_linear = importlib.import_module(k.__name__ + ".triton_kernels.linear")
    dev, dt = torch.device("cuda"), torch.bfloat16
    variants = args.variants.split(",")
    torch.manual_seed(0)
    # copy bandwidth: the floor is the three weights read once at this rate
    copy_rate = copy_gbs(dev)
    results = {}
    for name, (h, i) in SHAPES.items():
        per_set = 3 * h * i * 2
        n = max(2, -(-4 * L2_BYTES // per_set))
        sets = []
        for _ in range(n):
            x = torch.randn(args.tokens, h, device=dev, dtype=dt)
            wg = torch.randn(i, h, device=dev, dtype=dt) * h**-0.5
            wu = torch.randn(i, h, device=dev, dtype=dt) * h**-0.5
            wd = torch.randn(h, i, device=dev, dtype=dt) * i**-0.5
            sets.append((x, wg, wu, wd))
        graphs, outs = {}, {}
        for v in variants:
            configure(pdl, tk_linear, v)
            undo = with_configs(cfgmod, args.tokens, h, i, v)
            graphs[v], outs[v] = graph_of(lambda x, wg, wu, wd: k.geglu_mlp(x, wg, wu, wd, backend="triton"), sets)
            undo()
        os.environ["FUSED_GEGLU_PDL"] = "0"
        graphs["eager"], outs["eager"] = graph_of(eager_mlp, sets)
        base = "plain" if "plain" in outs else variants[0]
        same = {v: all(torch.equal(a, b) for a, b in zip(outs[v], outs[base])) for v in variants}
        maxdiff = {v: max((a.float() - b.float()).abs().max().item() for a, b in zip(outs[v], outs[base]))
                   for v in variants}
        times = {v: [] for v in graphs}
        for r in range(args.rounds):
            order = list(graphs) if r % 2 == 0 else list(reversed(graphs))
            for v in order:
                times[v] += [t / n for t in time_replays(graphs[v], args.reps)]
        floor = per_set / (copy_rate * 1e9) * 1e6
        row = {"H": h, "I": i, "tokens": args.tokens, "n_sets": n, "floor_us": floor,
               "same_bits_as": base, "same_bits": same, "max_abs_diff": maxdiff,
               "median_us": {v: statistics.median(t) for v, t in times.items()},
               "p20_us": {v: sorted(t)[len(t) // 5] for v, t in times.items()},
               "p80_us": {v: sorted(t)[4 * len(t) // 5] for v, t in times.items()}}
        if args.profile:
            row["kernels_us_per_call"] = {
                v: {kn: t / n for kn, t in kernel_times(graphs[v].replay, steps=10).items()} for v in graphs}
            for v, ks in row["kernels_us_per_call"].items():
                print(f"  {name} {v}: " + ", ".join(f"{kn[:48]} {t:.1f}" for kn, t in sorted(ks.items(), key=lambda kv: -kv[1])))
        results[name] = row
        print(f"{name:10s} floor {floor:6.1f} | " + " ".join(f"{v}={row['median_us'][v]:.1f}" for v in graphs),
              flush=True)
        del graphs, outs, sets
        torch.cuda.empty_cache()
    env = {**environment(), "copy_gbs": copy_rate,
           "variants": {v: VARIANTS.get(v) or CONFIG_VARIANTS[v] for v in variants}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode-pdl.json"), "w") as f:
        json.dump({"env": env, "rows": results}, f, indent=1)
    print("variant       " + " ".join(f"{n:>10s}" for n in results))
    for v in list(variants) + ["eager"]:
        print(f"{v:13s} " + " ".join(f"{results[n]['median_us'][v]:10.1f}" for n in results))
    print(f"{'floor':13s} " + " ".join(f"{results[n]['floor_us']:10.1f}" for n in results))


if __name__ == "__main__":
    main()
