"""Error measurement against a float64 reference, with tolerances that follow from the dtype.

The rule (as in quack's and Liger's tests): our error against the float64 reference may be at most
``FACTOR`` times the error of the same computation done by eager PyTorch in the same dtype, plus a
small floor for results where eager happens to be (near) exact. Both the relative Frobenius error
and the max abs error (scaled by the reference's magnitude) are checked.
"""

from __future__ import annotations

import json
import os

import torch

FACTOR = 2.0
# Floors, relative to the reference's scale: what FACTOR x eager alone does not cover where eager is
# (near) exact, as for a one-element output that eager happens to round onto the reference, or a
# tiny GEMM (K = 8) whose eager error happened to be small. Measured with $FUSED_GEGLU_TOLERANCE_LOG
# (benchmarks/diag/tolerance_report.py) over twelve CPU runs of the kernel tests, 47688 comparisons:
# the largest need was 1.9 eps in fp32 (a one-element fp32 result carries the GELU's few ulps and a
# second rounding; a 2 eps floor failed 10 of 3000 one-element exact-GELU draws), 0.42 eps in fp16 and
# 0.60 eps in bf16 outside the Triton kernels. Triton's interpreter (the CPU runs of the Triton
# kernels) converts fp32 to bf16 by truncation (1 + 2^-8 + 2^-12 becomes 1.0, where rounding gives
# 1 + 2^-7), so a bf16 result there carries up to one ulp (largest need 0.83 eps); the GPU rounds to
# nearest. The floors were 2 eps (bf16, fp16) and 17 eps (fp32) before, which let a bf16 result 9x
# eager's typical error pass.
_EPS = {dtype: torch.finfo(dtype).eps for dtype in (torch.float32, torch.float16, torch.bfloat16)}
_TRITON_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
FLOOR = {torch.float32: 4 * _EPS[torch.float32], torch.float16: _EPS[torch.float16],
         torch.bfloat16: _EPS[torch.bfloat16] * (1.5 if _TRITON_INTERPRETED else 1.0)}
# Floors for whole-model results (logits, every parameter's gradient, losses after SGD steps) in float32.
# There each op's rounding passes through many layers (and through the optimizer's updates), so two
# computations of equal accuracy end at errors against float64 that differ by more than 2x: which one is
# nearer is chance. Measured on an Intel Xeon with AVX-512 (2026-12-07, torch 2.13.0+cpu), where this
# project's CPU pointwise kernels are within 1 ulp of float64 on every code path (largest 1.1e-7
# relative): ModernBERT's losses after the SGD steps of tests/test_fsdp.py 2.16e-6 against eager's 4.53e-7
# (18 and 3.8 eps) with the AVX-512 path, 1.19e-6 with the scalar path (FUSED_GEGLU_CPU_ISA=baseline);
# T5Gemma's cross-attention q_proj gradient 1.02e-5 against 4.82e-6. Both passed on the AMD EPYC CPU
# the floors above were measured on. 32 eps (3.8e-6) covers the largest of these with 3x to spare and
# stays three orders below bf16's rounding, so a wrong path still fails. bf16 and fp16 keep FLOOR: there
# each op's rounding dominates and the 2x rule holds at model level.
MODEL_FLOOR = {**FLOOR, torch.float32: 32 * _EPS[torch.float32]}


def errors(out: torch.Tensor, ref: torch.Tensor, scale_ref: torch.Tensor | None = None) -> tuple[float, float]:
    """(relative Frobenius error, max abs error / max |ref|). ``scale_ref``, when given, is a tensor of
    the magnitude the result is built from; errors are taken relative to the larger of the two. A
    gradient through GELU is a product with gelu'(pre), which is zero near pre = -0.75: there the
    result is tiny next to the terms that form it, and its error relative to itself says nothing
    (a one-element dx at pre = -0.7524 measured 3.6e-4 relative to itself, 3x eager's)."""
    # In float64 on the output's device: on a GPU a [1024, 16384] result and its reference were copied
    # to the host and reduced there, host work that pytest-xdist's workers did on shared cores. Only
    # scalars come back now (the whole GPU suite went from 414 + 126 s to 147 + 83 s with the
    # per-worker thread share of conftest.py; the two were measured together).
    dev = out.device
    out, ref = out.detach().double(), ref.detach().to(dev, torch.float64)
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(out).all(), "non-finite values in the output"
    mag = ref if scale_ref is None else scale_ref.detach().to(dev, torch.float64)
    scale = max(ref.abs().max().item(), mag.abs().max().item()) or 1.0
    norm = max(ref.norm().item(), mag.norm().item()) or 1.0
    return (out - ref).norm().item() / norm, (out - ref).abs().max().item() / scale


def assert_close(out: torch.Tensor, ref: torch.Tensor, eager: torch.Tensor, what: str = "output",
                 factor: float = FACTOR, scale_ref: torch.Tensor | None = None, model: bool = False) -> None:
    """``model``: ``out`` is a whole model's result (``MODEL_FLOOR``), not one op's."""
    dtype = eager.dtype
    rel, mx = errors(out, ref, scale_ref)
    e_rel, e_mx = errors(eager, ref, scale_ref)
    # A result in the dtype's subnormal range is rounded to a fixed absolute step, which relative to a
    # tiny reference can exceed the floor: a one-element fp16 d_up of about 7e-6 (gate near -4) was
    # off by 0.9 % in one run and eager by 0.3 %, both within one subnormal step. One step, relative to
    # the reference's scale, is added to the floor.
    info = torch.finfo(dtype)
    mag = ref if scale_ref is None else scale_ref
    scale = max(ref.detach().abs().max().item() if ref.numel() else 0.0,
                mag.detach().abs().max().item() if mag.numel() else 0.0) or 1.0
    floor = (MODEL_FLOOR if model else FLOOR)[dtype] + info.smallest_normal * info.eps / scale
    ok = rel <= factor * e_rel + floor and mx <= factor * e_mx + 4 * floor
    _log(what, dtype, out.device, rel, e_rel, mx, e_mx, factor, ok, out.numel())
    assert ok, (f"{what} ({dtype}): rel err {rel:.3g} (eager {e_rel:.3g}), max err {mx:.3g} "
                f"(eager {e_mx:.3g}); allowed {factor}x eager + floor {floor:g}")


def _log(what, dtype, device, rel, e_rel, mx, e_mx, factor, ok, numel=None) -> None:
    """With $FUSED_GEGLU_TOLERANCE_LOG=PATH, one JSON line per comparison to PATH.<pid> (one file per
    process: pytest-xdist workers must not interleave): the measured errors beside eager's, which is
    what the floors above are chosen from (`benchmarks/diag/tolerance_report.py` summarises them)."""
    path = os.environ.get("FUSED_GEGLU_TOLERANCE_LOG")
    if not path:
        return
    rec = {"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0], "what": what,
           "dtype": str(dtype).removeprefix("torch."), "device": device.type, "rel": rel, "eager_rel": e_rel,
           "max": mx, "eager_max": e_mx, "factor": factor, "ok": ok, "numel": numel}
    with open(f"{path}.{os.getpid()}", "a") as f:
        f.write(json.dumps(rec) + "\n")


def randn(*shape, dtype=torch.float32, device="cpu", scale=1.0, requires_grad=False, gen=None):
    t = (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)
    return t.requires_grad_(requires_grad)


def laid_out(shape, dtype, device, layout, gen, scale=1.0, requires_grad=False):
    """A tensor of ``shape`` laid out as a real caller's might be: "contiguous"; "row_padded" (rows of a
    wider buffer: row stride above the last dim, last dim unit-stride, as a slice of a fused
    projection's weight); "strided" (every other element of the last dim)."""
    wide = {"contiguous": shape[-1], "row_padded": shape[-1] + 8, "strided": 2 * shape[-1]}[layout]
    base = randn(*shape[:-1], wide, dtype=dtype, device=device, scale=scale, gen=gen)
    t = base[..., ::2] if layout == "strided" else base[..., :shape[-1]]
    return t.requires_grad_(requires_grad)



def assert_step_close(y, ref, eager, operands, operands64, names, what: str, gen=None) -> None:
    """A forward ``y`` and the gradients of every operand that requires one, against the float64
    ``ref`` (built from ``operands64``) within the bound of ``eager`` (built from ``operands``), with
    one random output gradient. Where ``y`` has no elements, the gradients must be zeros of the
    operands' shapes (a GEMM over no rows)."""
    leaves = [k for k, t in enumerate(operands) if t is not None and t.requires_grad]
    if y.numel() == 0:
        for k, g in zip(leaves, torch.autograd.grad(y, [operands[k] for k in leaves], torch.zeros_like(y))):
            assert g.shape == operands[k].shape and not g.count_nonzero(), f"{names[k]} ({what})"
        return
    assert_close(y, ref, eager, f"y ({what})")
    if not leaves:
        return
    grad = randn(*y.shape, dtype=y.dtype, device=y.device, gen=gen)
    ours = torch.autograd.grad(y, [operands[k] for k in leaves], grad)
    refs = torch.autograd.grad(ref, [operands64[k] for k in leaves], grad.double())
    eagers = torch.autograd.grad(eager, [operands[k] for k in leaves], grad)
    for k, o, r, e in zip(leaves, ours, refs, eagers):
        assert_close(o, r, e, f"{names[k]} ({what})")
