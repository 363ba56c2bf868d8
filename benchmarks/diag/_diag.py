"""What the diagnosis scripts share: the benchmark shapes, the eager MLP, loading the kernel the way
users do, per-kernel GPU time from torch.profiler, the copy bandwidth, a call's host time, and the environment
recorded with the results."""

from __future__ import annotations

import importlib
import os
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

SHAPES = {"gemma3-1b": (1152, 6912), "gemma-2b": (2048, 16384), "gemma2-9b": (3584, 14336)}  # (H, I)
# Probed only when asked for by name (kernel_probe.py --shapes blog): the harness's small shape.
EXTRA_SHAPES = {"blog": (768, 3072)}


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


def copy_gbs(device: torch.device) -> float:
    """Device-to-device copy rate (GB/s, read + write) of 256 MB, 20 copies after 3 warm-ups: the
    weight-read floors of the decode scripts are the weights' bytes at this rate."""
    src = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        dst.copy_(src)
    e1.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * 20 / (e0.elapsed_time(e1) * 1e-3) / 1e9


def host_us(fn, n: int = 50, device: torch.device | None = None) -> float:
    """Median CPU time of one call of ``fn`` while the GPU is kept busy (launches are asynchronous,
    so this is the Python + dispatch + launch cost alone). On a CPU ``device`` it is the whole call."""
    sync = torch.cuda.synchronize if device is None or device.type == "cuda" else (lambda: None)
    sync()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    sync()
    return statistics.median(times)


def environment() -> dict:
    """Where the numbers came from: device, driver, versions, the commit the build was made from."""
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = None
    return {"device": torch.cuda.get_device_name(), "driver": driver, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": importlib.import_module("triton").__version__,
            "commit": os.environ.get("FUSED_GEGLU_COMMIT", "")}
