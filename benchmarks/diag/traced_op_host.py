"""Host time of the MLP ops a compiled graph calls (a diagnosis tool): what a ``torch.compile``d,
kernelized model pays per MLP call beyond the kernels.

    python3 benchmarks/diag/traced_op_host.py --out DIR [--device cpu|cuda] [--calls 4000] [--rounds 5]

A compiled graph calls ``geglu_mlp_fwd_op`` / ``geglu_mlp_bwd_op`` through the dispatcher, and each
call passes torch.library's custom-op layers (the Autograd kernel, a redispatch, a dynamo-disable
wrapper, the backend wrapper) before the op's Python runs. This times, at a tiny size where a call is
all host time (x [4, 8], I = 16; fp32 on CPU, bf16 on CUDA, where the GPU keeps up with the host):
- ``fwd_op`` / ``fwd_op_train`` / ``bwd_op``: the ops as the compiled graph calls them (``torch.ops``),
  inference forward, training forward (pre-activations kept) and backward (the functional form);
- ``forward_py`` / ``backward_py``: the same Python without the custom-op layers;
- ``geglu_mlp_nograd``: the public function in eager no-grad mode (the one-call C++ entry);
- ``infer_raw``: that C++ op alone; ``eager``: three ``F.linear`` and the GELU product;
- ``compiled_step_custom_ops`` / ``compiled_step_compiled_ops``: a whole training step (forward and
  backward) of the MLP compiled with inductor, its graphs calling the custom ops as above, or (static
  sizes, ``mlp_traced.training``, switched on here for the device whatever $FUSED_GEGLU_TRACED_OPS's
  default) ``geglu_mlp_train_fwd`` and ``geglu_mlp_gemm_bwd_keep`` directly; inputs that require
  grad, so this one runs with autograd;
- ``compiled_fwd_custom_op`` / ``compiled_fwd_planned_op``: an inductor-compiled inference forward,
  its graph calling ``geglu_mlp_fwd_op`` or (static sizes, ``mlp_traced.inference``)
  ``geglu_mlp_fwd_planned``.
Per entry: the best (lowest) mean µs per call over ``--rounds`` rounds of ``--calls`` calls. Loads the
kernel the way users do (the staged cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _diag import load_kernel  # noqa: E402


def best_us(fn, calls: int, rounds: int, sync) -> float:
    for _ in range(min(calls, 200)):
        fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--calls", type=int, default=4000)  # 20000 ran past a minute on the H200 host
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    k = load_kernel()
    ops = getattr(torch.ops, k.OPS_ID)
    mlp = sys.modules[f"{k.__name__}.mlp"]
    traced = sys.modules[f"{k.__name__}.mlp_traced"]
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    m, h, i = 4, 8, 16
    x, dy = torch.randn(m, h, device=dev, dtype=dtype), torch.randn(m, h, device=dev, dtype=dtype)
    wg, wu = (torch.randn(i, h, device=dev, dtype=dtype) for _ in range(2))
    wd = torch.randn(h, i, device=dev, dtype=dtype)
    none3 = (None, None, None)
    _, gate, up = mlp._forward(x, wg, wu, wd, *none3, "tanh", True, "auto")
    entries = {
        "fwd_op": lambda: ops.geglu_mlp_fwd_op(x, wg, wu, wd, *none3, "tanh", False, "auto"),
        "fwd_op_train": lambda: ops.geglu_mlp_fwd_op(x, wg, wu, wd, *none3, "tanh", True, "auto"),
        "bwd_op": lambda: ops.geglu_mlp_bwd_op(dy, x, wg, wu, wd, None, None, gate, up, "tanh", False, False, "auto"),
        "forward_py": lambda: mlp._forward(x, wg, wu, wd, *none3, "tanh", False, "auto"),
        "backward_py": lambda: mlp._mlp_backward(dy, x, wg, wu, wd, None, None, [gate, up], "tanh", False, False,
                                                 "auto", inplace=False),
        "geglu_mlp_nograd": lambda: k.geglu_mlp(x, wg, wu, wd),
        "eager": lambda: F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd),
    }
    plan = mlp._infer_plans_for(x, wg, (x.device, x.dtype, x.numel(), wg.shape))[0]
    if plan is not None:
        entries["infer_raw"] = lambda: ops.geglu_mlp_infer(x, wg, wu, wd, *none3, 1, *plan[1:])
    results = {}
    with torch.no_grad():  # a compiled graph runs its forward and backward without autograd recording
        for name, fn in entries.items():
            results[name] = best_us(fn, args.calls, args.rounds, sync)
            print(f"{name:27} {results[name]:7.1f} us", flush=True)
    # A compiled training step, with the traced plan switched off (the custom ops) and on.
    leaves = [t.detach().requires_grad_() for t in (x, wg, wu, wd)]
    # The switch itself ($FUSED_GEGLU_TRACED_OPS's set, whatever its default for this device).
    default = traced.TRACED_OPS_DEVICES
    for name, on in (("compiled_step_custom_ops", False), ("compiled_step_compiled_ops", True)):
        traced.TRACED_OPS_DEVICES = frozenset({dev.type} if on else ())
        torch._dynamo.reset()
        loss = torch.compile(lambda *a: k.geglu_mlp(*a).sum(), fullgraph=True)
        results[name] = best_us(lambda: loss(*leaves).backward(), args.calls // 4, args.rounds, sync)
        print(f"{name:27} {results[name]:7.1f} us", flush=True)
    for name, on in (("compiled_fwd_custom_op", False), ("compiled_fwd_planned_op", True)):
        traced.TRACED_OPS_DEVICES = frozenset({dev.type} if on else ())
        torch._dynamo.reset()
        fwd = torch.compile(lambda *a: k.geglu_mlp(*a), fullgraph=True)
        with torch.no_grad():
            results[name] = best_us(lambda: fwd(x, wg, wu, wd), args.calls // 4, args.rounds, sync)
        print(f"{name:27} {results[name]:7.1f} us", flush=True)
    traced.TRACED_OPS_DEVICES = default
    torch._dynamo.reset()
    env = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else f"cpu ({platform.machine()})",
           "torch": torch.__version__, "threads": torch.get_num_threads(),
           "commit": os.environ.get("FUSED_GEGLU_COMMIT", ""), "variant": k.__name__}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"traced-op-host-{dev.type}.json")
    with open(path, "w") as f:
        json.dump({"env": env, "config": {"m": m, "h": h, "i": i, "dtype": str(dtype), "calls": args.calls,
                                          "rounds": args.rounds}, "us_per_call": results}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
