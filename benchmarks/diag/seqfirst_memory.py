"""Peak memory of one training step of ``linear`` on a sequence-first x (a diagnosis tool).

The harness (``linear_seqfirst`` ops, 2fcf31d) measured ours' training peak 12-71 % above eager's, while the
saved tensors and the CPU allocations of the two graphs are the same. This times nothing: it runs one
forward + backward per variant, from a clean allocator state, and reports the peak allocated above what
was allocated before the step (the harness's measure), for:
- ``eager``: ``F.linear(xs.transpose(0, 1), w, b)`` (ATen: copy to rows, mm, separate bias add);
- ``ours``: ``k.linear(...)`` on the same x (since 2fcf31d: rows, then addmm on ATen's nodes);
- ``rows_addmm``: ``F.linear(x.reshape(M, K), w, b)`` written out by hand, no kernel code at all;
- ``eager_nobias`` / ``rows_nobias``: the same two without a bias.
If ``rows_addmm`` matches ``ours``, the excess is the ATen route's own (addmm's backward against mm + add).

    python3 benchmarks/diag/seqfirst_memory.py --out DIR [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import environment, load_kernel  # noqa: E402

CASES = {"gemma-2b gate M=8192": (2048, 4, 2048, 16384), "gemma2-9b gate M=1024": (256, 4, 3584, 14336),
         "gemma-2b down M=8192": (2048, 4, 16384, 2048)}  # (S, B, K, N)


def _peak_mb(step, device) -> float | None:
    if device.type != "cuda":
        step()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    device = torch.device(args.device)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    k = load_kernel()
    rows = []
    for name, (s, b, kk, n) in CASES.items():
        if device.type == "cpu":
            s, b, kk, n = 16, 2, 64, 128
        xs = torch.randn(s, b, kk, device=device, dtype=dt, requires_grad=True)
        w = torch.nn.Parameter(torch.randn(n, kk, device=device, dtype=dt) / kk**0.5)
        bias = torch.nn.Parameter(torch.randn(n, device=device, dtype=dt))
        dy = torch.randn(b, s, n, device=device, dtype=dt)
        variants = {
            "eager": lambda: F.linear(xs.transpose(0, 1), w, bias),
            "ours": lambda: k.linear(xs.transpose(0, 1), w, bias),
            "rows_addmm": lambda: F.linear(xs.transpose(0, 1).reshape(b * s, kk), w, bias).view(b, s, n),
            "eager_nobias": lambda: F.linear(xs.transpose(0, 1), w),
            "rows_nobias": lambda: F.linear(xs.transpose(0, 1).reshape(b * s, kk), w).view(b, s, n),
        }
        row = {"case": name, "S": s, "B": b, "K": kk, "N": n, "peak_mb": {}, "grad_fn": {}}
        for label, fwd in variants.items():
            for _ in range(2):  # the first step warms the allocator and cuBLAS; the second is measured
                for t in (xs, w, bias):
                    t.grad = None

                def step():
                    y = fwd()
                    row["grad_fn"][label] = y.grad_fn.name()
                    y.backward(dy)
                peak = _peak_mb(step, device)
            row["peak_mb"][label] = peak
        print(name, {key: (round(v, 1) if v is not None else None) for key, v in row["peak_mb"].items()},
              row["grad_fn"], flush=True)
        rows.append(row)
        del xs, w, bias, dy
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"seqfirst-memory-{device.type}.json"), "w") as f:
        env = environment() if device.type == "cuda" else {"device": "cpu", "torch": torch.__version__}
        json.dump({**env, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
