"""Kernel layers: accepted by kernels' own layer validation, and exact where they cannot fuse."""

from __future__ import annotations

from types import MethodType

import pytest
import torch
from torch import nn
from _numerics import assert_close, randn


class _HostMLP(nn.Module):
    """A Gemma-style MLP, as the host module kernelize would patch."""

    def __init__(self, h, i, act, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.act_fn = act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("name", ["GeGLUMLP", "T5GeGLUDense", "LinearBias", "GeluAndMul", "GeluTanhAndMul"])
def test_layers_pass_kernels_validation(kernel, name):
    from kernels.layer.layer import _validate_layer

    cls = getattr(kernel.layers, name)
    host = {"GeGLUMLP": _HostMLP, "LinearBias": nn.Linear}.get(name)
    if host is None:
        class host(nn.Module):  # noqa: N801 - same arity as the layer's forward
            def forward(self, x):
                return x
    _validate_layer(check_cls=host, cls=cls, repo="org/fused-geglu")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("bias", [False, True])
def test_geglu_mlp_layer_matches_host(kernel, device, approximate, bias):
    host = _HostMLP(24, 40, nn.GELU(approximate=approximate), bias).to(device)
    x = randn(3, 5, 24, device=device)
    expected = host(x)
    host.forward = MethodType(kernel.layers.GeGLUMLP.forward, host)  # what kernelize does
    got = host(x)
    assert kernel.last_backend("geglu_mlp") is not None
    ref = kernel.reference.geglu_mlp_ref(x, host.gate_proj.weight, host.up_proj.weight, host.down_proj.weight,
                                         host.gate_proj.bias, host.up_proj.bias, host.down_proj.bias, approximate)
    assert_close(got, ref, expected, "GeGLUMLP layer")


class _SpyHost(_HostMLP):
    """Records every call of the host's own forward."""

    calls = 0

    def forward(self, x):
        type(self).calls += 1
        return super().forward(x)


@pytest.mark.parametrize("case", ["silu", "sparsity", "dropout-training", "hooked-down-proj"])
def test_geglu_mlp_layer_defers_to_the_host_where_it_cannot_fuse(kernel, device, case):
    host = _SpyHost(16, 32, nn.SiLU() if case == "silu" else nn.GELU(approximate="tanh")).to(device)
    if case == "sparsity":
        host.activation_sparsity = 0.95  # Gemma3n: the host applies a top-k to gate first
    if case == "dropout-training":
        host.dropout = nn.Dropout(0.5)
        host.train()
    if case == "hooked-down-proj":  # e.g. a tensor-parallel all-reduce after a row-wise down_proj
        host.down_proj.register_forward_hook(lambda mod, args, out: out * 2)
    x = randn(4, 16, device=device)
    expected = _HostMLP.forward(host, x)
    _SpyHost.calls = 0
    got = MethodType(kernel.layers.GeGLUMLP.forward, host)(x)
    assert _SpyHost.calls == 1, "the layer must run the host's own forward here"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
