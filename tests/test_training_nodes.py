"""The C++ training nodes (``kernel_src/autograd_nodes``): eager training steps of ``geglu_mlp``,
``geglu`` / ``geglu_packed`` / ``gelu_and_mul`` and the cuBLASLt ``linear`` whose autograd nodes run
without Python, and ``linear`` on ATen's own nodes where ATen is the implementation. A C++ node issues
the kernels of the Python node's path in the same order, so the two must agree bit for bit; both must
be right against float64; the places it does not cover (recompute, non-contiguous inputs, the flag
off) keep the Python node; and what it cannot do (a second MLP backward through the graph,
create_graph=True) is refused with a message."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from _numerics import assert_close, randn
from test_geglu import DTYPES
from test_mlp import _assert_output_and_grads, _inference_operands
from test_mlp import _eager as _mlp_eager


def _modules(kernel):
    return importlib.import_module(kernel.__name__ + ".mlp"), importlib.import_module(kernel.__name__ + "._dispatch")


def _skip_without_node(kernel, device):
    _, dispatch = _modules(kernel)
    if not dispatch.compiled_has_autograd("geglu_mlp_train", device):
        pytest.skip(f"this variant has no compiled training node for {device} tensors")


def _is_cpp_node(y, node: str = "GegluMlpTrain") -> bool:
    return node in y.grad_fn.name()


def _both_nodes(kernel, monkeypatch, make_leaves, call, node: str):
    """Output and gradients of ``call(*leaves)`` for a fixed upstream gradient, with the C++ node and
    with the Python node (``_dispatch.CPP_AUTOGRAD`` off), fresh leaves each time."""
    _, dispatch = _modules(kernel)
    results = {}
    for cpp in (True, False):
        monkeypatch.setattr(dispatch, "CPP_AUTOGRAD", cpp)
        leaves = make_leaves()
        y = call(*leaves)
        assert _is_cpp_node(y, node) == cpp, y.grad_fn.name()
        grad = randn(*y.shape, dtype=y.dtype, device=y.device, gen=torch.Generator().manual_seed(7))
        results[cpp] = (y.detach(), *torch.autograd.grad(y, leaves, grad))
    for k, (a, b) in enumerate(zip(results[True], results[False])):
        assert torch.equal(a, b), f"output/gradient {k}: the C++ and the Python node differ"
    return results[True], grad


def _check_against_float64(outs, leaves, grad, ref_fn, eager_fn, what):
    """outs = (y, *grads of leaves) against float64 autograd of ref_fn, eager_fn's error as yardstick."""
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    y64 = ref_fn(*l64)
    refs = (y64.detach(), *torch.autograd.grad(y64, l64, grad.double()))
    le = [t.detach().requires_grad_() for t in leaves]
    ye = eager_fn(*le)
    eagers = (ye.detach(), *torch.autograd.grad(ye, le, grad))
    for k, (o, r, e) in enumerate(zip(outs, refs, eagers)):
        assert_close(o, r, e, f"{what} [{k}]")




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
    _, dispatch = _modules(kernel)
    backend = None if backend == "auto" else device  # the compiled backend of the device's variant
    lead, h, i = shape
    args = _inference_operands(dtype, device, lead, h, i, biases)
    present = [a is not None for a in args]
    grad = randn(*lead, h, dtype=dtype, device=device)
    results, ran = {}, {}
    for cpp in (True, False):
        monkeypatch.setattr(dispatch, "CPP_AUTOGRAD", cpp)
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
    _, dispatch = _modules(kernel)
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
    monkeypatch.setattr(dispatch, "CPP_AUTOGRAD", False)
    assert not _is_cpp_node(kernel.geglu_mlp(x, *params))
    monkeypatch.setattr(dispatch, "CPP_AUTOGRAD", True)
    with torch.no_grad():
        assert kernel.geglu_mlp(x, *params).grad_fn is None


@pytest.mark.gpu
def test_training_node_frees_preactivations_as_the_python_node_does(kernel, device, monkeypatch):
    """Above the one-call element bound the C++ node still runs (it hands the backward the only
    references to gate/up, which frees each after its last reader), and its backward's peak is the
    Python node's, not one M x I buffer more; the same bits. Under saved-tensor hooks the hooks hold
    gate/up, so above the bound the Python node runs, as before."""
    _skip_without_node(kernel, device)
    monkeypatch.setenv("FUSED_GEGLU_SM90_MLP", "no")  # cuBLAS + pointwise: the same kernels either node
    monkeypatch.delenv("FUSED_GEGLU_BACKEND", raising=False)
    mlp, dispatch = _modules(kernel)
    m, h, i = 2048, 256, 4096
    monkeypatch.setattr(mlp, "ONE_CALL_BWD_MAX_ELEMS", m * i - 1)
    args = _inference_operands(torch.bfloat16, device, (m,), h, i, "none")[:4]
    grad = randn(m, h, dtype=torch.bfloat16, device=device)
    results, peaks = {}, {}
    for cpp in (True, False, True):  # the first C++ run warms up cuBLAS and the allocator
        monkeypatch.setattr(dispatch, "CPP_AUTOGRAD", cpp)
        leaves = [a.clone().requires_grad_() for a in args]
        y = kernel.geglu_mlp(*leaves)
        assert _is_cpp_node(y) == cpp, y.grad_fn.name()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grads = torch.autograd.grad(y, leaves, grad)
        torch.cuda.synchronize()
        peaks[cpp] = torch.cuda.max_memory_allocated() - base
        results[cpp] = (y.detach(), *grads)
        del y, grads
    for name, a, b in zip(["y", "dx", "dW_gate", "dW_up", "dW_down"], results[True], results[False]):
        assert torch.equal(a, b), f"{name}: the C++ and the Python training node differ"
    buffer = m * i * 2
    assert peaks[True] <= peaks[False] + buffer // 4, (
        f"C++ node backward peak {peaks[True] / 2**20:.1f} MiB against the Python node's "
        f"{peaks[False] / 2**20:.1f} MiB (one M x I buffer is {buffer / 2**20:.0f} MiB)")
    monkeypatch.setattr(dispatch, "CPP_AUTOGRAD", True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        y = kernel.geglu_mlp(*[a.clone().requires_grad_() for a in args])
    assert not _is_cpp_node(y), "above the bound under saved-tensor hooks: the Python node"


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


def _gelu_mul(gate, up, approximate):
    return F.gelu(gate, approximate=approximate) * up


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(3, 15, 392), (37, 67)], ids=str)
def test_geglu_node_matches_the_python_node(kernel, device, monkeypatch, dtype, approximate, shape):
    """geglu(gate, up) in training: the C++ node (geglu_train) gives the Python node's bits, right
    against float64; a non-contiguous gate keeps the Python node."""
    _, dispatch = _modules(kernel)
    if not dispatch.compiled_has_autograd("geglu_train", device):
        pytest.skip(f"this variant has no compiled GeGLU node for {device} tensors")
    base = [randn(*shape, dtype=dtype, device=device) for _ in range(2)]
    outs, grad = _both_nodes(kernel, monkeypatch, lambda: [t.clone().requires_grad_() for t in base],
                             lambda g, u: kernel.geglu(g, u, approximate=approximate), "GegluTrain")
    assert kernel.last_backend("geglu") == device
    _check_against_float64(outs, base, grad, lambda g, u: _gelu_mul(g, u, approximate),
                           lambda g, u: _gelu_mul(g, u, approximate), f"geglu node {approximate}")
    wide = randn(*shape[:-1], 2 * shape[-1], dtype=dtype, device=device, requires_grad=True)
    assert not _is_cpp_node(kernel.geglu(wide[..., ::2], base[1], approximate=approximate), "GegluTrain")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(3, 15, 2 * 392), (37, 2 * 67)], ids=str)
def test_packed_geglu_node_matches_the_python_node(kernel, device, monkeypatch, dtype, approximate, shape):
    """geglu_packed(x) and gelu_and_mul(out, x) in training: the C++ node (geglu_packed_train) gives
    the Python node's bits, right against float64."""
    _, dispatch = _modules(kernel)
    if not dispatch.compiled_has_autograd("geglu_packed_train", device):
        pytest.skip(f"this variant has no compiled GeGLU node for {device} tensors")
    d = shape[-1] // 2
    x = randn(*shape, dtype=dtype, device=device)

    def packed_ref(t):
        return _gelu_mul(t[..., :d], t[..., d:], approximate)

    outs, grad = _both_nodes(kernel, monkeypatch, lambda: [x.clone().requires_grad_()],
                             lambda t: kernel.geglu_packed(t, approximate=approximate), "GegluPackedTrain")
    assert kernel.last_backend("gelu_and_mul") == device
    _check_against_float64(outs, [x], grad, packed_ref, packed_ref, f"packed geglu node {approximate}")
    fn = kernel.gelu_and_mul if approximate == "none" else kernel.gelu_tanh_and_mul
    leaf = x.clone().requires_grad_()
    out = fn(torch.empty(*shape[:-1], d, dtype=dtype, device=device), leaf)
    assert torch.equal(out.detach(), outs[0])
    assert torch.equal(torch.autograd.grad(out, leaf, grad)[0], outs[1]), "gelu_and_mul's gradient"


def test_nodes_take_upstream_gradients_of_any_layout(kernel, device, monkeypatch):
    """The gradient arriving at a C++ node need not be contiguous: a permuted one (the output was
    transposed downstream) and an expanded one (y.sum(): stride 0) give the Python node's bits for
    geglu, geglu_packed and the MLP, right against float64."""
    _skip_without_node(kernel, device)
    gen = torch.Generator().manual_seed(3)
    lead, h, i = (3, 5), 24, 40
    gate, up = randn(*lead, i, device=device, gen=gen), randn(*lead, i, device=device, gen=gen)
    mlp_args = _inference_operands(torch.float32, device, lead, h, i, "all")

    def packed(x):
        return _gelu_mul(x[..., :i], x[..., i:], "tanh")

    cases = {  # node: (operands, call, float64 reference, eager)
        "GegluTrain": ((gate, up), lambda g, u: kernel.geglu(g, u, approximate="tanh"),
                       lambda g, u: _gelu_mul(g, u, "tanh"), lambda g, u: _gelu_mul(g, u, "tanh")),
        "GegluPackedTrain": ((torch.cat([gate, up], -1),), lambda x: kernel.geglu_packed(x, approximate="tanh"),
                             packed, packed),
        "GegluMlpTrain": (mlp_args, lambda *a: kernel.geglu_mlp(*a, approximate="tanh"),
                          lambda *a: kernel.reference.geglu_mlp_ref(*a, approximate="tanh"),
                          lambda *a: _mlp_eager(*a, "tanh")),
    }
    _, dispatch = _modules(kernel)
    for node, (operands, call, ref, eager) in cases.items():
        n = h if node == "GegluMlpTrain" else i
        for layout, grad in {"permuted": randn(n, *reversed(lead), device=device, gen=gen).permute(2, 1, 0),
                             "expanded": randn(n, device=device, gen=gen).expand(*lead, n)}.items():
            assert not grad.is_contiguous()
            results = {}
            for cpp in (True, False):
                monkeypatch.setattr(dispatch, "CPP_AUTOGRAD", cpp)
                leaves = [t.clone().requires_grad_() for t in operands]
                y = call(*leaves)
                assert _is_cpp_node(y, node) == cpp, y.grad_fn.name()
                results[cpp] = (y.detach(), *torch.autograd.grad(y, leaves, grad))
            for k, (a, b) in enumerate(zip(results[True], results[False])):
                assert torch.equal(a, b), f"{node}, {layout} gradient: output/gradient {k} differs from the Python node"
            _check_against_float64(results[True], list(operands), grad, ref, eager, f"{node}, {layout} gradient")


def test_mlp_inference_call_declines_when_any_operand_needs_a_gradient(kernel, device):
    """The no-graph MLP call (geglu_mlp_infer) serves only steps where nothing needs a gradient: with
    grad mode on and any one leaf requiring one, bias included, a graph is recorded and that leaf's
    gradient is right against float64."""
    _skip_without_node(kernel, device)
    args = _inference_operands(torch.float32, device, (2, 3), 16, 24, "all")
    names = ["x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"]
    grad = randn(2, 3, 16, device=device)
    for k, name in enumerate(names):
        leaves = [a.clone().requires_grad_(j == k) for j, a in enumerate(args)]
        y = kernel.geglu_mlp(*leaves)
        assert y.requires_grad, f"{name} needs a gradient, but the output has no graph"
        (ours,) = torch.autograd.grad(y, leaves[k], grad)
        a64 = [a.detach().double().requires_grad_(j == k) for j, a in enumerate(args)]
        (ref,) = torch.autograd.grad(kernel.reference.geglu_mlp_ref(*a64, approximate="tanh"), a64[k], grad.double())
        le = [a.clone().requires_grad_(j == k) for j, a in enumerate(args)]
        (eager,) = torch.autograd.grad(_mlp_eager(*le, "tanh"), le[k], grad)
        assert_close(ours, ref, eager, f"d{name}, the only gradient asked for")


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "gelu"])
@pytest.mark.parametrize("bias", ["vector", None, "addend"], ids=["bias", "nobias", "addend"])
@pytest.mark.parametrize("shape", [((3, 5), 72, 136), ((37,), 45, 67)], ids=str)
def test_linear_training_runs_on_cpp_nodes(kernel, device, monkeypatch, backend, dtype, activation, bias, shape):
    """linear in training: where ATen is the implementation (the "torch" backend, the CPU backend, and
    on CUDA the policy's addmm for no activation and exact GELU) the step is ATen's own linear (+ GELU)
    with its C++ nodes; where the cuBLASLt path runs its GELU epilogue (CUDA: tanh GELU, not fp32,
    N % 8 == 0), or takes an addend (a bias of the output's shape: every activation and dtype), the
    step is linear_lt_train, with the Python node's bits; elsewhere (Triton) the Python node. Right
    against float64 in every case."""
    monkeypatch.delenv("FUSED_GEGLU_BACKEND", raising=False)
    monkeypatch.delenv("FUSED_GEGLU_CUBLASLT", raising=False)
    _, dispatch = _modules(kernel)
    backend = None if backend == "auto" else backend
    lead, k, n = shape
    x = randn(*lead, k, dtype=dtype, device=device)
    w = randn(n, k, dtype=dtype, device=device, scale=k**-0.5)
    b = randn(*{"vector": (n,), "addend": (*lead, n)}[bias], dtype=dtype, device=device, scale=0.5) if bias else None
    base = [t for t in (x, w, b) if t is not None]
    approx = {"gelu_tanh": "tanh", "gelu": "none"}.get(activation)

    def ref(*ts):
        y = F.linear(*ts)
        return y if approx is None else F.gelu(y, approximate=approx)

    def call(*ts):
        return kernel.linear(*ts, activation=activation, backend=backend)

    lt = (device == "cuda" and backend is None and dispatch.compiled_has_autograd("linear_lt_train", "cuda")
          and (bias == "addend" or (activation == "gelu_tanh" and dtype != torch.float32 and n % 8 == 0)))
    if lt:
        outs, grad = _both_nodes(kernel, monkeypatch, lambda: [t.clone().requires_grad_() for t in base], call,
                                 "LinearLtTrain")
        assert kernel.last_backend("linear") == "cuda"
    else:
        leaves = [t.clone().requires_grad_() for t in base]
        y = call(*leaves)
        ran = kernel.last_backend("linear")
        assert not (device == "cpu" and ran == "triton"), "auto on CPU must not pick the Triton interpreter"
        if ran in ("torch", "cpu"):
            assert y.grad_fn.name().endswith("Backward0"), f"ATen's own node expected, got {y.grad_fn.name()}"
        else:
            assert type(y.grad_fn).__name__ == "FusedLinearBackward", (ran, y.grad_fn.name())
        grad = randn(*y.shape, dtype=dtype, device=device)
        outs = (y.detach(), *torch.autograd.grad(y, leaves, grad))
    _check_against_float64(outs, base, grad, ref, ref, f"linear {activation} training")


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_training_nodes_under_activation_checkpointing(kernel, device, reentrant):
    """torch.utils.checkpoint over a block of the C++-node ops (the MLP node's saved gate/up go through
    the checkpoint's saved-tensor hooks and are recomputed, then overwritten in place by its backward):
    the same gradients as without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    _skip_without_node(kernel, device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    h, i = 64, 96
    x = randn(2, 7, h, dtype=dtype, device=device, requires_grad=True)
    wg, wu, wd = [p.requires_grad_() for p in _inference_operands(dtype, device, (1,), h, i, "none")[1:4]]
    w2 = randn(h, h, dtype=dtype, device=device, scale=h**-0.5, requires_grad=True)
    leaves = [x, wg, wu, wd, w2]

    def block(x, wg, wu, wd, w2):
        y = kernel.geglu_mlp(x, wg, wu, wd)
        assert not torch.is_grad_enabled() or _is_cpp_node(y)  # reentrant: the first run has no graph
        z = kernel.linear(y, w2, None, activation="gelu_tanh")
        return kernel.geglu(z, y)

    grad = randn(2, 7, h, dtype=dtype, device=device)
    ref = torch.autograd.grad(block(*leaves), leaves, grad)
    for t in leaves:
        t.grad = None
    checkpoint(block, *leaves, use_reentrant=reentrant).backward(grad)  # reentrant: .backward() only
    for k, (r, t) in enumerate(zip(ref, leaves)):
        assert torch.equal(t.grad, r), f"gradient {k} under checkpointing"
