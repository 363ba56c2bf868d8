"""Host time of the sm90 MLP call with and without the per-thread TMA descriptor table
(``kernel_src/gemm_sm90/tma_map_cache.h``; ``FUSED_GEGLU_SM90_TMA_CACHE=0`` turns it off), a
diagnosis tool. The switch is read once per process, so each round runs one child process per
setting, in alternating order, and the parent pairs them.

    python3 benchmarks/diag/tma_cache_ab.py --out DIR [--rounds 6] [--layers 8] [--tokens 16]

Per shape, bf16, under ``torch.no_grad``, in each child:
- ``raw_same``: the compiled op ``geglu_mlp_sm90`` (its launch resolved once) on one layer's
  weights and one x, back to back: every call after the first finds its two maps;
- ``raw_cycle``: the same op over ``--layers`` layers in turn, each with its own weights and x, as a
  model's decode step calls it (the table holds every layer's maps after the first pass);
- ``public_cycle``: ``geglu_mlp`` (the public function, auto policy) over the same layers.
Each is the median CPU time of one call while the GPU runs earlier calls (launches are
asynchronous), over 200 calls after 50 warm-up calls. Outputs are checked against the eager MLP.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import SHAPES, eager_mlp, environment, load_kernel  # noqa: E402

CASES = ("raw_same", "raw_cycle", "public_cycle")


def _per_call_us(calls, n: int = 200, warmup: int = 50) -> float:
    for i in range(warmup):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    times = []
    for i in range(n):
        f = calls[i % len(calls)]
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def child(tokens: int, layers: int) -> dict:
    k = load_kernel()
    pol = sys.modules[f"{k.__name__}.policy"]
    sw = sys.modules[f"{k.__name__}.sm90_weights"]
    raw = getattr(torch.ops, k.OPS_ID).geglu_mlp_sm90
    dev, dt = torch.device("cuda", 0), torch.bfloat16
    out = {}
    with torch.no_grad():
        for shape, (h, i) in SHAPES.items():
            gen = torch.Generator(device=dev).manual_seed(0)
            ws = [tuple(torch.randn(r, c, device=dev, dtype=dt, generator=gen) * c**-0.5
                        for r, c in ((i, h), (i, h), (h, i))) for _ in range(layers)]
            xs = [torch.randn(tokens, h, device=dev, dtype=dt, generator=gen) for _ in range(layers)]
            launch = sw.parse_launch(pol.sm90_mlp_launch(tokens, h, dev))

            def raw_call(j):
                return lambda: raw(xs[j], *ws[j], None, None, None, 1, *launch)

            def public_call(j):
                return lambda: k.geglu_mlp(xs[j], *ws[j], approximate="tanh")

            ref = eager_mlp(xs[0].float(), *(w.float() for w in ws[0]))
            errs = {name: ((f().float() - ref).abs().max() / ref.abs().max()).item()
                    for name, f in (("raw", raw_call(0)), ("public", public_call(0)))}
            out[shape] = {
                "launch": list(launch),
                "public_backend": k.last_backend("geglu_mlp"),
                "rel_err": errs,
                "raw_same": _per_call_us([raw_call(0)]),
                "raw_cycle": _per_call_us([raw_call(j) for j in range(layers)]),
                "public_cycle": _per_call_us([public_call(j) for j in range(layers)]),
            }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.tokens, args.layers)))
        return
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for setting in (("on", "off") if r % 2 == 0 else ("off", "on")):
            env = dict(os.environ, FUSED_GEGLU_SM90_TMA_CACHE="1" if setting == "on" else "0")
            res = subprocess.run([sys.executable, __file__, "--child", "--tokens", str(args.tokens),
                                  "--layers", str(args.layers)], env=env, capture_output=True, text=True,
                                 timeout=300)
            if res.returncode != 0:
                sys.exit(f"child ({setting}) failed:\n{res.stderr[-3000:]}")
            runs[setting].append(json.loads(res.stdout.strip().splitlines()[-1]))
    summary = {}
    for shape in SHAPES:
        row = {}
        for case in CASES:
            on = [run[shape][case] for run in runs["on"]]
            off = [run[shape][case] for run in runs["off"]]
            row[case] = {"on_median_us": statistics.median(on), "off_median_us": statistics.median(off),
                         "paired_on_minus_off_us": statistics.median(a - b for a, b in zip(on, off))}
        summary[shape] = row
    result = {"env": environment(), "args": vars(args), "summary": summary, "runs": runs}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tma-cache-ab.json").write_text(json.dumps(result, indent=1))
    print(f"{'shape':10} {'case':13} {'on':>8} {'off':>8} {'on-off':>8}  (µs per call, M = {args.tokens})")
    for shape, row in summary.items():
        for case, v in row.items():
            print(f"{shape:10} {case:13} {v['on_median_us']:8.1f} {v['off_median_us']:8.1f} "
                  f"{v['paired_on_minus_off_us']:+8.1f}")


if __name__ == "__main__":
    main()
