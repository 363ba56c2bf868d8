"""``linear``: GEMM with bias/GELU epilogue; forward and all gradients, every backend."""

from __future__ import annotations

import importlib
import random

import pytest
import torch
import torch.nn.functional as F
from _numerics import assert_close, assert_step_close, laid_out, randn
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
@pytest.mark.parametrize("with_bias", ["vector", None, "addend"], ids=["bias", "nobias", "addend"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_linear_forward_backward(kernel, device, backend, dtype, activation, with_bias, shape):
    """``with_bias``: a vector [N], none, or an addend of the output's shape [..., N] (a residual)."""
    _skip_unless(kernel, device, backend, dtype)
    if backend == "cuda" and activation == "gelu" and with_bias != "addend":
        pytest.skip("cuBLASLt has no exact-GELU epilogue (auto dispatch routes it to Triton)")
    x_shape, n = shape
    k = x_shape[-1]
    x = randn(*x_shape, dtype=dtype, device=device, requires_grad=True)
    w = randn(n, k, dtype=dtype, device=device, scale=k**-0.5, requires_grad=True)
    b_shape = {"vector": (n,), "addend": (*x_shape[:-1], n)}.get(with_bias)
    b = randn(*b_shape, dtype=dtype, device=device, requires_grad=True) if b_shape else None
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


@pytest.mark.parametrize("backend", ["cuda", "cpu", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("with_bias", ["vector", "addend"])
def test_linear_python_node_training(kernel, device, monkeypatch, backend, dtype, activation, with_bias):
    """The Python autograd node's ATen backward (what a compiled graph and $FUSED_GEGLU_CPP_AUTOGRAD=0
    run; eager training otherwise takes ATen's or the C++ nodes): GELU's derivative before the bias
    gradient's row sum, against float64, as test_linear_forward_backward checks the default nodes."""
    monkeypatch.setattr(importlib.import_module(f"{kernel.__name__}._dispatch"), "CPP_AUTOGRAD", False)
    test_linear_forward_backward(kernel, device, backend, dtype, activation, with_bias, ((3, 5, 37), 29))


@pytest.mark.parametrize("backend", ["triton", None], ids=["triton", "auto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
@pytest.mark.parametrize("bias_kind", ["vector", "addend"])
def test_linear_skinny_split_k(kernel, device, backend, dtype, activation, bias_kind, triton_module):
    """Decode sizes: few output tiles, so the Triton GEMM splits K and sums the slices in a second
    kernel that runs the epilogue (with the bias vector or the [M, N] addend). The K here is split
    into slices with a ragged last one."""
    _skip_unless(kernel, device, backend or "torch", dtype)
    if backend is None and device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("auto on CPU is the compiled CPU backend; covered by test_linear_forward_backward")
    m, k, n = (3, 70, 19) if device == "cpu" else (5, 2900, 300)  # interpreter: BLOCK_K 16; GPU: 128
    tk_linear = triton_module("linear")
    cfg = tk_linear.get_config("linear_fwd", torch.device(device), dtype, m, n, k)
    tiles = -(-m // cfg.BLOCK_M) * -(-n // cfg.BLOCK_N)
    split, per = tk_linear._k_slices(cfg, tiles, k, torch.device(device))
    assert split > 1 and k % per != 0, (cfg, split, per)  # the split path, ragged last slice
    x = randn(m, k, dtype=dtype, device=device, requires_grad=True)
    w = randn(n, k, dtype=dtype, device=device, scale=k**-0.5, requires_grad=True)
    b = randn(*((n,) if bias_kind == "vector" else (m, n)), dtype=dtype, device=device, requires_grad=True)
    y = kernel.linear(x, w, b, activation=activation, backend=backend)
    eager = _eager(x, w, b, activation)
    assert_close(y, kernel.reference.linear_ref(x.detach(), w.detach(), b.detach(), activation), eager, "linear")
    grad = randn(*y.shape, dtype=dtype, device=device)
    ours = torch.autograd.grad(y, (x, w, b), grad)
    p64 = [t.detach().double().requires_grad_() for t in (x, w, b)]
    refs = torch.autograd.grad(kernel.reference.linear_ref(*p64, activation), p64, grad.double())
    for name, o, r, e in zip(("dx", "dW", "db"), ours, refs, torch.autograd.grad(eager, (x, w, b), grad)):
        assert_close(o, r, e, f"linear {name}")


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
@pytest.mark.parametrize("k", [37, 0])
def test_linear_triton_epilogue_row_padded_addend_and_empty_k(kernel, device, activation, k):
    """The Triton epilogue reads an addend through its own row stride: the rows of a wider buffer
    (a slice of a fused residual, say) stay a view, so that stride is not N. With K == 0 the
    product is empty and the result is act(bias), vector or addend. Forward and gradients against
    float64 (x and W have no elements to differentiate when K == 0)."""
    _skip_unless(kernel, device, "triton", torch.float32)
    gen = torch.Generator().manual_seed(k)
    lead, n = (2, 3), 19
    x = randn(*lead, k, device=device, gen=gen, requires_grad=k > 0)
    w = randn(n, k, device=device, scale=max(k, 1) ** -0.5, gen=gen, requires_grad=k > 0)
    for bias_kind in ("vector", "row_padded addend"):
        if bias_kind == "vector":
            b = randn(n, device=device, gen=gen, requires_grad=True)
        else:
            b = laid_out((*lead, n), torch.float32, device, "row_padded", gen, requires_grad=True)
            assert b.stride(-2) != n
        y = kernel.linear(x, w, b, activation=activation, backend="triton")
        assert kernel.last_backend("linear") == "triton"
        o64 = [t.detach().double().requires_grad_(t.requires_grad) for t in (x, w, b)]
        case = f"K {k}, {activation}, bias {bias_kind}"
        assert_step_close(y, _eager(*o64, activation), _eager(x, w, b, activation), [x, w, b], o64,
                          ("dx", "dW", "db"), case, gen)


@pytest.mark.parametrize("bias_kind", ["vector", "addend"])
def test_linear_triton_fused_split_k_reduce_epilogue(kernel, device, bias_kind, triton_module):
    """With tile counters (the MLP's decode down projection passes them), each output tile's last
    split-K program sums the slices and runs the epilogue itself: the bias vector or the [M, N]
    addend (read through its row stride), the stored pre-activation and GELU, the same bits as the
    separate reduction kernel and right against float64; the counters are zero again afterwards."""
    _skip_unless(kernel, device, "triton", torch.float32)
    tk_linear = triton_module("linear")
    m, k, n = (3, 70, 19) if device == "cpu" else (5, 2900, 300)
    cfg = tk_linear.get_config("linear_fwd_act", torch.device(device), torch.float32, m, n, k)
    tiles = -(-m // cfg.BLOCK_M) * -(-n // cfg.BLOCK_N)
    assert tk_linear._k_slices(cfg, tiles, k, torch.device(device))[0] > 1, cfg  # the split path
    gen = torch.Generator().manual_seed(1)
    x = randn(m, k, device=device, gen=gen)
    w = randn(n, k, device=device, scale=k**-0.5, gen=gen)
    b = randn(n, device=device, gen=gen) if bias_kind == "vector" else \
        laid_out((m, n), torch.float32, device, "row_padded", gen)
    counters = torch.zeros(tk_linear.splitk_counters(m, n), dtype=torch.int32, device=device)
    fused, fused_pre = torch.empty(m, n, device=device), torch.empty(m, n, device=device)
    tk_linear.linear_fwd(fused, x, w, b, "gelu_tanh", fused_pre, tile_counters=counters)
    assert not counters.any(), "the counters must be re-armed for the next launch"
    plain, plain_pre = torch.empty(m, n, device=device), torch.empty(m, n, device=device)
    tk_linear.linear_fwd(plain, x, w, b, "gelu_tanh", plain_pre)
    assert torch.equal(fused, plain) and torch.equal(fused_pre, plain_pre)
    pre64 = F.linear(x.double(), w.double(), b.double())
    assert_close(fused_pre, pre64, F.linear(x, w, b), "fused split-K pre-activation")
    assert_close(fused, F.gelu(pre64, approximate="tanh"), _eager(x, w, b, "gelu_tanh"), "fused split-K")


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
    seq_first = randn(7, 3, 20, device=device).transpose(0, 1)  # [S, B, K] seen as [B, S, K]
    for name, x in {"x[::2]": base[::2, :, :20], "last-dim stride 2": base[..., ::2], "sequence-first": seq_first}.items():
        y = kernel.linear(x, w, b, backend=backend)
        assert y.shape == (*x.shape[:-1], 12)
        assert_close(y, kernel.reference.linear_ref(x, w, b), F.linear(x, w, b), name)



# A bias vector as a view of a larger tensor: every other value (strided), or a contiguous slice one
# element in (a data pointer aligned to one element only, 2 bytes in half precision).
BIAS_VIEWS = {"strided": lambda p, n: p[: 2 * n : 2], "offset": lambda p, n: p[1 : n + 1]}


@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "gelu"])
@pytest.mark.parametrize("view", BIAS_VIEWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_linear_bias_vector_views(kernel, device, backend, activation, view, dtype):
    """A bias vector that is a view (every other value of a packed bias, or a slice at an odd
    offset), as F.linear takes: right forward and backward on every backend. Until 2026-12-05 the
    Triton kernels read a strided one at unit stride (wrong values, silently) and cuBLASLt refused
    it with a RuntimeError."""
    if backend is not None:
        _skip_unless(kernel, device, backend, dtype)
    if backend == "cuda" and activation == "gelu":
        pytest.skip("cuBLASLt has no exact-GELU epilogue (auto dispatch routes it elsewhere)")
    bias_view = BIAS_VIEWS[view]
    x = randn(2, 5, 24, dtype=dtype, device=device, requires_grad=True)
    w = randn(16, 24, dtype=dtype, device=device, scale=24**-0.5, requires_grad=True)
    packed = randn(33, dtype=dtype, device=device, requires_grad=True)
    b = bias_view(packed, 16)
    y = kernel.linear(x, w, b, activation=activation, backend=backend)
    det = [t.detach() for t in (x, w, b)]
    assert_close(y, kernel.reference.linear_ref(*det, activation), _eager(*det, activation), f"{view} bias")
    grad = randn(*y.shape, dtype=dtype, device=device)
    ours = torch.autograd.grad(y, (x, w, packed), grad)
    p64 = [t.detach().double().requires_grad_() for t in (x, w, packed)]
    refs = torch.autograd.grad(kernel.reference.linear_ref(p64[0], p64[1], bias_view(p64[2], 16), activation), p64,
                               grad.double())
    e = [t.detach().clone().requires_grad_() for t in (x, w, packed)]
    eagers = torch.autograd.grad(_eager(e[0], e[1], bias_view(e[2], 16), activation), e, grad)
    for name, o, r, ee in zip(("dx", "dW", "d packed bias"), ours, refs, eagers):
        assert_close(o, r, ee, f"{view} bias {name}")



def test_fp32_gemm_configs_leave_room_for_tritons_conversion_tile(kernel, triton_module):
    """Fitting a config to shared memory counts what Triton asked for on the H200 (triton 3.6,
    2026-12-05): linear_bwd_weight at 128x128x64 with three fp32 stages wanted 233472 bytes, the
    196608-byte operand pipeline plus a 128 x 72 x 4 layout-conversion tile, past the 232448 an SM has,
    and failed with OutOfResources. The fitted fp32 config must be smaller; bf16 keeps its four stages."""
    configs = triton_module("configs")
    h200_smem = 232448
    tuned = configs.KernelConfig(128, 128, 64, 8, 8, 4)
    fp32 = configs.fit_config("linear_bwd_weight", tuned, 4, h200_smem)
    assert (fp32.BLOCK_M, fp32.BLOCK_N, fp32.BLOCK_K) == (128, 128, 64) and fp32.num_stages == 2, fp32
    assert configs.fit_config("linear_bwd_weight", tuned, 2, h200_smem) == tuned


def _linear_module(kernel):
    return importlib.import_module(f"{kernel.__name__}.linear")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "gelu"])
@pytest.mark.parametrize("dims", [(3, 37, 67, 45), (2, 8, 64, 96), (4, 48, 96, 40)], ids=str)
def test_linear_sequence_first_x_is_one_batched_gemm(kernel, device, monkeypatch, dtype, activation, dims):
    """A sequence-first x ([S, B, K] seen as [B, S, K]) has rows no 2-D view covers. Inference on
    CUDA runs it as B strided batches of one cuBLASLt GEMM with the bias (and tanh GELU) in the
    epilogue: no copy of x (``rows`` is made to raise here), where ATen runs bmm and then a bias add.
    Odd K and S leave batches misaligned for 16-byte loads; the alignment cuBLASLt is told covers
    every batch. Right against float64; backend "torch" stays ATen; a training step copies to rows."""
    if device != "cuda":
        pytest.skip("cuBLASLt runs on CUDA only; on CPU a sequence-first x is copied to rows "
                    "(test_linear_non_contiguous_x)")
    linear_mod = _linear_module(kernel)
    if not importlib.import_module(f"{kernel.__name__}._dispatch").compiled_has("linear_lt", "cuda"):
        pytest.skip("this variant has no compiled cuBLASLt linear")
    bsz, s, k, n = dims
    x = randn(s, bsz, k, dtype=dtype, device=device).transpose(0, 1)
    w = randn(n, k, dtype=dtype, device=device, scale=k**-0.5)
    b = randn(n, dtype=dtype, device=device, scale=0.5)
    ref = kernel.reference.linear_ref(x.double(), w.double(), b.double(), activation)
    eager = _eager(x, w, b, activation)
    with monkeypatch.context() as mp:
        def no_rows(t):
            raise AssertionError("x was copied to rows")

        mp.setattr(linear_mod, "rows", no_rows)
        with torch.no_grad():
            y = kernel.linear(x, w, b, activation=activation)
    assert kernel.last_backend("linear") == "cuda"
    assert y.shape == (bsz, s, n) and y.is_contiguous()
    assert_close(y, ref, eager, f"linear {activation} sequence-first")
    y_op = linear_mod.linear_fwd_op(x, w, b, activation or "none", False, "auto")[0]  # the traced path
    assert torch.equal(y_op, y)
    with torch.no_grad():
        y_torch = kernel.linear(x, w, b, activation=activation, backend="torch")
    assert kernel.last_backend("linear") == "torch"
    assert_close(y_torch, ref, eager, f"linear {activation} sequence-first, backend torch")
    leaves = [t.clone().requires_grad_() for t in (w, b)]
    yg = kernel.linear(x, *leaves, activation=activation)
    assert_close(yg, ref, eager, f"linear {activation} sequence-first, training")
    grads = torch.autograd.grad(yg, leaves, torch.ones_like(yg))
    l64 = [t.detach().double().requires_grad_() for t in (w, b)]
    r64 = torch.autograd.grad(kernel.reference.linear_ref(x.double(), *l64, activation), l64,
                              torch.ones(yg.shape, dtype=torch.float64, device=device))
    le = [t.detach().clone().requires_grad_() for t in (w, b)]
    re = torch.autograd.grad(_eager(x, *le, activation), le, torch.ones_like(yg))
    for name, g, r, e in zip(("dW", "db"), grads, r64, re):
        assert_close(g, r, e, f"linear {activation} sequence-first {name}")


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_linear_sequence_first_x_with_a_large_weight_goes_by_rows(kernel, device, monkeypatch, activation):
    """Three or more batches of few rows each, with a weight the L2 does not hold (policy op
    "linear_seqfirst"): B strided batches would each read the whole weight, so auto dispatch copies
    x to rows once and runs one GEMM (ATen's addmm, or cuBLASLt's GELU epilogue), which reads it
    once; with two batches, or many rows per batch, the batched GEMM stays, except for a wide
    weight (the gate/up projections' shape, N >= 2K) at up to 128 rows per batch and M <= 512
    (M <= 1024 from 96 MiB), and eight or more batches of up to 64 rows of a wide weight of any
    size. Both right against float64, in the layout ATen returns."""
    if device != "cuda":
        pytest.skip("the batched cuBLASLt route exists on CUDA only (test_linear_sequence_first_x_is_one_batched_gemm)")
    linear_mod = _linear_module(kernel)
    if not importlib.import_module(f"{kernel.__name__}._dispatch").compiled_has("linear_lt", "cuda"):
        pytest.skip("this variant has no compiled cuBLASLt linear")
    copies = []
    real_rows = linear_mod.rows

    def counted_rows(t):
        copies.append(tuple(t.shape))
        return real_rows(t)

    monkeypatch.setattr(linear_mod, "rows", counted_rows)
    # bf16 weights [N, K]: 32.0 MiB wide (a gate projection's shape) and narrow (a down
    # projection's), 15 MiB wide (L2-resident), 96 MiB wide; (S, B, weight, by rows)
    wide, narrow, small, large = (8200, 2048), (2048, 8200), (6912, 1152), (16384, 3072)
    cases = ((8, 4, wide, True), (64, 4, narrow, True), (2, 8, wide, True), (8, 2, wide, False),
             (8, 3, narrow, True), (64, 3, narrow, False), (64, 3, wide, True), (128, 4, wide, True),
             (128, 4, narrow, False), (128, 8, wide, False), (64, 8, small, True), (64, 4, small, False),
             (128, 8, small, False), (64, 8, small[::-1], False), (128, 8, large, True))
    for s, bsz, (n, k), by_rows in cases:
        w = randn(n, k, dtype=torch.bfloat16, device=device, scale=k**-0.5)
        b = randn(n, dtype=torch.bfloat16, device=device, scale=0.5)
        x = randn(s, bsz, k, dtype=torch.bfloat16, device=device).transpose(0, 1)
        copies.clear()
        with torch.no_grad():
            y = kernel.linear(x, w, b, activation=activation)
        assert bool(copies) == by_rows, (s, bsz, tuple(w.shape), copies)
        assert kernel.last_backend("linear") == ("cuda" if activation or not by_rows else "torch")
        assert y.shape == (bsz, s, n) and y.is_contiguous()
        ref = kernel.reference.linear_ref(x.double(), w.double(), b.double(), activation)
        assert_close(y, ref, _eager(x, w, b, activation), f"linear {activation} sequence-first S={s} B={bsz}")
        with torch.no_grad():
            y_cuda = kernel.linear(x, w, b, activation=activation, backend="cuda")  # cuBLASLt either way
        assert_close(y_cuda, ref, _eager(x, w, b, activation), f"linear {activation} sequence-first, cuda")


def test_linear_bad_input(kernel, device):
    x, w = randn(4, 6, device=device), randn(5, 6, device=device)
    with pytest.raises(ValueError, match="x has 6 input features"):
        kernel.linear(randn(4, 6, device=device), randn(5, 7, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\) \(weight.shape\[0\]\) or the output's shape \(4, 5\)"):
        kernel.linear(x, w, randn(4, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape .* got \(1, 5\)"):
        kernel.linear(x, w, randn(1, 5, device=device))  # broadcasting forms are refused, not guessed
    with pytest.raises(ValueError, match="weight must be 2-D"):
        kernel.linear(x, randn(5, 6, 1, device=device))
    with pytest.raises(TypeError, match="weight has dtype torch.bfloat16"):
        kernel.linear(x, w.bfloat16())
    with pytest.raises(ValueError, match="activation must be"):
        kernel.linear(x, w, activation="relu")
    for activation in (None, "gelu_tanh"):  # a bias that is not a tensor is named, not an AttributeError
        with pytest.raises(TypeError, match="bias must be a torch.Tensor or None, got float"):
            kernel.linear(x, w, 0.0, activation=activation)
    with pytest.raises(ValueError, match=r"backend must be one of .* got \['cpu'\]"):
        kernel.linear(x, w, backend=["cpu"])


def _fresh_tables(kernel, monkeypatch, short_path: str | None):
    """Empty pick tables in the linear module; ``short_path`` seeds its table of devices whose
    plain calls are F.linear (None: leave it empty, to be learned)."""
    mod = _linear_module(kernel)
    monkeypatch.setattr(mod, "_picks", {})
    monkeypatch.setattr(mod, "_ATEN_PLAIN", {})
    monkeypatch.setattr(mod, "_LT_GELU_TANH", set())
    if short_path is not None:
        mod._ATEN_PLAIN[torch.device(kernel_device(short_path))] = "torch"
    return mod


def kernel_device(device: str) -> str:
    return "cuda:0" if device == "cuda" else "cpu"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [((5, 7), 3), ((2, 9, 13), 11), ((33, 45), 29)], ids=str)
def test_linear_short_path_is_f_linear(kernel, device, monkeypatch, dtype, shape):
    """Where ATen is the implementation of a plain call (no activation, a [N] bias or none), the
    public function is F.linear on the caller's tensors: the same bits, forward and gradients, and
    ATen's own autograd node."""
    _fresh_tables(kernel, monkeypatch, device)
    x_shape, n = shape
    x = randn(*x_shape, dtype=dtype, device=device, requires_grad=True)
    w = randn(n, x_shape[-1], dtype=dtype, device=device, scale=x_shape[-1] ** -0.5, requires_grad=True)
    b = randn(n, dtype=dtype, device=device, requires_grad=True)
    y = kernel.linear(x, w, b)
    assert kernel.last_backend("linear") == "torch"
    assert y.grad_fn.name().endswith("Backward0"), y.grad_fn.name()
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y2 = F.linear(x2, w2, b2)
    assert torch.equal(y, y2)
    g = randn(*y.shape, dtype=dtype, device=device)
    y.backward(g)
    y2.backward(g)
    for got, want in ((x.grad, x2.grad), (w.grad, w2.grad), (b.grad, b2.grad)):
        assert torch.equal(got, want)
    with torch.no_grad():
        assert torch.equal(kernel.linear(x, w), F.linear(x, w))
    assert_close(y.detach().float(), kernel.reference.linear_ref(x.detach(), w.detach(), b.detach()).float(),
                 y2.detach().float(), "short path")


def test_linear_short_path_refuses_what_linear_refuses(kernel, device, monkeypatch):
    """The short path checks only what F.linear does not and rewords F.linear's own errors, so every
    bad input still gets the named error (and nothing F.linear would accept, such as integer
    tensors, a 1-D weight or a broadcasting bias, slips through)."""
    _fresh_tables(kernel, monkeypatch, device)
    x, w = randn(4, 6, device=device), randn(5, 6, device=device)
    kernel.linear(x, w)
    assert kernel.last_backend("linear") == "torch"
    with pytest.raises(ValueError, match="x has 6 input features"):
        kernel.linear(x, randn(5, 7, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape .* got \(1,\)"):
        kernel.linear(x, w, randn(1, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape .* got \(1, 5\)"):
        kernel.linear(x, w, randn(1, 5, device=device))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        kernel.linear(x, randn(6, device=device))
    with pytest.raises(TypeError, match="weight has dtype torch.bfloat16"):
        kernel.linear(x, w.bfloat16())
    with pytest.raises(TypeError, match="bias has dtype torch.float16"):
        kernel.linear(x, w, randn(5, device=device).half())
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16, got torch.int64"):
        kernel.linear(x.long(), w.long())
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16, got torch.float64"):
        kernel.linear(x.double(), w.double())
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        kernel.linear(x[0, 0], w)
    if device == "cuda":
        with pytest.raises(ValueError, match="weight is on cpu but x is on cuda"):
            kernel.linear(x, w.cpu())
    # F.linear itself takes a "meta" weight with a CPU x and returns an uninitialised CPU tensor.
    with pytest.raises(ValueError, match=f"weight is on meta but x is on {device}"):
        kernel.linear(x, torch.empty(5, 6, device="meta"))
    with pytest.raises(ValueError, match=f"bias is on meta but x is on {device}"):
        kernel.linear(x, w, torch.empty(5, device="meta"))


def test_linear_short_path_yields_to_overrides(kernel, device, compiled, monkeypatch, backends):
    """The short path runs only while nothing overrides the policy: a backend named in the call or
    in $FUSED_GEGLU_BACKEND, $FUSED_GEGLU_CUBLASLT set, an activation, an addend, a strided x, or
    the Python autograd node asked for ($FUSED_GEGLU_CPP_AUTOGRAD=0) in a training step."""
    mod = _fresh_tables(kernel, monkeypatch, device)
    dispatch = importlib.import_module(f"{kernel.__name__}._dispatch")
    other = next(b for b in backends if b != "torch")  # triton (interpreted on CPU) or cuda
    x, w, b = randn(6, 16, device=device), randn(8, 16, device=device, scale=0.25), randn(8, device=device)
    kernel.linear(x, w, b)
    assert kernel.last_backend("linear") == "torch"
    kernel.linear(x, w, b, backend=other)
    assert kernel.last_backend("linear") == other
    monkeypatch.setenv("FUSED_GEGLU_BACKEND", other)
    kernel.linear(x, w, b)
    assert kernel.last_backend("linear") == other
    monkeypatch.delenv("FUSED_GEGLU_BACKEND")
    monkeypatch.setenv("FUSED_GEGLU_CUBLASLT", "0")
    mod._ATEN_PLAIN[torch.device(kernel_device(device))] = "marker"  # not a backend: shows which path ran
    kernel.linear(x, w, b)
    assert kernel.last_backend("linear") != "marker"
    monkeypatch.delenv("FUSED_GEGLU_CUBLASLT")
    kernel.linear(x, w, b)
    assert kernel.last_backend("linear") == "marker"
    for call in (lambda: kernel.linear(x, w, b, activation="gelu_tanh"),
                 lambda: kernel.linear(x, w, randn(6, 8, device=device)),
                 lambda: kernel.linear(randn(16, 6, device=device).t(), w, b)):
        call()
        assert kernel.last_backend("linear") != "marker"
    monkeypatch.setattr(dispatch, "CPP_AUTOGRAD", False)
    y = kernel.linear(x.clone().requires_grad_(), w, b)
    assert kernel.last_backend("linear") != "marker" and type(y.grad_fn).__name__ == "FusedLinearBackward"
    with torch.no_grad():
        kernel.linear(x, w, b)
    assert kernel.last_backend("linear") == "marker"


def test_linear_short_path_is_learned_where_auto_picks_aten(kernel, device, compiled, monkeypatch):
    """A device enters the short path's table after a plain auto call that chose ATen, and only
    then: not while an override is set, nor where auto chose another backend."""
    mod = _fresh_tables(kernel, monkeypatch, None)
    dev = torch.device(kernel_device(device))
    x, w, b = randn(6, 16, device=device), randn(8, 16, device=device, scale=0.25), randn(8, device=device)
    monkeypatch.setenv("FUSED_GEGLU_CUBLASLT", "0")
    kernel.linear(x, w, b)
    assert dev not in mod._ATEN_PLAIN  # an override was set
    monkeypatch.delenv("FUSED_GEGLU_CUBLASLT")
    kernel.linear(x, w, b, activation="gelu_tanh")
    assert dev not in mod._ATEN_PLAIN  # not a plain call
    kernel.linear(x, w, b)
    ran = kernel.last_backend("linear")
    assert mod._ATEN_PLAIN.get(dev) == (ran if ran in ("torch", "cpu") else None)
    if device == "cpu":
        # Auto's first choice on CPU is the compiled CPU backend (also under TRITON_INTERPRET); with
        # only "cpu" and "torch" available the device is learned as "cpu" all the same.
        monkeypatch.setattr(mod, "_picks", {})
        monkeypatch.setattr(mod._dispatch, "_available", lambda device_type: ("cpu", "torch"))
        kernel.linear(x, w, b)
        assert kernel.last_backend("linear") == "cpu" and mod._ATEN_PLAIN.get(dev) == "cpu"
        kernel.linear(x, w, b)
        assert kernel.last_backend("linear") == "cpu"



def _lt_short_path_or_skip(kernel, device):
    if device != "cuda":
        pytest.skip("the tanh-GELU short path is cuBLASLt's (CUDA); on CPU "
                    "test_linear_gelu_tanh_short_path_is_not_learned_off_cuda covers it")
    dispatch = importlib.import_module(f"{kernel.__name__}._dispatch")
    if not dispatch.compiled_has("linear_lt_infer", "cuda"):
        pytest.skip("this variant has no compiled no-graph cuBLASLt linear")
    policy = importlib.import_module(f"{kernel.__name__}.policy")
    dev = torch.device("cuda", torch.cuda.current_device())
    if not (policy.backend_for("linear_gelu_tanh", dev, "triton", m=16) == "cuda" and policy.size_free("linear_gelu_tanh", dev)):
        pytest.skip("auto dispatch does not run cuBLASLt for tanh-GELU calls at every size on this GPU "
                    "(its policy JSON, measured on sm90, says otherwise or is absent)")


def _count_short_calls(mod, monkeypatch) -> list:
    """Wraps the short path's call; the list gets one entry per call that it ran (not None)."""
    ran = []
    real = mod._lt_gelu_tanh_call

    def counted(*args):
        out = real(*args)
        if out is not None:
            ran.append(1)
        return out

    monkeypatch.setattr(mod, "_lt_gelu_tanh_call", counted)
    return ran


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [((5, 24), 16), ((2, 9, 40), 24), ((33, 64), 30)], ids=str)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
def test_linear_gelu_tanh_short_path_gives_the_full_paths_bits(kernel, device, monkeypatch, dtype, shape,
                                                               with_bias, training):
    """On a device where auto dispatch runs tanh-GELU calls on cuBLASLt at every size, such a call is
    one compiled op (linear_lt_infer, or the linear_lt_train node in a training step the node takes):
    it is learned by the first call, runs from the second, and gives the full path's bits, forward
    and gradients; N % 8 != 0 in fp32/half training and every fp32 step keep the full path's node."""
    _lt_short_path_or_skip(kernel, device)
    mod = _fresh_tables(kernel, monkeypatch, None)
    ran = _count_short_calls(mod, monkeypatch)
    x_shape, n = shape
    x = randn(*x_shape, dtype=dtype, device=device, requires_grad=training)
    w = randn(n, x_shape[-1], dtype=dtype, device=device, scale=x_shape[-1] ** -0.5, requires_grad=training)
    b = randn(n, dtype=dtype, device=device, requires_grad=training) if with_bias else None
    leaves = [t for t in (x, w, b) if t is not None]
    full = kernel.linear(x, w, b, activation="gelu_tanh")  # the full path, which learns the device
    assert kernel.last_backend("linear") == "cuda" and not ran
    assert torch.device(device, torch.cuda.current_device()) in mod._LT_GELU_TANH
    short = kernel.linear(x, w, b, activation="gelu_tanh")
    takes_node = dtype != torch.float32 and n % 8 == 0
    assert len(ran) == (1 if not training or takes_node else 0)
    assert kernel.last_backend("linear") == "cuda"
    assert torch.equal(short, full) and short.shape == (*x_shape[:-1], n)
    det = [t.detach() for t in (x, w, b) if t is not None] + ([] if with_bias else [None])
    assert_close(short.detach(), kernel.reference.linear_ref(*det, "gelu_tanh"), _eager(*det, "gelu_tanh"), "short path")
    if training:
        g = randn(*short.shape, dtype=dtype, device=device)
        for got, want in zip(torch.autograd.grad(short, leaves, g), torch.autograd.grad(full, leaves, g)):
            assert torch.equal(got, want)
    else:
        short.add_(1)  # a fresh tensor the caller owns


def test_linear_gelu_tanh_short_path_yields_and_rewords(kernel, device, monkeypatch):
    """The short path runs only while nothing overrides the policy (a backend in the call or in
    $FUSED_GEGLU_BACKEND, $FUSED_GEGLU_CUBLASLT) and for operands it takes (contiguous x and
    weight, a [N] bias or none, no transform); the op's refusals get the named errors."""
    _lt_short_path_or_skip(kernel, device)
    mod = _fresh_tables(kernel, monkeypatch, None)
    ran = _count_short_calls(mod, monkeypatch)
    x, w, b = randn(6, 16, device=device), randn(8, 16, device=device, scale=0.25), randn(8, device=device)
    kernel.linear(x, w, b, activation="gelu_tanh")
    kernel.linear(x, w, b, activation="gelu_tanh")
    assert len(ran) == 1
    for call in (lambda: kernel.linear(x, w, b, activation="gelu_tanh", backend="triton"),
                 lambda: kernel.linear(x, w, randn(6, 8, device=device), activation="gelu_tanh"),
                 lambda: kernel.linear(randn(16, 6, device=device).t(), w, b, activation="gelu_tanh"),
                 lambda: kernel.linear(x, randn(16, 8, device=device).t(), b, activation="gelu_tanh"),
                 lambda: kernel.linear(x[:0], w, b, activation="gelu_tanh")):
        call()
    assert len(ran) == 1
    for name, value in (("FUSED_GEGLU_BACKEND", "torch"), ("FUSED_GEGLU_CUBLASLT", "0")):
        with monkeypatch.context() as mp:
            mp.setenv(name, value)
            kernel.linear(x, w, b, activation="gelu_tanh")
    assert len(ran) == 1
    y = torch.func.vmap(lambda r: kernel.linear(r, w, b, activation="gelu_tanh"))(x.unsqueeze(1))
    assert len(ran) == 1 and y.shape == (6, 1, 8)
    with pytest.raises(ValueError, match="x has 16 input features"):
        kernel.linear(x, randn(8, 12, device=device), activation="gelu_tanh")
    with pytest.raises(TypeError, match="weight has dtype torch.bfloat16"):
        kernel.linear(x, w.bfloat16(), activation="gelu_tanh")
    with pytest.raises(TypeError, match="bias has dtype torch.float16"):
        kernel.linear(x, w, b.half(), activation="gelu_tanh")
    with pytest.raises(ValueError, match="weight is on cpu but x is on cuda"):
        kernel.linear(x, w.cpu(), activation="gelu_tanh")


def test_linear_gelu_tanh_short_path_is_not_learned_off_cuda(kernel, device, monkeypatch):
    """Off CUDA (and wherever auto dispatch does not choose cuBLASLt) no device enters the short
    path's table: its op is cuBLASLt's."""
    mod = _fresh_tables(kernel, monkeypatch, None)
    x, w, b = randn(6, 16, device=device), randn(8, 16, device=device, scale=0.25), randn(8, device=device)
    kernel.linear(x, w, b, activation="gelu_tanh")
    chosen = kernel.last_backend("linear")
    assert (len(mod._LT_GELU_TANH) == 1) == (chosen == "cuda" and device == "cuda" and importlib.import_module(
        f"{kernel.__name__}._dispatch").compiled_has("linear_lt_infer", "cuda"))


def test_rows_is_a_view_where_the_strides_allow_and_one_copy_where_not(kernel, device):
    """``_views.rows`` (every op's N-D -> 2-D step): a view where the leading dims collapse (the
    contiguous case, a slice of the last dim), one contiguous copy where they do not (a
    sequence-first x seen batch-first, a transposed last dim) or where the rows would overlap (a
    broadcast), the right values either way, and empty last dims kept. It decides without a failed view: that path cost 15 µs per call on the CPU."""
    rows = importlib.import_module(f"{kernel.__name__}._views").rows
    base = randn(6, 5, 8, device=device)
    cases = {"contiguous": (base, True), "last-dim slice": (base[..., :3], True),
             "sequence-first": (base.transpose(0, 1), False), "transposed last dim": (base.transpose(1, 2), False),
             "2-D transposed": (base[0].t(), False),
             "broadcast over the leading dims": (randn(8, device=device).expand(6, 5, 8), False)}
    for name, (t, is_view) in cases.items():
        r = rows(t)
        assert r.shape == (t.numel() // t.shape[-1], t.shape[-1]) and r.stride(-1) == 1, name
        assert r.stride(0) >= r.shape[1], f"{name}: rows overlap"
        assert (r.data_ptr() == t.data_ptr()) == is_view, name
        assert torch.equal(r, t.reshape(-1, t.shape[-1])), name
    assert rows(torch.empty(3, 4, 0, device=device)).shape == (12, 0)
    assert rows(torch.empty(0, 4, 5, device=device)).shape == (0, 5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
def test_auto_on_cpu_tensors_is_the_compiled_cpu_backend(kernel, dtype, activation):
    """On CPU tensors ``auto`` runs the compiled CPU backend (plain ATen in a variant without one) for
    every activation and dtype, also where TRITON_INTERPRET=1 puts Triton's interpreter among the
    backends (the tests set it): that interpreter is a debugging aid, slow, and it mis-computes bf16
    ``tl.dot``, so it runs only when asked for by name. The result is checked against float64, bf16
    included."""
    # A variant without the compiled CPU backend (the CUDA ones) runs plain ATen there, never Triton.
    want = "cpu" if "cpu" in kernel.available_backends(torch.device("cpu")) else "torch"
    x = randn(7, 3, 40, dtype=dtype, requires_grad=True)
    w = randn(24, 40, dtype=dtype, scale=40**-0.5, requires_grad=True)
    b = randn(24, dtype=dtype, requires_grad=True)
    y = kernel.linear(x, w, b, activation=activation)
    assert kernel.last_backend("linear") == want, (kernel.last_backend("linear"), want)
    grad = randn(*y.shape, dtype=dtype)
    got = (y, *torch.autograd.grad(y, (x, w, b), grad))
    p64 = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y64 = _eager(*p64, activation)
    refs = (y64, *torch.autograd.grad(y64, p64, grad.double()))
    pe = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    ye = _eager(*pe, activation)
    eagers = (ye, *torch.autograd.grad(ye, pe, grad))
    for name, o, r, e in zip(("y", "dx", "dW", "db"), got, refs, eagers):
        assert_close(o.detach(), r.detach(), e.detach(), f"linear {name}")


@pytest.mark.parametrize("seed", range(24))
def test_linear_random_operands(kernel, device, seed):
    """What a user gets (``backend=None``) on operands drawn at random per seed: dtype, activation,
    odd or model-like sizes, 1- to 3-D x (sequence-first views included), x and weight contiguous,
    row-padded or strided, a bias vector, an addend of the output's shape (possibly strided) or none,
    any subset of leaves needing a gradient. Forward and every gradient against float64."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = rng.choice(DTYPES)
    activation = rng.choice([None, "gelu", "gelu_tanh"])
    if device == "cuda" and rng.random() < 0.5:
        k, n, lead = 8 * rng.randint(8, 64), 8 * rng.randint(8, 96), (rng.randint(1, 300),)
    else:
        k, n = rng.randint(1, 80), rng.randint(1, 80)
        lead = rng.choice([(rng.randint(0, 9),), (rng.randint(1, 4), rng.randint(1, 7))])
    if seed == 0:
        lead = (0, 3)  # no rows, every gradient asked for
    layouts = ["contiguous", "row_padded", "strided"]
    x = laid_out((*lead, k), dtype, device, rng.choice(layouts), gen)
    if x.dim() == 3 and rng.random() < 0.3:
        x = x.transpose(0, 1)
    w = laid_out((n, k), dtype, device, rng.choice(layouts), gen, k**-0.5)
    bias_kind = rng.choice(["vector", "addend", "none"])
    b = {"vector": lambda: randn(n, dtype=dtype, device=device, gen=gen),
         "addend": lambda: laid_out((*x.shape[:-1], n), dtype, device, rng.choice(layouts), gen),
         "none": lambda: None}[bias_kind]()
    operands = [x, w, b]
    needs = [t is not None and (seed == 0 or rng.random() < 0.6) for t in operands]
    for t, need in zip(operands, needs):
        if need:
            t.requires_grad_()
    case = (f"seed {seed}: {dtype}, {activation}, x {tuple(x.shape)} strides {x.stride()}, w strides "
            f"{w.stride()}, bias {bias_kind}, grads {needs}")

    y = kernel.linear(x, w, b, activation=activation)
    assert y.shape == (*x.shape[:-1], n) and y.dtype == dtype, case
    o64 = [None if t is None else t.detach().double().requires_grad_(need) for t, need in zip(operands, needs)]
    ref, eager = _eager(*o64, activation), _eager(*operands, activation)
    assert_step_close(y, ref, eager, operands, o64, ("dx", "dW", "db"), case, gen)


@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "gelu"])
@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_linear_under_autocast_casts_as_f_linear(kernel, device, backend, activation, amp_dtype):
    """Under torch.autocast, linear computes what F.linear (then F.gelu) computes there: every operand
    cast to the autocast dtype, the result in it, float32 gradients for float32 leaves, each within twice
    eager's error against float64, on every backend. Until 2026-12-05 the dtype depended on the backend:
    the ATen paths were cast by autocast inside, Triton and cuBLASLt computed in float32."""
    if backend is not None:
        _skip_unless(kernel, device, backend, amp_dtype)
    if backend == "cuda" and activation == "gelu":
        pytest.skip("cuBLASLt has no exact-GELU epilogue (auto dispatch routes it elsewhere)")
    g = torch.Generator().manual_seed(7)
    x = randn(4, 16, 40, device=device, requires_grad=True, gen=g)
    w = randn(24, 40, device=device, scale=40**-0.5, requires_grad=True, gen=g)
    b = randn(24, device=device, requires_grad=True, gen=g)
    dy = randn(4, 16, 24, device=device, gen=g)
    approx = {None: None, "gelu": "none", "gelu_tanh": "tanh"}[activation]

    def run(fn):
        for t in (x, w, b):
            t.grad = None
        with torch.autocast(device, dtype=amp_dtype):
            y = fn()
        y.backward(dy.to(y.dtype))
        return y.detach(), [t.grad.clone() for t in (x, w, b)]

    def eager():
        y = F.linear(x, w, b)
        return y if approx is None else F.gelu(y, approximate=approx)

    expected, eager_grads = run(eager)
    got, grads = run(lambda: kernel.linear(x, w, b, activation=activation, backend=backend))
    assert got.dtype == expected.dtype == amp_dtype
    assert all(g.dtype == torch.float32 for g in grads)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref = kernel.reference.linear_ref(x64, w64, b64, activation)
    ref_grads = torch.autograd.grad(ref, (x64, w64, b64), dy.double())
    assert_close(got, ref, expected, "output")
    for name, g, r, e in zip(("dx", "dW", "db"), grads, ref_grads, eager_grads):
        assert_close(g, r, e, name)
