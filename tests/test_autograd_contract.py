"""In-place ops on the outputs of a training step: ``y += residual`` / ``y.mul_(s)`` work as after
``F.linear`` and give the right gradients, on every route that records a graph.

A result of x's leading shape made as a view of a 2-D buffer inside an autograd node is marked by
autograd as "a view created inside a custom Function", and an in-place op on it raises. Until the
outputs were made tensors of their own (``_opdef._own_output``, ``at::_unsafe_view`` in the C++
nodes), ``geglu_mlp`` refused ``y.add_(1)`` on every training route for 3-D x and on the C++ node
for 2-D x too, and ``linear`` on its Triton/CUDA routes for 3-D x.
"""

from __future__ import annotations

import pytest
import torch
from _numerics import randn
from test_geglu import BACKENDS, _skip_unless

LEADS = [(5,), (2, 3)]


def _check_inplace(fn, leaves, ref_fn):
    """``y = fn(*leaves)``, then ``y.mul_(2).add_(r)`` in place and a backward: the value and every
    gradient against the float64 reference of ``2 * fn + r``."""
    y = fn(*leaves)
    r = torch.randn_like(y)
    y.mul_(2.0).add_(r)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = 2.0 * ref_fn(*ref_leaves) + r.double()
    ref.backward(dy.double())
    torch.testing.assert_close(y.detach().double(), ref.detach(), rtol=1e-4, atol=1e-4)
    for t, rt in zip(leaves, ref_leaves):
        torch.testing.assert_close(t.grad.double(), rt.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("route", ["auto", "recompute", *BACKENDS])
@pytest.mark.parametrize("lead", LEADS, ids=str)
def test_geglu_mlp_output_takes_inplace_ops(kernel, device, route, lead):
    backend = None if route in ("auto", "recompute") else route
    if backend is not None:
        _skip_unless(kernel, device, backend, torch.float32)
    h, i = 16, 24
    leaves = [randn(*lead, h, device=device, requires_grad=True),
              *(randn(*s, device=device, scale=0.3, requires_grad=True) for s in ((i, h), (i, h), (h, i), (i,)))]

    def fn(x, wg, wu, wd, bg):
        return kernel.geglu_mlp(x, wg, wu, wd, bg, approximate="tanh", recompute=route == "recompute",
                                backend=backend)

    _check_inplace(fn, leaves, lambda x, wg, wu, wd, bg: kernel.reference.geglu_mlp_ref(x, wg, wu, wd, bg))


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("lead", LEADS, ids=str)
def test_linear_output_takes_inplace_ops(kernel, device, backend, activation, lead):
    if backend is not None:
        _skip_unless(kernel, device, backend, torch.float32)
    leaves = [randn(*lead, 16, device=device, requires_grad=True),
              randn(24, 16, device=device, scale=0.3, requires_grad=True),
              randn(24, device=device, requires_grad=True)]
    _check_inplace(lambda x, w, b: kernel.linear(x, w, b, activation=activation, backend=backend), leaves,
                   lambda x, w, b: kernel.reference.linear_ref(x, w, b, activation))


@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_geglu_forms_output_takes_inplace_ops(kernel, device, backend, strided):
    if backend is not None:
        _skip_unless(kernel, device, backend, torch.float32)
    packed = randn(2, 3, 48, device=device)
    if strided:  # a packed x with padded rows: the Python node's route
        packed = torch.cat([packed, randn(2, 3, 8, device=device)], -1)[..., :48]
    packed.requires_grad_()
    _check_inplace(lambda x: kernel.geglu_packed(x, approximate="tanh", backend=backend), [packed],
                   lambda x: kernel.reference.geglu_packed_ref(x, "tanh"))
    gate, up = (randn(2, 3, 24, device=device) for _ in range(2))
    if strided:
        gate = gate.transpose(0, 1)
        up = up.transpose(0, 1)
    gate.requires_grad_()
    up.requires_grad_()
    _check_inplace(lambda g, u: kernel.geglu(g, u, approximate="none", backend=backend), [gate, up],
                   lambda g, u: kernel.reference.geglu_ref(g, u, "none"))


@pytest.mark.parametrize("backend", [None, *BACKENDS])
def test_broadcast_gradients(kernel, device, backend):
    """The gradient autograd hands a backward may be a broadcast view: ``(y * v).sum()`` gives
    ``v.expand_as(y)`` (row stride 0). Every backward takes it, on every route: the Python nodes pass
    rows to kernels that need a row stride of at least the row's width."""
    if backend is not None:
        _skip_unless(kernel, device, backend, torch.float32)
    h, i = 16, 24
    cases = {
        "geglu (strided: the Python node)": (
            [randn(24, 5, device=device).t(), randn(24, 5, device=device).t()],
            lambda g, u: kernel.geglu(g, u, approximate="tanh", backend=backend),
            lambda g, u: kernel.reference.geglu_ref(g, u, "tanh")),
        "linear": (
            [randn(5, h, device=device), randn(i, h, device=device, scale=0.3), randn(i, device=device)],
            lambda x, w, b: kernel.linear(x, w, b, activation="gelu_tanh", backend=backend),
            lambda x, w, b: kernel.reference.linear_ref(x, w, b, "gelu_tanh")),
        "geglu_mlp recompute": (
            [randn(5, h, device=device), *(randn(*s, device=device, scale=0.3) for s in ((i, h), (i, h), (h, i)))],
            lambda *a: kernel.geglu_mlp(*a, recompute=True, backend=backend),
            lambda *a: kernel.reference.geglu_mlp_ref(*a)),
    }
    for name, (leaves, fn, ref_fn) in cases.items():
        leaves = [t.detach().requires_grad_() for t in leaves]
        y = fn(*leaves)
        v = torch.randn(y.shape[-1], device=device, dtype=y.dtype)
        grads = torch.autograd.grad((y * v).sum(), leaves)
        ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
        want = torch.autograd.grad((ref_fn(*ref_leaves) * v.double()).sum(), ref_leaves)
        for got, ref in zip(grads, want):
            torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4, msg=name)
