"""ATen's linear against this kernel's cached cuBLASLt op (``linear_lt``), per GEMM of the MLP: host
time of one call and GPU time, to decide whether the one-call MLP ops (``geglu_mlp_sm90``,
``geglu_mlp_gemm``) should call cuBLASLt through the cached plans instead of ``at::linear``.

host_us: median CPU time of one call while the GPU is kept busy (launches are asynchronous);
gpu_us: CUDA events around replays of one CUDA graph of calls over weight sets that together exceed
L2 (so weights come from DRAM), median per call over 5 interleaved rounds; kernels: the kernel names torch.profiler saw.

    python3 benchmarks/diag/gemm_host.py --out DIR [--tokens 16,128,512,8192]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import SHAPES, environment, host_us, kernel_times, load_kernel  # noqa: E402

L2_BYTES = 60 << 20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", default="16,128,512,8192")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    k = load_kernel()
    ops = getattr(torch.ops, k.OPS_ID)
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for shape, (h, i) in SHAPES.items():
        for gemm, (n, kk) in (("gate", (i, h)), ("down", (h, i))):
            nsets = max(2, -(-2 * L2_BYTES // (n * kk * 2)))
            ws = [torch.randn(n, kk, device=dev, dtype=dt) * kk**-0.5 for _ in range(nsets)]
            for m in (int(t) for t in args.tokens.split(",")):
                x = torch.randn(m, kk, device=dev, dtype=dt)
                out = torch.empty(m, n, device=dev, dtype=dt)
                provs = {
                    "aten_linear": lambda w: F.linear(x, w),
                    "linear_lt": lambda w: ops.linear_lt(out, x, w, None, 0, None),
                    "linear_lt_alloc": lambda w: ops.linear_lt(torch.empty(m, n, device=dev, dtype=dt), x, w, None, 0,
                                                               None),
                }
                ref = F.linear(x.double(), ws[0].double())
                row = {"shape": shape, "gemm": gemm, "M": m, "N": n, "K": kk, "host_us": {}, "gpu_us": {},
                       "rel_err": {}, "kernels": {}}
                for name, f in provs.items():
                    y = f(ws[0])
                    y = out if y is None else y
                    torch.cuda.synchronize()
                    row["rel_err"][name] = ((y.double() - ref).abs().max() / ref.abs().max()).item()
                    row["host_us"][name] = host_us(lambda: f(ws[0]), 100)
                    row["kernels"][name] = sorted(kernel_times(lambda: f(ws[0]), steps=5))
                graphs = {}
                for name, f in provs.items():
                    for w in ws:
                        f(w)
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for j in range(2 * nsets):
                            f(ws[j % nsets])
                    g.replay()
                    graphs[name] = g
                torch.cuda.synchronize()
                times = {name: [] for name in provs}
                for r in range(args.rounds):
                    for name in (provs if r % 2 == 0 else reversed(list(provs))):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        for _ in range(5):
                            graphs[name].replay()
                        e1.record()
                        torch.cuda.synchronize()
                        times[name].append(e0.elapsed_time(e1) * 1e3 / (5 * 2 * nsets))
                del graphs
                row["gpu_us"] = {name: statistics.median(t) for name, t in times.items()}
                rows.append(row)
                print(f"{shape:10s} {gemm:4s} M={m:5d} host " + " ".join(f"{a}={b:.1f}" for a, b in row["host_us"].items())
                      + " | gpu " + " ".join(f"{a}={b:.1f}" for a, b in row["gpu_us"].items()), flush=True)
            del ws
            torch.cuda.empty_cache()
    env = environment()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemm-host.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
