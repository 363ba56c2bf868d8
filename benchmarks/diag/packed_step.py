"""ModernBERT's packed GeGLU MLP on the GPU (a diagnosis tool): forward and training step of the host module
against the kernel's ``PackedGeGLUMLP`` layer on it, beside a Gemma-style MLP of the same widths (three
``nn.Linear``) and its ``GeGLUMLP`` layer, so that what the packed form costs is told apart from what the
widths cost; and the kernel's ops composed in the host's order (``linear``, ``geglu_packed``, ``linear``: one GEMM
per packed projection, as the host runs them, with the fused pointwise between).

    python3 benchmarks/diag/packed_step.py --out DIR [--shapes modernbert-large,modernbert-base] [--tokens 8192]

Per shape, bf16, M tokens: median µs over interleaved rounds (CUDA events, 4 input sets rotated, 20 calls per
timing), the backend each fused call ran (``last_backend``) and, for each training step, the GPU kernels of one
step (torch.profiler: name -> µs). Writes ``packed-step-<commit>.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from types import MethodType

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _diag import environment, kernel_times, load_kernel  # noqa: E402

SHAPES = {"modernbert-large": (1024, 2624), "modernbert-base": (768, 1152)}  # (H, I)


class Packed(nn.Module):
    """transformers' ModernBertMLP, written out."""

    def __init__(self, h, i):
        super().__init__()
        self.Wi, self.act, self.drop, self.Wo = nn.Linear(h, 2 * i, bias=False), nn.GELU(), nn.Dropout(0.0), \
            nn.Linear(i, h, bias=False)

    def forward(self, x):
        a, b = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(self.act(a) * b))


class Split(nn.Module):
    """A Gemma-style MLP (exact GELU) with the same widths."""

    def __init__(self, h, i):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False), \
            nn.Linear(i, h, bias=False)
        self.act_fn = nn.GELU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _events_us(fn, xs, calls: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for k in range(calls):
        fn(xs[k % len(xs)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("packed_step: needs a CUDA GPU; nothing measured")
        return 0
    kernel = load_kernel()
    dev, dt = torch.device("cuda"), torch.bfloat16
    dispatch = sys.modules[f"{kernel.__name__}._dispatch"]
    result = {"env": environment(), "tokens": args.tokens, "shapes": {}}
    for name in args.shapes.split(","):
        h, i = SHAPES[name]
        torch.manual_seed(0)
        packed = Packed(h, i).to(dev, dt)
        split = Split(h, i).to(dev, dt)
        with torch.no_grad():  # the same weights in both forms
            split.gate_proj.weight.copy_(packed.Wi.weight[:i])
            split.up_proj.weight.copy_(packed.Wi.weight[i:])
            split.down_proj.weight.copy_(packed.Wo.weight)
        ours_packed, ours_split = copy.deepcopy(packed), copy.deepcopy(split)
        ours_packed.forward = MethodType(kernel.layers.PackedGeGLUMLP.forward, ours_packed)
        ours_split.forward = MethodType(kernel.layers.GeGLUMLP.forward, ours_split)
        composed = copy.deepcopy(packed)  # the kernel's ops in the host's order: linear, packed GeGLU, linear
        composed.forward = lambda t, m=composed: kernel.linear(
            kernel.geglu_packed(kernel.linear(t, m.Wi.weight, m.Wi.bias), approximate="none"), m.Wo.weight, m.Wo.bias)
        providers = {"eager packed": packed, "ours packed": ours_packed, "ours composed": composed,
                     "eager split": split, "ours split": ours_split}
        xs = [torch.randn(args.tokens, h, device=dev, dtype=dt, requires_grad=True) for _ in range(4)]
        dy = torch.randn(args.tokens, h, device=dev, dtype=dt)

        def fwd(m):
            def run(x):
                with torch.no_grad():
                    return m(x)
            return run

        def train(m):
            def run(x):
                m(x).backward(dy)
            return run

        backends = {}
        for pname, m in providers.items():
            if pname.startswith("ours"):
                for k in ("geglu_mlp", "geglu_mlp_backward"):
                    dispatch._last.pop(k, None)
                train(m)(xs[0])
                fwd(m)(xs[0])
                backends[pname] = {k: kernel.last_backend(k) for k in ("geglu_mlp", "geglu_mlp_backward")}
        times = {f"{pname} {mode}": [] for pname in providers for mode in ("fwd", "train")}
        for rnd in range(args.rounds):
            order = list(providers.items())
            for pname, m in (order if rnd % 2 == 0 else order[::-1]):
                for mode, fn in (("fwd", fwd(m)), ("train", train(m))):
                    fn(xs[0])
                    times[f"{pname} {mode}"].append(_events_us(fn, xs))
        medians = {k: statistics.median(v) for k, v in times.items()}
        kernels = {pname: {k: round(v, 1) for k, v in sorted(kernel_times(lambda: train(m)(xs[0]), 3).items(),
                                                                 key=lambda kv: -kv[1])[:14]}
                   for pname, m in providers.items()}
        result["shapes"][name] = {"H": h, "I": i, "median_us": medians, "rounds_us": times, "backends": backends,
                                  "train_kernels_us": kernels}
        print(f"== {name} (H {h}, I {i}, M {args.tokens}) backends {backends}")
        for k, v in medians.items():
            print(f"  {k:22} {v:9.1f} us")
        for pname in ("eager packed", "ours packed", "ours composed", "ours split"):
            print(f"  {pname} train kernels: " + "; ".join(f"{k[:48]} {v}" for k, v in list(kernels[pname].items())[:9]))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"packed-step-{(result['env']['commit'] or 'unknown')[:7]}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
