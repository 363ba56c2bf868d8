"""Where a training step's (or a forward's) GPU time goes: geglu_mlp (auto) against torch.compile
of the eager MLP and eager itself, kernel by kernel, from torch.profiler (GPU only; a diagnosis
tool, not the product benchmark).

    python3 benchmarks/diag/train_profile.py --shape gemma-2b --tokens 8192 [--mode fwd] --out DIR
    python3 benchmarks/diag/train_profile.py --shape gemma2-9b --tokens 1024 --providers ours \
        --launches policy,no,128x128pp/s1,128x256/s1 --rounds 3 --out DIR

Prints, per provider, the summed CUDA time of each kernel over ``--steps`` steps (divided by the
step count), grouped into GEMMs and the rest, and writes the same as JSON. ``--launches`` profiles
ours once per value of ``$FUSED_GEGLU_SM90_MLP`` (``policy``: unset, the rules' pick; ``no``: cuBLAS
+ pointwise; or a CUTLASS launch), in one process: GPU time per kernel, free of the host time and
the run-to-run spread that make two harness rows 1-3 % apart hard to order. Each profile follows
``--warmup-ms`` of steps, and ``--rounds`` interleaves the providers (per kernel, the median over
rounds). Even so, at the sizes where the board sits at its power cap the profiles say where a step's
time goes, not which of two providers within ~5 % is faster: on an H200 (b999aac) one provider's step
moved by up to 10 % between rounds, and two launches running identical kernels came out 4 % apart
(benchmarks/RESULTS.md, "Profiles of a training step under the power cap"). The harness orders them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
from _diag import SHAPES, eager_mlp, environment, kernel_times, load_kernel

GEMM_MARKS = ("gemm", "cutlass", "sm90_xmma", "cublas", "nvjet", "matmul")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="gemma-2b", choices=sorted(SHAPES))
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--mode", choices=("train", "fwd"), default="train")
    p.add_argument("--providers", default="ours,compile,eager",
                   help="comma-separated, from ours, compile, eager")
    p.add_argument("--launches", default="policy",
                   help="comma-separated values of $FUSED_GEGLU_SM90_MLP for ours ('policy': unset)")
    p.add_argument("--rounds", type=int, default=1,
                   help="profile every provider/launch this many times, interleaved; per kernel, the median")
    p.add_argument("--warmup-ms", type=float, default=300.0,
                   help="keep stepping this long before each profile (power-cap state; _diag.kernel_times)")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds: expected a positive count, got {args.rounds}")
    providers = args.providers.split(",")
    unknown = set(providers) - {"ours", "compile", "eager"}
    if unknown:
        p.error(f"--providers: unknown {sorted(unknown)}; expected ours, compile or eager")
    k = load_kernel()
    h, i = SHAPES[args.shape]
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(args.tokens, h, device=dev, dtype=dt, requires_grad=True)
    ws = [torch.nn.Parameter(torch.randn(*s, device=dev, dtype=dt) * s[1] ** -0.5) for s in ((i, h), (i, h), (h, i))]
    dy = torch.randn(args.tokens, h, device=dev, dtype=dt)
    compiled = torch.compile(eager_mlp)

    def step_of(fn):
        def step():
            if args.mode == "fwd":
                with torch.no_grad():
                    fn(x, *ws)
                return
            for t in (x, *ws):
                t.grad = None
            fn(x, *ws).backward(dy)
        return step

    def ours(*a):
        return k.geglu_mlp(*a, approximate="tanh")

    runs = []  # (name, fn, value of $FUSED_GEGLU_SM90_MLP or None)
    if "ours" in providers:
        launches = args.launches.split(",")
        runs += [("ours-auto" if launches == ["policy"] else f"ours[{launch}]", ours,
                  None if launch == "policy" else launch) for launch in launches]
    runs += [(name, fn, None) for name, fn in (("compile", compiled), ("eager", eager_mlp)) if name in providers]

    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in runs}
    for _ in range(args.rounds):
        for name, fn, launch in runs:
            os.environ.pop("FUSED_GEGLU_SM90_MLP", None)
            if launch is not None:
                os.environ["FUSED_GEGLU_SM90_MLP"] = launch
            samples[name].append(kernel_times(step_of(fn), args.steps, warmup_ms=args.warmup_ms))
            os.environ.pop("FUSED_GEGLU_SM90_MLP", None)
    result = {}
    for name, rounds in samples.items():
        # A kernel missing from a round (none should be) counts as 0 there rather than being dropped.
        names = {n for r in rounds for n in r}
        kern = {n: statistics.median(r.get(n, 0.0) for r in rounds) for n in names}
        gemm = sum(t for n, t in kern.items() if any(m in n.lower() for m in GEMM_MARKS))
        result[name] = {"total_us": sum(kern.values()), "gemm_us": gemm, "kernels": kern,
                        "round_totals_us": [sum(r.values()) for r in rounds]}
        totals = " ".join(f"{t:.0f}" for t in result[name]["round_totals_us"])
        print(f"== {name}: {sum(kern.values()):.0f} us of kernels per step, GEMMs {gemm:.0f} us (rounds: {totals})")
        for n, t in sorted(kern.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {t:9.1f} us  {n[:110]}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.mode}-profile-{args.shape}-{args.tokens}.json"
    path.write_text(json.dumps({"shape": args.shape, "tokens": args.tokens, "mode": args.mode, "steps": args.steps,
                                "rounds": args.rounds, "warmup_ms": args.warmup_ms,
                                "env": environment(), "providers": result}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
