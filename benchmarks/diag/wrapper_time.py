"""Host cost of one eager inference call of each public function against the ATen expression it replaces
(a diagnosis tool): what the Python wrapper adds where a call is bound by host time.

    python3 benchmarks/diag/wrapper_time.py --tokens 16 --rounds 15 --out DIR [--device cpu]

Per shape (the gate projection's: x [M, H], weight [I, H], bias [I]; the GeGLU forms on [M, I]) and
per op, under ``torch.no_grad``, ours and eager in ``--rounds`` interleaved rounds (order reversed every
other round, since the host's speed drifts between runs by more than the difference measured):
- host_us: CPU time of one call while earlier calls keep the GPU busy, median of 40;
- wall_us: wall time per call over 50 back-to-back calls between two synchronisations (on a
  host-bound size the GPU waits for the host, so this is what a caller sees);
- the paired difference ours - eager of each round's wall time, and its median.
On CPU (``--device cpu``) the sizes are H = 64, I = 128 in fp32, where a call is all host time.

Ops: ``linear`` (``F.linear(x, w, b)``), ``linear_gelu_tanh`` (``F.gelu(F.linear(...), "tanh")``; and
``linear_gelu_tanh_cuda``, the same call with ``backend="cuda"``, which takes the general path where the
auto call takes the short one: their difference is what the short path saves),
``geglu`` (``F.gelu(gate, "tanh") * up``), ``geglu_packed`` and ``gelu_and_mul`` (the same on halves of
a packed [M, 2I] x, into a given out for the latter), ``geglu_mlp`` (the op against the three
``F.linear`` calls and the GELU product). What a kernelized model pays per call, the host module's
``__call__`` included on both sides: ``layer_mlp`` (a Gemma-style MLP module whose forward is
``layers.GeGLUMLP``'s, as kernelize leaves it, against the module itself) and ``layer_linear``
(``nn.Linear`` with ``layers.LinearBias``'s forward against ``nn.Linear``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import SHAPES, environment, host_us, load_kernel  # noqa: E402

OPS = ("linear", "linear_gelu_tanh", "linear_gelu_tanh_cuda", "geglu", "geglu_packed", "gelu_and_mul", "geglu_mlp", "layer_mlp", "layer_linear")
_RECORDED_AS = {"geglu_packed": "gelu_and_mul", "gelu_and_mul": "gelu_and_mul", "linear_gelu_tanh": "linear",
                "linear_gelu_tanh_cuda": "linear",
                "layer_mlp": "geglu_mlp", "layer_linear": "linear"}


class _GemmaStyleMLP(torch.nn.Module):
    """The host module kernelize patches: ``down(gelu_tanh(gate(x)) * up(x))``, no biases."""

    def __init__(self, h: int, i: int):
        super().__init__()
        self.gate_proj = torch.nn.Linear(h, i, bias=False)
        self.up_proj = torch.nn.Linear(h, i, bias=False)
        self.down_proj = torch.nn.Linear(i, h, bias=False)
        self.act_fn = torch.nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _layer_calls(k, op: str, m: int, h: int, i: int, device: torch.device, dtype: torch.dtype):
    """(kernelized module, host module) zero-argument callables: the same weights, the kernelized
    one with its instance ``forward`` replaced by the layer's, which is what kernelize does."""
    host = (_GemmaStyleMLP(h, i) if op == "layer_mlp" else torch.nn.Linear(h, i)).to(device=device, dtype=dtype)
    layer = k.layers.GeGLUMLP if op == "layer_mlp" else k.layers.LinearBias
    kernelized = copy.deepcopy(host)
    kernelized.forward = types.MethodType(layer.forward, kernelized)
    x = torch.randn(m, h, device=device, dtype=dtype)
    return (lambda: kernelized(x)), (lambda: host(x))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _calls(k, op: str, m: int, h: int, i: int, device: torch.device, dtype: torch.dtype):
    """(ours, eager) zero-argument callables for ``op`` at [m, h] x [i, h]."""
    if op.startswith("layer_"):
        return _layer_calls(k, op, m, h, i, device, dtype)
    if op == "geglu_mlp":
        x = torch.randn(m, h, device=device, dtype=dtype)
        wg, wu = (torch.randn(i, h, device=device, dtype=dtype) * h**-0.5 for _ in range(2))
        wd = torch.randn(h, i, device=device, dtype=dtype) * i**-0.5
        return ((lambda: k.geglu_mlp(x, wg, wu, wd, approximate="tanh")),
                (lambda: F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd)))
    if op.startswith("linear"):
        x = torch.randn(m, h, device=device, dtype=dtype)
        w = torch.randn(i, h, device=device, dtype=dtype) * h**-0.5
        b = torch.randn(i, device=device, dtype=dtype)
        if op == "linear":
            return (lambda: k.linear(x, w, b)), (lambda: F.linear(x, w, b))
        if op == "linear_gelu_tanh_cuda":  # backend named: the general path, never the short one
            return ((lambda: k.linear(x, w, b, activation="gelu_tanh", backend="cuda")),
                    (lambda: F.gelu(F.linear(x, w, b), approximate="tanh")))
        return ((lambda: k.linear(x, w, b, activation="gelu_tanh")),
                (lambda: F.gelu(F.linear(x, w, b), approximate="tanh")))
    packed = torch.randn(m, 2 * i, device=device, dtype=dtype)
    if op == "geglu":
        gate, up = torch.randn(m, i, device=device, dtype=dtype), torch.randn(m, i, device=device, dtype=dtype)
        return (lambda: k.geglu(gate, up, approximate="tanh")), (lambda: F.gelu(gate, approximate="tanh") * up)

    def eager():
        return F.gelu(packed[:, :i], approximate="tanh") * packed[:, i:]

    if op == "geglu_packed":
        return (lambda: k.geglu_packed(packed, approximate="tanh")), eager
    out = torch.empty(m, i, device=device, dtype=dtype)
    return (lambda: k.gelu_tanh_and_mul(out, packed)), eager


def _wall_us(fn, device: torch.device, n: int = 50) -> float:
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / n * 1e6


def _measure(k, op, name, m, h, i, device, dtype, rounds: int) -> dict:
    ours, eager = _calls(k, op, m, h, i, device, dtype)
    providers = {"eager": eager, "ours": ours}
    host = {p: [] for p in providers}
    wall = {p: [] for p in providers}
    recorded = _RECORDED_AS.get(op, op)
    sys.modules[f"{k.__name__}._dispatch"]._last.pop(recorded, None)  # None below: the kernel never ran
    with torch.no_grad():
        for f in providers.values():
            for _ in range(20):
                f()
        backend = k.last_backend(recorded)
        for r in range(rounds):
            for p in (("ours", "eager") if r % 2 else ("eager", "ours")):
                host[p].append(host_us(providers[p], 40, device=device))
                wall[p].append(_wall_us(providers[p], device))
    diff = [o - e for o, e in zip(wall["ours"], wall["eager"])]
    med = {p: {"host_us": statistics.median(host[p]), "wall_us": statistics.median(wall[p])} for p in providers}
    print(f"{op:17s} {name:10s} M={m:5d} wall / host us: ours {med['ours']['wall_us']:6.1f} / "
          f"{med['ours']['host_us']:5.1f}  eager {med['eager']['wall_us']:6.1f} / {med['eager']['host_us']:5.1f}  "
          f"paired ours-eager {statistics.median(diff):+6.1f}  ({backend})", flush=True)
    return {"op": op, "shape": name, "M": m, "H": h, "I": i, "dtype": str(dtype), "rounds": rounds,
            "backend": backend, "median": med, "paired_wall_diff_us": statistics.median(diff),
            "wall_samples": wall, "host_samples": host}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--shapes", default="gemma3-1b,gemma-2b,gemma2-9b")
    p.add_argument("--tokens", default="16")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--pin-cpu", type=int, default=None, help="pin the process to this CPU")
    p.add_argument("--out", default=None, help="directory for wrapper-time.json")
    args = p.parse_args()
    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: use --device cpu")
        return 0
    k = load_kernel()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = {name: SHAPES[name] for name in args.shapes.split(",")} if device.type == "cuda" else {"cpu-small": (64, 128)}
    rows = []
    for op in args.ops.split(","):
        for name, (h, i) in shapes.items():
            for m in (int(t) for t in args.tokens.split(",")):
                rows.append(_measure(k, op, name, m, h, i, device, dtype, args.rounds))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        env = environment() if device.type == "cuda" else {"device": "cpu", "torch": torch.__version__}
        with open(os.path.join(args.out, "wrapper-time.json"), "w") as f:
            json.dump({"environment": env, "args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
