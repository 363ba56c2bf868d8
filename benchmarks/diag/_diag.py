"""What the diagnosis scripts share: the benchmark shapes, the eager MLP, loading the kernel the way
users do, and per-kernel GPU time from torch.profiler."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

SHAPES = {"gemma3-1b": (1152, 6912), "gemma-2b": (2048, 16384), "gemma2-9b": (3584, 14336)}  # (H, I)


def eager_mlp(x, wg, wu, wd):
    return F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd)


def load_kernel():
    """``kernels.get_kernel`` from the staged cache (HF_HUB_CACHE), offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import kernels

    return kernels.get_kernel("org/fused-geglu", version=1, trust_remote_code=True)


def kernel_times(fn, steps: int, warmup: int = 3) -> dict[str, float]:
    """GPU µs per call of ``fn``, per kernel name, summed over ``steps`` profiled calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = {}
    for evt in prof.key_averages():
        t = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
        if t > 0:
            per_kernel[evt.key] = per_kernel.get(evt.key, 0.0) + t / steps
    return per_kernel
