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
    """d gelu(x) / dx, formed without cancellation (a reference: the "torch" backend runs ATen's one-pass
    gelu_backward, eager's own derivative, since 2026-12-05): tanh GELU's
    0.5 (1 + tanh u) is sigmoid(2u) and 1 - tanh(u)^2 is 4 s (1 - s) with 1 - s = sigmoid(-2u), where
    1 + tanh u cancelled for x below about -3 (fp32 errors 5x eager's at x = -3.6); exact GELU's Phi is
    0.5 erfc(-x / sqrt 2), where 1 + erf cancels in the negative tail."""
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        two_u = 2 * k * (x + 0.044715 * x**3)
        s = torch.sigmoid(two_u)
        return s + 2 * k * x * s * torch.sigmoid(-two_u) * (1 + 3 * 0.044715 * x * x)
    cdf = 0.5 * torch.special.erfc(-x / math.sqrt(2.0))
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
