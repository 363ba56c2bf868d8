"""``geglu_mlp``'s C++ training node (``kernel_src/mlp_autograd``): an eager training step whose
autograd node runs without Python. It issues the kernels of the Python node's launch in the same
order, so the two must agree bit for bit; both must be right against float64; the places it does not
cover (recompute, a non-contiguous x, the flag off) keep the Python node; and what it cannot do
(a second backward through the graph, create_graph=True) is refused with a message."""

from __future__ import annotations

import importlib

import pytest
import torch
from _numerics import randn
from test_geglu import DTYPES
from test_mlp import _assert_output_and_grads, _inference_operands


def _modules(kernel):
    return importlib.import_module(kernel.__name__ + ".mlp"), importlib.import_module(kernel.__name__ + "._dispatch")


def _skip_without_node(kernel, device):
    _, dispatch = _modules(kernel)
    if not dispatch.compiled_has_autograd("geglu_mlp_train", device):
        pytest.skip(f"this variant has no compiled training node for {device} tensors")


def _is_cpp_node(y) -> bool:
    return "GegluMlpTrain" in y.grad_fn.name()




@pytest.mark.parametrize("backend", ["auto", "forced"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("biases", ["all", "up_only", "none"])
@pytest.mark.parametrize("shape", [((3, 15), 264, 392), ((37,), 45, 67)], ids=str)
def test_training_node_matches_the_python_node(kernel, device, monkeypatch, backend, dtype, approximate, biases,
                                               shape):
    """Output and every gradient: the C++ node against the Python node (same bits), and against
    float64. On the H200 the forced "cuda" backend at (264, 392) runs the CUTLASS gate+up GEMM, auto
    runs cuBLAS + pointwise (no sm_90 rule below H = 1152); fp32 and the odd widths take cuBLAS."""
    _skip_without_node(kernel, device)
    monkeypatch.delenv("FUSED_GEGLU_SM90_MLP", raising=False)
    monkeypatch.delenv("FUSED_GEGLU_BACKEND", raising=False)
    mlp, _ = _modules(kernel)
    backend = None if backend == "auto" else device  # the compiled backend of the device's variant
    lead, h, i = shape
    args = _inference_operands(dtype, device, lead, h, i, biases)
    present = [a is not None for a in args]
    grad = randn(*lead, h, dtype=dtype, device=device)
    results, ran = {}, {}
    for cpp in (True, False):
        monkeypatch.setattr(mlp, "CPP_AUTOGRAD", cpp)
        leaves = [None if a is None else a.clone().requires_grad_() for a in args]
        y = kernel.geglu_mlp(*leaves, approximate=approximate, backend=backend)
        assert _is_cpp_node(y) == cpp, y.grad_fn.name()
        ran[cpp] = kernel.last_backend("geglu_mlp")
        grads = torch.autograd.grad(y, [a for a, p in zip(leaves, present) if p], grad)
        ran[cpp] = (ran[cpp], kernel.last_backend("geglu_mlp_backward"))
        results[cpp] = (y.detach(), *grads)
        if cpp:
            _assert_output_and_grads(kernel, kernel.geglu_mlp(*leaves, approximate=approximate, backend=backend),
                                     leaves, approximate, f"C++ training node, {ran[cpp][0]}, biases {biases}")
    assert ran[True] == ran[False], "both nodes name the same kernels"
    if device == "cuda" and dtype != torch.float32 and h % 8 == 0 and backend == "cuda" \
            and torch.cuda.get_device_capability() == (9, 0):
        assert ran[True][0] == "cuda:sm90"
    for name, a, b in zip(["y", "dx", "dW_gate", "dW_up", "dW_down", "db_gate", "db_up", "db_down"],
                          results[True], results[False]):
        assert torch.equal(a, b), f"{name}: the C++ and the Python training node differ"


def test_training_node_only_where_it_runs_the_same_step(kernel, device, monkeypatch):
    """recompute=True, a non-contiguous x and FUSED_GEGLU_CPP_AUTOGRAD=0 keep the Python node (still
    right against float64); inference needs no node at all."""
    _skip_without_node(kernel, device)
    mlp, _ = _modules(kernel)
    h, i = 24, 40
    wg, wu, wd, bg, bu, bd = _inference_operands(torch.float32, device, (1,), h, i, "all")[1:]
    params = [p.requires_grad_() for p in (wg, wu, wd, bg, bu, bd)]
    x = randn(6, h, device=device, requires_grad=True)
    assert _is_cpp_node(kernel.geglu_mlp(x, *params))
    y = kernel.geglu_mlp(x, *params, recompute=True)
    assert not _is_cpp_node(y)
    _assert_output_and_grads(kernel, y, [x, *params], "tanh", "recompute")
    wide = randn(6, 2 * h, device=device, requires_grad=True)
    strided = wide[:, ::2]
    y = kernel.geglu_mlp(strided, *params)
    assert not _is_cpp_node(y), "x with a strided last dimension"
    _assert_output_and_grads(kernel, y, [strided, *params], "tanh", "non-contiguous x")
    monkeypatch.setattr(mlp, "CPP_AUTOGRAD", False)
    assert not _is_cpp_node(kernel.geglu_mlp(x, *params))
    monkeypatch.setattr(mlp, "CPP_AUTOGRAD", True)
    with torch.no_grad():
        assert kernel.geglu_mlp(x, *params).grad_fn is None


def test_training_node_refuses_what_it_cannot_compute(kernel, device):
    """The backward overwrites the saved pre-activations with their gradients and records no graph:
    a second backward through the same graph and create_graph=True are errors, not wrong numbers."""
    _skip_without_node(kernel, device)
    h, i = 16, 24
    params = [p.requires_grad_() for p in _inference_operands(torch.float32, device, (1,), h, i, "none")[1:4]]
    x = randn(2, 5, h, device=device, requires_grad=True)
    y = kernel.geglu_mlp(x, *params)
    assert _is_cpp_node(y)
    grad = randn(*y.shape, device=device)
    torch.autograd.grad(y, [x, *params], grad, retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward through the same graph is not supported"):
        torch.autograd.grad(y, [x, *params], grad)
    y = kernel.geglu_mlp(x, *params)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(y, [x, *params], grad, create_graph=True)
