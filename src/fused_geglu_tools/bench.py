"""``fused-geglu bench``: the side-by-side comparison of fused-geglu with its baselines (GPU only).

For each op (``geglu_mlp``, ``linear`` with bias, ``linear_gelu`` = bias + tanh GELU, ``geglu``
pointwise, and ``linear_seqfirst`` / ``linear_seqfirst_down``: ``linear`` with bias on a sequence-first
activation seen batch-first, ``x[S, B, K].transpose(0, 1)``, at the gate and the down projection's
shapes, where ATen's linear runs bmm and a separate bias add; ``linear_addend``: ``linear`` whose
bias is an [M, N] addend, e.g. a residual, which ATen's addmm copies into its output first) and each
model shape
(Gemma3-1B, Gemma-2B, Gemma2-9B MLPs at M = 16, 1024, 8192 tokens, and the blog shape M=8192,
H=768, I=3072), in one process:

- providers: eager PyTorch (a GemmaMLP-like ``nn.Module`` in bf16), ``torch.compile`` (default
  mode; ``--max-autotune`` adds ``max-autotune-no-cudagraphs``), Liger (``LigerGEGLUMLP`` /
  ``LigerGELUMulFunction``, tanh only), and this kernel through each backend it has
  (``triton``, ``cuda``), loaded through ``kernels`` from ``build/``;
- modes: ``fwd`` (forward under no_grad), ``train`` (forward + backward, all grads), and for
  decode sizes (M <= 64) ``fwd_graph`` (forward replayed from a CUDA graph);
- per row: median / p20 / p80 of CUDA-event times over rotated input sets (weights included, so
  the working set is several times the L2), a check of the output (and every grad) against a
  float64 reference before the time is kept (error <= 2x eager bf16's error + epsilon, else
  ``FAILED``), peak memory above what was allocated before the call, and the roofline floor from
  ceilings measured in the same run (bf16 8192^3 GEMM rate, device copy bandwidth).

Output: ``<out>/<device>-<date>.json`` (schema ``fused-geglu-bench/1``, one row per
(op, shape, M, provider, mode)), a PNG beside it (``plot(json_path)``), and a short table of
ours/baseline time ratios printed last. ``python -m fused_geglu_tools.bench --help`` for flags.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import gpu_power

SCHEMA = "fused-geglu-bench/1"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results"

GPU_ONLY_MESSAGE = (
    "fused-geglu bench: GPU only. torch.cuda.is_available() is False here, so nothing was measured "
    "and no results were written. Run it on a CUDA machine (see benchmarks/README.md); "
    "`--plot-only RESULTS.json` works anywhere."
)


# --------------------------------------------------------------------------------------------
# What is measured
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    name: str
    H: int  # hidden size (model dim)
    I: int  # intermediate size
    tokens: tuple[int, ...]  # M values


SHAPES: tuple[Shape, ...] = (
    Shape("gemma3-1b", 1152, 6912, (16, 1024, 8192)),
    Shape("gemma-2b", 2048, 16384, (16, 1024, 8192)),
    Shape("gemma2-9b", 3584, 14336, (16, 1024, 8192)),
    Shape("blog", 768, 3072, (8192,)),
)
# CPU smoke run (--smoke-cpu): exercises the whole pipeline, measures nothing worth keeping.
SMOKE_SHAPES: tuple[Shape, ...] = (Shape("tiny", 64, 96, (16, 40)),)

OPS: tuple[str, ...] = ("geglu_mlp", "linear", "linear_gelu", "geglu", "linear_seqfirst", "linear_seqfirst_down",
                         "linear_addend")
# (order of work: the product first). linear_gelu: activation="gelu_tanh" vs F.gelu(F.linear(...)).
LINEAR_OPS = ("linear", "linear_gelu", "linear_seqfirst", "linear_seqfirst_down", "linear_addend")
# x stored sequence-first [S, B, K] and passed as its [B, S, K] transpose (no 2-D view covers its rows).
SEQ_FIRST_OPS = ("linear_seqfirst", "linear_seqfirst_down")
# --quick: one (shape, M) per op, the first of these that the filters leave.
QUICK_PREFERENCE: tuple[tuple[str, int], ...] = (("blog", 8192), ("gemma-2b", 1024), ("gemma3-1b", 16))
DECODE_MAX_M = 64  # rows with M <= this also get a CUDA-graph-replay forward
# "auto" is what a user gets (backend=None: the measured policy); the others force one backend.
OURS_BACKENDS: tuple[str, ...] = ("auto", "triton", "cuda")
# Rows that run only when --providers names them: the ATen backend (what auto's pointwise falls back to).
OURS_ON_REQUEST: tuple[str, ...] = ("torch",)
BASELINES: tuple[str, ...] = ("eager", "compile", "liger")


@dataclass
class Settings:
    warmup_ms: float = 25.0
    target_ms: float = 100.0  # timed time per row (reps = target / estimate, clamped)
    min_reps: int = 10
    max_reps: int = 400
    # Timing rounds per (case, mode): round 1 times every provider in turn; each further round times
    # them again in the opposite order and pools the samples, so a clock or thermal drift during a
    # case lands on every provider instead of on whichever ran last.
    rounds: int = 1
    rotate_factor: float = 4.0  # rotation working set = factor x L2
    max_sets: int = 256
    graph_reps: int = 50
    tol_factor: float = 2.0  # our error may be this many times eager bf16's (quack's criterion)
    eps_rel: float = 1e-4  # bf16: rel error must be <= tol_factor * eager's + eps_rel
    ulps_max: float = 2.0  # max abs error allowance: 2 * eager's + ulps_max bf16 ulps of max|ref|


# --------------------------------------------------------------------------------------------
# Cost model: FLOPs and the fewest bytes (each input read once, each output written once)
# --------------------------------------------------------------------------------------------


def seq_first_dims(M: int) -> tuple[int, int]:
    """(S, B) of a sequence-first x with M = S * B rows: 2 sequences at decode sizes, else 4."""
    b = 2 if M < 64 else 4
    if M % b:
        b = 1
    return M // b, b


def linear_dims(op: str, H: int, I: int) -> tuple[int, int]:
    """(K, N) of a linear op at an MLP shape: the gate projection's, or the down projection's."""
    return (I, H) if op == "linear_seqfirst_down" else (H, I)


def cost(op: str, mode: str, M: int, H: int, I: int, elt: int = 2) -> tuple[float, float]:
    """(flops, bytes) of one call. ``mode`` is fwd/fwd_graph (forward) or train (fwd + bwd)."""
    train = mode == "train"
    if op == "geglu":  # gate, up [M, I] -> out [M, I]; bwd reads dy, gate, up, writes dgate, dup
        flops = 0.0  # pointwise: the floor is the bytes
        nbytes = (8 if train else 3) * M * I * elt
    elif op in LINEAR_OPS:  # x [M, H] @ w[I, H]^T + b[I] -> y [M, I] (the down shape: K = I, N = H)
        K, N = linear_dims(op, H, I)
        flops = (6.0 if train else 2.0) * M * N * K
        nb = M * N if op == "linear_addend" else N  # the bias: a vector, or an [M, N] addend
        if train:  # fwd: x, w, b, y; bwd: dy, x, w in; dx, dw, db out
            nbytes = (3 * M * K + 3 * N * K + 2 * M * N + 2 * nb) * elt
        else:
            nbytes = (M * K + N * K + nb + M * N) * elt
    elif op == "geglu_mlp":  # x [M, H]; w_gate, w_up [I, H]; w_down [H, I] -> y [M, H]
        flops = (18.0 if train else 6.0) * M * H * I
        if train:  # x, W, dy in; y, dx, dW out (the M x I intermediate is not a must-move)
            nbytes = (4 * M * H + 6 * H * I) * elt
        else:
            nbytes = (2 * M * H + 3 * H * I) * elt
    else:
        raise ValueError(f"unknown op {op!r}")
    return flops, float(nbytes)


# --------------------------------------------------------------------------------------------
# Rows and results
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    op: str
    shape: str
    H: int
    I: int
    M: int
    provider: str  # eager | compile | compile-max | liger | ours-auto | ours-triton | ours-cuda | ours-torch (on request)
    mode: str  # fwd | train | fwd_graph
    status: str = "pending"  # ok | FAILED | unavailable | error | skipped
    ok: bool = False
    err: str | None = None  # why the row is not ok (or a note), None when there is nothing to say
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    reps: int | None = None
    n_buffers: int | None = None  # input sets rotated through
    flops: float | None = None
    bytes: float | None = None
    tflops: float | None = None
    gbps: float | None = None  # the must-move bytes over the measured time
    floor_us: float | None = None
    frac_of_floor: float | None = None  # floor_us / median_us (1.0 = at the roofline)
    peak_mb: float | None = None  # max_memory_allocated during one call - memory_allocated before
    grads_mb: float | None = None  # of which the leaf grads (train) are this much at the end
    compile_s: float | None = None  # first call (compile + run) for torch.compile rows
    rel_err: float | None = None  # worst ||out - ref|| / ||ref|| over the checked tensors
    max_err: float | None = None  # worst max|out - ref| / max|ref| over the checked tensors
    checks: dict[str, dict[str, float]] = field(default_factory=dict)
    backend_ran: str | None = None  # for ours-*: kernel.last_backend(op) after the check call
    gpu: dict[str, float] | None = None  # SM clock / board power while this row was timed (gpu_power)


def _now() -> float:
    return time.perf_counter()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def _run_cmd(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - absent or broken metadata: just unknown
        return None


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


class Clock:
    """CUDA events on a GPU; perf_counter around a synchronised call on the CPU smoke path."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def time_calls(self, step: Callable[[int], Any], n: int, n_sets: int, pre=None) -> list[float]:
        """Per-call times in microseconds of ``step(i % n_sets)`` for n calls."""
        if self.cuda:
            ev = [(self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for r in range(n):
                i = r % n_sets
                if pre is not None:
                    pre(i)
                ev[r][0].record()
                step(i)
                ev[r][1].record()
            self.torch.cuda.synchronize()
            return [s.elapsed_time(e) * 1e3 for s, e in ev]
        times = []
        for r in range(n):
            i = r % n_sets
            if pre is not None:
                pre(i)
            t0 = _now()
            step(i)
            times.append((_now() - t0) * 1e6)
        return times

    def span_us(self, fn: Callable[[], Any]) -> float:
        """Wall time of ``fn`` on the device in microseconds (one start/end pair)."""
        if self.cuda:
            s, e = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            self.torch.cuda.synchronize()
            return s.elapsed_time(e) * 1e3
        t0 = _now()
        fn()
        return (_now() - t0) * 1e6


def _quantile(sorted_vals: list[float], q: float) -> float:
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = (len(sorted_vals) - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize(times_us: list[float]) -> tuple[float, float, float]:
    s = sorted(times_us)
    return statistics.median(s), _quantile(s, 0.2), _quantile(s, 0.8)


def measure(clock: Clock, step, n_sets: int, st: Settings, pre=None) -> tuple[list[float], int]:
    """Warm up (>= 3 calls and >= warmup_ms), pick reps from the estimate, time them."""
    calls, spent = 0, 0.0
    while calls < 3 or spent < st.warmup_ms * 1e3:
        k = max(1, calls)  # doubling batches, so the estimate costs little host time

        def batch(k=k, start=calls):
            for j in range(k):
                if pre is not None:
                    pre((start + j) % n_sets)
                step((start + j) % n_sets)

        spent_batch = clock.span_us(batch)
        spent += spent_batch
        calls += k
        if calls >= 1024:
            break
    est = spent / calls
    reps = int(min(st.max_reps, max(st.min_reps, math.ceil(st.target_ms * 1e3 / max(est, 1e-3)))))
    return clock.time_calls(step, reps, n_sets, pre=pre), reps


# --------------------------------------------------------------------------------------------
# Cases: the inputs of one (op, shape, M), rotated, and their float64 reference
# --------------------------------------------------------------------------------------------


class Case:
    """Input sets for one (op, shape, M). Weights are ``nn.Parameter`` so that modules can share
    them; ``train`` turns on requires_grad for the leaves."""

    def __init__(self, torch, op, shape: Shape, M, dtype, device, approximate, st: Settings, l2_bytes, seed):
        self.torch, self.op, self.shape, self.M = torch, op, shape, M
        self.dtype, self.device, self.approximate, self.seed = dtype, device, approximate, seed
        H, I = shape.H, shape.I
        # (name -> (shape, std)); std chosen so GELU sees O(1) inputs and outputs stay O(1)
        if op == "geglu":
            spec = {"gate": ((M, I), 1.0), "up": ((M, I), 1.0), "dy": ((M, I), 1.0)}
            self.leaves = ("gate", "up")
        elif op in LINEAR_OPS:
            K, N = linear_dims(op, H, I)
            if op in SEQ_FIRST_OPS:
                S, B = seq_first_dims(M)
                spec = {"x": ((S, B, K), 1.0), "w": ((N, K), K**-0.5), "b": ((N,), 0.5), "dy": ((B, S, N), 1.0)}
            else:
                b_shape = (M, N) if op == "linear_addend" else (N,)
                spec = {"x": ((M, K), 1.0), "w": ((N, K), K**-0.5), "b": (b_shape, 0.5), "dy": ((M, N), 1.0)}
            self.leaves = ("x", "w", "b")
        elif op == "geglu_mlp":
            spec = {
                "x": ((M, H), 1.0),
                "wg": ((I, H), H**-0.5),
                "wu": ((I, H), H**-0.5),
                "wd": ((H, I), I**-0.5),
                "dy": ((M, H), 1.0),
            }
            self.leaves = ("x", "wg", "wu", "wd")
        else:
            raise ValueError(f"unknown op {op!r}")
        self.spec = spec
        elt = torch.empty((), dtype=dtype).element_size()
        set_bytes = sum(math.prod(s) for s, _ in spec.values()) * elt
        want = st.rotate_factor * l2_bytes
        self.n_sets = int(min(st.max_sets, max(1, math.ceil(want / set_bytes))))
        self.set_bytes = set_bytes
        self.sets: list[dict[str, Any]] = []
        for i in range(self.n_sets):
            tensors = {}
            for name, (shp, _std) in spec.items():
                t = torch.empty(shp, dtype=dtype, device=device)
                if name in self.leaves and name not in ("x", "gate", "up"):
                    t = torch.nn.Parameter(t, requires_grad=False)
                tensors[name] = t
            self.sets.append(tensors)
        self.refill()

    def refill(self) -> None:
        """(Re)write every set with its seeded random data (never zeros)."""
        torch = self.torch
        with torch.no_grad():
            for i, tensors in enumerate(self.sets):
                g = torch.Generator(device=self.device).manual_seed(self.seed * 1000 + i)
                for name, (shp, std) in self.spec.items():
                    r = torch.randn(shp, generator=g, device=self.device, dtype=torch.float32)
                    tensors[name].copy_(r.mul_(std))

    def set_train(self, train: bool) -> None:
        for tensors in self.sets:
            for name in self.leaves:
                tensors[name].requires_grad_(train)
                tensors[name].grad = None

    def clear_grads(self, i: int) -> None:
        for name in self.leaves:
            self.sets[i][name].grad = None

    def next_train_step(self, i: int) -> None:
        """Before each timed training step (untimed): clear the grads and bump the leaves' version
        counters, as an optimizer's in-place update does every step (no kernel runs). Anything a
        provider caches from a weight (an earlier version of ours kept a repacked gate/up copy) is
        then remade inside the timed step, as it would be in a real training loop."""
        self.clear_grads(i)
        for name in self.leaves:
            self.torch.autograd.graph.increment_version(self.sets[i][name])

    def grads_bytes(self, i: int) -> int:
        total = 0
        for name in self.leaves:
            gr = self.sets[i][name].grad
            if gr is not None:
                total += gr.numel() * gr.element_size()
        return total

    def reference(self, train: bool) -> dict[str, Any]:
        """float64 output (and leaf grads) on set 0."""
        torch, F = self.torch, self.torch.nn.functional
        s = self.sets[0]
        d = {k: v.detach().double().requires_grad_(train and k in self.leaves) for k, v in s.items()}
        a = self.approximate
        with torch.enable_grad() if train else torch.no_grad():
            if self.op == "geglu":
                y = F.gelu(d["gate"], approximate=a) * d["up"]
            elif self.op in ("linear", "linear_addend", *SEQ_FIRST_OPS):
                y = F.linear(linear_input(self.op, d["x"]), d["w"], d["b"])
            elif self.op == "linear_gelu":
                y = F.gelu(F.linear(d["x"], d["w"], d["b"]), approximate="tanh")
            else:
                y = F.linear(F.gelu(F.linear(d["x"], d["wg"]), approximate=a) * F.linear(d["x"], d["wu"]), d["wd"])
            out = {"out": y.detach()}
            if train:
                y.backward(d["dy"])
                for k in self.leaves:
                    out[f"d{k}"] = d[k].grad
        return out

    def collect(self, y, train: bool) -> dict[str, Any]:
        got = {"out": y.detach()}
        if train:
            for k in self.leaves:
                got[f"d{k}"] = self.sets[0][k].grad
        return got

    def free(self) -> None:
        self.sets.clear()


def _errors(torch, got, ref) -> tuple[float, float, float]:
    """(||got-ref||/||ref||, max|got-ref|, max|ref|); inf when got is missing or not finite."""
    if got is None or tuple(got.shape) != tuple(ref.shape):
        return math.inf, math.inf, float(ref.abs().max()) if ref.numel() else 0.0
    g = got.detach().double()
    if not bool(torch.isfinite(g).all()):
        return math.inf, math.inf, float(ref.abs().max())
    diff = g - ref
    rn = float(ref.norm())
    return float(diff.norm()) / max(rn, 1e-30), float(diff.abs().max()), float(ref.abs().max())


# --------------------------------------------------------------------------------------------
# Providers
# --------------------------------------------------------------------------------------------


class Unavailable(Exception):
    """A provider that cannot run here (not installed, not built, not for this op/flavour)."""


def _gemma_mlp_class(torch):
    nn, F = torch.nn, torch.nn.functional

    class GemmaLikeMLP(nn.Module):
        """transformers' GemmaMLP: down(act(gate(x)) * up(x)), gelu_pytorch_tanh (or erf)."""

        def __init__(self, H, I, approximate):
            super().__init__()
            self.gate_proj = nn.Linear(H, I, bias=False)
            self.up_proj = nn.Linear(H, I, bias=False)
            self.down_proj = nn.Linear(I, H, bias=False)
            self.approximate = approximate

        def forward(self, x):
            return self.down_proj(F.gelu(self.gate_proj(x), approximate=self.approximate) * self.up_proj(x))

    return GemmaLikeMLP


def _share_weights(torch, module, s):
    module.gate_proj.weight = s["wg"]
    module.up_proj.weight = s["wu"]
    module.down_proj.weight = s["wd"]
    return module


def linear_input(op: str, x):
    """The x a linear op is called with: the stored tensor, or for the sequence-first ops its
    [B, S, K] transpose."""
    return x.transpose(0, 1) if op in SEQ_FIRST_OPS else x


def _functional(torch, op, approximate):
    """The eager computation as a function of the set's tensors (what torch.compile gets: with
    weights as inputs, rotating them causes no recompiles)."""
    F = torch.nn.functional
    if op == "geglu":

        def fn(gate, up):
            return F.gelu(gate, approximate=approximate) * up

        return fn, ("gate", "up")
    if op in ("linear", "linear_addend"):

        def fn(x, w, b):
            return F.linear(x, w, b)

        return fn, ("x", "w", "b")
    if op in SEQ_FIRST_OPS:

        def fn(x, w, b):
            return F.linear(x.transpose(0, 1), w, b)

        return fn, ("x", "w", "b")
    if op == "linear_gelu":

        def fn(x, w, b):
            return F.gelu(F.linear(x, w, b), approximate="tanh")

        return fn, ("x", "w", "b")

    def fn(x, wg, wu, wd):
        return F.linear(F.gelu(F.linear(x, wg), approximate=approximate) * F.linear(x, wu), wd)

    return fn, ("x", "wg", "wu", "wd")


def _recorded_as(op: str) -> str:
    """The name the kernel's ``last_backend`` knows the op by."""
    return "linear" if op in LINEAR_OPS else op


def bind_provider(torch, name: str, case: Case, kernel, args) -> tuple[Callable[[int], Any], dict]:
    """Return ``call(i) -> Tensor`` for set i and facts about the provider."""
    op, a = case.op, case.approximate
    info: dict[str, Any] = {}
    if name == "eager":
        if op == "geglu_mlp":
            cls = _gemma_mlp_class(torch)
            mods = []
            for s in case.sets:
                with torch.device("meta"):
                    m = cls(case.shape.H, case.shape.I, a)
                mods.append(_share_weights(torch, m, s))
            return (lambda i: mods[i](case.sets[i]["x"])), info
        fn, names = _functional(torch, op, a)
        return (lambda i: fn(*(case.sets[i][n] for n in names))), info
    if name in ("compile", "compile-max"):
        if args.no_compile:
            raise Unavailable("--no-compile")
        fn, names = _functional(torch, op, a)
        mode = None if name == "compile" else "max-autotune-no-cudagraphs"
        cfn = torch.compile(fn, dynamic=False, mode=mode)
        return (lambda i: cfn(*(case.sets[i][n] for n in names))), info
    if name == "liger":
        if op in LINEAR_OPS:
            raise Unavailable("Liger has no bias-epilogue linear")
        if a != "tanh":
            raise Unavailable("Liger's GEGLU is tanh-only")
        if case.device.type != "cuda":
            raise Unavailable("Liger runs on CUDA only")
        try:
            if op == "geglu":
                from liger_kernel.ops.geglu import LigerGELUMulFunction
            else:
                from liger_kernel.transformers.geglu import LigerGEGLUMLP
        except Exception as exc:  # noqa: BLE001 - any import failure means no Liger rows
            raise Unavailable(f"liger_kernel not importable: {type(exc).__name__}: {exc}") from None
        if op == "geglu":
            # Liger's backward writes dgate/dup into the saved gate/up storage: the inputs are
            # clobbered, so the harness refills the sets after the train row.
            info["mutates_inputs"] = True
            return (lambda i: LigerGELUMulFunction.apply(case.sets[i]["gate"], case.sets[i]["up"])), info
        from types import SimpleNamespace

        cfg = SimpleNamespace(
            hidden_size=case.shape.H, intermediate_size=case.shape.I, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh"
        )
        mods = []
        for s in case.sets:
            with torch.device("meta"):
                m = LigerGEGLUMLP(cfg)
            mods.append(_share_weights(torch, m, s))
        return (lambda i: mods[i](case.sets[i]["x"])), info
    if name.startswith("ours-"):
        backend = name.split("-", 1)[1]
        if kernel is None:
            raise Unavailable(f"kernel not loaded: {args._kernel_error}")
        avail = args._available
        if backend == "auto":
            backend = None
        elif avail is not None and backend not in avail:
            raise Unavailable(f"backend {backend!r} not in available_backends={avail}")
        if op == "geglu":
            return (lambda i: kernel.geglu(case.sets[i]["gate"], case.sets[i]["up"], approximate=a, backend=backend)), info
        if op in LINEAR_OPS:
            s_ = case.sets
            act = "gelu_tanh" if op == "linear_gelu" else None
            return (lambda i: kernel.linear(linear_input(op, s_[i]["x"]), s_[i]["w"], s_[i]["b"], activation=act,
                                            backend=backend)), info
        s_ = case.sets
        return (
            lambda i: kernel.geglu_mlp(s_[i]["x"], s_[i]["wg"], s_[i]["wu"], s_[i]["wd"], approximate=a, backend=backend)
        ), info
    raise ValueError(f"unknown provider {name!r}")


def _classify(exc: BaseException) -> str:
    msg = str(exc)
    if isinstance(exc, (Unavailable, NotImplementedError, ImportError)) or "cannot run" in msg or "not built" in msg:
        return "unavailable"
    return "error"


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sticky_cuda_error(exc: BaseException) -> bool:
    msg = str(exc)
    return any(s in msg for s in ("illegal memory access", "unspecified launch failure", "device-side assert", "misaligned address"))


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


class Run:
    def __init__(self, torch, args, st: Settings):
        self.torch, self.args, self.st = torch, args, st
        self.t0 = _now()
        self.rows: list[Row] = []
        self.dispatch: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.device = torch.device("cpu" if args.smoke_cpu else "cuda")
        self.clock = Clock(torch, self.device)
        self.dtype = torch.float32 if args.smoke_cpu else torch.bfloat16
        self.aborted: str | None = None
        self.phase_s: dict[str, float] = {}
        self.compile_total_s = 0.0
        self._last_timed: tuple | None = None  # (step, pre, times, info) of the row _one just timed
        self.power: gpu_power.PowerLog | None = None  # started by main() on a GPU
        self._windows: dict[int, list[tuple[float, float]]] = {}  # id(row) -> when it was timed

    def timed(self, row: Row, fn):
        """fn() with its wall-clock window recorded for the row's clock / power summary."""
        t0 = time.time()
        try:
            return fn()
        finally:
            self._windows.setdefault(id(row), []).append((t0, time.time()))

    def summarize_gpu(self) -> None:
        """Each timed row's SM clock and board power over its windows (None without a sampler)."""
        if self.power is None:
            return
        for row in self.rows:
            windows = self._windows.get(id(row))
            if windows:
                row.gpu = self.power.summary(windows)

    # ---- budget -----------------------------------------------------------------------------
    def elapsed(self) -> float:
        return _now() - self.t0

    def over_budget(self) -> bool:
        return self.elapsed() > self.args.budget_s

    # ---- ceilings -----------------------------------------------------------------------------
    def ceilings(self) -> dict[str, Any]:
        torch, clock = self.torch, self.clock
        t = _now()
        n = 1024 if self.args.smoke_cpu else 8192
        g = torch.Generator(device=self.device).manual_seed(1)
        a = torch.randn(n, n, device=self.device, dtype=self.dtype, generator=g)
        b = torch.randn(n, n, device=self.device, dtype=self.dtype, generator=g)
        c = torch.empty(n, n, device=self.device, dtype=self.dtype)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        clock.sync()
        mm = [clock.span_us(lambda: torch.matmul(a, b, out=c)) for _ in range(5 if self.args.smoke_cpu else 20)]
        mm_us = statistics.median(mm)
        del a, b, c
        nbytes = (64 << 20) if self.args.smoke_cpu else (1 << 30)
        src = torch.randn(nbytes // 2, device=self.device, dtype=torch.float32 if self.args.smoke_cpu else torch.bfloat16, generator=g)
        nbytes = src.numel() * src.element_size()
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        clock.sync()
        cp = [clock.span_us(lambda: dst.copy_(src)) for _ in range(20)]
        cp_us = statistics.median(cp)
        del src, dst
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.phase_s["ceilings"] = _now() - t
        out = {
            "matmul_shape": [n, n, n],
            "matmul_dtype": str(self.dtype).replace("torch.", ""),
            "matmul_us": mm_us,
            "matmul_tflops": 2.0 * n**3 / (mm_us * 1e-6) / 1e12,
            "copy_bytes_each_way": nbytes,
            "copy_us": cp_us,
            "copy_gbps": 2.0 * nbytes / (cp_us * 1e-6) / 1e9,  # bytes read + bytes written
        }
        self.ceil = out
        return out

    # ---- one row ------------------------------------------------------------------------------
    def _fill_cost(self, row: Row) -> None:
        flops, nbytes = cost(row.op, row.mode, row.M, row.H, row.I, elt=2 if self.dtype != self.torch.float32 else 4)
        row.flops, row.bytes = flops, nbytes
        floor_s = max(flops / (self.ceil["matmul_tflops"] * 1e12), nbytes / (self.ceil["copy_gbps"] * 1e9))
        row.floor_us = floor_s * 1e6
        if row.median_us:
            row.tflops = flops / (row.median_us * 1e-6) / 1e12 if flops else None
            row.gbps = nbytes / (row.median_us * 1e-6) / 1e9
            row.frac_of_floor = row.floor_us / row.median_us

    def _check(self, row: Row, got: dict, ref: dict, tol: dict | None) -> bool:
        """Compare every tensor; returns ok. ``tol`` is None for eager (which sets it)."""
        torch = self.torch
        ok, worst_rel, worst_max = True, 0.0, 0.0
        for name, r in ref.items():
            rel, mx, rmax = _errors(torch, got.get(name), r)
            entry = {"rel": rel, "max_abs": mx, "ref_max": rmax}
            if tol is not None:
                e = tol[name]
                t_rel = self.st.tol_factor * e["rel"] + (self.st.eps_rel if self.dtype != torch.float32 else 1e-6)
                ulp = 2.0 ** (math.floor(math.log2(max(rmax, 1e-30))) - (7 if self.dtype == torch.bfloat16 else 23))
                t_max = self.st.tol_factor * e["max_abs"] + self.st.ulps_max * ulp
                entry.update(tol_rel=t_rel, tol_max=t_max)
                if not (rel <= t_rel and mx <= t_max):
                    ok = False
            elif not math.isfinite(rel):
                ok = False
            row.checks[name] = entry
            worst_rel = max(worst_rel, rel)
            worst_max = max(worst_max, mx / max(rmax, 1e-30))
        row.rel_err, row.max_err = worst_rel, worst_max
        return ok

    def _peak(self, fn) -> float | None:
        torch = self.torch
        if self.device.type != "cuda":
            fn()
            return None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    def run_case(self, op: str, shape: Shape, M: int, providers: list[str], kernel) -> None:
        torch, st, args = self.torch, self.st, self.args
        if self.device.type == "cuda":
            torch._dynamo.reset()  # fresh compile caches per shape: no recompile limits, fair compile_s
        l2 = self.l2_bytes
        case = Case(torch, op, shape, M, self.dtype, self.device, args.approximate, st, l2, args.seed)
        modes = ["fwd"] + ([] if args.no_train else ["train"])
        try:
            refs = {m: case.reference(m == "train") for m in modes}
            tol: dict[str, dict] = {}
            bound: dict[str, tuple] = {}
            for prov in providers:
                try:
                    bound[prov] = bind_provider(torch, prov, case, kernel, args)
                except Exception as exc:  # noqa: BLE001
                    bound[prov] = exc
            for mode in modes:
                case.set_train(mode == "train")
                timed = []
                for prov in providers:
                    row = Row(op, shape.name, shape.H, shape.I, M, prov, mode, n_buffers=case.n_sets)
                    self.rows.append(row)
                    self._one(row, case, bound[prov], refs[mode], tol, mode, kernel)
                    if self.aborted:
                        return
                    if self._last_timed is not None:
                        timed.append((row, *self._last_timed))
                self._more_rounds(case, timed, mode == "train")
                if mode == "fwd" and kernel is not None and not args.smoke_cpu:
                    self._record_dispatch(case, kernel)
            if M <= DECODE_MAX_M and self.device.type == "cuda" and not args.no_graph:
                case.set_train(False)
                for prov in providers:
                    row = Row(op, shape.name, shape.H, shape.I, M, prov, "fwd_graph", n_buffers=case.n_sets)
                    self.rows.append(row)
                    self._one_graph(row, case, bound[prov], refs["fwd"], tol.get("fwd"))
                    if self.aborted:
                        return
        finally:
            case.free()
            del case
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _more_rounds(self, case: Case, timed: list[tuple], train: bool) -> None:
        """Rounds 2..N of the timed rows of one mode, alternating the order; samples are pooled."""
        for r in range(1, self.st.rounds):
            order = timed[::-1] if r % 2 else timed
            for row, step, pre, times, info in order:
                if self.over_budget():
                    return
                more, reps = self.timed(row, lambda: measure(self.clock, step, case.n_sets, self.st, pre=pre))
                times.extend(more)
                row.reps += reps
                row.median_us, row.p20_us, row.p80_us = summarize(times)
                self._fill_cost(row)
                if train:
                    if info.get("mutates_inputs"):
                        case.refill()
                    for i in range(case.n_sets):
                        case.clear_grads(i)

    def _record_dispatch(self, case: Case, kernel) -> None:
        torch = self.torch
        try:
            s = case.sets[0]
            with torch.no_grad():
                if case.op == "geglu":
                    kernel.geglu(s["gate"], s["up"], approximate=case.approximate)
                elif case.op in LINEAR_OPS:
                    kernel.linear(linear_input(case.op, s["x"]), s["w"], s["b"],
                                  activation="gelu_tanh" if case.op == "linear_gelu" else None)
                else:
                    kernel.geglu_mlp(s["x"], s["wg"], s["wu"], s["wd"], approximate=case.approximate)
            ran = str(kernel.last_backend(_recorded_as(case.op)))
        except Exception as exc:  # noqa: BLE001
            ran = f"error: {_short(exc, 120)}"
        self.dispatch.append({"op": case.op, "shape": case.shape.name, "M": case.M, "auto_backend": ran})

    def _one(self, row: Row, case: Case, bound, ref: dict, tol: dict, mode: str, kernel) -> None:
        torch, st = self.torch, self.st
        self._last_timed = None
        if self.over_budget():
            row.status, row.err = "skipped", f"time budget ({self.args.budget_s:.0f} s) spent"
            return
        if isinstance(bound, Exception):
            row.status, row.err = _classify(bound), _short(bound)
            return
        call, info = bound
        train = mode == "train"
        if train:

            def step(i):
                y = call(i)
                y.backward(case.sets[i]["dy"])
                return y

            pre = case.next_train_step
        else:

            def step(i):
                with torch.no_grad():
                    return call(i)

            pre = None
        try:
            # 1. first call (compiles for torch.compile / JIT), then the check on set 0
            if pre:
                pre(0)
            t = _now()
            y = step(0)
            self.clock.sync()
            first_s = _now() - t
            if row.provider.startswith("compile"):
                row.compile_s = first_s
                self.compile_total_s += first_s
            if row.provider.startswith("ours-") and hasattr(kernel, "last_backend"):
                try:
                    ran = kernel.last_backend(_recorded_as(case.op))
                    row.backend_ran = None if ran is None else str(ran)
                except Exception:  # noqa: BLE001
                    row.backend_ran = None
            got = case.collect(y, train)
            if row.provider != "eager" and mode not in tol:
                row.status, row.err = "error", "no tolerance: the eager row of this mode did not pass"
                return
            ok = self._check(row, got, ref, tol.get(mode) if row.provider != "eager" else None)
            if row.provider == "eager":
                tol[mode] = row.checks
            del y, got
            want = row.provider.split("-", 1)[1] if row.provider.startswith("ours-") else None
            want = None if want == "auto" else want
            if want and row.backend_ran and want not in row.backend_ran:
                row.status, row.err = "unavailable", f"asked for {want!r}, {row.backend_ran!r} ran"
                return
            if not ok:
                row.status, row.err = "FAILED", "output/grads beyond tolerance (see checks)"
                if info.get("mutates_inputs"):
                    case.refill()
                return
            # 2. timing
            times, reps = self.timed(row, lambda: measure(self.clock, step, case.n_sets, st, pre=pre))
            row.median_us, row.p20_us, row.p80_us = summarize(times)
            row.reps = reps
            self._last_timed = (step, pre, times, info)
            # 3. memory of one call
            if train:
                for i in range(case.n_sets):
                    case.clear_grads(i)
            holder = []
            row.peak_mb = self._peak(lambda: holder.append(step(0)))
            if train:
                row.grads_mb = case.grads_bytes(0) / 2**20
                for i in range(case.n_sets):
                    case.clear_grads(i)
            holder.clear()
            row.status, row.ok = "ok", True
            self._fill_cost(row)
        except Exception as exc:  # noqa: BLE001
            row.status, row.err = _classify(exc), _short(exc)
            if self.args.verbose:
                traceback.print_exc()
            if _sticky_cuda_error(exc):
                self.aborted = f"sticky CUDA error in {row.op}/{row.shape}/M={row.M}/{row.provider}/{row.mode}: {row.err}"
        finally:
            if row.floor_us is None:
                self._fill_cost(row)
            if info.get("mutates_inputs") and train:
                case.refill()
            for i in range(case.n_sets):
                case.clear_grads(i)

    def _one_graph(self, row: Row, case: Case, bound, ref: dict, tol: dict | None) -> None:
        torch = self.torch
        if self.over_budget():
            row.status, row.err = "skipped", f"time budget ({self.args.budget_s:.0f} s) spent"
            return
        if isinstance(bound, Exception):
            row.status, row.err = _classify(bound), _short(bound)
            return
        if tol is None:
            row.status, row.err = "error", "no eager fwd tolerance (eager fwd did not run)"
            return
        fwd_row = next((r for r in self.rows if (r.op, r.shape, r.M, r.provider, r.mode) == (row.op, row.shape, row.M, row.provider, "fwd")), None)
        if fwd_row is not None and not fwd_row.ok:
            row.status, row.err = "skipped", f"fwd row is {fwd_row.status}"
            return
        call, _info = bound
        n = case.n_sets
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(2):
                    for i in range(n):
                        call(i)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph):
                outs = [call(i) for i in range(n)]
            graph.replay()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            row.status, row.err = "unavailable", "not capturable: " + _short(exc)
            try:
                torch.cuda.synchronize()
            except Exception as exc2:  # noqa: BLE001
                if _sticky_cuda_error(exc2):
                    self.aborted = f"sticky CUDA error after graph capture of {row.provider}: {_short(exc2)}"
            return
        try:
            ok = self._check(row, {"out": outs[0]}, ref, tol)
            if not ok:
                row.status, row.err = "FAILED", "graph replay output beyond tolerance"
                return
            for _ in range(3):
                graph.replay()
            times = self.timed(row, lambda: self.clock.time_calls(lambda _i: graph.replay(), self.st.graph_reps, 1))
            per_call = [t / n for t in times]
            row.median_us, row.p20_us, row.p80_us = summarize(per_call)
            row.reps = self.st.graph_reps * n
            row.status, row.ok = "ok", True
            row.err = f"one graph of {n} calls over {n} input sets; time per call"
            self._fill_cost(row)
        except Exception as exc:  # noqa: BLE001
            row.status, row.err = _classify(exc), _short(exc)
        finally:
            del outs, graph


# --------------------------------------------------------------------------------------------
# Environment, kernel, selection
# --------------------------------------------------------------------------------------------


def _tree_dirty(root: Path) -> bool | None:
    """Whether the benchmarked tree differs from the commit the run records, judged as the builder
    judges it (``gitid.source_identity``): on a device machine's copy, whose ``.git`` may hold a stale
    HEAD, ``git status`` lists every commit since that HEAD, and the copier's $FUSED_GEGLU_COMMIT /
    $FUSED_GEGLU_DIRTY say what the tree is. None where nothing says (no git, no flag)."""
    top = _run_cmd(["git", "rev-parse", "--show-toplevel"], cwd=root)
    if top is None or Path(top).resolve() != Path(root).resolve():
        flag = os.environ.get("FUSED_GEGLU_DIRTY")
        return None if flag is None else flag != "0"
    from .gitid import source_identity

    try:
        return source_identity(root).dirty
    except (OSError, subprocess.SubprocessError):
        return None


def environment(torch, device, kernel, args) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": _version("triton"),
        "kernels": _version("kernels"),
        "liger_kernel": _version("liger-kernel") or _version("liger_kernel"),
        "transformers": _version("transformers"),
        "commit": args.commit or os.environ.get("FUSED_GEGLU_COMMIT") or _run_cmd(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT),
        "tree_dirty": _tree_dirty(REPO_ROOT),
        "allow_bf16_reduced_precision_reduction": bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(
            device=torch.cuda.get_device_name(device),
            capability=".".join(map(str, torch.cuda.get_device_capability(device))),
            sm_count=p.multi_processor_count,
            memory_gb=round(p.total_memory / 2**30, 1),
            l2_bytes=getattr(p, "L2_cache_size", None),
            driver=_run_cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            clocks=_run_cmd(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.limit,temperature.gpu", "--format=csv,noheader"]),
        )
    else:
        env.update(device=f"cpu ({platform.processor() or platform.machine()})", driver=None)
    if kernel is not None:
        env["kernel_module"] = getattr(kernel, "__name__", None)
        kfile = getattr(kernel, "__file__", None)
        if kfile:
            vdir = Path(kfile).resolve().parent
            env["kernel_variant"] = vdir.name
            meta = vdir / "metadata.json"
            if meta.exists():
                try:
                    env["kernel_metadata"] = json.loads(meta.read_text())
                except (OSError, ValueError):
                    pass
        env["kernel_available_backends"] = args._available
    else:
        env["kernel_error"] = args._kernel_error
    return env


def load_kernel(build: Path):
    """The kernel as users get it: through ``kernels`` from the local build/ tree."""
    import kernels

    return kernels.get_local_kernel(build)


def select_cases(args, shapes: tuple[Shape, ...]) -> list[tuple[str, Shape, int]]:
    ops = [o for o in OPS if not args.ops or o in args.ops]
    sh = [s for s in shapes if not args.shapes or s.name in args.shapes]
    cases = []
    for op in ops:
        pairs = [(s, M) for s in sh for M in s.tokens if not args.tokens or M in args.tokens]
        if args.quick and pairs:
            pref = [p for name, m in QUICK_PREFERENCE for p in pairs if (p[0].name, p[1]) == (name, m)]
            pairs = [pref[0] if pref else pairs[0]]
        cases.extend((op, s, M) for s, M in pairs)
    return cases


def providers_for(args) -> list[str]:
    provs = ["eager", *(f"ours-{b}" for b in OURS_BACKENDS), "liger", "compile"]
    if args.max_autotune:
        provs.append("compile-max")
    if args.providers:
        provs += [f"ours-{b}" for b in OURS_ON_REQUEST]
        provs = ["eager"] + [p for p in provs[1:] if p in args.providers]  # eager sets the tolerance
    return provs


# --------------------------------------------------------------------------------------------
# Output: JSON, table, plot
# --------------------------------------------------------------------------------------------


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def _clean(obj):
    """JSON has no inf/nan: write them as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _index(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["op"], r["shape"], r["M"], r["provider"], r["mode"]): r for r in rows}


def _fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def table(payload: dict) -> str:
    """Ratios ours/baseline (< 1: ours faster), one line per (op, shape, M, our backend)."""
    rows = payload["rows"]
    idx = _index(rows)
    ours = sorted({r["provider"] for r in rows if r["provider"].startswith("ours-")})
    seen, lines = [], []
    for r in rows:
        key = (r["op"], r["shape"], r["M"])
        if key not in seen:
            seen.append(key)

    def cell(prov, key, mode):
        r = idx.get((*key, prov, mode))
        if r is None:
            return None, "-"
        if not r["ok"]:
            return None, {"FAILED": "FAIL", "unavailable": "n/a", "skipped": "skip"}.get(r["status"], "err")
        return r["median_us"], _fmt_us(r["median_us"])

    def ratio(mine, prov, key, mode):
        theirs, label = cell(prov, key, mode)
        if mine is None:
            return "-"
        if theirs is None:
            return label
        q = mine / theirs
        return f"{q:.2f}" if 0.01 <= q < 100 else f"{q:.0e}"

    c = payload.get("ceilings", {})
    env = payload.get("env", {})
    lines.append(
        f"fused-geglu bench  {env.get('device')}  torch {env.get('torch')}  triton {env.get('triton')}  "
        f"ceilings: {c.get('matmul_tflops', 0):.0f} TFLOP/s {c.get('matmul_dtype', 'bf16')} GEMM, {c.get('copy_gbps', 0):.0f} GB/s copy"
    )
    lines.append("time ratios ours/baseline (< 1 = ours faster); us = median microseconds; %floor = roofline floor / time")
    hdr = (
        f"{'op':<20} {'shape':<9} {'M':>5} {'ours':<6} | {'fwd us':>7} {'/eager':>6} {'/comp':>6} {'/liger':>6} {'%flr':>4} |"
        f" {'train us':>8} {'/eager':>6} {'/comp':>6} {'/liger':>6} | {'graph us':>8} {'/eager':>6} {'/comp':>6}"
    )
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for key in seen:
        for prov in ours:
            mine = [idx.get((*key, prov, m)) for m in ("fwd", "train", "fwd_graph")]
            if all(r is None or r["status"] == "unavailable" for r in mine):
                continue  # listed once under "unavailable" below
            f_mine, f_txt = cell(prov, key, "fwd")
            t_mine, t_txt = cell(prov, key, "train")
            g_mine, g_txt = cell(prov, key, "fwd_graph")
            fr = (idx.get((*key, prov, "fwd")) or {}).get("frac_of_floor")
            flr = f"{100 * fr:.0f}" if fr else "-"
            graph = ""
            if (*key, prov, "fwd_graph") in idx:
                graph = f" {g_txt:>8} {ratio(g_mine, 'eager', key, 'fwd_graph'):>6} {ratio(g_mine, 'compile', key, 'fwd_graph'):>6}"
            lines.append(
                f"{key[0]:<20} {key[1]:<9} {key[2]:>5} {prov[5:]:<6} | {f_txt:>7} {ratio(f_mine, 'eager', key, 'fwd'):>6}"
                f" {ratio(f_mine, 'compile', key, 'fwd'):>6} {ratio(f_mine, 'liger', key, 'fwd'):>6} {flr:>4} |"
                f" {t_txt:>8} {ratio(t_mine, 'eager', key, 'train'):>6} {ratio(t_mine, 'compile', key, 'train'):>6}"
                f" {ratio(t_mine, 'liger', key, 'train'):>6} |{graph}"
            )
    bad = [r for r in rows if r["status"] in ("FAILED", "error")]
    if bad:
        lines.append(f"{len(bad)} row(s) FAILED/error (not timed):")
        for r in bad[:12]:
            lines.append(f"  {r['status']:<6} {r['op']}/{r['shape']}/M={r['M']}/{r['provider']}/{r['mode']}: {(r.get('err') or '')[:110]}")
    skipped = sum(r["status"] == "skipped" for r in rows)
    if skipped:
        lines.append(f"{skipped} row(s) skipped (time budget or a failed fwd row)")
    na = sorted({f"{r['provider']}: {(r.get('err') or '')[:80]}" for r in rows if r["status"] == "unavailable"})
    if na:
        lines.append("unavailable: " + "; ".join(na[:6]))
    gpu = gpu_footer(rows)
    if gpu:
        lines.append(gpu)
    host = host_footer(payload.get("env", {}))
    if host:
        lines.append(host)
    t = payload.get("timing", {})
    lines.append(
        f"total {t.get('total_s', 0):.0f} s (torch.compile first calls {t.get('compile_s', 0):.0f} s); "
        f"json {payload.get('json_path', '?')}"
    )
    return "\n".join(lines)


def gpu_footer(rows: list[dict]) -> str | None:
    """One line: each provider's SM clock while timed (median over its rows) and the share of all
    samples taken at the board's power cap; None when no row has a ``gpu`` summary."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("gpu"):
            by.setdefault(r["provider"], []).append(r["gpu"])
    if not by:
        return None
    every = [g for gs in by.values() for g in gs]
    n = sum(g["samples"] for g in every)
    capped = sum(g["power_capped"] * g["samples"] for g in every) / n
    clocks = ", ".join(f"{p} {statistics.median(g['sm_mhz_median'] for g in gs):.0f}" for p, gs in sorted(by.items()))
    return f"SM clock while timed (MHz, median of rows): {clocks}; power cap (0x4) in {100 * capped:.0f}% of {n} samples"


def host_op_us(torch, device, calls: int = 2000) -> float:
    """Host microseconds of one trivial ATen op (``aten.alias``: dispatcher only, no kernel), the
    median of 5 batches. Rows without CUDA graphs at decode sizes are host-bound, and this host's
    speed moves by up to 2x between runs (host_time.py), so each run records it at its start and end."""
    x = torch.empty(8, device=device)
    alias = torch.ops.aten.alias
    per_batch = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            alias(x)
        per_batch.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(per_batch)


def host_footer(env: dict) -> str | None:
    probe = env.get("host_probe_us") or {}
    if "start" not in probe:
        return None
    end = f", {probe['end']:.2f} at the end" if "end" in probe else ""
    pinned = f"; process pinned to CPU {env['cpu_affinity']}" if env.get("pinned") else ""
    return (f"host: a trivial ATen op took {probe['start']:.2f} us at the start{end} "
            f"(no-graph decode rows are host-bound; compare them within one run){pinned}")


PROVIDER_STYLE = {
    "compile": ("tab:orange", "torch.compile"),
    "compile-max": ("tab:brown", "compile max-autotune"),
    "liger": ("tab:green", "Liger"),
    "ours-auto": ("tab:purple", "ours (auto policy)"),
    "ours-triton": ("tab:blue", "ours (triton)"),
    "ours-cuda": ("tab:red", "ours (cuda)"),
    "ours-torch": ("tab:olive", "ours (torch)"),
    "eager": ("tab:gray", "eager"),
}


def _results_stem(path: Path) -> Path:
    """``r.json`` and ``r.json.gz`` both name the results ``r``."""
    return path.with_suffix("") if path.suffix == ".gz" else path


def read_results(path: Path) -> dict:
    """A results JSON as this harness wrote it, or gzipped (the all-op runs are kept in the repo as
    ``.json.gz``: a megabyte each as plain text)."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(raw)


def plot(json_path, png_path=None) -> Path:
    """Speed-up over eager vs tokens, one panel per (op, shape), fwd solid / train dashed, plus a
    train-peak-memory panel per op. Writes the PNG beside the JSON (or at ``png_path``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    json_path = Path(json_path)
    payload = read_results(json_path)
    rows = payload["rows"]
    idx = _index(rows)
    ops = [o for o in OPS if any(r["op"] == o for r in rows)] or sorted({r["op"] for r in rows})
    shapes: list[str] = []
    for r in rows:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    provs = [p for p in PROVIDER_STYLE if p != "eager" and any(r["provider"] == p for r in rows)]
    ncols = len(shapes) + 1
    fig, axes = plt.subplots(len(ops), ncols, figsize=(3.3 * ncols, 2.8 * len(ops)), squeeze=False)
    for oi, op in enumerate(ops):
        for si, shape in enumerate(shapes):
            ax = axes[oi][si]
            Ms = sorted({r["M"] for r in rows if r["op"] == op and r["shape"] == shape})
            for prov in provs:
                color, label = PROVIDER_STYLE[prov]
                for mode, ls in (("fwd", "-"), ("train", "--"), ("fwd_graph", ":")):
                    xs, ys = [], []
                    for M in Ms:
                        mine, base = idx.get((op, shape, M, prov, mode)), idx.get((op, shape, M, "eager", mode))
                        if mine and base and mine["ok"] and base["ok"] and mine["median_us"] and base["median_us"]:
                            xs.append(M)
                            ys.append(base["median_us"] / mine["median_us"])
                    if xs:
                        first = oi == 0 and si == 0 and mode == "fwd"
                        ax.plot(xs, ys, ls, color=color, marker="o", ms=3.5, label=label if first else None)
            ax.axhline(1.0, color="k", lw=0.6)
            ax.set_xscale("log", base=2)
            if Ms:
                ax.set_xticks(Ms)
                ax.set_xticklabels([str(m) for m in Ms])
            H = next((r["H"] for r in rows if r["shape"] == shape), "?")
            I = next((r["I"] for r in rows if r["shape"] == shape), "?")
            ax.set_title(f"{op} · {shape} (H={H}, I={I})", fontsize=8)
            if si == 0:
                ax.set_ylabel("speed-up vs eager")
            if oi == len(ops) - 1:
                ax.set_xlabel("tokens M")
            ax.grid(alpha=0.3)
        # memory: train peak (or fwd peak when no train rows) / eager's, at each shape's largest M
        ax = axes[oi][-1]
        mode = "train" if any(r["op"] == op and r["mode"] == "train" and r["ok"] for r in rows) else "fwd"
        width = 0.8 / max(1, len(provs))
        for pi, prov in enumerate(provs):
            xs, ys = [], []
            for si, shape in enumerate(shapes):
                Ms = [r["M"] for r in rows if r["op"] == op and r["shape"] == shape]
                if not Ms:
                    continue
                M = max(Ms)
                mine, base = idx.get((op, shape, M, prov, mode)), idx.get((op, shape, M, "eager", mode))
                if mine and base and mine["ok"] and base["ok"] and mine.get("peak_mb") and base.get("peak_mb"):
                    xs.append(si + (pi - (len(provs) - 1) / 2) * width)
                    ys.append(mine["peak_mb"] / base["peak_mb"])
            if xs:
                ax.bar(xs, ys, width=width, color=PROVIDER_STYLE[prov][0])
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, fontsize=7, rotation=20)
        ax.set_title(f"{op} · {mode} peak memory / eager (largest M)", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    env = payload.get("env", {})
    fig.suptitle(
        f"fused-geglu vs baselines: {env.get('device')}, torch {env.get('torch')}, {payload.get('created', '')[:10]}\n"
        "speed-up = eager time / provider time; solid: forward, dashed: forward+backward, dotted: CUDA-graph forward",
        fontsize=9,
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    from matplotlib.lines import Line2D

    for ls, text in (("-", "fwd"), ("--", "fwd+bwd"), (":", "graph fwd")):
        handles.append(Line2D([0], [0], color="k", ls=ls))
        labels.append(text)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    png = Path(png_path) if png_path else _results_stem(json_path).with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _csv(kind):
    def parse(text: str):
        return [kind(x) for x in text.split(",") if x.strip()]

    return parse


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fused-geglu bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help=f"results folder (default {DEFAULT_OUT})")
    p.add_argument("--build", type=Path, default=REPO_ROOT / "build", help="kernel build/ tree to load through kernels")
    p.add_argument("--quick", action="store_true", help="one shape per op, shorter timing")
    p.add_argument("--ops", type=_csv(str), default=None, help=f"comma list of {','.join(OPS)}")
    p.add_argument("--shapes", type=_csv(str), default=None, help=f"comma list of {','.join(s.name for s in SHAPES)}")
    p.add_argument("--tokens", type=_csv(int), default=None, help="comma list of M values to keep, e.g. 16,8192")
    p.add_argument("--providers", type=_csv(str), default=None, help="keep only these (eager always runs: it sets the tolerance); ours-torch runs only when named here")
    p.add_argument("--approximate", choices=("tanh", "none"), default="tanh", help="GELU flavour (Liger: tanh only)")
    p.add_argument("--max-autotune", action="store_true", help="add torch.compile mode=max-autotune-no-cudagraphs (slow)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile rows")
    p.add_argument("--no-train", action="store_true", help="forward rows only")
    p.add_argument("--no-graph", action="store_true", help="skip CUDA-graph replay rows")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop starting rows after this many seconds (default 540)")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="time every (case, mode) this many times, alternating the provider order, and pool the samples")
    p.add_argument("--warmup-ms", type=_positive_float, default=None,
                   help="untimed calls before each row's timed ones, at least this long (default 25). Under the "
                        "700 W cap a row that starts on a cool GPU (after a CPU-bound phase: torch.compile's first "
                        "calls) runs its first timed calls at a higher clock; a longer warm-up evens that out")
    p.add_argument("--target-ms", type=_positive_float, default=None,
                   help="timed time per row: reps = target / estimate, clamped (default 100)")
    p.add_argument("--pin-cpu", type=int, default=None, metavar="CPU",
                   help="run on this one CPU core (os.sched_setaffinity), to see whether host jitter moves the no-graph rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol-factor", type=float, default=2.0, help="error allowed vs eager bf16's (default 2x)")
    p.add_argument("--commit", default=None, help="source commit to record (default: $FUSED_GEGLU_COMMIT or git HEAD)")
    p.add_argument("--plot-only", type=Path, default=None, metavar="JSON",
                   help="only draw the PNG for an existing results JSON (.json or .json.gz)")
    p.add_argument("--smoke-cpu", action="store_true", help=argparse.SUPPRESS)  # pipeline test on CPU: tiny, fp32
    p.add_argument("--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.plot_only is not None:
        print(f"wrote {plot(args.plot_only)}")
        return 0
    try:
        import torch
    except ImportError:
        print(GPU_ONLY_MESSAGE)
        return 0
    if not args.smoke_cpu and not torch.cuda.is_available():
        print(GPU_ONLY_MESSAGE)
        return 0
    if args.pin_cpu is not None:
        try:
            os.sched_setaffinity(0, {args.pin_cpu})
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--pin-cpu {args.pin_cpu}: cannot pin to that CPU ({exc}); "
                             f"this process may use {sorted(os.sched_getaffinity(0))}") from None
    t_start = _now()
    st = Settings(tol_factor=args.tol_factor, rounds=args.rounds)
    if args.quick or args.smoke_cpu:
        st.target_ms, st.warmup_ms, st.max_reps, st.graph_reps = 40.0, 10.0, 200, 20
    if args.smoke_cpu:
        st.target_ms, st.warmup_ms, st.min_reps, st.max_reps = 5.0, 2.0, 3, 20
    if args.warmup_ms is not None:
        st.warmup_ms = args.warmup_ms
    if args.target_ms is not None:
        st.target_ms = args.target_ms
    out_dir = args.out or (Path("/tmp/fused-geglu-bench-smoke") if args.smoke_cpu else DEFAULT_OUT)

    # torch.compile: one graph per (function, shape, grad mode); fail loudly instead of falling
    # back to eager silently if a limit is ever hit.
    dyn = torch._dynamo.config
    for name, value in (("recompile_limit", 64), ("cache_size_limit", 64), ("accumulated_recompile_limit", 4096), ("accumulated_cache_size_limit", 4096)):
        if hasattr(dyn, name):
            setattr(dyn, name, value)
    if hasattr(dyn, "fail_on_recompile_limit_hit"):
        dyn.fail_on_recompile_limit_hit = True

    args._kernel_error, args._available, kernel = None, None, None
    t = _now()
    try:
        kernel = load_kernel(args.build)
    except Exception as exc:  # noqa: BLE001 - baselines still run; ours rows say why not
        args._kernel_error = _short(exc)
        print(f"[bench] kernel not loaded from {args.build}: {args._kernel_error}", flush=True)
    if kernel is not None:
        try:
            args._available = list(kernel.available_backends("cpu" if args.smoke_cpu else "cuda"))
        except Exception as exc:  # noqa: BLE001
            args._available = None
            print(f"[bench] kernel.available_backends failed: {_short(exc)}", flush=True)
    load_s = _now() - t

    run = Run(torch, args, st)
    run.t0 = t_start
    run.phase_s["kernel_load"] = load_s
    dev = run.device
    if dev.type == "cuda":
        run.l2_bytes = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (50 << 20)
    else:
        run.l2_bytes = 1 << 20
    env = environment(torch, dev, kernel, args)
    env["pinned"] = args.pin_cpu is not None
    env["cpu_affinity"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    env["host_probe_us"] = {"start": host_op_us(torch, dev)}
    if dev.type == "cuda":
        # Clock and power per timed row (gpu_power: why); a failure leaves rows without them.
        uuid = str(getattr(torch.cuda.get_device_properties(dev), "uuid", "") or "")  # nvidia-smi's order may differ
        ident = (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else str(torch.cuda.current_device())
        run.power = gpu_power.PowerLog.nvidia_smi(ident)
        if run.power is not None and not run.power.start():
            run.power = None
    ceil = run.ceilings()
    print(
        f"[bench] {env['device']}: {ceil['matmul_tflops']:.0f} TFLOP/s {ceil['matmul_dtype']} GEMM {ceil['matmul_shape'][0]}^3, "
        f"{ceil['copy_gbps']:.0f} GB/s copy; kernel backends {args._available}",
        flush=True,
    )
    shapes = SMOKE_SHAPES if args.smoke_cpu else SHAPES
    cases = select_cases(args, shapes)
    providers = providers_for(args)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    stem = f"{_slug(env['device'] if dev.type == 'cuda' else 'cpu-smoke')}-{date}"
    if args.quick:
        stem += "-quick"
    json_path = out_dir / f"{stem}.json"

    def payload(final: bool) -> dict:
        run.summarize_gpu()
        return _clean(
            {
                "schema": SCHEMA,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "complete": final and run.aborted is None,
                "aborted": run.aborted,
                "smoke": bool(args.smoke_cpu),
                "argv": list(argv if argv is not None else sys.argv[1:]),
                "quick": bool(args.quick),
                "env": env,
                "ceilings": ceil,
                "config": {
                    "dtype": str(run.dtype).replace("torch.", ""),
                    "approximate": args.approximate,
                    "providers": providers,
                    "settings": asdict(st),
                    "l2_bytes": run.l2_bytes,
                    "budget_s": args.budget_s,
                    "decode_max_m": DECODE_MAX_M,
                    "shapes": [asdict(s) for s in shapes],
                    "cases": [[o, s.name, m] for o, s, m in cases],
                },
                "dispatch": run.dispatch,
                "rows": [asdict(r) for r in run.rows],
                "timing": {"total_s": run.elapsed(), "compile_s": run.compile_total_s, "phase_s": run.phase_s},
                "gpu_sampler": run.power.cmd if run.power is not None else None,
                "json_path": str(json_path),
            }
        )

    for n, (op, shape, M) in enumerate(cases, 1):
        t = _now()
        run.run_case(op, shape, M, providers, kernel)
        run.phase_s[f"{op}/{shape.name}/{M}"] = _now() - t
        done = [r for r in run.rows if (r.op, r.shape, r.M) == (op, shape.name, M)]
        summary = " ".join(f"{r.provider}:{r.mode}={_fmt_us(r.median_us) if r.ok else r.status}" for r in done)
        print(f"[bench {run.elapsed():5.0f}s {n}/{len(cases)}] {op} {shape.name} M={M}: {summary}", flush=True)
        write_json(json_path, payload(final=False))
        if run.aborted:
            print(f"[bench] aborted: {run.aborted}", flush=True)
            break
    if run.power is not None:
        run.power.stop()
    env["host_probe_us"]["end"] = host_op_us(torch, dev)
    final = payload(final=True)
    write_json(json_path, final)
    png = None
    if not args.no_plot:
        try:
            png = plot(json_path)
        except Exception as exc:  # noqa: BLE001 - no matplotlib on the box: the JSON still stands
            print(f"[bench] plot skipped: {_short(exc)}", flush=True)
    if png:
        print(f"[bench] wrote {json_path} and {png}", flush=True)
    else:
        print(f"[bench] wrote {json_path}", flush=True)
    print()
    print(table(final))
    return 1 if run.aborted else 0


if __name__ == "__main__":
    sys.exit(main())
