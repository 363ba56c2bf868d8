"""Device helpers shared by the Triton kernels: GELU math, tile ordering, dtype flags.

Everything here runs on fp32 values. Only `tl.erf`, `tl.exp` and `tl.sigmoid` are used, because they
exist under the same names in Triton 3.6 and 3.9 and in the interpreter (libdevice moved between
versions). The tanh GELU is written through the sigmoid identity

    0.5 * (1 + tanh(z)) = sigmoid(2 z)

so gelu_tanh(x) = x * sigmoid(2 z) with z = sqrt(2/pi) * (x + 0.044715 x^3); that avoids `tanh` and the
cancellation of `2 * sigmoid(2z) - 1` near 0. Its derivative uses 1 - tanh(z)^2 = 4 s (1 - s).
"""

import torch
import triton
import triton.language as tl

# Activation codes passed to the kernels as `tl.constexpr`.
ACT_NONE = 0
ACT_GELU_ERF = 1  # 0.5 * x * (1 + erf(x / sqrt(2)))
ACT_GELU_TANH = 2  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))

_APPROXIMATE_TO_ACT = {"none": ACT_GELU_ERF, "tanh": ACT_GELU_TANH}
_ACTIVATION_TO_ACT = {"none": ACT_NONE, "gelu": ACT_GELU_ERF, "gelu_tanh": ACT_GELU_TANH}


def act_from_approximate(approximate: str) -> int:
    """GeGLU flavour ("none" = erf, "tanh") -> activation code."""
    try:
        return _APPROXIMATE_TO_ACT[approximate]
    except KeyError:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}") from None


def act_from_activation(activation: str) -> int:
    """Linear epilogue activation ("none", "gelu", "gelu_tanh") -> activation code."""
    try:
        return _ACTIVATION_TO_ACT[activation]
    except KeyError:
        raise ValueError(
            f"activation must be 'none', 'gelu' or 'gelu_tanh', got {activation!r}"
        ) from None


def or_dummy(t, fallback):
    """Stand-in pointer for an absent optional tensor; never dereferenced because its constexpr flag
    (HAS_BIAS, STORE_PREACT, ...) is off."""
    return fallback if t is None else t


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision: exact ("ieee") for fp32 operands, so fp32 results stay fp32-accurate
    (no silent TF32); irrelevant (and left at the default "tf32") for fp16/bf16 operands."""
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def gelu(x, ACT: tl.constexpr):
    """gelu(x) in fp32 for ACT in {ACT_GELU_ERF, ACT_GELU_TANH}; identity for ACT_NONE."""
    if ACT == 1:
        return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == 2:
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        return x * tl.sigmoid(2.0 * z)
    else:
        return x


@triton.jit
def gelu_grad(x, ACT: tl.constexpr):
    """d gelu(x) / dx in fp32 (1 for ACT_NONE).

    erf:  Phi(x) + x * phi(x),  Phi = 0.5 (1 + erf(x/sqrt2)), phi = exp(-x^2/2) / sqrt(2 pi)
    tanh: s + 2 x s (1 - s) * sqrt(2/pi) (1 + 3 * 0.044715 x^2),  s = sigmoid(2 z)
    """
    if ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))
        pdf = 0.3989422804014327 * tl.exp(-0.5 * x * x)
        return cdf + x * pdf
    elif ACT == 2:
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        s = tl.sigmoid(2.0 * z)
        dz = 0.7978845608028654 * (1.0 + 0.134145 * x * x)
        return s + 2.0 * x * s * (1.0 - s) * dz
    else:
        return tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def gelu_and_grad(x, ACT: tl.constexpr):
    """(gelu(x), gelu'(x)) sharing the transcendental work; ACT must be 1 or 2."""
    if ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))
        pdf = 0.3989422804014327 * tl.exp(-0.5 * x * x)
        return x * cdf, cdf + x * pdf
    else:
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        s = tl.sigmoid(2.0 * z)
        dz = 0.7978845608028654 * (1.0 + 0.134145 * x * x)
        return x * s, s + 2.0 * x * s * (1.0 - s) * dz


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """L2-friendly tile order: walk GROUP_M row-tiles down a column of tiles before moving right, so
    a group of programs running together shares the same B (weight) column panels and A row panels."""
    width = GROUP_M * num_pid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_rows
    pid_n = (pid % width) // group_rows
    return pid_m, pid_n


@triton.jit
def load_tile(ptr, stride_m, offs_m, offs_n, M, N):
    """Masked [len(offs_m), len(offs_n)] tile of a row-major 2-D view (unit column stride), as fp32."""
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    ptrs = ptr + offs_m.to(tl.int64)[:, None] * stride_m + offs_n[None, :]
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_tile(ptr, stride_m, offs_m, offs_n, M, N, val):
    """Masked store of an fp32 tile into a row-major 2-D view, rounding once to the view's dtype."""
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    ptrs = ptr + offs_m.to(tl.int64)[:, None] * stride_m + offs_n[None, :]
    tl.store(ptrs, val.to(ptr.dtype.element_ty), mask=mask)
