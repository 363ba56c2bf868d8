"""Host time of one training step at small M, ours against eager (a diagnosis tool): where the
harness's small-M training rows, which are host-bound, spend the time ours loses to eager.

    python3 benchmarks/diag/train_host.py --tokens 16 --out DIR [--device cpu]

Per shape and M, bf16 on CUDA (on CPU: fp32 at H = 64, I = 128, where a step is all host time),
weights as parameters:
- host_us fwd / step: CPU time of the forward alone and of forward + backward (``backward``
  returns once every backward kernel is issued), median of 50, the GPU kept busy by earlier steps;
- kernels: the GPU kernels of one step (name -> µs per step, torch.profiler) and their count;
- profile: the top functions of ours' step by own time (cProfile over 200 steps), to say which
  Python pieces the difference is made of.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import SHAPES, eager_mlp, environment, host_us, kernel_times, load_kernel  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    device = torch.device(args.device)
    k = load_kernel()
    shapes = SHAPES if device.type == "cuda" else {"tiny": (64, 128)}
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for name, (h, i) in shapes.items():
        ws = [torch.nn.Parameter(torch.randn(*s, device=device, dtype=dt) / s[1] ** 0.5)
              for s in ((i, h), (i, h), (h, i))]
        for m in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(m, h, device=device, dtype=dt, requires_grad=True)
            dy = torch.randn(m, h, device=device, dtype=dt)
            providers = {"eager": lambda: eager_mlp(x, *ws), "ours": lambda: k.geglu_mlp(x, *ws)}
            for prov, f in providers.items():
                def step(f=f):
                    f().backward(dy)
                    for t in (x, *ws):
                        t.grad = None
                for _ in range(10):
                    step()
                row = {"shape": name, "M": m, "provider": prov,
                       "host_us_fwd": host_us(f, device=device), "host_us_step": host_us(step, device=device)}
                if device.type == "cuda":
                    kt = kernel_times(step, 20)
                    row["kernels"] = kt
                    row["n_kernels"] = len(kt)
                    row["kernel_us"] = sum(kt.values())
                if prov == "ours":
                    row["backend"] = k.last_backend("geglu_mlp")
                    row["backward"] = k.last_backend("geglu_mlp_backward")
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(200):
                        step()
                    prof.disable()
                    _sync(device)
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).strip_dirs().sort_stats("tottime").print_stats(22)
                    row["profile"] = s.getvalue()[-6000:]
                rows.append(row)
                print(f"{name:10s} M={m:5d} {prov:6s} host fwd {row['host_us_fwd']:7.1f} us, step "
                      f"{row['host_us_step']:7.1f} us"
                      + (f", {row['n_kernels']} kernels {row['kernel_us']:.1f} us" if "kernels" in row else ""),
                      flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"train-host-{device.type}.json")
    with open(path, "w") as fh:
        env = environment() if device.type == "cuda" else {"device": "cpu", "torch": torch.__version__}
        json.dump({**env, "rows": rows}, fh, indent=1)
    for r in rows:
        if "profile" in r:
            print(f"== {r['shape']} M={r['M']} ours ({r['backend']}, backward {r['backward']})")
            print("\n".join(r["profile"].splitlines()[:34]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
