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


def _python_node_cases(kernel, device):
    """(name, leaves, fn) on routes that record this module's Python autograd nodes, not the C++ ones."""
    h, i = 16, 24
    cases = [
        ("geglu strided", [randn(24, 5, device=device).t(), randn(24, 5, device=device).t()],
         lambda g, u: kernel.geglu(g, u)),
        ("geglu_packed strided", [randn(5, 64, device=device)[:, :48]], lambda x: kernel.geglu_packed(x)),
        ("linear triton + gelu", [randn(5, h, device=device), randn(i, h, device=device)],
         lambda x, w: kernel.linear(x, w, activation="gelu", backend="triton")),
        ("geglu_mlp recompute", [randn(5, h, device=device), *(randn(*s, device=device, scale=0.3)
                                                               for s in ((i, h), (i, h), (h, i)))],
         lambda *a: kernel.geglu_mlp(*a, recompute=True)),
    ]
    # Triton needs a GPU, or the interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1 there).
    return [c for c in cases if "triton" not in c[0] or "triton" in kernel.available_backends(device)]


def test_double_backward_is_refused_by_name(kernel, device):
    """create_graph=True through a Python node: refused with the op's name. Its backward kernels record
    no graph, so second derivatives were silently wrong (detached, or part of the graph)."""
    for name, leaves, fn in _python_node_cases(kernel, device):
        leaves = [t.detach().requires_grad_() for t in leaves]
        y = fn(*leaves)
        op = name.split()[0]
        with pytest.raises(RuntimeError, match=f"{op}: create_graph=True \\(double backward\\) is not supported"):
            torch.autograd.grad(y.square().sum(), leaves, create_graph=True)


@pytest.mark.parametrize("transform", ["grad", "vjp", "jvp", "jacrev", "vmap", "forward_ad"])
def test_torch_func_transforms_compute_the_math(kernel, device, transform):
    """Under torch.func transforms and forward-mode AD every public op gives eager's values (ATen's ops
    there: the kernels' autograd nodes do not compose with functorch), where the C++ nodes raised
    "cannot use C++ torch::autograd::Function with functorch transforms" or, for jvp, a storage error."""
    import torch.autograd.forward_ad as fwad
    from torch.func import grad, jacrev, jvp, vjp, vmap

    h, i = 8, 12
    x, wg, wu, wd, bg = (randn(3, h, device=device), randn(i, h, device=device, scale=0.3),
                         randn(i, h, device=device, scale=0.3), randn(h, i, device=device, scale=0.3),
                         randn(i, device=device))
    ops = {
        "geglu_mlp": (lambda x: kernel.geglu_mlp(x, wg, wu, wd, bg),
                      lambda x: kernel.reference.geglu_mlp_ref(x, wg, wu, wd, bg, dtype=x.dtype)),
        "linear": (lambda x: kernel.linear(x, wg, bg, activation="gelu_tanh"),
                   lambda x: kernel.reference.linear_ref(x, wg, bg, "gelu_tanh", dtype=x.dtype)),
        "geglu": (lambda x: kernel.geglu(x, x * 0.5 + 1.0),
                  lambda x: kernel.reference.geglu_ref(x, x * 0.5 + 1.0, dtype=x.dtype)),
        "geglu_packed": (lambda x: kernel.geglu_packed(x),
                         lambda x: kernel.reference.geglu_packed_ref(x, dtype=x.dtype)),
        "gelu_and_mul": (lambda x: kernel.gelu_and_mul(x.new_empty(*x.shape[:-1], x.shape[-1] // 2), x),
                         lambda x: kernel.reference.geglu_packed_ref(x, dtype=x.dtype)),
    }
    for name, (fn, ref) in ops.items():
        t = tangent = randn(*x.shape, device=device)
        if transform == "grad":
            got, want = grad(lambda a: fn(a).square().sum())(x), grad(lambda a: ref(a).square().sum())(x)
        elif transform == "vjp":
            got, want = vjp(fn, x)[1](fn(x))[0], vjp(ref, x)[1](ref(x))[0]
        elif transform == "jvp":
            got, want = jvp(fn, (x,), (tangent,))[1], jvp(ref, (x,), (tangent,))[1]
        elif transform == "jacrev":
            got, want = jacrev(fn)(x), jacrev(ref)(x)
        elif transform == "vmap":
            batch = x[:, None].expand(3, 2, h).contiguous()
            got, want = vmap(fn)(batch), vmap(ref)(batch)
        else:
            with fwad.dual_level():
                got = fwad.unpack_dual(fn(fwad.make_dual(x, t))).tangent
                want = fwad.unpack_dual(ref(fwad.make_dual(x, t))).tangent
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{name} under {transform}")


def test_python_autograd_nodes_carry_the_op_name(kernel, monkeypatch):
    """The Python autograd node of each op (the torch/triton/cuda routes without a C++ node) is named after
    the op, so a graph (a profiler trace, torchviz, a test that counts fused nodes) can tell them apart:
    until 2026-12-05 every one was "_FunctionBackward" (the class was renamed after autograd had named
    its node class)."""
    import importlib

    monkeypatch.setattr(importlib.import_module(f"{kernel.__name__}._dispatch"), "CPP_AUTOGRAD", False)
    x = randn(3, 8, requires_grad=True)
    w = [randn(16, 8, requires_grad=True), randn(16, 8, requires_grad=True), randn(8, 16, requires_grad=True)]
    calls = {
        "FusedGegluBackward": lambda: kernel.geglu(w[0], w[1], backend="torch"),
        "FusedGegluPackedBackward": lambda: kernel.geglu_packed(torch.cat(w[:2], 1), backend="torch"),
        "FusedLinearBackward": lambda: kernel.linear(x, w[0], activation="gelu_tanh", backend="torch"),
        "FusedGegluMlpBackward": lambda: kernel.geglu_mlp(x, *w, backend="torch"),
    }
    for want, call in calls.items():
        y = call()
        assert y.grad_fn.name() == want, (want, y.grad_fn.name())
        y.sum().backward()
