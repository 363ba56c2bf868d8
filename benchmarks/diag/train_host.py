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

``--ab-one-call R`` instead times ours' step with the cuBLAS + pointwise sequences issued from one
compiled call each (``mlp.ONE_CALL``, the default) and from Python, and eager, in R interleaved
rounds (order reversed every other round), since the host's speed drifts by more between runs than
the difference being measured.

``--ab-train-launch R`` times, in R interleaved rounds, one step of eager, of ours with the auto policy
(below M = 1024: the cuBLAS + pointwise training forward from one compiled call) and of ours with the
CUTLASS gate+up GEMM forced for the training forward (``$FUSED_GEGLU_SM90_MLP``: 64x128pp/s1 and
128x128/s1): host µs per step and wall µs per step (40 steps between two synchronisations). The
harness measured the forced CUTLASS step faster than auto at M = 16 in three of four runs; this asks
whether a training rule should say so.

``--ab-cpp-node R`` times, in R interleaved rounds, eager and ours' step with the C++ training node
(``_dispatch.CPP_AUTOGRAD``, kernel_src/autograd_nodes) and with the Python ``autograd.Function`` (same
kernels): host and wall µs per step, and paired wall differences. Eager also runs a second time
("eager again", its own slot per round): the A/A difference is the host's noise floor. ``--op`` (with ``--ab-cpp-node`` only)
times another op's step instead, at the gate projection's shape: ``linear``, ``linear_gelu_tanh``,
``geglu``, ``geglu_packed``.

``--micro`` adds, per shape at the first M, what one ``F.linear`` (the gate GEMM's shape) costs on
the host in each setting the two providers call it in: grad mode off, grad mode on with a weight
that requires grad (eager's forward), and inside a bare ``autograd.Function`` forward (ours'), plus
``torch.empty`` and a trivial op; and the CPU-side profiler table (self CPU time per ATen op and
CUDA runtime call) of each provider's step, to name the call ours' extra host time is spent in.
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
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import SHAPES, eager_mlp, environment, host_us, kernel_times, load_kernel  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class _Bare(torch.autograd.Function):
    """F.linear as ours' forward calls it: inside an autograd.Function (grad mode off)."""

    @staticmethod
    def forward(ctx, x, w):
        return torch.nn.functional.linear(x, w)

    @staticmethod
    def backward(ctx, g):
        return None, None


def _micro(x: torch.Tensor, w: torch.Tensor, device: torch.device) -> dict[str, float]:
    lin = torch.nn.functional.linear
    xd = x.detach()

    def no_grad():
        with torch.no_grad():
            lin(xd, w)

    shape = (x.shape[0], w.shape[0])
    cases = {"linear_no_grad": no_grad, "linear_grad": lambda: lin(x, w),
             "linear_in_function": lambda: _Bare.apply(x, w),
             "empty": lambda: torch.empty(shape, dtype=x.dtype, device=device),
             "alias": lambda: torch.ops.aten.alias(xd)}
    out = {}
    for name, f in cases.items():
        for _ in range(20):
            f()
        out[name] = host_us(f, 400, device=device)
    return out


def _cpu_ops(step, device: torch.device) -> str:
    """Self CPU time per op and CUDA runtime call (cudaLaunchKernel, cudaMalloc, ...) over 50 steps,
    per step: torch.profiler (the CUDA activity only adds the runtime calls on the host's side)."""
    for _ in range(5):
        step()
    _sync(device)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                    if device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(50):
            step()
        _sync(device)
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:40]
    return "\n".join(f"{e.self_cpu_time_total / 50:8.1f} {e.count / 50:5.1f}  {e.key[:80]}" for e in rows)


def _train_step(f, dy: torch.Tensor, leaves) -> None:
    """One training step of provider ``f``: forward, backward, gradients dropped."""
    f().backward(dy)
    for t in leaves:
        t.grad = None


def _ab_one_call(k, providers, x, ws, dy, device, rounds: int, name: str, m: int) -> dict:
    mlp = importlib.import_module(k.__name__ + ".mlp")

    def step(f):
        _train_step(f, dy, (x, *ws))

    labels = ("eager", "ours one call", "ours python")
    samples: dict[str, list[float]] = {label: [] for label in labels}
    try:
        for r in range(rounds):
            for label in (labels[::-1] if r % 2 else labels):
                mlp.ONE_CALL = label != "ours python"
                f = providers["eager" if label == "eager" else "ours"]
                for _ in range(5):
                    step(f)
                samples[label].append(host_us(lambda: step(f), 40, device=device))
    finally:
        mlp.ONE_CALL = True
    med = {label: statistics.median(v) for label, v in samples.items()}
    paired = statistics.median(a - b for a, b in zip(samples["ours one call"], samples["ours python"]))
    print(f"{name:10s} M={m:5d} host us per step: eager {med['eager']:7.1f}, ours one call "
          f"{med['ours one call']:7.1f}, ours python {med['ours python']:7.1f}; one call - python, paired "
          f"median {paired:+.1f}", flush=True)
    return {"shape": name, "M": m, "mode": "ab_one_call", "rounds": rounds, "host_us_step": med,
            "paired_one_call_minus_python_us": paired, "backward": k.last_backend("geglu_mlp_backward"),
            "samples": samples}


def _interleaved(k, providers, x, ws, dy, device, rounds: int, labels, configure, op: str = "geglu_mlp"):
    """Host and wall µs per training step of each label in ``rounds`` interleaved rounds (order
    reversed every other round): ``configure(label)`` sets ours up before its steps; "eager" runs
    the eager module. Returns (host samples, wall samples, the forward backend each label ran)."""
    host: dict[str, list[float]] = {label: [] for label in labels}
    wall: dict[str, list[float]] = {label: [] for label in labels}
    backends = {}

    def step(f):
        _train_step(f, dy, (x, *ws))

    for r in range(rounds):
        for label in (labels[::-1] if r % 2 else labels):
            configure(label)
            f = providers["eager" if label.startswith("eager") else "ours"]
            for _ in range(5):
                step(f)
            if not label.startswith("eager"):
                backends[label] = k.last_backend("gelu_and_mul" if op == "geglu_packed" else op.split("_gelu")[0])
            host[label].append(host_us(lambda: step(f), 30, device=device))
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(40):
                step(f)
            _sync(device)
            wall[label].append((time.perf_counter() - t0) / 40 * 1e6)
    return host, wall, backends


def _report(mode: str, name: str, m: int, rounds: int, labels, host, wall, backends, **extra) -> dict:
    med_h = {label: statistics.median(v) for label, v in host.items()}
    med_w = {label: statistics.median(v) for label, v in wall.items()}
    print(f"{name:10s} M={m:5d} wall / host us per step: "
          + ", ".join(f"{label} {med_w[label]:.1f} / {med_h[label]:.1f}" for label in labels), flush=True)
    return {"shape": name, "M": m, "mode": mode, "rounds": rounds, "wall_us_step": med_w,
            "host_us_step": med_h, "backends": backends, **extra, "wall_samples": wall, "host_samples": host}


def _ab_train_launch(k, providers, x, ws, dy, device, rounds: int, name: str, m: int) -> dict:
    labels = ("eager", "ours auto", "ours 64x128pp/s1", "ours 128x128/s1")

    def configure(label):
        launch = label.removeprefix("ours ")
        if launch == "auto" or label == "eager":
            os.environ.pop("FUSED_GEGLU_SM90_MLP", None)
        else:
            os.environ["FUSED_GEGLU_SM90_MLP"] = launch

    try:
        host, wall, backends = _interleaved(k, providers, x, ws, dy, device, rounds, labels, configure)
    finally:
        os.environ.pop("FUSED_GEGLU_SM90_MLP", None)
    return _report("ab_train_launch", name, m, rounds, labels, host, wall, backends)


def _ab_cpp_node(k, providers, x, ws, dy, device, rounds: int, name: str, m: int, op: str = "geglu_mlp") -> dict:
    """Ours' step with the C++ training node (``_dispatch.CPP_AUTOGRAD``, the default) against the same
    kernels under the Python autograd.Function, and eager; paired medians of wall time per step."""
    dispatch = importlib.import_module(k.__name__ + "._dispatch")
    # "eager again" runs eager a second time in its own slot of each round: the A/A difference is
    # the noise floor of this host, against which the other paired differences are read.
    labels = ("eager", "ours C++ node", "ours Python node", "eager again")

    def configure(label):
        dispatch.CPP_AUTOGRAD = label != "ours Python node"

    try:
        host, wall, backends = _interleaved(k, providers, x, ws, dy, device, rounds, labels, configure, op)
    finally:
        dispatch.CPP_AUTOGRAD = True
    paired = {
        "cpp_minus_python_wall_us": statistics.median(a - b for a, b in zip(wall[labels[1]], wall[labels[2]])),
        "cpp_minus_eager_wall_us": statistics.median(a - b for a, b in zip(wall[labels[1]], wall["eager"])),
        "cpp_faster_than_python_rounds": sum(a < b for a, b in zip(wall[labels[1]], wall[labels[2]])),
        "cpp_faster_than_eager_rounds": sum(a < b for a, b in zip(wall[labels[1]], wall["eager"])),
        "eager_again_minus_eager_wall_us": statistics.median(a - b for a, b in zip(wall["eager again"], wall["eager"])),
        "eager_again_abs_diff_wall_us": sorted(abs(a - b) for a, b in zip(wall["eager again"], wall["eager"])),
    }
    print(f"{'':10s} paired wall: C++ - Python {paired['cpp_minus_python_wall_us']:+.1f} us "
          f"({paired['cpp_faster_than_python_rounds']}/{rounds} faster), C++ - eager "
          f"{paired['cpp_minus_eager_wall_us']:+.1f} us ({paired['cpp_faster_than_eager_rounds']}/{rounds}); A/A eager again - "
          f"eager {paired['eager_again_minus_eager_wall_us']:+.1f} us", flush=True)
    shown = name if op == "geglu_mlp" else f"{name} {op}"
    return _report("ab_cpp_node", shown, m, rounds, labels, host, wall, backends, op=op, paired=paired)


_OPS = ("linear", "linear_gelu_tanh", "geglu", "geglu_packed")


def _op_providers(k, op: str, m: int, h: int, i: int, device, dt):
    """(providers, leaves, dy) of one training step of ``op`` at the MLP's gate-projection shape:
    ``linear`` [m, h] x [i, h]^T + bias (and tanh GELU), ``geglu`` on gate/up [m, i], ``geglu_packed``
    on x [m, 2i]; eager is the ATen composition."""
    import torch.nn.functional as F

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=dt, requires_grad=True)

    if op.startswith("linear"):
        act = "gelu_tanh" if op == "linear_gelu_tanh" else None
        x, w, b = rand(m, h), torch.nn.Parameter(torch.randn(i, h, device=device, dtype=dt) / h ** 0.5), rand(i)

        def eager():
            y = F.linear(x, w, b)
            return F.gelu(y, approximate="tanh") if act else y
        return {"eager": eager, "ours": lambda: k.linear(x, w, b, activation=act)}, [x, w, b], \
            torch.randn(m, i, device=device, dtype=dt)
    if op == "geglu":
        gate, up = rand(m, i), rand(m, i)
        return {"eager": lambda: F.gelu(gate, approximate="tanh") * up,
                "ours": lambda: k.geglu(gate, up, approximate="tanh")}, [gate, up], torch.randn(m, i, device=device, dtype=dt)
    x = rand(m, 2 * i)
    return {"eager": lambda: F.gelu(x[:, :i], approximate="tanh") * x[:, i:],
            "ours": lambda: k.geglu_packed(x, approximate="tanh")}, [x], torch.randn(m, i, device=device, dtype=dt)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    p.add_argument("--micro", action="store_true")
    p.add_argument("--ab-one-call", type=int, default=0, metavar="ROUNDS")
    p.add_argument("--ab-train-launch", type=int, default=0, metavar="ROUNDS")
    p.add_argument("--ab-cpp-node", type=int, default=0, metavar="ROUNDS")
    p.add_argument("--op", default="geglu_mlp", choices=("geglu_mlp", *_OPS))
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
            if args.op != "geglu_mlp":
                if not args.ab_cpp_node:
                    raise SystemExit("--op other than geglu_mlp: only with --ab-cpp-node")
                providers, leaves, dy = _op_providers(k, args.op, m, h, i, device, dt)
                rows.append(_ab_cpp_node(k, providers, leaves[0], leaves[1:], dy, device, args.ab_cpp_node, name, m,
                                         args.op))
                continue
            if args.ab_one_call:
                rows.append(_ab_one_call(k, providers, x, ws, dy, device, args.ab_one_call, name, m))
                continue
            if args.ab_train_launch:
                rows.append(_ab_train_launch(k, providers, x, ws, dy, device, args.ab_train_launch, name, m))
                continue
            if args.ab_cpp_node:
                rows.append(_ab_cpp_node(k, providers, x, ws, dy, device, args.ab_cpp_node, name, m))
                continue
            for prov, f in providers.items():
                def step(f=f):
                    _train_step(f, dy, (x, *ws))
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
                if args.micro and m == int(args.tokens.split(",")[0]):
                    row["cpu_ops"] = _cpu_ops(step, device)
                    if prov == "eager":
                        row["micro_us"] = _micro(x, ws[0], device)
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
        if "micro_us" in r:
            print(f"== {r['shape']} M={r['M']} host us per call: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in r["micro_us"].items()))
        if "cpu_ops" in r:
            print(f"== {r['shape']} M={r['M']} {r['provider']}: self CPU us per step")
            print("\n".join(r["cpu_ops"].splitlines()[:24]))
    for r in rows:
        if "profile" in r:
            print(f"== {r['shape']} M={r['M']} ours ({r['backend']}, backward {r['backward']})")
            print("\n".join(r["profile"].splitlines()[:34]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
