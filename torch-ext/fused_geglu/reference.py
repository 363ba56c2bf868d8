"""Reference twins of every public op, in plain PyTorch at a chosen precision.

Shared by the tests, the benchmarks and the ``"torch"`` backend. Defaults compute in float64 and
return that precision, for error measurement; pass ``dtype=`` to compute in another.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return F.gelu(x, approximate=approximate)


def gelu_grad(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """d gelu(x) / dx."""
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        inner = k * (x + 0.044715 * x**3)
        t = torch.tanh(inner)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return cdf + x * pdf


def geglu_ref(gate, up, approximate="none", dtype=torch.float64):
    return gelu(gate.to(dtype), approximate) * up.to(dtype)


def geglu_packed_ref(x, approximate="none", dtype=torch.float64):
    d = x.shape[-1] // 2
    return geglu_ref(x[..., :d], x[..., d:], approximate, dtype)


def linear_ref(x, weight, bias=None, activation=None, dtype=torch.float64):
    y = x.to(dtype) @ weight.to(dtype).t()
    if bias is not None:
        y = y + bias.to(dtype)
    if activation == "gelu":
        y = gelu(y, "none")
    elif activation == "gelu_tanh":
        y = gelu(y, "tanh")
    return y


def geglu_mlp_ref(x, w_gate, w_up, w_down, b_gate=None, b_up=None, b_down=None, approximate="tanh",
                  dtype=torch.float64):
    gate = linear_ref(x, w_gate, b_gate, dtype=dtype)
    up = linear_ref(x, w_up, b_up, dtype=dtype)
    return linear_ref(gelu(gate, approximate) * up, w_down, b_down, dtype=dtype)
