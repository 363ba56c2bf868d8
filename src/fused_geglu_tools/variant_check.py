"""``python -m fused_geglu_tools.variant_check``: load the staged kernel as a user does and check its numbers.

``fused-geglu build-matrix`` runs this under each member's interpreter, once per backend that member
built, after staging the matrix's ``build/`` as a local Hub snapshot. It answers what a build alone does
not: does this torch load the variant built for it (and not another one, or the Triton-only noarch), do
its compiled libraries resolve against this torch, and are the numbers right.

What it runs, on fresh random inputs against a float64 reference computed here with plain torch:
- ``geglu_mlp`` with biases, forward and every gradient, on a 3-D x with an odd token count;
- ``linear`` with a bias, forward and gradients; ``geglu`` (exact GELU), forward and gradients.
On CPU tensors in fp32 (every variant, since a CUDA torch runs CPU tensors too), and where this torch
sees a GPU, on CUDA tensors in bf16 with the suite's rule: no worse than twice eager bf16's error.

It imports only the standard library, torch and kernels (a build environment has those), and prints one
JSON object, the last line of its output; the exit status is 0 whether the numbers pass or not, so that
the caller reports every member. 2 means it could not load anything. ``--backend cuda`` under a CPU build of
torch answers ``skipped``: kernels refuses that backend there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

FP32_REL_TOL = 2e-5  # fp32 against float64, relative to the reference's largest magnitude; seen: ~5e-7
BF16_EAGER_FACTOR = 2.0  # bf16: at most this times eager bf16's error against the same reference


def rel_error(got, ref) -> float:
    """Largest absolute difference, relative to the reference's largest magnitude (at least 1e-12)."""
    ref = ref.double()
    return (got.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)


def _gelu(t, approximate):
    return torch.nn.functional.gelu(t, approximate=approximate)


def _cases(device, dtype, gen):
    """(name, kernel call, eager call) triples over shared leaf tensors; each call returns the output."""

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device, dtype).requires_grad_()

    h, i = 64, 96
    x = leaf(3, 5, h)  # 15 tokens: not a multiple of any block size
    wg, wu, wd = leaf(i, h, scale=h ** -0.5), leaf(i, h, scale=h ** -0.5), leaf(h, i, scale=i ** -0.5)
    bg, bu, bd = leaf(i, scale=0.1), leaf(i, scale=0.1), leaf(h, scale=0.1)
    gate, up = leaf(7, 33), leaf(7, 33)
    w_lin, b_lin = leaf(48, h, scale=h ** -0.5), leaf(48, scale=0.1)

    def mlp_eager(x, wg, wu, wd, bg, bu, bd):
        f = torch.nn.functional.linear
        return f(_gelu(f(x, wg, bg), "tanh") * f(x, wu, bu), wd, bd)

    return [
        ("geglu_mlp", (x, wg, wu, wd, bg, bu, bd),
         lambda k, *a: k.geglu_mlp(*a, approximate="tanh"), lambda *a: mlp_eager(*a)),
        ("linear", (x, w_lin, b_lin), lambda k, *a: k.linear(*a), lambda *a: torch.nn.functional.linear(*a)),
        ("geglu", (gate, up), lambda k, *a: k.geglu(*a, approximate="none"),
         lambda g, u: _gelu(g, "none") * u),
    ]


def _forward_backward(fn, leaves, grad_out):
    """The output and every leaf's gradient for ``grad_out``."""
    for t in leaves:
        t.grad = None
    out = fn(*leaves)
    out.backward(grad_out.to(out.dtype))
    return [out.detach()] + [t.grad.detach() for t in leaves]


def check_device(kernel, device: str) -> list[dict]:
    """One record per op: its largest error over the output and every gradient, the allowed error, and
    the backend that ran it."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(20261207)
    records = []
    for name, leaves, ours, eager in _cases(device, dtype, gen):
        ref_leaves = [t.detach().double().cpu().requires_grad_() for t in leaves]
        grad_out = torch.randn(eager(*ref_leaves).shape, generator=gen, dtype=torch.float64)
        ref = _forward_backward(eager, ref_leaves, grad_out)
        got = _forward_backward(lambda *a: ours(kernel, *a), leaves, grad_out.to(device))
        err = max(rel_error(g.cpu(), r) for g, r in zip(got, ref))
        if dtype == torch.float32:
            allowed = FP32_REL_TOL
        else:
            base = _forward_backward(eager, leaves, grad_out.to(device))
            allowed = BF16_EAGER_FACTOR * max(rel_error(b.cpu(), r) for b, r in zip(base, ref))
        records.append({"op": name, "device": device, "dtype": str(dtype).removeprefix("torch."),
                        "error": err, "allowed": allowed, "ok": err <= allowed,
                        "backend": kernel.last_backend(name)})
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fused_geglu_tools.variant_check",
                                description="Load the kernel through kernels (HF_HUB_CACHE, HF_HUB_OFFLINE) "
                                            "and check it against float64.")
    p.add_argument("--repo-id", required=True)
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--backend", choices=("cpu", "cuda"), default=None,
                   help="the backend kernels loads for (default: the one this torch is built for)")
    args = p.parse_args(argv)

    result = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "backend": args.backend,
              "gpu": torch.cuda.is_available()}
    if args.backend == "cuda" and torch.version.cuda is None:
        result["skipped"] = "a CPU build of torch loads no CUDA variant"
        print(json.dumps(result))
        return 0
    try:
        import kernels

        kernel = kernels.get_kernel(args.repo_id, version=args.version, backend=args.backend,
                                    trust_remote_code=True)
    except Exception as exc:  # any load failure is the answer: report it rather than a traceback alone
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(result))
        return 2
    result["variant"] = Path(kernel.__file__).parent.name
    result["available"] = {d: kernel.available_backends(d) for d in ("cpu", "cuda")}
    records = check_device(kernel, "cpu")
    if args.backend in (None, "cuda") and torch.cuda.is_available():
        records += check_device(kernel, "cuda")
    result["checks"] = records
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
