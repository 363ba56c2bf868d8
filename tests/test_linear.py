"""``linear``: GEMM with bias/GELU epilogue; forward and all gradients, every backend."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from _numerics import assert_close, randn
from test_geglu import BACKENDS, DTYPES, _skip_unless

SHAPES = [((1, 1), 1), ((5, 7), 3), ((2, 9, 13), 11), ((33, 45), 29)]  # (x shape, N)


def _eager(x, w, b, activation):
    y = F.linear(x, w, b)
    if activation == "gelu":
        y = F.gelu(y)
    elif activation == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_linear_forward_backward(kernel, device, backend, dtype, activation, with_bias, shape):
    _skip_unless(kernel, device, backend, dtype)
    if backend == "cuda" and activation == "gelu":
        pytest.skip("cuBLASLt has no exact-GELU epilogue (auto dispatch routes it to Triton)")
    x_shape, n = shape
    k = x_shape[-1]
    x = randn(*x_shape, dtype=dtype, device=device, requires_grad=True)
    w = randn(n, k, dtype=dtype, device=device, scale=k**-0.5, requires_grad=True)
    b = randn(n, dtype=dtype, device=device, requires_grad=True) if with_bias else None
    y = kernel.linear(x, w, b, activation=activation, backend=backend)
    assert kernel.last_backend("linear") == backend
    ref = kernel.reference.linear_ref(x.detach(), w.detach(), None if b is None else b.detach(), activation)
    eager = _eager(x, w, b, activation)
    assert_close(y, ref, eager, "linear")

    params = [t for t in (x, w, b) if t is not None]
    grad = randn(*y.shape, dtype=dtype, device=device)
    ours = torch.autograd.grad(y, params, grad)
    p64 = [t.detach().double().requires_grad_() for t in params]
    ref_y = kernel.reference.linear_ref(p64[0], p64[1], p64[2] if with_bias else None, activation)
    refs = torch.autograd.grad(ref_y, p64, grad.double())
    eagers = torch.autograd.grad(eager, params, grad)
    # Through an activation, errors are measured against the size of the same gradients without it
    # as well (gelu' vanishes near pre = -0.75; _numerics.errors).
    plain = refs if activation is None else torch.autograd.grad(
        kernel.reference.linear_ref(p64[0], p64[1], p64[2] if with_bias else None, None), p64, grad.double())
    for name, o, r, e, s in zip(("dx", "dW", "db"), ours, refs, eagers, plain):
        assert_close(o, r, e, f"linear {name}", scale_ref=s)


@pytest.mark.parametrize("backend", ["triton", None], ids=["triton", "auto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_linear_skinny_split_k(kernel, device, backend, dtype, activation):
    """Decode sizes: few output tiles, so the Triton GEMM splits K and sums the slices in a second
    kernel that runs the epilogue. The K here is split into slices with a ragged last one."""
    _skip_unless(kernel, device, backend or "torch", dtype)
    if backend is None and device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("auto on CPU is the compiled CPU backend; covered by test_linear_forward_backward")
    m, k, n = (3, 70, 19) if device == "cpu" else (5, 2900, 300)  # interpreter: BLOCK_K 16; GPU: 128
    tk_linear = importlib.import_module(kernel.__name__ + ".triton_kernels.linear")
    cfg = tk_linear.get_config("linear_fwd", torch.device(device), dtype, m, n, k)
    tiles = -(-m // cfg.BLOCK_M) * -(-n // cfg.BLOCK_N)
    split, per = tk_linear._k_slices(cfg, tiles, k, torch.device(device))
    assert split > 1 and k % per != 0, (cfg, split, per)  # the split path, ragged last slice
    x = randn(m, k, dtype=dtype, device=device, requires_grad=True)
    w = randn(n, k, dtype=dtype, device=device, scale=k**-0.5, requires_grad=True)
    b = randn(n, dtype=dtype, device=device, requires_grad=True)
    y = kernel.linear(x, w, b, activation=activation, backend=backend)
    eager = _eager(x, w, b, activation)
    assert_close(y, kernel.reference.linear_ref(x.detach(), w.detach(), b.detach(), activation), eager, "linear")
    grad = randn(*y.shape, dtype=dtype, device=device)
    ours = torch.autograd.grad(y, (x, w, b), grad)
    p64 = [t.detach().double().requires_grad_() for t in (x, w, b)]
    refs = torch.autograd.grad(kernel.reference.linear_ref(*p64, activation), p64, grad.double())
    for name, o, r, e in zip(("dx", "dW", "db"), ours, refs, torch.autograd.grad(eager, (x, w, b), grad)):
        assert_close(o, r, e, f"linear {name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_linear_inference(kernel, device, backend, dtype, activation, mode):
    """Eager inference skips the op dispatch and autograd; the ATen path applies GELU in place on
    the GEMM's own output. Same results either way, no graph."""
    _skip_unless(kernel, device, backend, dtype)
    if backend == "cuda" and activation == "gelu":
        with pytest.raises(ValueError, match="no exact-GELU epilogue"):
            kernel.linear(randn(3, 8, dtype=dtype, device=device), randn(5, 8, dtype=dtype, device=device),
                          activation="gelu", backend="cuda")
        return
    x = randn(2, 7, 29, dtype=dtype, device=device)
    w = randn(19, 29, dtype=dtype, device=device, scale=29**-0.5, requires_grad=True)
    b = randn(19, dtype=dtype, device=device, requires_grad=True)
    ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
    if mode == "inference_mode":
        w, b = w.detach(), b.detach()
    with ctx():
        y = kernel.linear(x, w, b, activation=activation, backend=backend)
    assert not y.requires_grad and y.grad_fn is None and y.shape == (2, 7, 19)
    assert kernel.last_backend("linear") == backend
    wd, bd = w.detach(), b.detach()
    assert_close(y, kernel.reference.linear_ref(x, wd, bd, activation), _eager(x, wd, bd, activation), f"linear {mode}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_non_contiguous_x(kernel, device, backend):
    _skip_unless(kernel, device, backend)
    base = randn(8, 6, 40, device=device)
    w = randn(12, 20, device=device, scale=0.2)
    b = randn(12, device=device)
    for name, x in {"x[::2]": base[::2, :, :20], "last-dim stride 2": base[..., ::2]}.items():
        y = kernel.linear(x, w, b, backend=backend)
        assert y.shape == (*x.shape[:-1], 12)
        assert_close(y, kernel.reference.linear_ref(x, w, b), F.linear(x, w, b), name)


def test_linear_bad_input(kernel, device):
    x, w = randn(4, 6, device=device), randn(5, 6, device=device)
    with pytest.raises(ValueError, match="x has 6 input features"):
        kernel.linear(randn(4, 6, device=device), randn(5, 7, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        kernel.linear(x, w, randn(4, device=device))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        kernel.linear(x, randn(5, 6, 1, device=device))
    with pytest.raises(TypeError, match="weight has dtype torch.bfloat16"):
        kernel.linear(x, w.bfloat16())
    with pytest.raises(ValueError, match="activation must be"):
        kernel.linear(x, w, activation="relu")
