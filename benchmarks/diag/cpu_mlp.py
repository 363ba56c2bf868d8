"""The MLP on CPU tensors: ``geglu_mlp`` (the compiled CPU backend: ATen GEMMs around the C++ GeGLU, the
C++ training node) against the eager module, forward (no_grad) and training step, fp32 and bf16; and the
GeGLU pointwise alone (``geglu`` on [1024, 2048], or ``--geglu-shapes``, both GELU flavours) against
``F.gelu(gate) * up``.

    python3 benchmarks/diag/cpu_mlp.py --out DIR [--rounds 6] [--calls 3] [--ops geglu_mlp,geglu] [--dtypes ...]
        [--geglu-shapes 1024x2048,2048x4096]

``autocast_bf16`` rows: float32 tensors with both sides under ``torch.autocast("cpu", bfloat16)``, a region
per call (a training step's). ``autocast_bf16_region`` rows (forward only): each side's ``--calls`` calls
inside one region, as a ``generate()`` under autocast runs its steps, so autocast's weight cache serves the
float32 weights' bf16 copies after the region's first call.

The kernel's product is the GPU; on CPU the functions and layers must work, and a kernelized model must not
be slower than its own forward. Both are ATen's GEMMs, which take almost all the time, so this shows what
the pointwise kernel and the node's sequence add or save. Wall ms per call (forward, or forward + backward),
median over ``--rounds`` interleaved rounds of ``--calls`` calls, the order reversed every other round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from _diag import eager_mlp, load_kernel

MLP_DTYPES = ("float32", "bfloat16", "autocast_bf16", "autocast_bf16_region")
CASES = [(16, 1152, 6912), (256, 1152, 6912), (1024, 512, 2048), (2048, 1024, 4096)]  # (M, H, I)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _one(fn, args, dy, train: bool) -> float:
    t0 = time.perf_counter()
    if train:
        fn(*args).backward(dy)
    else:
        with torch.no_grad():
            fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--ops", default="geglu_mlp,geglu", help="comma-separated: geglu_mlp (the MLP), geglu (pointwise)")
    p.add_argument("--geglu-shapes", default="1024x2048",
                   help="the geglu rows' [M, I], comma-separated MxI (above 2M elements the torch backend, "
                        "which torch-cpu runs, works in row blocks)")
    p.add_argument("--dtypes", default=",".join(MLP_DTYPES), help=f"the MLP rows' dtypes, of {','.join(MLP_DTYPES)}")
    args = p.parse_args()
    ops = set(args.ops.split(","))
    dtypes = args.dtypes.split(",")
    if not set(dtypes) <= set(MLP_DTYPES):
        p.error(f"--dtypes takes {','.join(MLP_DTYPES)}, got {args.dtypes!r}")
    if not ops or not ops <= {"geglu_mlp", "geglu"}:
        p.error(f"--ops takes geglu_mlp and/or geglu, got {args.ops!r}")
    k = load_kernel()

    def ours(x, wg, wu, wd):
        return k.geglu_mlp(x, wg, wu, wd, approximate="tanh")

    def under_autocast(fn):
        def run(*args):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(*args)
        return run

    torch.manual_seed(0)
    rows = []
    # "autocast_bf16": float32 tensors under torch.autocast("cpu", bfloat16), both sides (Trainer's bf16=True).
    for dtype in dtypes if "geglu_mlp" in ops else ():
        autocast = dtype.startswith("autocast")
        region = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype.endswith("region") else contextlib.nullcontext
        store = torch.float32 if autocast else getattr(torch, dtype)
        for m, h, i in CASES:
            x = torch.randn(m, h).to(store)
            ws = [(torch.randn(i, h) * h**-0.5).to(store), (torch.randn(i, h) * h**-0.5).to(store),
                  (torch.randn(h, i) * i**-0.5).to(store)]
            dy = torch.randn(m, h).to(torch.bfloat16 if autocast else store)
            for train in (False, True) if dtype != "autocast_bf16_region" else (False,):
                # Weights are leaves that need a gradient, as a model's parameters (autocast caches only those).
                leaves = [x.clone().requires_grad_(train), *(w.clone().requires_grad_() for w in ws)]
                times = {"eager": [], "ours": []}
                fns = {"eager": eager_mlp, "ours": ours}
                if dtype == "autocast_bf16":
                    fns = {name: under_autocast(fn) for name, fn in fns.items()}
                for fn in fns.values():  # warm-up
                    _one(fn, leaves, dy, train)
                    _one(fn, leaves, dy, train)
                for r in range(args.rounds):
                    for name in (("eager", "ours") if r % 2 == 0 else ("ours", "eager")):
                        with region():
                            times[name] += [_one(fns[name], leaves, dy, train) for _ in range(args.calls)]
                row = {"op": "geglu_mlp", "dtype": dtype, "M": m, "H": h, "I": i,
                       "mode": "train" if train else "fwd", "backend": k.last_backend("geglu_mlp"),
                       **{f"{n}_ms": statistics.median(t) * 1e3 for n, t in times.items()}}
                row["ours_over_eager"] = row["ours_ms"] / row["eager_ms"]
                rows.append(row)
                print(f"{row['dtype']:13} M={m:5} H={h:5} I={i:5} {row['mode']:5} eager {row['eager_ms']:8.2f} ms "
                      f"ours {row['ours_ms']:8.2f} ms  ours/eager {row['ours_over_eager']:.2f}", flush=True)
    geglu_shapes = [tuple(int(n) for n in s.split("x")) for s in args.geglu_shapes.split(",") if s]
    for (gm, gi), dtype in ((s, d) for s in geglu_shapes for d in (torch.float32, torch.bfloat16)) if "geglu" in ops else ():
        for approximate in ("tanh", "none"):
            gate, up, dy = (torch.randn(gm, gi).to(dtype) for _ in range(3))
            for train in (False, True):
                leaves = [gate.clone().requires_grad_(train), up.clone().requires_grad_(train)]
                fns = {"eager": lambda g, u: torch.nn.functional.gelu(g, approximate=approximate) * u,
                       "ours": lambda g, u: k.geglu(g, u, approximate)}
                times = {"eager": [], "ours": []}
                for fn in fns.values():
                    _one(fn, leaves, dy, train)
                for r in range(args.rounds):
                    for name in (("eager", "ours") if r % 2 == 0 else ("ours", "eager")):
                        times[name] += [_one(fns[name], leaves, dy, train) for _ in range(5 * args.calls)]
                row = {"op": "geglu", "dtype": str(dtype).replace("torch.", ""), "M": gm, "I": gi,
                       "approximate": approximate, "mode": "train" if train else "fwd",
                       "backend": k.last_backend("geglu"),
                       **{f"{n}_ms": statistics.median(t) * 1e3 for n, t in times.items()}}
                row["ours_over_eager"] = row["ours_ms"] / row["eager_ms"]
                rows.append(row)
                print(f"geglu {row['dtype']:9} [{gm}, {gi}] {approximate:4} {row['mode']:5} "
                      f"eager {row['eager_ms']:6.2f} ms ours {row['ours_ms']:6.2f} ms  "
                      f"ours/eager {row['ours_over_eager']:.2f}", flush=True)
    env = {"device": "cpu", "cpu": _cpu_model(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "commit": os.environ.get("FUSED_GEGLU_COMMIT", ""),
           "kernel_variant": Path(k.__file__).parent.name}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-mlp.json").write_text(json.dumps({"env": env, "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
