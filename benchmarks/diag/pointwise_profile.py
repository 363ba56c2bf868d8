"""GPU time of the GeGLU pointwise kernels alone (a diagnosis tool, GPU only): this project's CUDA
and Triton kernels against torch.compile's generated ones, per kernel from torch.profiler, so host
time (which decides the harness's stand-alone pointwise rows at M <= 1024) does not enter.

    python3 benchmarks/diag/pointwise_profile.py --sizes 1024x16384,8192x6912 --out DIR

Per size and provider: the forward kernel, the backward kernel (separate outputs) and, for ours,
the in-place backward the training MLP uses (gate <- dgate, up <- dup, dh <- h), each as GPU µs
and as GB/s of the bytes it must move (fwd 3, bwd 5, in-place bwd 6 tensors of M x I). The same
tensors are reused every step: sizes whose tensors fit in L2 (H200: 50 MB) read partly from cache.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from _diag import kernel_times, load_kernel


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1024x6912,1024x16384,1024x14336,8192x6912,8192x16384,8192x14336")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--sweep", default="1024x4,2048x4,2048x8,4096x8",
                   help="flat Triton configs to time as BLOCKxWARPS (besides the shipped ones)")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    k = load_kernel()
    ops = getattr(torch.ops, k.OPS_ID)
    tk = importlib.import_module(k.__name__ + ".triton_kernels.geglu")
    dev, dt = torch.device("cuda"), torch.bfloat16

    def fwd_eager(g, u):
        return F.gelu(g, approximate="tanh") * u

    fwd_c = torch.compile(fwd_eager, dynamic=False)

    def bwd_eager(dy, g, u):  # what autograd of fwd_eager computes, as one function for inductor
        gf, uf, dyf = g.float(), u.float(), dy.float()
        a = F.gelu(gf, approximate="tanh")
        return (dyf * uf * torch.ops.aten.gelu_backward(torch.ones_like(gf), gf, approximate="tanh")).to(g.dtype), \
            (dyf * a).to(u.dtype)

    bwd_c = torch.compile(bwd_eager, dynamic=False)
    rows = []
    for spec in args.sizes.split(","):
        m, n = (int(v) for v in spec.split("x"))
        torch.manual_seed(0)
        g, u, dy = (torch.randn(m, n, device=dev, dtype=dt) for _ in range(3))
        out, dg, du = (torch.empty_like(g) for _ in range(3))
        gi, ui, di = g.clone(), u.clone(), dy.clone()
        mb = m * n * 2 / 1e3  # bytes per tensor / 1e3, so GB/s = tensors * mb / us
        cases = {
            ("fwd", "cuda"): (3, lambda: ops.geglu_fwd(out, g, u, 1)),
            ("fwd", "triton"): (3, lambda: tk.geglu_fwd(out, g, u, "tanh")),
            ("fwd", "compile"): (3, lambda: fwd_c(g, u)),
            ("bwd", "cuda"): (5, lambda: ops.geglu_bwd(dg, du, dy, g, u, 1)),
            ("bwd", "triton"): (5, lambda: tk.geglu_bwd(dg, du, dy, g, u, "tanh")),
            ("bwd", "compile"): (5, lambda: bwd_c(dy, g, u)),
            # In place over copies (values drift over the steps; only the time is read).
            ("bwd_inplace", "cuda"): (6, lambda: ops.geglu_bwd_inplace(gi, ui, di, 1)),
            ("bwd_inplace", "triton"): (6, lambda: tk.geglu_bwd_inplace(gi, ui, di, "tanh")),
        }
        numel = m * n
        for spec_c in args.sweep.split(","):
            blk, nw = (int(v) for v in spec_c.split("x"))
            fa = dict(BLOCK=blk, EVEN=numel % blk == 0, INT64=False, num_warps=nw)
            grid = (-(-numel // blk),)
            cases[("fwd", f"tflat{blk}x{nw}")] = (
                3, lambda fa=fa, grid=grid: tk._geglu_fwd_flat_kernel[grid](out, g, u, numel, ACT=2, **fa))
            cases[("bwd_inplace", f"tflat{blk}x{nw}")] = (
                6, lambda fa=fa, grid=grid: tk._geglu_bwd_flat_kernel[grid](gi, ui, di, di, gi, ui, numel, ACT=2,
                                                                           STORE_H=True, **fa))
        for (mode, prov), (tensors, fn) in cases.items():
            us = sum(kernel_times(fn, args.steps).values())
            rows.append({"M": m, "N": n, "mode": mode, "provider": prov, "gpu_us": us, "gbps": tensors * mb / us})
            print(f"{m:5d}x{n:<6d} {mode:12s} {prov:8s} {us:8.1f} us  {tensors * mb / us:7.0f} GB/s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "pointwise-profile.json"
    path.write_text(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
