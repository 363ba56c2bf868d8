"""Argument checks for the public API: each failure names the argument and what was expected."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
APPROXIMATIONS = ("none", "tanh")
ACTIVATIONS = ("none", "gelu", "gelu_tanh")


def tensor(name: str, t, ndim: int | None = None, min_ndim: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) bytes of the memory ``t``'s elements occupy (strides are never negative)."""
    if t.numel() == 0:
        return 0, 0
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    lo = t.data_ptr()
    return lo, lo + (extent + 1) * t.element_size()


def memory_overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` may share an element: their byte spans intersect (exact for dense
    tensors; strided ones interleaved without sharing count as overlapping, which only costs a
    refusal of an unusual ``out``)."""
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    return a0 < b1 and b0 < a1


def same_dtype_device(ref_name: str, ref: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.dtype != ref.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; they must match")
        if t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; they must be on one device")


def approximate(value) -> str:
    if value not in APPROXIMATIONS:
        raise ValueError(f"approximate must be 'none' (exact erf GELU) or 'tanh', got {value!r}")
    return value


def activation(value) -> str:
    value = "none" if value is None else value
    if value not in ACTIVATIONS:
        raise ValueError(f"activation must be None, 'gelu' or 'gelu_tanh', got {value!r}")
    return value


def shape(name: str, t: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)} ({what}), got {tuple(t.shape)}")


def mlp_args_ok(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate) -> bool:
    """One pass, no messages: True when every check of ``geglu_mlp``'s arguments passes. The
    public function runs the named checks (and their errors) only when this says False, which
    keeps a decode-size call's host time down."""
    T = torch.Tensor
    if not (isinstance(x, T) and isinstance(w_gate, T) and isinstance(w_up, T) and isinstance(w_down, T)):
        return False
    dt, dev = x.dtype, x.device
    if dt not in FLOAT_DTYPES or x.dim() < 1 or w_gate.dim() != 2 or approximate not in APPROXIMATIONS:
        return False
    i, h = w_gate.shape
    if x.shape[-1] != h or w_up.shape != (i, h) or w_down.shape != (h, i):
        return False
    for w in (w_gate, w_up, w_down):
        if w.dtype != dt or w.device != dev:
            return False
    for b, n in ((b_gate, i), (b_up, i), (b_down, h)):
        if b is not None and not (isinstance(b, T) and b.dtype == dt and b.device == dev and b.shape == (n,)):
            return False
    return True


def linear_args_ok(x, weight, bias, activation) -> bool:
    """As :func:`mlp_args_ok`, for ``linear`` (``activation`` already mapped None -> "none")."""
    T = torch.Tensor
    if not (isinstance(x, T) and isinstance(weight, T)) or activation not in ACTIVATIONS:
        return False
    dt, dev = x.dtype, x.device
    if dt not in FLOAT_DTYPES or x.dim() < 1 or weight.dim() != 2 or weight.dtype != dt or weight.device != dev:
        return False
    n, k = weight.shape
    if x.shape[-1] != k:
        return False
    if bias is None:
        return True
    if not (isinstance(bias, T) and bias.dtype == dt and bias.device == dev):
        return False
    return bias.shape == (n,) or (x.dim() > 1 and bias.shape == (*x.shape[:-1], n))


def linear_bias(name: str, bias: torch.Tensor, x: torch.Tensor, n: int) -> None:
    """``linear``'s bias: a vector [N], or an addend of the output's shape [..., N] (x's leading dims)."""
    tensor(name, bias)
    out_shape = (*x.shape[:-1], n)
    if tuple(bias.shape) != (n,) and not (x.dim() > 1 and tuple(bias.shape) == out_shape):
        raise ValueError(f"{name} must have shape ({n},) (weight.shape[0]) or the output's shape {out_shape} "
                         f"(an addend), got {tuple(bias.shape)}")


def geglu_args_ok(gate, up, approximate) -> bool:
    """As :func:`mlp_args_ok`, for ``geglu(gate, up)``."""
    T = torch.Tensor
    return (isinstance(gate, T) and isinstance(up, T) and gate.dtype in FLOAT_DTYPES and gate.dim() >= 1
            and up.dtype == gate.dtype and up.device == gate.device and up.shape == gate.shape
            and approximate in APPROXIMATIONS)


def packed_args_ok(x, approximate) -> bool:
    """As :func:`mlp_args_ok`, for the packed form ``x = [..., 2d]``."""
    return (isinstance(x, torch.Tensor) and x.dtype in FLOAT_DTYPES and x.dim() >= 1 and not x.shape[-1] % 2
            and approximate in APPROXIMATIONS)


def packed_out_ok(out, x) -> bool:
    """The ``out`` of ``gelu_and_mul(out, x)`` (``x`` already passed :func:`packed_args_ok`)."""
    return (isinstance(out, torch.Tensor) and out.dtype == x.dtype and out.device == x.device
            and out.dim() == x.dim() and out.shape[-1] * 2 == x.shape[-1] and out.shape[:-1] == x.shape[:-1]
            and out.is_contiguous())
