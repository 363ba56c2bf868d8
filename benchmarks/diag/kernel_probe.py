"""Per-kernel timings on one GPU, for choosing tiles and the dispatch policy (not the product
benchmark: that is benchmarks/compare.py, side by side with eager / compile / Liger).

Loads the kernel the way users do (kernels.get_kernel from the staged cache), then times with CUDA
events, medians over many calls, inputs rotated over enough sets to exceed the L2:
  pointwise  geglu fwd / bwd / bwd_inplace, CUDA vs Triton vs torch.compile, as % of copy bandwidth
  sm90       the CUTLASS gate+up GEMM per tile x scheduler order vs one cuBLAS GEMM over [w_gate; w_up]
  mlptrain   training step with the backward's dh as cuBLAS + pointwise or the sm90 dGeGLU GEMM
  mlpfwd     whole-MLP inference forward: cuBLAS + pointwise vs the CUTLASS path at candidate launches,
             compile, eager, in interleaved rounds (what policy_sm90.json's geglu_mlp_sm90 rules cite)
  mlp        geglu_mlp forward and training step, ours (cuda, triton) vs eager and compile, with
             peak memory above the inputs
  overhead   where the Python time of a decode-sized geglu_mlp call goes (cProfile)
  decode     whole-MLP inference forward at M = --decode-tokens (16,64) per CUTLASS tile (above 64: the 128-row tiles, no Triton),
             cuBLAS + pointwise, Triton and eager: without graphs (host time included, interleaved
             rounds) and as CUDA-graph replays (GPU time), plus the gate+up GEMM alone per tile

  python3 benchmarks/diag/kernel_probe.py --out DIR [--sections pointwise,sm90,mlpfwd,mlp,overhead]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import json
import os
import pstats
import statistics
import time

import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import EXTRA_SHAPES, REPO_ID, SHAPES, VERSION, environment  # noqa: E402

L2_BYTES = 60 << 20


def load():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_CACHE", os.path.abspath(".hub-cache"))
    import kernels

    k = kernels.get_kernel(REPO_ID, version=VERSION, trust_remote_code=True)
    return k, getattr(torch.ops, k.OPS_ID)


def n_sets(bytes_per_set: int) -> int:
    return max(1, min(64, (3 * L2_BYTES) // max(bytes_per_set, 1) + 1))


def time_us(fn, sets: int, reps: int = 60, warmup: int = 5) -> float:
    """Median microseconds of fn(i) over reps calls, i rotating over sets."""
    for i in range(warmup):
        fn(i % sets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for r in range(reps):
        starts[r].record()
        fn(r % sets)
        ends[r].record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_samples(fn, sets: int, reps: int, warmup: int = 3) -> list[float]:
    """Per-call microseconds of reps calls of fn(i), i rotating over sets (CUDA events)."""
    for i in range(warmup):
        fn(i % sets)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for r, (s, e) in enumerate(ev):
        s.record()
        fn(r % sets)
        e.record()
    torch.cuda.synchronize()
    return [1e3 * s.elapsed_time(e) for s, e in ev]


def time_rounds(cases: dict, sets: int, rounds: int, reps: int) -> dict[str, float]:
    """Median per case over ``rounds`` rounds, each timing every case, the order reversed every other
    round, so a clock or thermal drift during the run lands on all cases alike."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            samples[name] += time_samples(cases[name], sets, reps)
    return {name: statistics.median(v) for name, v in samples.items()}


def copy_gbps() -> float:
    a = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = time_us(lambda i: b.copy_(a), 1, reps=30)
    return 2 * a.numel() / t / 1e3


def pointwise(k, ops, rows: list) -> None:
    tk = importlib.import_module(k.__name__ + ".triton_kernels.geglu")
    bw = copy_gbps()
    rows.append({"section": "pointwise", "what": "copy", "gbps": bw})
    dt = torch.bfloat16
    for m, n in [(8192, 16384), (8192, 14336), (8192, 6912), (1024, 16384), (16, 16384)]:
        numel = m * n
        sets = n_sets(5 * numel * 2)
        g = [torch.randn(m, n, device="cuda", dtype=dt) for _ in range(sets)]
        u = [torch.randn(m, n, device="cuda", dtype=dt) for _ in range(sets)]
        dy = [torch.randn(m, n, device="cuda", dtype=dt) for _ in range(sets)]
        out = [torch.empty(m, n, device="cuda", dtype=dt) for _ in range(sets)]
        out2 = [torch.empty(m, n, device="cuda", dtype=dt) for _ in range(sets)]
        for approx, code in (("tanh", 1), ("none", 0)):
            with_compile = approx == "tanh" and m == 8192 and n != 6912  # compiles cost seconds each
            comp_f = torch.compile(lambda a, b: F.gelu(a, approximate=approx) * b, dynamic=False)

            def comp_b(a, b, d):
                a = a.detach().requires_grad_()
                b = b.detach().requires_grad_()
                y = F.gelu(a, approximate=approx) * b
                return torch.autograd.grad(y, (a, b), d)
            comp_b = torch.compile(comp_b, dynamic=False)
            cases = {
                ("fwd", "cuda"): lambda i: ops.geglu_fwd(out[i], g[i], u[i], code),
                ("fwd", "triton"): lambda i: tk.geglu_fwd(out[i], g[i], u[i], approx),
                ("fwd", "compile"): lambda i: comp_f(g[i], u[i]),
                ("bwd", "cuda"): lambda i: ops.geglu_bwd(out[i], out2[i], dy[i], g[i], u[i], code),
                ("bwd", "triton"): lambda i: tk.geglu_bwd(out[i], out2[i], dy[i], g[i], u[i], approx),
                ("bwd", "compile"): lambda i: comp_b(g[i], u[i], dy[i]),
                ("bwd_inplace", "cuda"): lambda i: ops.geglu_bwd_inplace(out[i], out2[i], dy[i], code),
                ("bwd_inplace", "triton"): lambda i: tk.geglu_bwd_inplace(out[i], out2[i], dy[i], approx),
            }
            if not with_compile:
                del cases[("fwd", "compile")], cases[("bwd", "compile")]
            for i in range(sets):  # values for the in-place cases: pre-activations, not empty memory
                out[i].copy_(g[i])
                out2[i].copy_(u[i])
            tensors = {"fwd": 3, "bwd": 5, "bwd_inplace": 6}
            for (direction, impl), fn in cases.items():
                try:
                    t = time_us(fn, sets)
                    gbps = tensors[direction] * numel * 2 / t / 1e3
                    rows.append({"section": "pointwise", "what": f"{direction} {approx}", "impl": impl,
                                 "shape": [m, n], "us": t, "gbps": gbps, "of_copy": gbps / bw})
                except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                    rows.append({"section": "pointwise", "what": f"{direction} {approx}", "impl": impl,
                                 "shape": [m, n], "error": repr(exc)[:300]})
        del g, u, dy, out, out2
        torch.cuda.empty_cache()


def _sm90_env(tile: str, swizzle: str = "1", raster: str = "") -> None:
    os.environ["FUSED_GEGLU_SM90_TILE"] = tile
    os.environ["FUSED_GEGLU_SM90_SWIZZLE"] = swizzle
    if raster:
        os.environ["FUSED_GEGLU_SM90_RASTER"] = raster
    else:
        os.environ.pop("FUSED_GEGLU_SM90_RASTER", None)


def _sm90_env_clear() -> None:
    for v in ("FUSED_GEGLU_SM90_TILE", "FUSED_GEGLU_SM90_SWIZZLE", "FUSED_GEGLU_SM90_RASTER"):
        os.environ.pop(v, None)


# Scheduler orders (swizzle, raster) the sm90 section sweeps at M >= 1024.
SM90_ORDERS = (("1", ""), ("4", ""), ("8", ""), ("4", "n"))


def sm90(k, ops, rows: list) -> None:
    """Every tile x scheduler order of the CUTLASS gate+up GEMM against cuBLAS over [w_gate; w_up]
    (the same FLOPs, no GeGLU) and compile's 2 GEMMs + GeGLU; each tile's h checked once. The
    "no-epilogue" rows time the mainloop alone ($FUSED_GEGLU_SM90_DIAG_NO_EPILOGUE)."""
    dt = torch.bfloat16
    SM90_TILES = importlib.import_module(k.__name__ + ".sm90_weights").TILES
    for name, (h, i) in SHAPES.items():
        wg = torch.randn(i, h, device="cuda", dtype=dt) / h ** 0.5
        wu = torch.randn(i, h, device="cuda", dtype=dt) / h ** 0.5
        wcat = torch.cat([wg, wu], 0)
        two = torch.compile(lambda x: F.gelu(x @ wg.t(), approximate="tanh") * (x @ wu.t()), dynamic=False)
        for m in (16, 1024, 8192):
            sets = n_sets(m * h * 2 + 3 * m * i * 2)
            xs = [torch.randn(m, h, device="cuda", dtype=dt) for _ in range(sets)]
            hs = [torch.empty(m, i, device="cuda", dtype=dt) for _ in range(sets)]
            flops = 2.0 * m * h * 2 * i
            cases = {"cublas [wg;wu] one GEMM": lambda j: xs[j] @ wcat.t()}
            if m == 8192:
                cases["compile 2 GEMM + geglu"] = lambda j: two(xs[j])
            orders = SM90_ORDERS if m >= 1024 else (("1", ""),)
            for tile in SM90_TILES:
                for swz, raster in orders:
                    def run(j, tile=tile, swz=swz, raster=raster):
                        _sm90_env(tile, swz, raster)
                        ops.geglu_gateup_sm90(hs[j], xs[j], wg, wu, None, None, 1, None, None)
                    cases[f"sm90 {tile} s{swz}{raster}"] = run
                if m >= 1024:  # the mainloop alone: the epilogue returns at once (h unwritten)
                    for swz in ("1", "8"):
                        def mainloop(j, tile=tile, swz=swz):
                            _sm90_env(tile, swz, "")
                            os.environ["FUSED_GEGLU_SM90_DIAG_NO_EPILOGUE"] = "1"
                            try:
                                ops.geglu_gateup_sm90(hs[j], xs[j], wg, wu, None, None, 1, None, None)
                            finally:
                                os.environ.pop("FUSED_GEGLU_SM90_DIAG_NO_EPILOGUE")
                        cases[f"sm90 {tile} s{swz} no-epilogue"] = mainloop
            for impl, fn in cases.items():
                try:
                    t = time_us(fn, sets, reps=40 if m == 8192 else 100)
                    rows.append({"section": "sm90", "shape": name, "M": m, "impl": impl, "us": t,
                                 "tflops": flops / t / 1e6})
                except Exception as exc:  # noqa: BLE001
                    rows.append({"section": "sm90", "shape": name, "M": m, "impl": impl, "error": repr(exc)[:300]})
            ref = F.gelu((xs[0].float() @ wg.float().t()), approximate="tanh") * (xs[0].float() @ wu.float().t())
            for tile in SM90_TILES:
                _sm90_env(tile, "4", "")
                try:
                    ops.geglu_gateup_sm90(hs[0], xs[0], wg, wu, None, None, 1, None, None)
                    rows.append({"section": "sm90", "shape": name, "M": m, "impl": f"check {tile}",
                                 "rel_err": float((hs[0].float() - ref).norm() / ref.norm())})
                except Exception as exc:  # noqa: BLE001
                    rows.append({"section": "sm90", "shape": name, "M": m, "impl": f"check {tile}",
                                 "error": repr(exc)[:300]})
            _sm90_env_clear()
            del xs, hs
        del wg, wu, wcat
        torch.cuda.empty_cache()


# Whole-MLP forward launches compared by mlpfwd (FUSED_GEGLU_SM90_* env overrides the policy).
MLPFWD_LAUNCHES = (("128x128pp", "1", ""), ("128x128pp", "4", ""), ("128x128pp", "4", "n"),
                   ("128x192pp", "1", ""), ("128x192pp", "4", ""), ("128x128pp", "8", ""),
                   ("128x256", "4", ""), ("128x256", "8", ""), ("256x128", "8", ""))


def mlpfwd(k, ops, rows: list, rounds: int = 3) -> None:
    """Inference forward of the whole MLP (bf16, tanh) at M = 1024 and 8192: this project's
    cuBLAS + pointwise path, the CUTLASS gate+up path at each candidate launch, compile, eager.
    Timed in interleaved rounds: the decision between paths within a few percent needs it."""
    dt = torch.bfloat16
    for name, (h, i) in SHAPES.items():
        mod = EagerMLP(h, i).to("cuda", dt)
        comp = torch.compile(mod, dynamic=False)
        wg, wu, wd = mod.gate_proj.weight, mod.up_proj.weight, mod.down_proj.weight
        for m in (1024, 8192):
            sets = n_sets(m * h * 2 * 2 + 3 * m * i * 2)
            xs = [torch.randn(m, h, device="cuda", dtype=dt) for _ in range(sets)]

            def cublas(j):
                x = xs[j]
                return F.linear(k.geglu(F.linear(x, wg), F.linear(x, wu), approximate="tanh", backend="cuda"), wd)

            cases = {"eager": lambda j: mod(xs[j]), "compile": lambda j: comp(xs[j]), "cublas+pointwise": cublas}
            for tile, swz, raster in MLPFWD_LAUNCHES:
                def sm90_path(j, tile=tile, swz=swz, raster=raster):
                    _sm90_env(tile, swz, raster)
                    out = k.geglu_mlp(xs[j], wg, wu, wd, approximate="tanh", backend="cuda")
                    _sm90_env_clear()
                    return out
                cases[f"sm90 {tile}/s{swz}{raster}"] = sm90_path
            with torch.no_grad():
                ref = mod(xs[0]).float()
                for impl, fn in cases.items():
                    err = float((fn(0).float() - ref).norm() / ref.norm())
                    rows.append({"section": "mlpfwd", "shape": name, "M": m, "impl": f"check {impl}", "rel_err": err})
                times = time_rounds(cases, sets, rounds, 12 if m == 8192 else 40)
            for impl, t in times.items():
                rows.append({"section": "mlpfwd", "shape": name, "M": m, "impl": impl, "us": t, "rounds": rounds})
            del xs
        del mod, comp
        torch.cuda.empty_cache()


DH_LAUNCHES = ("0", "s1", "s4", "s8")  # $FUSED_GEGLU_SM90_DH: 0 = cuBLAS dh + pointwise
# Training forwards through the CUTLASS gate+up GEMM ($FUSED_GEGLU_SM90_MLP), dh as cuBLAS + pointwise.
TRAIN_FWD_LAUNCHES = ("128x128pp/s1", "128x128pp/s4", "128x128pp/s8", "128x192pp/s1", "128x256/s8")
# --train-tokens / --train-launches; --train-lean times only ours (cuBLAS + pointwise forward and each
# CUTLASS launch, dh as cuBLAS + pointwise): for a fine M grid, where compile would recompile per M.
TRAIN_OPTS = {"tokens": [1024, 8192], "launches": TRAIN_FWD_LAUNCHES, "lean": False}


def mlptrain(k, ops, rows: list, rounds: int = 3) -> None:
    """Training step (forward + backward, bf16, tanh) of the whole MLP at M = 1024 and 8192: ours
    with the backward's dh GEMM as cuBLAS + the in-place pointwise kernel ("dh 0") or as the sm90
    GEMM with the GeGLU-backward epilogue at each tile order, against compile and eager, in
    interleaved rounds. Also checks every gradient of each dh variant against eager's (TRAIN_OPTS:
    the M values and forward launches, or lean: ours' forwards only, each checked against eager)."""
    dt = torch.bfloat16
    lean = TRAIN_OPTS["lean"]
    for name, (h, i) in SHAPES.items():
        mod = EagerMLP(h, i).to("cuda", dt)
        comp = torch.compile(mod, dynamic=False)
        wts = (mod.gate_proj.weight, mod.up_proj.weight, mod.down_proj.weight)
        for m in TRAIN_OPTS["tokens"]:
            sets = n_sets(m * h * 2 * 2 + 5 * m * i * 2)
            xs = [torch.randn(m, h, device="cuda", dtype=dt) for _ in range(sets)]
            dys = [torch.randn(m, h, device="cuda", dtype=dt) for _ in range(sets)]

            def step(j, f):
                # An optimizer updates the weights in place every step: bump their versions (no
                # kernel), so that anything keyed on them (a cached copy) is remade as it would be.
                for p in mod.parameters():
                    torch.autograd.graph.increment_version(p)
                x = xs[j].detach().requires_grad_()
                f(x).backward(dys[j])
                for p in mod.parameters():
                    p.grad = None

            def ours(x):
                return k.geglu_mlp(x, *wts, approximate="tanh")

            cases = {} if lean else {"eager": lambda j: step(j, mod), "compile": lambda j: step(j, comp)}

            def fwd_cublas(j):  # the forward as cuBLAS gate/up + the pointwise kernel
                os.environ["FUSED_GEGLU_SM90_MLP"] = "no"
                step(j, ours)
                os.environ.pop("FUSED_GEGLU_SM90_MLP", None)
            cases["ours fwd cublas+pointwise, dh 0"] = fwd_cublas
            for launch in TRAIN_OPTS["launches"]:
                def fwd_sm90(j, launch=launch):
                    os.environ["FUSED_GEGLU_SM90_MLP"] = launch
                    os.environ["FUSED_GEGLU_SM90_DH"] = "0"
                    step(j, ours)
                    os.environ.pop("FUSED_GEGLU_SM90_MLP", None)
                    os.environ.pop("FUSED_GEGLU_SM90_DH", None)
                cases[f"ours fwd {launch}, dh 0"] = fwd_sm90
            for launch in () if lean else DH_LAUNCHES:
                def run(j, launch=launch):
                    os.environ["FUSED_GEGLU_SM90_DH"] = launch
                    step(j, ours)
                    os.environ.pop("FUSED_GEGLU_SM90_DH", None)
                cases[f"ours dh {launch}"] = run
            x = xs[0].detach().requires_grad_()
            mod(x).backward(dys[0])
            ref = [x.grad.float()] + [p.grad.float() for p in mod.parameters()]
            checks = ({f"fwd {launch}": {"FUSED_GEGLU_SM90_MLP": launch, "FUSED_GEGLU_SM90_DH": "0"}
                       for launch in ("no", *TRAIN_OPTS["launches"])} if lean
                      else {f"dh {launch}": {"FUSED_GEGLU_SM90_DH": launch} for launch in DH_LAUNCHES})
            for label, env in checks.items():
                for p in mod.parameters():
                    p.grad = None
                x = xs[0].detach().requires_grad_()
                os.environ.update(env)
                ours(x).backward(dys[0])
                forward_path = k.last_backend("geglu_mlp")
                for var in env:
                    os.environ.pop(var)
                got = [x.grad.float()] + [p.grad.float() for p in mod.parameters()]
                errs = [float((g - r).norm() / r.norm()) for g, r in zip(got, ref)]
                rows.append({"section": "mlptrain", "shape": name, "M": m, "impl": f"check ours {label}",
                             "rel_err": max(errs), "rel_err_vs_eager": errs, "forward": forward_path,
                             "backward": k.last_backend("geglu_mlp_backward")})
            for p in mod.parameters():
                p.grad = None
            times = time_rounds(cases, sets, rounds, 6 if m == 8192 else 20)
            for impl, t in times.items():
                rows.append({"section": "mlptrain", "shape": name, "M": m, "impl": impl, "us": t, "rounds": rounds})
            del xs, dys
        del mod, comp
        torch.cuda.empty_cache()


class EagerMLP(torch.nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.gate_proj = torch.nn.Linear(h, i, bias=False)
        self.up_proj = torch.nn.Linear(h, i, bias=False)
        self.down_proj = torch.nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


def mlp(k, ops, rows: list) -> None:
    dt = torch.bfloat16
    for name in ("gemma-2b", "gemma2-9b"):
        h, i = SHAPES[name]
        mod = EagerMLP(h, i).to("cuda", dt)
        comp = torch.compile(mod, dynamic=False)
        for m in (8192,):
            sets = n_sets(m * h * 2 * 2)
            xs = [torch.randn(m, h, device="cuda", dtype=dt) for _ in range(sets)]
            dys = [torch.randn(m, h, device="cuda", dtype=dt) for _ in range(sets)]
            wts = (mod.gate_proj.weight, mod.up_proj.weight, mod.down_proj.weight)
            impls = {
                "eager": mod,
                "compile": comp,
                "ours cuda": lambda x: k.geglu_mlp(x, *wts, approximate="tanh", backend="cuda"),
                "ours triton": lambda x: k.geglu_mlp(x, *wts, approximate="tanh", backend="triton"),
            }
            for impl, f in impls.items():
                for mode in ("fwd", "train"):
                    def step(j, f=f, mode=mode):
                        if mode == "fwd":
                            with torch.no_grad():
                                return f(xs[j])
                        x = xs[j].detach().requires_grad_()
                        y = f(x)
                        y.backward(dys[j])
                        for p in mod.parameters():
                            p.grad = None
                    try:
                        t = time_us(step, sets, reps=20 if m == 8192 else 60)
                        torch.cuda.synchronize()
                        base = torch.cuda.memory_allocated()
                        torch.cuda.reset_peak_memory_stats()
                        step(0)
                        torch.cuda.synchronize()
                        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                        rows.append({"section": "mlp", "shape": name, "M": m, "impl": impl, "mode": mode,
                                     "us": t, "peak_mb": peak})
                    except Exception as exc:  # noqa: BLE001
                        rows.append({"section": "mlp", "shape": name, "M": m, "impl": impl, "mode": mode,
                                     "error": repr(exc)[:300]})
            del xs, dys
        del mod, comp
        torch.cuda.empty_cache()


def overhead(k, ops, rows: list) -> None:
    dt = torch.bfloat16
    h, i = SHAPES["gemma-2b"]
    wg, wu = (torch.randn(i, h, device="cuda", dtype=dt) for _ in range(2))
    wd = torch.randn(h, i, device="cuda", dtype=dt)
    x = torch.randn(16, h, device="cuda", dtype=dt)
    for backend in ("cuda", "triton"):
        for _ in range(10):
            k.geglu_mlp(x, wg, wu, wd, backend=backend)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            k.geglu_mlp(x, wg, wu, wd, backend=backend)
        cpu_us = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            k.geglu_mlp(x, wg, wu, wd, backend=backend)
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        rows.append({"section": "overhead", "impl": backend, "cpu_us_per_call": cpu_us,
                     "last_backend": k.last_backend("geglu_mlp"), "profile": s.getvalue()[-3500:]})


# Gate+up launches the decode section compares (the policy's "<tile>/s<swizzle>" form).
DECODE_LAUNCHES = ("128x128/s1", "128x128pp/s1", "64x128pp/s1", "64x256pp/s1", "64x128k128pp/s1")
# Above M = 64 (the unmeasured M = 65..1023 range) the 128-row tiles of the prefill rules join, and
# Triton's decode kernels (3.7-3.8x the weight-read floor already at M = 64) leave.
MID_LAUNCHES = ("128x128/s1", "128x128pp/s1", "128x192pp/s1", "128x256/s1", "64x128pp/s1", "64x256pp/s1")


def _graph_us(fn, sets: int, reps: int = 30) -> float:
    """Median microseconds per call of fn(j) replayed from one CUDA graph holding a call per set."""
    for j in range(sets):
        fn(j)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(sets):
            fn(j)
    return time_us(lambda _: g.replay(), 1, reps=reps) / sets


DECODE_TOKENS = [16, 64]  # --decode-tokens
# --graph-only: GPU time of the whole call only (for a fine M grid); --launches: the above-64 launches
DECODE_OPTS = {"graph_only": False, "launches": MID_LAUNCHES}


def decode(k, ops, rows: list, rounds: int = 3) -> None:
    """Decode-size inference forward (bf16, tanh, no biases) per shape at M = DECODE_TOKENS.
    No graph: through ``k.geglu_mlp`` with the auto policy and $FUSED_GEGLU_SM90_MLP naming the
    launch ("no" = cuBLAS + pointwise), so the host work of a real call is included; interleaved
    rounds. Graph: the compiled one-call ops (``geglu_mlp_sm90`` per tile, ``geglu_mlp_gemm``),
    Triton and eager replayed from CUDA graphs (GPU time only); and the gate+up GEMM alone.
    Weights rotate with the inputs (as in the harness): at 7db55cf they did not, and Gemma3-1B's
    47.8 MB of weights, under the 60 MB L2, read partly from L2 (up to 19 % faster than the harness)."""
    dt = torch.bfloat16
    sw = importlib.import_module(k.__name__ + ".sm90_weights")
    bw = copy_gbps()
    rows.append({"section": "decode", "what": "copy", "gbps": bw})
    for name, (h, i) in SHAPES.items():
        floor_us = 3 * h * i * 2 / bw / 1e3  # the three weights read once at the copy bandwidth
        sets = n_sets(3 * h * i * 2)
        ws = [(torch.randn(i, h, device="cuda", dtype=dt) / h ** 0.5, torch.randn(i, h, device="cuda", dtype=dt) / h ** 0.5,
               torch.randn(h, i, device="cuda", dtype=dt) / i ** 0.5) for _ in range(sets)]

        def eager(j):
            wg, wu, wd = ws[j]
            return F.linear(F.gelu(F.linear(xs[j], wg), approximate="tanh") * F.linear(xs[j], wu), wd)

        for m in DECODE_TOKENS:
            xs = [torch.randn(m, h, device="cuda", dtype=dt) for _ in range(sets)]
            hs = [torch.empty(m, i, device="cuda", dtype=dt) for _ in range(sets)]

            def auto_with(launch):
                def run(j):
                    os.environ["FUSED_GEGLU_SM90_MLP"] = launch
                    try:
                        return k.geglu_mlp(xs[j], *ws[j], approximate="tanh")
                    finally:
                        os.environ.pop("FUSED_GEGLU_SM90_MLP")
                return run

            def triton(j):
                return k.geglu_mlp(xs[j], *ws[j], approximate="tanh", backend="triton")

            nograph = {"eager": eager, "cublas+pointwise": auto_with("no")}
            graph = {"eager": eager,
                     "cublas+pointwise": lambda j: ops.geglu_mlp_gemm(xs[j], *ws[j], None, None, None, 1)}
            if m <= 64:
                nograph["triton"] = graph["triton"] = triton
            gateup = {}
            for launch in (DECODE_LAUNCHES if m <= 64 else DECODE_OPTS["launches"]):
                # "heuristic": the op's own tile choice (what a forced backend="cuda" runs outside the policy)
                args = sw.parse_launch(None if launch == "heuristic" else launch)
                if launch != "heuristic":  # the no-graph rounds name the launch through the policy override
                    nograph[f"sm90 {launch}"] = auto_with(launch)
                graph[f"sm90 {launch}"] = (lambda j, a=args:
                                           ops.geglu_mlp_sm90(xs[j], *ws[j], None, None, None, 1, *a))
                gateup[f"gate+up {launch}"] = (lambda j, a=args: ops.geglu_gateup_sm90(
                    hs[j], xs[j], ws[j][0], ws[j][1], None, None, 1, None, None, *a))
            with torch.no_grad():
                x64, (wg64, wu64, wd64) = xs[0].double(), (w.double() for w in ws[0])
                ref64 = F.linear(F.gelu(F.linear(x64, wg64), approximate="tanh") * F.linear(x64, wu64), wd64)
                eager_err = float((eager(0).double() - ref64).norm() / ref64.norm())
                for impl, fn in graph.items():
                    err = float((fn(0).double() - ref64).norm() / ref64.norm())
                    rows.append({"section": "decode", "shape": name, "M": m, "impl": f"check {impl}",
                                 "rel_err": err, "eager_rel_err": eager_err})
                times = {} if DECODE_OPTS["graph_only"] else time_rounds(nograph, sets, rounds, 100)
                if DECODE_OPTS["graph_only"]:
                    gateup = {}
                for impl, t in times.items():
                    rows.append({"section": "decode", "shape": name, "M": m, "mode": "nograph", "impl": impl,
                                 "us": t, "rounds": rounds})
                # Interleaved like the no-graph rounds (order reversed every other round): a tile
                # decision within a few percent must not ride on the clock of one stretch of time.
                cases, samples, errors = {**graph, **gateup}, {}, {}
                for r in range(rounds):
                    for impl, fn in (list(cases.items())[::-1] if r % 2 else cases.items()):
                        if impl in errors:
                            continue
                        try:
                            samples.setdefault(impl, []).append(_graph_us(fn, sets))
                        except Exception as exc:  # noqa: BLE001
                            errors[impl] = repr(exc)[:300]
                for impl in cases:
                    if impl in errors:
                        rows.append({"section": "decode", "shape": name, "M": m, "mode": "graph", "impl": impl,
                                     "error": errors[impl]})
                        continue
                    t = statistics.median(samples[impl])
                    row = {"section": "decode", "shape": name, "M": m, "mode": "graph", "impl": impl, "us": t,
                           "rounds": rounds}
                    if impl in graph:
                        row["of_floor"] = t / floor_us
                    rows.append(row)
            del xs, hs
        del ws
        torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sections", default="pointwise,sm90,mlp,overhead")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " + ",".join({**SHAPES, **EXTRA_SHAPES}))
    p.add_argument("--decode-tokens", default="16,64", help="M values of the decode section (e.g. 16,64,256,512)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the decode section")
    p.add_argument("--launches", default=None,
                   help="comma list of gate+up launches the decode section times above M = 64 (default: MID_LAUNCHES); "
                        "'heuristic' = the op's own tile choice")
    p.add_argument("--train-tokens", default="1024,8192", help="M values of the mlptrain section")
    p.add_argument("--train-launches", default=None, help="comma list of CUTLASS forward launches mlptrain times")
    p.add_argument("--train-lean", action="store_true",
                   help="mlptrain: ours only (no eager, compile or sm90 dh variants), for a fine M grid")
    p.add_argument("--graph-only", action="store_true",
                   help="decode section: only the whole call replayed from graphs (no host-timed rounds, no gate+up alone)")
    args = p.parse_args()
    DECODE_OPTS["graph_only"] = args.graph_only
    if args.launches:
        DECODE_OPTS["launches"] = tuple(args.launches.split(","))
    DECODE_TOKENS[:] = [int(v) for v in args.decode_tokens.split(",")]
    TRAIN_OPTS["tokens"] = [int(v) for v in args.train_tokens.split(",")]
    TRAIN_OPTS["lean"] = args.train_lean
    if args.train_launches:
        TRAIN_OPTS["launches"] = tuple(args.train_launches.split(","))
    wanted = args.shapes.split(",")
    unknown = set(wanted) - set(SHAPES) - set(EXTRA_SHAPES)
    if unknown:
        p.error(f"--shapes: unknown {sorted(unknown)}; known: {sorted({**SHAPES, **EXTRA_SHAPES})}")
    SHAPES.update({name: EXTRA_SHAPES[name] for name in wanted if name in EXTRA_SHAPES})
    for name in set(SHAPES) - set(wanted):
        del SHAPES[name]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    k, ops = load()
    rows: list = []
    path = os.path.join(args.out, "kernel_probe.json")
    for section in args.sections.split(","):
        t0 = time.time()
        if section == "decode":
            decode(k, ops, rows, rounds=args.rounds)
        else:
            globals()[section](k, ops, rows)
        print(f"[probe] {section} done in {time.time() - t0:.0f} s", flush=True)
        with open(path, "w") as f:
            json.dump({**environment(), "ops_id": k.OPS_ID, "args": vars(args), "rows": rows}, f, indent=1)
    for r in rows:
        if r["section"] == "overhead":
            print(f"overhead {r['impl']}: {r['cpu_us_per_call']:.1f} us/call CPU ({r['last_backend']})")
            print(r["profile"][:2500])
    for r in rows:
        if r["section"] == "overhead":
            continue
        keys = ("section", "what", "shape", "M", "impl", "mode")
        label = " ".join(str(r[k_]) for k_ in keys if k_ in r)
        vals = " ".join(f"{k_}={r[k_]:.4g}" if isinstance(r[k_], float) else f"{k_}={r[k_]}"
                        for k_ in ("us", "of_floor", "gbps", "of_copy", "tflops", "peak_mb", "rel_err", "error") if k_ in r)
        print(f"{label:60s} {vals}")


if __name__ == "__main__":
    main()
