"""The lean eager paths of the public functions: the GeGLU forms' one-call compiled entries for calls
that record no graph (``kernel_src/autograd_nodes/geglu_infer.cpp``: ``geglu_infer``,
``geglu_packed_infer``, ``geglu_packed_into``), ``linear`` straight on ATen where ATen is the
implementation, the remembered backend picks and the environment reads. Each runs the kernel the
Python op path would, so the two must agree bit for bit, and both must be right against float64; what
the entries do not cover (strided operands, a recorded graph) keeps the other paths."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from _numerics import assert_close, randn
from test_geglu import DTYPES


def _mod(kernel, name: str):
    return importlib.import_module(f"{kernel.__name__}.{name}")


def _skip_without_entries(kernel, device):
    if not _mod(kernel, "_dispatch").compiled_has("geglu_infer", device):
        pytest.skip(f"this variant has no compiled GeGLU entries for {device} tensors")


def _refuse_python_ops(monkeypatch, geglu_mod):
    """Make the Python op path raise, so a call that returns ran through a compiled entry."""
    def refuse(*args):
        raise AssertionError("the Python op path ran where the compiled entry should have")

    for name in ("geglu_fwd_op", "geglu_packed_fwd_op", "gelu_and_mul_out_op"):
        monkeypatch.setattr(geglu_mod, name, refuse)


def _gelu_mul(gate, up, approximate):
    return F.gelu(gate, approximate=approximate) * up


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(3, 15, 392), (37, 67), (1, 1)], ids=str)
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "no_leaf"])
def test_no_graph_calls_run_one_compiled_entry(kernel, device, monkeypatch, dtype, approximate, shape, mode):
    """geglu, geglu_packed and gelu_and_mul / gelu_tanh_and_mul with nothing to record (under no_grad,
    under inference_mode, or with no input that requires grad): one compiled call each, the bits of
    the Python op path (the same geglu_fwd kernel), right against float64."""
    _skip_without_entries(kernel, device)
    monkeypatch.delenv("FUSED_GEGLU_BACKEND", raising=False)
    geglu_mod = _mod(kernel, "geglu")
    gate, up = (randn(*shape, dtype=dtype, device=device, scale=2.0) for _ in range(2))
    packed = torch.cat([gate, up], dim=-1)
    d = shape[-1]
    python_path = (geglu_mod.geglu_fwd_op(gate, up, approximate, "auto"),
                   geglu_mod.geglu_packed_fwd_op(packed, approximate, "auto"))
    leaf = mode == "no_grad"  # under no_grad the inputs may require grad: still no graph
    ctx = torch.inference_mode() if mode == "inference_mode" else torch.no_grad() if mode == "no_grad" \
        else torch.enable_grad()
    _refuse_python_ops(monkeypatch, geglu_mod)
    with ctx:
        g, u, p = (t.clone().requires_grad_(leaf) for t in (gate, up, packed))
        y = kernel.geglu(g, u, approximate=approximate)
        assert kernel.last_backend("geglu") == device
        yp = kernel.geglu_packed(p, approximate=approximate)
        out = torch.full((*shape[:-1], d), float("nan"), dtype=dtype, device=device)
        fn = kernel.gelu_and_mul if approximate == "none" else kernel.gelu_tanh_and_mul
        ret = fn(out, p)
        assert kernel.last_backend("gelu_and_mul") == device
    assert ret is out and y.grad_fn is None and yp.grad_fn is None
    assert torch.equal(y, python_path[0]), "geglu: the compiled entry and the Python op differ"
    assert torch.equal(yp, python_path[1]), "geglu_packed: the compiled entry and the Python op differ"
    assert torch.equal(out, python_path[1]), "gelu_and_mul: the compiled entry and the Python op differ"
    ref = _gelu_mul(gate.double(), up.double(), approximate)
    assert_close(y, ref, _gelu_mul(gate, up, approximate), f"geglu entry {approximate}")


def test_entries_keep_the_other_paths_where_they_do_not_apply(kernel, device):
    """Strided operands (a packed tensor's halves as separate gate/up, a non-contiguous packed x or
    out), an empty tensor, a backend that is not compiled: the Python op paths, still right."""
    _skip_without_entries(kernel, device)
    geglu_mod = _mod(kernel, "geglu")
    x = randn(5, 3, 2 * 40, device=device)
    gate, up = x[..., :40], x[..., 40:]
    ref = _gelu_mul(gate.double(), up.double(), "none")
    with torch.no_grad():
        assert_close(kernel.geglu(gate, up), ref, _gelu_mul(gate, up, "none"), "strided geglu")
        wide = randn(5, 3, 4 * 40, device=device)[..., ::2]  # a non-contiguous packed x
        out = torch.empty(5, 3, 40, device=device)
        kernel.gelu_and_mul(out, wide)
        assert torch.equal(out, geglu_mod.geglu_packed_fwd_op(wide.contiguous(), "none", "auto"))
        out_t = torch.empty(5, 40, 3, device=device).transpose(1, 2)  # out must be contiguous
        with pytest.raises(ValueError, match="out must be contiguous"):
            kernel.gelu_and_mul(out_t, x)
        assert kernel.geglu(gate[:0], up[:0]).shape == (0, 3, 40)
        assert kernel.geglu_packed(x[:0].contiguous()).shape == (0, 3, 40)
        y = kernel.geglu(gate.contiguous(), up.contiguous(), backend="torch")
        assert kernel.last_backend("geglu") == "torch"
        assert_close(y, ref, _gelu_mul(gate, up, "none"), "torch backend")


def test_entry_refuses_what_the_wrapper_checks(kernel, device):
    """The entries check their own operands (a call that reaches one with the wrong layout gets a
    message, not a wrong result); the public functions' named errors are unchanged."""
    _skip_without_entries(kernel, device)
    ops = _mod(kernel, "_ops").ops
    a = randn(4, 6, device=device)
    with pytest.raises(RuntimeError, match="geglu_infer: gate and up must be contiguous"):
        ops.geglu_infer(a.t(), a.t(), 0)
    with pytest.raises(RuntimeError, match="geglu_packed_into"):
        ops.geglu_packed_into(torch.empty(4, 2, device=device), a, 0)
    with pytest.raises(ValueError, match="gate and up must have the same shape"):
        kernel.geglu(a, a[:2])
    with pytest.raises(TypeError, match="up has dtype"):
        kernel.geglu(a, a.half())
    with pytest.raises(ValueError, match="approximate must be"):
        kernel.geglu(a, a, approximate="fast")
    with pytest.raises(ValueError, match="even last dimension"):
        kernel.geglu_packed(a[:, :5])
    with pytest.raises(ValueError, match=r"out must have shape \(4, 3\)"):
        kernel.gelu_and_mul(torch.empty(4, 4, device=device), a)


def test_backend_environment_is_read_on_every_call(kernel, device, monkeypatch):
    """$FUSED_GEGLU_BACKEND set or cleared at run time takes effect on the next call, through the
    fast environment read, and a bad value is refused with the accepted ones."""
    dispatch = _mod(kernel, "_dispatch")
    gate, up = randn(3, 8, device=device), randn(3, 8, device=device)
    monkeypatch.setenv("FUSED_GEGLU_BACKEND", "torch")
    assert dispatch.env("FUSED_GEGLU_BACKEND") == "torch" and dispatch.requested(None) == "torch"
    kernel.geglu(gate, up)
    assert kernel.last_backend("geglu") == "torch"
    monkeypatch.setenv("FUSED_GEGLU_BACKEND", "fastest")
    with pytest.raises(ValueError, match="backend must be one of"):
        kernel.geglu(gate, up)
    monkeypatch.delenv("FUSED_GEGLU_BACKEND")
    assert dispatch.env("FUSED_GEGLU_BACKEND") is None and dispatch.requested(None) == "auto"
    kernel.geglu(gate, up)
    assert kernel.last_backend("geglu") != "torch"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "gelu"])
@pytest.mark.parametrize("layout", ["2d", "3d", "3d_strided", "2d_transposed"])
def test_linear_on_aten_takes_the_short_path(kernel, device, monkeypatch, dtype, activation, layout):
    """linear where ATen is the implementation (backend "torch"): no grad, a contiguous x straight
    into F.linear (the addmm ATen reaches itself) with the GELU in place; a strided x as rows first
    (one copy, then addmm with the bias in its epilogue, not ATen's matmul + separate add; on the
    H200 a transposed fp32 x given to cuBLAS as is took another GEMM, with other bits). The bits of
    the op path (``linear_fwd_op``), right against float64, with and without a graph."""
    monkeypatch.delenv("FUSED_GEGLU_CUBLASLT", raising=False)
    linear_mod = _mod(kernel, "linear")
    k, n = 40, 24
    base = randn(6, 5, 2 * k, dtype=dtype, device=device)
    x = {"2d": base[0, :, :k].contiguous(), "3d": base[..., :k].contiguous(), "3d_strided": base[..., ::2],
         "2d_transposed": randn(k, 7, dtype=dtype, device=device).t()}[layout]
    w = randn(n, k, dtype=dtype, device=device, scale=k**-0.5)
    b = randn(n, dtype=dtype, device=device, scale=0.5)
    act = "none" if activation is None else activation
    op_path = linear_mod.linear_fwd_op(x, w, b, act, False, "torch")[0]
    with torch.no_grad():
        y = kernel.linear(x, w, b, activation=activation, backend="torch")
    assert kernel.last_backend("linear") == "torch"
    assert y.shape == (*x.shape[:-1], n)
    assert torch.equal(y, op_path), "the short path and the op path differ"
    approx = {"gelu_tanh": "tanh", "gelu": "none"}.get(activation)

    def ref(*ts):
        out = F.linear(*ts)
        return out if approx is None else F.gelu(out, approximate=approx)

    assert_close(y, ref(x.double(), w.double(), b.double()), ref(x, w, b), f"linear {activation} {layout}")
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    yg = kernel.linear(*leaves, activation=activation, backend="torch")
    assert yg.grad_fn.name().endswith("Backward0"), yg.grad_fn.name()
    assert torch.equal(yg.detach(), y)
    grads = torch.autograd.grad(yg, leaves, torch.ones_like(yg))
    l64 = [t.detach().double().requires_grad_() for t in (x, w, b)]
    r64 = torch.autograd.grad(ref(*l64), l64, torch.ones(yg.shape, dtype=torch.float64, device=device))
    le = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    re = torch.autograd.grad(ref(*le), le, torch.ones_like(yg))
    for name, g, r, e in zip(("dx", "dW", "db"), grads, r64, re):
        assert_close(g, r, e, f"linear {activation} {layout} {name}")
    monkeypatch.setattr(_mod(kernel, "_dispatch"), "CPP_AUTOGRAD", False)  # the Python node, for measuring
    yp = kernel.linear(*leaves, activation=activation, backend="torch")
    assert type(yp.grad_fn).__name__ == "_FunctionBackward", yp.grad_fn.name()
    assert torch.equal(yp.detach(), y)
    # Its backward is the op path's own GEMMs and fp32 bias sum, not ATen's: right, not the same bits.
    for name, g, r, e in zip(("dx", "dW", "db"), torch.autograd.grad(yp, leaves, torch.ones_like(yp)), r64, re):
        assert_close(g, r, e, f"linear {activation} {layout} {name}, Python node")
