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
def _tanh_parts(x):
    """(s, 1 - s, v') of tanh GELU = x * s, s = sigmoid(v), v = 2 sqrt(2/pi) (x + 0.044715 x^3).

    1 - s is formed as e * s (e = exp(-v)), not by subtraction: for large x, 1 - s cancels to a few
    bits, and near gelu's stationary point (x ~ -0.75) the derivative's two terms nearly cancel, so
    their sum is taken in one fused multiply-add (fp32 gradients measured 3x eager's error before).
    -v is clamped so 1 + e stays finite and e * s is never inf * 0.
    """
    x2 = x * x
    v = x * (0.0713548162726008322 * x2 + 1.59576912160573071)
    e = tl.exp(tl.minimum(-v, 88.0))
    s = 1.0 / (1.0 + e)
    return s, e * s, 0.2140644488178024966 * x2 + 1.59576912160573071


@triton.jit
def gelu(x, ACT: tl.constexpr):
    """gelu(x) in fp32 for ACT in {ACT_GELU_ERF, ACT_GELU_TANH}; identity for ACT_NONE."""
    if ACT == 1:
        return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == 2:
        s, _, _ = _tanh_parts(x)
        return x * s
    else:
        return x


@triton.jit
def gelu_grad(x, ACT: tl.constexpr):
    """d gelu(x) / dx in fp32 (1 for ACT_NONE).

    erf:  Phi(x) + x * phi(x),  Phi = 0.5 (1 + erf(x/sqrt2)), phi = exp(-x^2/2) / sqrt(2 pi)
    tanh: s + x s (1 - s) v',  s = sigmoid(v), v = 2 sqrt(2/pi) (x + 0.044715 x^3)
    """
    if ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))
        pdf = 0.3989422804014327 * tl.exp(-0.5 * x * x)
        return cdf + x * pdf
    elif ACT == 2:
        s, one_minus_s, dv = _tanh_parts(x)
        return tl.fma(x * s, one_minus_s * dv, s)
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
        s, one_minus_s, dv = _tanh_parts(x)
        return x * s, tl.fma(x * s, one_minus_s * dv, s)


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
