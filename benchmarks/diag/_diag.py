"""What the diagnosis scripts share: the benchmark shapes, the eager MLP, loading the kernel the way
users do, per-kernel GPU time from torch.profiler, the copy bandwidth, a call's host time, and the environment
recorded with the results."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # fused_geglu_tools, as e2e_gemma.py does
from fused_geglu_tools.buildconfig import hub_repo_id, hub_version  # noqa: E402

REPO_ID = hub_repo_id(ROOT)  # the Hub id the kernel is staged under (a fork's own id in a fork)
VERSION = hub_version(ROOT)  # and its major version: `make stage` stages refs/v<VERSION>
SHAPES = {"gemma3-1b": (1152, 6912), "gemma-2b": (2048, 16384), "gemma2-9b": (3584, 14336)}  # (H, I)
# Probed only when asked for by name (kernel_probe.py --shapes blog): the harness's small shape.
EXTRA_SHAPES = {"blog": (768, 3072)}


def eager_mlp(x, wg, wu, wd):
    return F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd)


def load_kernel():
    """``kernels.get_kernel`` from the staged cache (HF_HUB_CACHE), offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import kernels

    return kernels.get_kernel(REPO_ID, version=VERSION, trust_remote_code=True)


def kernel_times(fn, steps: int, warmup: int = 3, warmup_ms: float = 0.0) -> dict[str, float]:
    """GPU µs per call of ``fn``, per kernel name, summed over ``steps`` profiled calls.

    ``warmup_ms``: after the ``warmup`` calls, keep calling until that much wall time has passed. A
    GEMM-bound step at M = 8192 draws the board to its power cap, and a provider profiled right after
    seconds of idle GPU (torch.compile compiling) may run its first ~100 ms at higher clocks than one
    profiled after a busy one; a 3-call warm-up would not hide that."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if warmup_ms > 0:
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < warmup_ms:
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


def span_us(fn, n: int = 50) -> float:
    """CUDA-event span of one call issued back to back (as the harness times it), median of ``n``."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    torch.cuda.synchronize()
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in ev)


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


# L2 of the H200 rounded up (50 MB on the data sheet): decode weight sets total at least 4x this.
L2_BYTES = 60 << 20


def projection_weight_sets(shape: str, proj: str, device, dtype):
    """(K, N, weight bytes, (weight, bias) sets) of one projection of a benchmark shape: ``gate`` is
    K = H, N = I, ``down`` K = I, N = H. At least two sets, together at least 4x L2, so that a CUDA
    graph calling a linear once per set reads every weight from DRAM."""
    h, i = SHAPES[shape]
    k, n = (h, i) if proj == "gate" else (i, h)
    wbytes = n * k * torch.finfo(dtype).bits // 8
    nsets = max(2, -(-4 * L2_BYTES // wbytes))
    return k, n, wbytes, [(torch.randn(n, k, device=device, dtype=dtype) * k**-0.5,
                           torch.randn(n, device=device, dtype=dtype)) for _ in range(nsets)]


def decode_weight_sets(h: int, i: int, tokens: int, device, dtype):
    """(sets, bytes of one set's weights, float64 eager outputs): n (x, w_gate, w_up, w_down) sets,
    together at least 4x L2, so that a CUDA graph calling the MLP once per set reads every set's weights
    from DRAM, as a decode step does."""
    per_set = 3 * h * i * torch.finfo(dtype).bits // 8
    n = max(2, -(-4 * L2_BYTES // per_set))
    sets = [(torch.randn(tokens, h, device=device, dtype=dtype),
             torch.randn(i, h, device=device, dtype=dtype) * h**-0.5,
             torch.randn(i, h, device=device, dtype=dtype) * h**-0.5,
             torch.randn(h, i, device=device, dtype=dtype) * i**-0.5) for _ in range(n)]
    return sets, per_set, [eager_mlp(*(t.double() for t in s)) for s in sets]


def decode_setup():
    """(kernel, its Triton mlp and linear modules, the CUDA device, copy rate in GB/s, SM count); seeded."""
    k = load_kernel()
    tk_mlp = importlib.import_module(k.__name__ + ".triton_kernels.mlp")
    tk_linear = importlib.import_module(k.__name__ + ".triton_kernels.linear")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    return k, tk_mlp, tk_linear, dev, copy_gbs(dev), torch.cuda.get_device_properties(dev).multi_processor_count


def print_timed(rows: dict, floor_us: float | None = None) -> None:
    """One line per timed variant, fastest first: median [p20-p80], x floor, label, error."""
    for lab, v in sorted(rows.items(), key=lambda kv: kv[1].get("median_us", 1e9)):
        if "median_us" not in v:
            print(f"   ---- {lab}: {v.get('error', '')[:100]}")
            continue
        err = "" if v.get("rel_err") is None else f"  err {v['rel_err']:.2e}"
        of = "" if not floor_us else f" {v['median_us'] / floor_us:.2f}x"
        print(f"   {v['median_us']:7.2f} [{v['p20_us']:.2f}-{v['p80_us']:.2f}]{of}  {lab}{err}")


def save_results(out_dir: str, name: str, rows: dict, copy_rate: float, args) -> None:
    """out_dir/name: the environment (with the copy rate and the arguments) and the rows."""
    env = {**environment(), "copy_gbs": copy_rate, "args": vars(args)}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)


def decode_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every decode script takes: --out, --shapes, --tokens, --rounds, --reps."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="gemma3-1b")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=20)
    return p


def decode_shapes(args, device, dtype):
    """(shape, H, I, weight sets, bytes per set, float64 outputs) for each of ``args.shapes`` in turn
    (``decode_weight_sets`` at ``args.tokens``); a shape's sets are made only when its turn comes."""
    for shape in args.shapes.split(","):
        h, i = SHAPES[shape]
        yield (shape, h, i, *decode_weight_sets(h, i, args.tokens, device, dtype))
