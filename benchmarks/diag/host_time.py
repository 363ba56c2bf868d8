"""Host time against GPU time of one MLP forward (a diagnosis tool, GPU only): why a provider's
harness median can sit above the sum of its kernels.

    python3 benchmarks/diag/host_time.py --shape gemma-2b --tokens 16,1024 --out DIR

Per provider (geglu_mlp auto, torch.compile of the eager MLP, eager), under no_grad:
- host_us: CPU time of one call while the GPU is still busy with earlier ones (launches are
  asynchronous, so this is the Python + dispatch + launch cost alone), median of 50;
- span_us: CUDA-event span of one call issued back to back, as the harness times it, median of 50;
- kernel_us: the summed kernel time of one call from torch.profiler.
A span near max(host_us, kernel_us) says the GPU waited for the host.

``--parts`` also times, host side only, the pieces of ours' path at each size: the Python dispatch
before any launch (policy, operand checks), the output allocation, the compiled CUTLASS gate+up op
called directly, the cuBLAS down GEMM alone, both as two calls and as the one compiled call the
path makes (``geglu_mlp_sm90``), the cuBLAS + pointwise one-call op (``geglu_mlp_gemm``) against its three
linears and eager's five ops, and a trivial ATen op (the dispatcher's floor). ``--forced`` adds
ours with the policy's sm90 choice replaced (CUTLASS gate+up / cuBLAS + pointwise, through
$FUSED_GEGLU_SM90_MLP) and the Triton path, for the no-graph decode rule. The same x and weights
every call: weights below L2's size (Gemma3-1B) read faster here than in the harness.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from _diag import SHAPES, eager_mlp, host_us as _host_us, kernel_times, load_kernel, span_us as _span_us

# --forced: ours with the auto policy's sm90 choice replaced, for deciding the no-graph decode rule.
_FORCED_ENV = {"ours-cutlass": {"FUSED_GEGLU_SM90_MLP": "128x128/s1"}, "ours-cublas": {"FUSED_GEGLU_SM90_MLP": "no"}}


def _forced(k, x, ws, on: bool):
    if not on:
        return ()
    return (("ours-cutlass", lambda: k.geglu_mlp(x, *ws, approximate="tanh")),
            ("ours-cublas", lambda: k.geglu_mlp(x, *ws, approximate="tanh")),
            ("ours-triton", lambda: k.geglu_mlp(x, *ws, approximate="tanh", backend="triton")))


def _parts(k, x, ws) -> dict[str, float]:
    """Host µs of each piece of ours' auto path at this size (each timed alone, GPU kept busy)."""
    import torch.nn.functional as F

    wg, wu, wd = ws
    m, (i, h) = x.shape[0], wg.shape
    dev = x.device
    ops = getattr(torch.ops, k.OPS_ID)
    launch = k.policy.sm90_mlp_launch(m, h, dev)
    hid = torch.empty((m, i), dtype=x.dtype, device=dev)
    pieces = {
        "checks": lambda: k._checks.mlp_args_ok(x, wg, wu, wd, None, None, None, "tanh"),
        "pick": lambda: k.mlp._pick(dev, "auto", m, h, i),
        "usable": lambda: k.sm90_weights.usable(x, wg, wu),
        "launch_rule": lambda: k.policy.sm90_mlp_launch(m, h, dev),
        "empty": lambda: torch.empty((m, i), dtype=x.dtype, device=dev),
        "gateup_op": lambda: ops.geglu_gateup_sm90(hid, x, wg, wu, None, None, 1, None, None,
                                                   *k.sm90_weights.parse_launch(launch)),
        "gateup_wrapper": lambda: k.sm90_weights.gateup_sm90(ops, x, wg, wu, None, None, "tanh", launch),
        "down_linear": lambda: F.linear(hid, wd),
        "two_calls": lambda: F.linear(k.sm90_weights.gateup_sm90(ops, x, wg, wu, None, None, "tanh", launch)[0], wd),
        "mlp_op": lambda: k.sm90_weights.mlp_sm90(ops, x, wg, wu, wd, None, None, None, "tanh", launch),
        "record": lambda: k._dispatch.record("geglu_mlp", "cuda:sm90"),
        # the cuBLAS + pointwise path (policy "no"): its pieces against eager's five ops
        "pointwise_pick": lambda: k.mlp._geglu._pick(dev, "auto", "fwd", m * i, True),
        "gemm_op": lambda: ops.geglu_mlp_gemm(x, wg, wu, wd, None, None, None, 1),
        "three_linears": lambda: (F.linear(x, wg), F.linear(x, wu), F.linear(hid, wd)),
        "eager": lambda: F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd),
        "whole": lambda: k.geglu_mlp(x, wg, wu, wd, approximate="tanh"),
        "trivial_op": lambda: torch.ops.aten.alias(x),
    }
    out = {}
    for name, f in pieces.items():
        for _ in range(5):
            f()
        out[name] = _host_us(f, 200)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="gemma-2b", choices=sorted(SHAPES))
    p.add_argument("--tokens", default="16,1024")
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--parts", action="store_true", help="also host time of each piece of ours' path")
    p.add_argument("--forced", action="store_true",
                   help="also ours with the sm90 choice forced: CUTLASS gate+up, cuBLAS + pointwise, Triton")
    args = p.parse_args()
    k = load_kernel()
    h, i = SHAPES[args.shape]
    dev, dt = torch.device("cuda"), torch.bfloat16
    ws = [torch.randn(*s, device=dev, dtype=dt) * s[1] ** -0.5 for s in ((i, h), (i, h), (h, i))]
    compiled = torch.compile(eager_mlp, dynamic=False)
    rows = []
    for m in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(m, h, device=dev, dtype=dt)
        for name, f in (("ours-auto", lambda: k.geglu_mlp(x, *ws, approximate="tanh")),
                        ("compile", lambda: compiled(x, *ws)), ("eager", lambda: eager_mlp(x, *ws)),
                        *_forced(k, x, ws, args.forced)):
            env = _FORCED_ENV.get(name, {})
            saved = {v: os.environ.get(v) for v in env}
            os.environ.update(env)
            with torch.no_grad():
                for _ in range(5):
                    f()
                row = {"shape": args.shape, "M": m, "provider": name, "host_us": _host_us(f),
                       "span_us": _span_us(f), "kernel_us": sum(kernel_times(f, 20, warmup=0).values())}
            for v, old in saved.items():
                if old is None:
                    os.environ.pop(v, None)
                else:
                    os.environ[v] = old
            row["backend_ran"] = k.last_backend("geglu_mlp") if name.startswith("ours") else None
            rows.append(row)
            print(f"{args.shape:10s} M={m:5d} {name:13s} host {row['host_us']:7.1f}  span {row['span_us']:7.1f}  "
                  f"kernels {row['kernel_us']:7.1f} us", flush=True)
        if args.parts:
            with torch.no_grad():
                parts = _parts(k, x, ws)
            rows.append({"shape": args.shape, "M": m, "provider": "ours-parts", "parts_host_us": parts,
                         "sm90_launch": k.policy.sm90_mlp_launch(m, h, dev)})
            print(f"{args.shape:10s} M={m:5d} parts (host us): "
                  + ", ".join(f"{n} {t:.1f}" for n, t in parts.items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"host-time-{args.shape}.json").write_text(json.dumps(
        {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
