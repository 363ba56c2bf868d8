"""``geglu_mlp``: the whole down(gelu(gate(x)) * up(x)) block, forward and all gradients."""

from __future__ import annotations

import contextlib
import importlib
import random

import pytest
import torch
import torch.nn.functional as F
from _cast_count import CastCounter
from _numerics import assert_close, assert_step_close, laid_out, randn
from test_geglu import BACKENDS, DTYPES, _skip_unless
from test_linear import BIAS_VIEWS

# (tokens, H, I). (3, 24, 72): under the interpreter (BLOCK_K 16) the down GEMM of the Triton path
# splits K at this decode-like size; test_geglu_mlp_decode covers the split at GPU tile sizes.
SHAPES = [(1, 8, 16), (37, 45, 67), ((2, 5), 24, 40), (3, 24, 72)]


def _params(h, i, dtype, device, biases):
    wg = randn(i, h, dtype=dtype, device=device, scale=h**-0.5, requires_grad=True)
    wu = randn(i, h, dtype=dtype, device=device, scale=h**-0.5, requires_grad=True)
    wd = randn(h, i, dtype=dtype, device=device, scale=i**-0.5, requires_grad=True)
    bs = [randn(n, dtype=dtype, device=device, scale=0.5, requires_grad=True) if biases else None for n in (i, i, h)]
    return [wg, wu, wd, *bs]


def _eager(x, wg, wu, wd, bg, bu, bd, approximate):
    return F.linear(F.gelu(F.linear(x, wg, bg), approximate=approximate) * F.linear(x, wu, bu), wd, bd)


def _skip_unless_sm90_compiled(kernel, device, why: str) -> None:
    """Skip off sm_90, and in a build without the compiled CUDA library (the noarch torch-cuda, whose
    auto routes test_geglu_mlp_auto_without_the_compiled_library checks): the CUTLASS kernels and the
    launches sm_90's policy names exist only in the compiled variant."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(why)
    if "cuda" not in kernel.available_backends(device):
        pytest.skip(f"no compiled CUDA library in this build ({kernel.__name__}, noarch)")


def _captured_auto_call(kernel, x, params, fresh):
    """``kernel.geglu_mlp(x, *params)`` (auto, tanh) captured in a CUDA graph, then replayed after
    ``fresh()`` refilled x: ``(y, the backend the captured call ran)``. Warm-up is the caller's (each
    path's first call compiles Triton kernels or sets up cuBLAS, which capture does not allow)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kernel.geglu_mlp(x, *params, approximate="tanh")
    ran = kernel.last_backend("geglu_mlp")
    x.copy_(fresh())
    g.replay()
    torch.cuda.synchronize()
    return y, ran


def _skip_without_compiled_cuda(kernel, device) -> None:
    """Skip in a build without the compiled CUDA library (the noarch torch-cuda): the compiled
    cuBLAS + pointwise calls these tests compare are the compiled variant's."""
    if "cuda" not in kernel.available_backends(device):
        pytest.skip(f"no compiled CUDA library in this build ({kernel.__name__}, noarch)")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("biases", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_geglu_mlp_forward_backward(kernel, device, backend, dtype, approximate, biases, recompute, shape):
    _skip_unless(kernel, device, backend, dtype)
    tokens, h, i = shape
    lead = tokens if isinstance(tokens, tuple) else (tokens,)
    x = randn(*lead, h, dtype=dtype, device=device, requires_grad=True)
    params = _params(h, i, dtype, device, biases)
    y = kernel.geglu_mlp(x, *params, approximate=approximate, recompute=recompute, backend=backend)
    assert kernel.last_backend("geglu_mlp").split("+")[0].split(":")[0] == backend
    det = [None if p is None else p.detach() for p in params]
    ref = kernel.reference.geglu_mlp_ref(x.detach(), *det, approximate=approximate)
    eager = _eager(x, *params, approximate)
    assert y.shape == (*lead, h)
    assert_close(y, ref, eager, "geglu_mlp")

    leaves = [x] + [p for p in params if p is not None]
    grad = randn(*y.shape, dtype=dtype, device=device)
    ours = torch.autograd.grad(y, leaves, grad)
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(l64[1:])
    p64 = [next(it) if p is not None else None for p in params]
    refs = torch.autograd.grad(kernel.reference.geglu_mlp_ref(l64[0], *p64, approximate=approximate), l64, grad.double())
    eagers = torch.autograd.grad(eager, leaves, grad)
    names = ["dx", "dW_gate", "dW_up", "dW_down", "db_gate", "db_up", "db_down"]
    for name, o, r, e in zip(names, ours, refs, eagers):
        assert_close(o, r, e, f"geglu_mlp {name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("biases", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "no_leaf_needs_grad"])
def test_geglu_mlp_inference(kernel, device, backend, dtype, biases, mode):
    """Eager inference skips the op dispatch and autograd (straight to the implementation): same
    results, no graph, whichever way autograd is off."""
    _skip_unless(kernel, device, backend, dtype)
    h, i = 24, 40
    x = randn(2, 5, h, dtype=dtype, device=device)
    params = _params(h, i, dtype, device, biases)
    if mode != "no_grad":  # under no_grad the weights keep requires_grad=True, as in a model
        params = [None if p is None else p.detach() for p in params]
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, contextlib.nullcontext)
    with ctx():
        y = kernel.geglu_mlp(x, *params, approximate="tanh", backend=backend)
    assert not y.requires_grad and y.grad_fn is None
    assert kernel.last_backend("geglu_mlp").split("+")[0].split(":")[0] == backend
    det = [None if p is None else p.detach() for p in params]
    ref = kernel.reference.geglu_mlp_ref(x, *det, approximate="tanh")
    assert_close(y, ref, _eager(x, *det, "tanh"), f"geglu_mlp {mode}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_geglu_mlp_non_contiguous_x(kernel, device, backend):
    _skip_unless(kernel, device, backend)
    base = randn(6, 4, 64, device=device)
    params = [p.detach() for p in _params(32, 48, torch.float32, device, False)[:3]]
    for name, x in {"x[::2]": base[::2, :, :32], "last-dim stride 2": base[..., ::2]}.items():
        y = kernel.geglu_mlp(x, *params, backend=backend)
        assert_close(y, kernel.reference.geglu_mlp_ref(x, *params), _eager(x, *params, None, None, None, "tanh"), name)



@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("view", BIAS_VIEWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_geglu_mlp_bias_views(kernel, device, backend, training, view, dtype):
    """Biases that are views (every other value of packed biases, or slices at an odd offset), which
    ATen's linear takes: right on every backend, forward and gradients. Until 2026-12-05 the Triton
    gate+up and down kernels read strided ones at unit stride (wrong values, silently)."""
    if backend is not None:
        _skip_unless(kernel, device, backend, dtype)
    bias_view = BIAS_VIEWS[view]
    h, i = 24, 40
    x = randn(3, 7, h, dtype=dtype, device=device, requires_grad=training)
    weights = [p.detach().requires_grad_(training) for p in _params(h, i, dtype, device, False)[:3]]
    packed = [randn(2 * n + 1, dtype=dtype, device=device, scale=0.5, requires_grad=training) for n in (i, i, h)]
    biases = [bias_view(p, n) for p, n in zip(packed, (i, i, h))]
    y = kernel.geglu_mlp(x, *weights, *biases, backend=backend)
    det = [t.detach() for t in (x, *weights, *biases)]
    assert_close(y, kernel.reference.geglu_mlp_ref(*det), _eager(*det, "tanh"), f"{view} biases")
    if not training:
        return
    leaves = (x, *weights, *packed)
    grad = randn(*y.shape, dtype=dtype, device=device)
    ours = torch.autograd.grad(y, leaves, grad)
    views = lambda ps: [bias_view(p, n) for p, n in zip(ps, (i, i, h))]  # noqa: E731
    p64 = [t.detach().double().requires_grad_() for t in leaves]
    refs = torch.autograd.grad(kernel.reference.geglu_mlp_ref(*p64[:4], *views(p64[4:])), p64, grad.double())
    e = [t.detach().clone().requires_grad_() for t in leaves]
    eagers = torch.autograd.grad(_eager(*e[:4], *views(e[4:]), "tanh"), e, grad)
    for name, o, r, ee in zip(("dx", "dW_gate", "dW_up", "dW_down", "db_gate", "db_up", "db_down"), ours, refs, eagers):
        assert_close(o, r, ee, f"{view} biases {name}")


def test_geglu_mlp_saves_only_preactivations(kernel, device):
    """Training saves x and the gate/up pre-activations (2*M*I), not the M*I product h."""
    m, h, i = 64, 32, 96
    x = randn(m, h, device=device, requires_grad=True)
    params = _params(h, i, torch.float32, device, False)[:3]
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        kernel.geglu_mlp(x, *params, backend="torch" if device == "cpu" else None)
    sizes = sorted(t.numel() for t in saved)
    assert sizes.count(m * i) == 2, f"expected gate and up pre-activations saved, got numel {sizes}"
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        kernel.geglu_mlp(x, *params, recompute=True)
    assert all(t.numel() != m * i for t in saved), "recompute=True must not save M*I tensors"


@pytest.mark.gpu
def test_geglu_mlp_inference_holds_two_preactivation_buffers(kernel, device, monkeypatch):
    """Inference on the cuBLAS + pointwise path writes h over gate: its peak above the inputs is
    gate + up (2*M*I) and y, not three M x I buffers. Checked against the allocator's peak."""
    # The auto policy's cuBLAS path at every size (a forced backend="cuda" would run the CUTLASS
    # gate+up GEMM on Hopper).
    monkeypatch.setenv("FUSED_GEGLU_SM90_MLP", "no")
    backend = None
    m, h, i = 2048, 256, 4096
    x = randn(m, h, dtype=torch.bfloat16, device=device)
    params = [p.detach() for p in _params(h, i, torch.bfloat16, device, biases=True)]
    with torch.no_grad():
        kernel.geglu_mlp(x, *params, backend=backend)  # warm-up: cuBLAS workspace, Triton compile
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = kernel.geglu_mlp(x, *params, backend=backend)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    # The compiled cuBLAS + pointwise route, or the noarch build's ATen GEMMs + Triton pointwise.
    assert kernel.last_backend("geglu_mlp") == ("cuda+gemm" if "cuda" in kernel.available_backends(device) else "triton+gemm")
    elt = 2
    limit = (2 * m * i + m * h) * elt + (4 << 20)  # slack: cuBLAS workspace and allocator rounding
    assert peak <= limit, f"peak {peak / 2**20:.1f} MiB above {limit / 2**20:.1f} MiB (three M x I buffers?)"
    ref = kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh")
    assert_close(y, ref, _eager(x, *params, "tanh"), "geglu_mlp h over gate")


@pytest.mark.parametrize("backend", BACKENDS)
def test_geglu_mlp_second_backward_is_refused_not_wrong(kernel, device, backend):
    """The backward overwrites the saved pre-activations with their gradients (memory): a second
    backward through the same graph must raise, and with recompute=True (nothing saved but x) it
    must give the same gradients again."""
    _skip_unless(kernel, device, backend)
    x = randn(7, 16, device=device, requires_grad=True)
    params = [p.detach().requires_grad_() for p in _params(16, 24, torch.float32, device, False)[:3]]
    grad = randn(7, 16, device=device)
    y = kernel.geglu_mlp(x, *params, backend=backend)
    first = torch.autograd.grad(y, [x, *params], grad, retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward through the same graph is not supported"):
        torch.autograd.grad(y, [x, *params], grad)
    # Under saved-tensor hooks (checkpointing, offloading) gate/up are saved tensors, which the
    # hooks see (autograd then skips its version check): still refused, the same gradients first.
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        y = kernel.geglu_mlp(x, *params, backend=backend)
    hooked = torch.autograd.grad(y, [x, *params], grad, retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward through the same graph is not supported"):
        torch.autograd.grad(y, [x, *params], grad)
    for a, b in zip(first, hooked):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    y = kernel.geglu_mlp(x, *params, recompute=True, backend=backend)
    again = [torch.autograd.grad(y, [x, *params], grad, retain_graph=True) for _ in range(2)]
    for a, b, c in zip(first, *again):
        torch.testing.assert_close(b, c, rtol=0, atol=0)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_geglu_mlp_bad_input(kernel, device):
    x = randn(4, 8, device=device)
    wg, wu, wd = randn(16, 8, device=device), randn(16, 8, device=device), randn(8, 16, device=device)
    with pytest.raises(ValueError, match=r"w_up must have shape \(16, 8\)"):
        kernel.geglu_mlp(x, wg, randn(15, 8, device=device), wd)
    with pytest.raises(ValueError, match=r"w_down must have shape \(8, 16\)"):
        kernel.geglu_mlp(x, wg, wu, wg)
    with pytest.raises(ValueError, match="x has 9 features"):
        kernel.geglu_mlp(randn(4, 9, device=device), wg, wu, wd)
    with pytest.raises(ValueError, match=r"b_down must have shape \(8,\)"):
        kernel.geglu_mlp(x, wg, wu, wd, b_down=randn(16, device=device))
    with pytest.raises(TypeError, match="w_down has dtype torch.float16"):
        kernel.geglu_mlp(x, wg, wu, wd.half())
    with pytest.raises(TypeError, match="b_gate must be a torch.Tensor or None, got float"):
        kernel.geglu_mlp(x, wg, wu, wd, b_gate=0.0)
    with pytest.raises(ValueError, match="backend must be one of"):
        kernel.geglu_mlp(x, wg, wu, wd, backend=("cpu",))


def test_geglu_mlp_on_meta_tensors(kernel):
    """Meta tensors (shape inference, a model built on the meta device) get meta results, with and
    without gradients: no lookup of a compiled kernel for the "meta" device type (a KeyError once)."""
    m = [torch.empty(*s, device="meta") for s in ((2, 3, 8), (16, 8), (16, 8), (8, 16))]
    assert kernel.geglu_mlp(*m).shape == (2, 3, 8)
    y = kernel.geglu_mlp(m[0].requires_grad_(), *m[1:])
    assert y.shape == (2, 3, 8) and y.device.type == "meta" and y.requires_grad


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=pytest.mark.gpu), None], ids=["triton", "auto"])
@pytest.mark.parametrize("tokens", [1, 16, (2, 9)], ids=str)
def test_geglu_mlp_decode(kernel, device, backend, tokens):
    """Decode sizes at a real width (bf16, I = 2304: the down GEMM splits K on the GPU), forward and
    gradients, through the forced Triton path (GPU: bf16 tl.dot) and through the measured auto policy
    (on CPU tensors the compiled CPU backend)."""
    h, i, dtype = 256, 2304, torch.bfloat16
    lead = tokens if isinstance(tokens, tuple) else (tokens,)
    x = randn(*lead, h, dtype=dtype, device=device, requires_grad=True)
    params = _params(h, i, dtype, device, biases=True)
    y = kernel.geglu_mlp(x, *params, approximate="tanh", backend=backend)
    det = [p.detach() for p in params]
    eager = _eager(x, *params, "tanh")
    assert_close(y, kernel.reference.geglu_mlp_ref(x.detach(), *det, approximate="tanh"), eager, "geglu_mlp")
    leaves = [x, *params]
    grad = randn(*y.shape, dtype=dtype, device=device)
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    refs = torch.autograd.grad(kernel.reference.geglu_mlp_ref(l64[0], *l64[1:], approximate="tanh"), l64,
                               grad.double())
    for o, r, e in zip(torch.autograd.grad(y, leaves, grad), refs, torch.autograd.grad(eager, leaves, grad)):
        assert_close(o, r, e, "geglu_mlp decode grad")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(16, 1152, 6912), (5, 200, 2304), ((2, 9), 3584, 1440)], ids=str)
def test_geglu_mlp_decode_pdl_matches_plain_launches(kernel, device, monkeypatch, dtype, shape, triton_module):
    """The Triton decode chain launched with programmatic dependent launch (the default on sm90) gives
    the same bits as the same kernels launched one after another (FUSED_GEGLU_PDL=0), eagerly and
    replayed from a CUDA graph, and is as close to float64 as eager is. The shapes take the split-K
    down GEMM (Gemma3-1B's width) and the unsplit one (I = 1440), with sizes off every tile."""
    if torch.cuda.get_device_capability(device)[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or newer")
    pdl = triton_module("pdl")
    tokens, h, i = shape
    lead = tokens if isinstance(tokens, tuple) else (tokens,)
    x = randn(*lead, h, dtype=dtype, device=device)
    params = [p.detach() for p in _params(h, i, dtype, device, biases=True)]

    def run(flag):
        monkeypatch.setenv("FUSED_GEGLU_PDL", flag)
        assert pdl.pdl_enabled(x.device, x.numel() // h) == (flag == "1")
        eager_y = kernel.geglu_mlp(x, *params, approximate="tanh", backend="triton")
        lin = kernel.linear(x, params[0], params[3], activation="gelu_tanh", backend="triton")
        out = torch.empty_like(eager_y)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out.copy_(kernel.geglu_mlp(x, *params, approximate="tanh", backend="triton"))
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        return eager_y, out, lin

    plain, with_pdl = run("0"), run("1")
    for a, b, what in zip(plain, with_pdl, ["eager", "graph replay", "linear"]):
        assert torch.equal(a, b), f"{what}: PDL changed the result"
    ref = kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh")
    assert_close(with_pdl[1], ref, _eager(x, *params, "tanh"), "geglu_mlp decode with PDL")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(3, 24, 72), ((2, 5), 40, 200), (16, 1152, 6912), (33, 200, 2304)], ids=str)
def test_geglu_mlp_decode_reduces_split_k_in_the_down_gemm(kernel, device, monkeypatch, dtype, shape, triton_module):
    """At decode sizes the Triton MLP sums the down GEMM's K slices in the down GEMM itself (the last
    program of each tile, on counters its gate+up kernel zeroed). It must give the bits of the separate
    reduction kernel, also for `linear` run on its own, and leave the counters at zero for the next call.
    CPU: the interpreter at small sizes (K splits there too); GPU: real widths, split 4 ways."""
    _skip_unless(kernel, device, "triton", dtype)
    tokens, h, i = shape
    if device == "cpu" and i > 300:
        pytest.skip("real widths run on the GPU (the interpreter takes minutes)")
    tk_linear = triton_module("linear")
    tk_mlp = triton_module("mlp")
    lead = tokens if isinstance(tokens, tuple) else (tokens,)
    x = randn(*lead, h, dtype=dtype, device=device)
    params = [p.detach() for p in _params(h, i, dtype, device, biases=True)]
    fused = kernel.geglu_mlp(x, *params, approximate="tanh", backend="triton")
    monkeypatch.setattr(tk_linear, "FUSED_REDUCE_MAX_M", 0)
    separate = kernel.geglu_mlp(x, *params, approximate="tanh", backend="triton")
    assert torch.equal(fused, separate), "the fused split-K reduction changed the result"
    assert_close(fused, kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh"),
                 _eager(x, *params, "tanh"), "geglu_mlp decode, fused split-K reduction")

    # The launchers directly: counters zeroed by gate+up, used and re-armed by the down GEMM, twice.
    x2 = x.reshape(-1, h)
    m = x2.shape[0]
    counters = torch.full((tk_linear.splitk_counters(m, h),), 7, dtype=torch.int32, device=device)
    hid = torch.empty(m, i, dtype=dtype, device=device)
    tk_mlp.gateup_fwd(hid, x2, params[0], params[1], params[3], params[4], "tanh", None, None, zero_out=counters)
    assert not counters.any(), "gate+up left the counters non-zero"
    plain = tk_linear.linear_fwd(torch.empty(m, h, dtype=dtype, device=device), hid, params[2], params[5],
                                 "gelu_tanh", None)
    for _ in range(2):
        out = tk_linear.linear_fwd(torch.empty(m, h, dtype=dtype, device=device), hid, params[2], params[5],
                                   "gelu_tanh", None, tile_counters=counters)
        assert torch.equal(out, plain)
        assert not counters.any(), "the down GEMM did not re-arm its counters"
    with pytest.raises(ValueError, match="tile_counters holds 0 counters, this launch needs"):
        tk_linear.linear_fwd(torch.empty(m, h, dtype=dtype, device=device), hid, params[2], params[5],
                             "none", None, tile_counters=counters[:0])


def test_pdl_only_for_decode_on_sm90(kernel, monkeypatch, triton_module):
    """Programmatic dependent launch is asked for only at decode sizes on a CUDA device of sm_90 or
    newer, and FUSED_GEGLU_PDL=0 turns it off (CPU: the capability lookup is stubbed)."""
    pdl = triton_module("pdl")
    cuda = torch.device("cuda", 0)
    assert not pdl.pdl_enabled(torch.device("cpu"), 16), "the interpreter has no griddepcontrol"
    monkeypatch.setattr(pdl, "_cuda_major", lambda index: 9)
    monkeypatch.delenv("FUSED_GEGLU_PDL", raising=False)
    assert pdl.pdl_enabled(cuda, 1) and pdl.pdl_enabled(cuda, pdl.PDL_MAX_M)
    assert not pdl.pdl_enabled(cuda, pdl.PDL_MAX_M + 1), "prefill sizes launch plainly"
    assert pdl.launch_kwargs(True) == {"launch_pdl": True} and pdl.launch_kwargs(False) == {}
    for off in ("0", "off", "no"):
        monkeypatch.setenv("FUSED_GEGLU_PDL", off)
        assert not pdl.pdl_enabled(cuda, 16), off
    monkeypatch.setenv("FUSED_GEGLU_PDL", "1")
    monkeypatch.setattr(pdl, "_cuda_major", lambda index: 8)
    assert not pdl.pdl_enabled(cuda, 16), "Ampere has no programmatic dependent launch"


# Every tile of the sm90 CUTLASS gate+up GEMM (kernel_src/gemm_sm90/geglu_gateup_sm90.h), forced
# through the env knobs the probe uses, with the scheduler orders it sweeps. M and I are not
# multiples of any tile, so every tile has partial tiles in both directions.
SM90_TILES = ["128x128", "128x256", "128x128pp", "256x128", "128x192pp", "64x128pp", "64x256pp", "64x128k128pp"]
SM90_DECODE_TILES = ["64x128pp", "64x256pp", "64x128k128pp"]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", SM90_TILES)
@pytest.mark.parametrize("order", [("1", None), ("8", "m"), ("2", "n")], ids=["s1", "s8m", "s2n"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_geglu_mlp_sm90_every_tile(kernel, device, monkeypatch, tile, order, dtype):
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS gate+up GEMM is sm_90 only")
    swizzle, raster = order
    monkeypatch.setenv("FUSED_GEGLU_SM90_TILE", tile)
    monkeypatch.setenv("FUSED_GEGLU_SM90_SWIZZLE", swizzle)
    if raster:
        monkeypatch.setenv("FUSED_GEGLU_SM90_RASTER", raster)
    m, h, i = 333, 264, 392
    x = randn(m, h, dtype=dtype, device=device)
    params = [p.detach() for p in _params(h, i, dtype, device, biases=True)]
    with torch.no_grad():
        y = kernel.geglu_mlp(x, *params, approximate="tanh", backend="cuda")
    assert kernel.last_backend("geglu_mlp") == "cuda:sm90"
    ref = kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh")
    assert_close(y, ref, _eager(x, *params, "tanh"), f"geglu_mlp sm90 {tile} swizzle {swizzle} raster {raster}")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", SM90_DECODE_TILES)
@pytest.mark.parametrize("m", [1, 16, 65])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_geglu_mlp_sm90_decode_tiles(kernel, device, monkeypatch, tile, m, dtype):
    """The 64-row tiles at decode sizes, through the one-call inference op with the launch named
    the way the policy names it: one row, a full 16, and one row into a second M tile; H spans
    several K tiles with a partial last one, I is not a multiple of any tile's N."""
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS gate+up GEMM is sm_90 only")
    monkeypatch.setenv("FUSED_GEGLU_SM90_MLP", f"{tile}/s1")
    h, i = 456, 712
    x = randn(m, h, dtype=dtype, device=device)
    params = [p.detach() for p in _params(h, i, dtype, device, biases=True)]
    with torch.no_grad():
        y = kernel.geglu_mlp(x, *params, approximate="tanh")
    assert kernel.last_backend("geglu_mlp") == "cuda:sm90"
    ref = kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh")
    assert_close(y, ref, _eager(x, *params, "tanh"), f"geglu_mlp sm90 {tile} M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m, expected", [(16, "triton"), (33, "cuda:sm90")])
def test_geglu_mlp_auto_under_graph_capture(kernel, device, m, expected):
    """The auto policy under CUDA-graph capture: Triton's decode kernels up to M = 16, the CUTLASS
    64-row tile above (policy_sm90.json; in the noarch build ATen's GEMMs around Triton's pointwise);
    the replay computes what a plain call does."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the policy measured here is the sm_90 one")
    if expected == "cuda:sm90" and "cuda" not in kernel.available_backends(device):
        expected = "triton+gemm"
    h, i = 456, 712
    x = randn(m, h, dtype=torch.bfloat16, device=device)
    params = [p.detach() for p in _params(h, i, torch.bfloat16, device, biases=True)]
    with torch.no_grad():
        # Warm-up outside the capture: without capture auto runs the CUTLASS path at both sizes, so
        # the Triton kernels the captured M = 16 call takes are compiled (JIT) by a forced call here.
        kernel.geglu_mlp(x, *params, approximate="tanh")
        kernel.geglu_mlp(x, *params, approximate="tanh", backend="triton")
        torch.cuda.synchronize()
        y, ran = _captured_auto_call(kernel, x, params, lambda: randn(m, h, dtype=torch.bfloat16, device=device))
        assert ran == expected
    ref = kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh")
    assert_close(y, ref, _eager(x, *params, "tanh"), f"geglu_mlp auto captured at M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("captured", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("m", [97, 129, 200, 256, 257, 300, 480, 640, 800, 1023, 1024, 1025, 1152, 4097, 6144])
@pytest.mark.parametrize("h", [768, 1152, 2048, 3584])
def test_geglu_mlp_auto_between_decode_and_prefill(kernel, device, m, h, captured):
    """Inference at M = 65..1023 (batched decode, chunked prefill) and on both sides of the
    multiples of 128 and 2048 above it, plain and inside CUDA-graph capture: the auto path runs the
    launch the sm_90 policy names for the size and capture state (a CUTLASS tile, or cuBLAS +
    pointwise where no tile measured faster), and either way the output matches float64 within
    bf16's own error."""
    _skip_unless_sm90_compiled(kernel, device, "the policy measured here is the sm_90 one")
    i = 712  # a multiple of 8 (16-byte TMA rows), not of any tile
    x = randn(m, h, dtype=torch.bfloat16, device=device)
    params = [p.detach() for p in _params(h, i, torch.bfloat16, device, biases=True)]
    policy = importlib.import_module(kernel.__name__ + ".policy")
    launch = policy.sm90_mlp_launch(m, h, x.device, capturing_now=int(captured))
    with torch.no_grad():
        if captured:
            # Both paths once outside capture (cuBLAS sets up its handle and workspace there).
            kernel.geglu_mlp(x, *params, approximate="tanh")
            _eager(x, *params, "tanh")
            torch.cuda.synchronize()
            y, ran = _captured_auto_call(kernel, x, params, lambda: randn(m, h, dtype=torch.bfloat16, device=device))
        else:
            y = kernel.geglu_mlp(x, *params, approximate="tanh")
            ran = kernel.last_backend("geglu_mlp")
    assert ran == ("cuda+gemm" if launch is None else "cuda:sm90"), launch
    ref = kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh")
    assert_close(y, ref, _eager(x, *params, "tanh"), f"geglu_mlp auto at M={m}, H={h} ({launch}, {ran})")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 17, 300, 1024])
@pytest.mark.parametrize("captured", [False, True], ids=["plain", "graph"])
def test_geglu_mlp_auto_without_the_compiled_library(kernel, device, m, captured):
    """The noarch torch-cuda build (what a CUDA torch without a compiled variant loads): auto runs ATen's
    GEMMs around Triton's pointwise kernel ("triton+gemm"), except where sm90's policy measured the fused
    Triton kernels faster (decode, M <= 16, under CUDA-graph capture); either way the results match
    float64 within bf16's own error. Until 2026-12-05 this build ran the fused Triton MLP at every size
    (see test_policy's test_auto_on_cuda_never_picks_a_triton_gemm_that_lost), and from 14abf27 to
    f9bebc9 ATen's pointwise for small forwards outside capture ("torch+gemm")."""
    if "cuda" in kernel.available_backends(device):
        pytest.skip("this build has the compiled CUDA library: test_geglu_mlp_auto_between_decode_and_prefill")
    h, i = 1152, 1432  # an I that is no multiple of the pointwise kernels' blocks
    params = _params(h, i, torch.bfloat16, device, biases=True)
    fused = captured and m <= 16 and torch.cuda.get_device_capability() == (9, 0)
    expected = "triton" if fused else "triton+gemm"
    if captured:
        x = randn(m, h, dtype=torch.bfloat16, device=device)
        det = [p.detach() for p in params]
        with torch.no_grad():
            kernel.geglu_mlp(x, *det, approximate="tanh")  # Triton compiles outside the capture
            torch.cuda.synchronize()
            y, ran = _captured_auto_call(kernel, x, det, lambda: randn(m, h, dtype=torch.bfloat16, device=device))
            assert ran == expected
        ref = kernel.reference.geglu_mlp_ref(x, *det, approximate="tanh")
        assert_close(y, ref, _eager(x, *det, "tanh"), f"geglu_mlp auto, graph, M={m}")
        return
    x = randn(m, h, dtype=torch.bfloat16, device=device, requires_grad=True)
    y = kernel.geglu_mlp(x, *params, approximate="tanh")
    assert kernel.last_backend("geglu_mlp") == expected
    leaves = [x, *params]
    grad = randn(*y.shape, dtype=torch.bfloat16, device=device)
    ours = torch.autograd.grad(y, leaves, grad)
    assert kernel.last_backend("geglu_mlp_backward") == "triton+gemm"  # the pointwise rule is the forward's
    eager = _eager(x, *params, "tanh")
    eagers = torch.autograd.grad(eager, leaves, grad)
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    ref = kernel.reference.geglu_mlp_ref(l64[0], *l64[1:], approximate="tanh")
    assert_close(y, ref, eager, f"geglu_mlp auto, M={m}")
    refs = torch.autograd.grad(ref, l64, grad.double())
    for name, o, r, e in zip(["dx", "dW_gate", "dW_up", "dW_down", "db_gate", "db_up", "db_down"], ours, refs, eagers):
        assert_close(o, r, e, f"geglu_mlp auto {name}, M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 65])
@pytest.mark.parametrize("h", [1152, 2048, 3584])
def test_geglu_mlp_auto_small_training_step(kernel, device, monkeypatch, m, h):
    """A training step at M <= 64 (host-bound) takes the CUTLASS gate+up GEMM with the 64-row tile
    where the sm_90 training rules name it, cuBLAS + pointwise from M = 65; output and every gradient
    against float64."""
    _skip_unless_sm90_compiled(kernel, device, "the policy measured here is the sm_90 one")
    monkeypatch.delenv("FUSED_GEGLU_SM90_MLP", raising=False)
    monkeypatch.delenv("FUSED_GEGLU_BACKEND", raising=False)
    i = 712
    x = randn(m, h, dtype=torch.bfloat16, device=device, requires_grad=True)
    params = _params(h, i, torch.bfloat16, device, biases=False)
    policy = importlib.import_module(kernel.__name__ + ".policy")
    launch = policy.sm90_mlp_launch(m, h, x.device, training=True)
    assert (launch == "64x128pp/s1") == (m <= 64), launch
    y = kernel.geglu_mlp(x, *params, approximate="tanh")
    assert kernel.last_backend("geglu_mlp") == ("cuda:sm90" if launch else "cuda+gemm")
    _assert_output_and_grads(kernel, y, [x, *params], "tanh", f"geglu_mlp auto training M={m}, H={h}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [100, 129, 300, 520, 700, 1000])
@pytest.mark.parametrize("h", [768, 1152, 2048, 3584])
def test_geglu_mlp_forced_cuda_between_decode_and_prefill(kernel, device, monkeypatch, m, h):
    """backend="cuda" at M = 65..1023: the CUTLASS gate+up GEMM with the launch the auto rules name,
    or where they leave cuBLAS + pointwise the forced rule's (the op's heuristic at widths nothing
    measured), and the output right against float64."""
    _skip_unless_sm90_compiled(kernel, device, "the policy measured here is the sm_90 one")
    monkeypatch.delenv("FUSED_GEGLU_SM90_MLP", raising=False)
    i = 712
    x = randn(m, h, dtype=torch.bfloat16, device=device)
    params = [p.detach() for p in _params(h, i, torch.bfloat16, device, biases=True)]
    policy = importlib.import_module(kernel.__name__ + ".policy")
    sm90 = importlib.import_module(kernel.__name__ + ".sm90_weights")
    launches = []
    real = sm90.mlp_sm90
    monkeypatch.setattr(sm90, "mlp_sm90", lambda *a: launches.append(a[-1]) or real(*a))
    with torch.no_grad():
        y = kernel.geglu_mlp(x, *params, approximate="tanh", backend="cuda")
    assert kernel.last_backend("geglu_mlp") == "cuda:sm90"
    auto = policy.sm90_mlp_launch(m, h, x.device)
    assert launches == [auto if auto is not None else policy.sm90_forced_launch(m, h, x.device)]
    ref = kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh")
    assert_close(y, ref, _eager(x, *params, "tanh"), f"geglu_mlp forced cuda at M={m}, H={h} ({launches})")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", SM90_TILES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_geglu_mlp_sm90_training(kernel, device, monkeypatch, tile, dtype, approximate):
    """Training through the CUTLASS gate+up GEMM: its epilogue also writes gate and up for the
    backward. Every gradient against float64; M and I not multiples of the tile."""
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS gate+up GEMM is sm_90 only")
    monkeypatch.setenv("FUSED_GEGLU_SM90_TILE", tile)
    m, h, i = 333, 264, 392
    x = randn(m, h, dtype=dtype, device=device, requires_grad=True)
    params = _params(h, i, dtype, device, biases=True)
    y = kernel.geglu_mlp(x, *params, approximate=approximate, backend="cuda")
    assert kernel.last_backend("geglu_mlp") == "cuda:sm90"
    _assert_output_and_grads(kernel, y, [x, *params], approximate, f"geglu_mlp sm90 {tile} training")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", SM90_TILES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("order", ["gate_first", "up_first"])
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_geglu_mlp_sm90_weights_in_one_buffer(kernel, device, monkeypatch, tile, dtype, order, train):
    """The CUTLASS GEMM reads w_gate and w_up where they are, as one TMA view spanning both
    tensors with the lower address first: here they are the two halves of one [2I, H] buffer (a
    fused gate_up_proj), in both orders, with only b_gate given (b_up filled with zeros). M and I
    not multiples of the tile; for training all gradients."""
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS gate+up GEMM is sm_90 only")
    monkeypatch.setenv("FUSED_GEGLU_SM90_TILE", tile)
    m, h, i = 333, 264, 392
    buf = randn(2 * i, h, dtype=dtype, device=device, scale=h**-0.5)
    first, second = buf[:i].detach(), buf[i:].detach()
    wg, wu = (first, second) if order == "gate_first" else (second, first)
    wd = randn(h, i, dtype=dtype, device=device, scale=i**-0.5)
    bg, bd = (randn(n, dtype=dtype, device=device, scale=0.5) for n in (i, h))
    params = [wg, wu, wd, bg, None, bd]
    for p in params:
        if p is not None:
            p.requires_grad_(train)
    x = randn(m, h, dtype=dtype, device=device, requires_grad=train)
    with contextlib.nullcontext() if train else torch.no_grad():
        y = kernel.geglu_mlp(x, *params, approximate="tanh", backend="cuda")
    assert kernel.last_backend("geglu_mlp") == "cuda:sm90"
    if train:
        _assert_output_and_grads(kernel, y, [x, *params], "tanh", f"{tile} {order}")
    else:
        ref = kernel.reference.geglu_mlp_ref(x, *params, approximate="tanh")
        assert_close(y, ref, _eager(x, *params, "tanh"), f"{tile} {order}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["same_tensor", "different_row_strides"])
def test_geglu_mlp_sm90_declines_weights_one_view_cannot_span(kernel, device, case):
    """w_gate and w_up that one TMA view cannot cover (the same tensor: a zero stride; different
    row strides) must not reach the CUTLASS GEMM: the MLP computes them through cuBLAS + the
    pointwise kernel instead, correctly."""
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS gate+up GEMM is sm_90 only")
    m, h, i = 200, 128, 256
    dt = torch.bfloat16
    x = randn(m, h, dtype=dt, device=device)
    wd = randn(h, i, dtype=dt, device=device, scale=i**-0.5)
    if case == "same_tensor":
        wg = wu = randn(i, h, dtype=dt, device=device, scale=h**-0.5)
    else:
        wg = randn(i, 2 * h, dtype=dt, device=device, scale=h**-0.5)[:, :h]  # row stride 2H
        wu = randn(i, h, dtype=dt, device=device, scale=h**-0.5)
    with torch.no_grad():
        y = kernel.geglu_mlp(x, wg, wu, wd, approximate="tanh", backend="cuda")
    assert kernel.last_backend("geglu_mlp") != "cuda:sm90"
    ref = kernel.reference.geglu_mlp_ref(x, wg, wu, wd, approximate="tanh")
    assert_close(y, ref, _eager(x, wg, wu, wd, None, None, None, "tanh"), case)


def test_sm90_usable_needs_one_view_over_both_weights(kernel, monkeypatch):
    """The Python gate in front of the CUTLASS gate+up GEMM (sm90_weights.usable), on CPU tensors with
    the capability check stubbed to sm_90: it must decline exactly what the host op would refuse."""
    sm90 = importlib.import_module(kernel.__name__ + ".sm90_weights")
    monkeypatch.setattr(sm90, "device_capability", lambda device: (9, 0))
    i, h = 64, 32
    x = torch.randn(16, h, dtype=torch.bfloat16)
    buf = torch.randn(2 * i, h, dtype=torch.bfloat16)
    wg, wu = buf[:i], buf[i:]
    assert sm90.usable(x, wg, wu) and sm90.usable(x, wu, wg)  # halves of one buffer, either order
    assert sm90.usable(x, wg, torch.randn(i, h, dtype=torch.bfloat16))  # two allocations
    assert not sm90.usable(x, wg, wg), "the same tensor twice: a zero TMA stride"
    wide = torch.randn(i, 2 * h, dtype=torch.bfloat16)[:, :h]
    assert not sm90.usable(x, wide, wu), "different row strides"
    odd = torch.randn(i * h + 1, dtype=torch.bfloat16)[1:].view(i, h)  # 2 bytes past an aligned start
    assert not sm90.usable(x, odd, wu), "a weight not 16-byte aligned"
    assert not sm90.usable(x.float(), wg.float(), wu.float()), "fp32"
    assert not sm90.usable(x, buf[:60], buf[60:120]), "I % 8 != 0"
    monkeypatch.setattr(sm90, "device_capability", lambda device: (8, 0))
    assert not sm90.usable(x, wg, wu), "not sm_90"


def test_cublas_forward_takes_one_compiled_call_only_for_inference(kernel, monkeypatch):
    """The routing in front of geglu_mlp_gemm, on CPU tensors with a stand-in for the compiled op:
    the inference forward with the CUDA pointwise kernel is handed over whole; training (which keeps
    gate/up for the backward: geglu_mlp_gemm_train, absent here, next test) and the other pointwise
    backends are not."""
    mlp = importlib.import_module(kernel.__name__ + ".mlp")
    dispatch = importlib.import_module(kernel.__name__ + "._dispatch")
    calls = []

    class Ops:
        def geglu_mlp_gemm(self, *args):
            calls.append(args)
            return args[0].new_full((args[0].shape[0], args[3].shape[0]), 7.0)

    monkeypatch.setattr(mlp, "ops", Ops())
    monkeypatch.setattr(dispatch, "compiled_has", lambda op, device_type: op == "geglu_mlp_gemm")
    m, h, i = 5, 8, 16
    x2 = torch.randn(m, h)
    wg, wu, wd = torch.randn(i, h), torch.randn(i, h), torch.randn(h, i)
    bg = torch.randn(i)
    y, gate, up = mlp._gemm_forward(x2, wg, wu, wd, bg, None, None, "none", "cuda", False)
    assert len(calls) == 1 and gate is None and up is None and torch.equal(y, torch.full((m, h), 7.0))
    assert calls[0][4] is bg and calls[0][5] is None and calls[0][7] == 0, "biases and GELU flavour passed on"
    mlp._gemm_forward(x2, wg, wu, wd, bg, None, None, "tanh", "cuda", False)
    assert calls[-1][7] == 1
    n = len(calls)
    y, gate, up = mlp._gemm_forward(x2, wg, wu, wd, bg, None, None, "tanh", "torch", True)  # training
    y2, _, _ = mlp._gemm_forward(x2, wg, wu, wd, bg, None, None, "tanh", "torch", False)  # another pointwise
    assert len(calls) == n, "only the CUDA pointwise's inference forward is geglu_mlp_gemm's call"
    assert gate is not None and up is not None
    ref = kernel.reference.geglu_mlp_ref(x2, wg, wu, wd, bg, None, None, approximate="tanh")
    assert torch.allclose(y, ref.float(), rtol=1e-4, atol=1e-4) and torch.allclose(y2, y)


def test_cublas_training_takes_one_compiled_call_each_way(kernel, monkeypatch):
    """The routing in front of geglu_mlp_gemm_train and geglu_mlp_gemm_bwd, on CPU tensors with
    stand-ins for the compiled ops: the training forward with the CUDA pointwise kernel is handed
    over whole, and so is the backward up to ONE_CALL_BWD_MAX_ELEMS M x I elements (above it the
    Python sequence frees dgate early: memory); ONE_CALL = False (FUSED_GEGLU_ONE_CALL=0) keeps both
    in Python. The real ops are compared bit for bit on the GPU
    (test_geglu_mlp_cublas_training_one_call_matches_python)."""
    mlp = importlib.import_module(kernel.__name__ + ".mlp")
    dispatch = importlib.import_module(kernel.__name__ + "._dispatch")
    calls = {"train": [], "bwd": []}
    m, h, i = 6, 8, 16

    class Ops:
        def geglu_mlp_gemm_train(self, *args):
            calls["train"].append(args)
            return (args[0].new_full((args[0].shape[0], h), 7.0), args[0].new_full((m, i), 1.0),
                    args[0].new_full((m, i), 2.0))

        def geglu_mlp_gemm_bwd(self, *args):
            calls["bwd"].append(args)
            return tuple(args[1].new_full(s, float(k)) for k, s in enumerate(
                [args[1].shape, (i, h), (i, h), (h, i), (i,) if args[8] else (0,), (i,) if args[9] else (0,),
                 (h,) if args[10] else (0,)]))

    one_call = ("geglu_mlp_gemm_train", "geglu_mlp_gemm_bwd")
    monkeypatch.setattr(mlp, "ops", Ops())
    monkeypatch.setattr(dispatch, "compiled_has", lambda op, device_type: op in one_call)
    monkeypatch.setattr(mlp, "_pick", lambda *args: "cuda")  # CPU tensors down the CUDA path
    geglu = importlib.import_module(kernel.__name__ + ".geglu")
    monkeypatch.setattr(geglu, "_pick", lambda *args: "cuda")  # the CUDA pointwise kernel
    x = torch.randn(2, 3, h)
    wg, wu, wd, bg = torch.randn(i, h), torch.randn(i, h), torch.randn(h, i), torch.randn(i)

    y, gate, up = mlp._gemm_forward(x.view(m, h), wg, wu, wd, bg, None, None, "tanh", "cuda", True)
    assert len(calls["train"]) == 1 and calls["train"][0][4] is bg and calls["train"][0][7] == 1
    assert torch.equal(y, torch.full((m, h), 7.0)) and torch.equal(up, torch.full((m, i), 2.0))

    dy = torch.randn(2, 3, h)
    gate, up = torch.randn(m, i), torch.randn(m, i)
    out = mlp._mlp_backward(dy, x, wg, wu, wd, bg, None, [gate, up], "none", False, True, "auto", True)
    (args,) = calls["bwd"]
    assert args[5] is gate and args[6] is up, "the saved pre-activations, to be overwritten in place"
    assert args[7:] == (0, True, False, True), "GELU flavour and which biases exist"
    assert args[0].shape == (m, h) and args[1].shape == (m, h), "dy and x as rows"
    assert out[0].shape == x.shape and torch.equal(out[0], torch.zeros(x.shape)), "dx in x's shape"
    assert [o.shape for o in out[1:]] == [(i, h), (i, h), (h, i), (i,), (0,), (h,)]

    # Above the element bound, and with ONE_CALL off: the Python sequence, against float64. Its
    # pointwise step runs the torch reference behind the "cuda" name (a CUDA variant has no CPU kernels).
    bwd_inplace, fwd_into = geglu._bwd_inplace, geglu._fwd_into
    monkeypatch.setattr(geglu, "_bwd_inplace", lambda g, u, d, a, b: bwd_inplace(g, u, d, a, "torch"))
    monkeypatch.setattr(geglu, "_fwd_into", lambda o, g, u, a, b: fwd_into(o, g, u, a, "torch"))

    def python_backward():
        gate, up = torch.randn(m, i), torch.randn(m, i)
        saved = [gate.clone(), up.clone()]
        dx, dwg, dwu, dwd, dbg, _, dbd = mlp._mlp_backward(dy, x, wg, wu, wd, bg, None, [gate, up], "none",
                                                            False, True, "auto", True)
        leaves = [t.double().requires_grad_() for t in (x, wg, wu, wd, bg, *saved)]
        x64, wg64, wu64, wd64, bg64, g64, u64 = leaves
        y64 = F.linear(F.gelu(g64) * u64, wd64)
        ref = torch.autograd.grad(y64, [wd64, g64, u64], dy.double().view(m, h))
        assert torch.allclose(dwd.double(), ref[0], rtol=1e-4, atol=1e-4)
        dgate, dup = ref[1], ref[2]
        assert torch.allclose(dx.double().view(m, h), dgate @ wg64 + dup @ wu64, rtol=1e-4, atol=1e-4)
        assert torch.allclose(dwg.double(), dgate.t() @ x64.view(m, h), rtol=1e-4, atol=1e-4)
        assert torch.allclose(dbg.double(), dgate.sum(0), rtol=1e-4, atol=1e-4)
        assert torch.allclose(dbd.double(), dy.double().view(m, h).sum(0), rtol=1e-4, atol=1e-4)

    monkeypatch.setattr(mlp, "ONE_CALL_BWD_MAX_ELEMS", m * i - 1)
    python_backward()
    monkeypatch.setattr(mlp, "ONE_CALL_BWD_MAX_ELEMS", m * i)
    monkeypatch.setattr(mlp, "ONE_CALL", False)
    python_backward()
    y, gate, up = mlp._gemm_forward(x.view(m, h), wg, wu, wd, bg, None, None, "tanh", "cuda", True)
    assert len(calls["bwd"]) == 1 and len(calls["train"]) == 1, "ONE_CALL = False: no compiled call"
    ref = kernel.reference.geglu_mlp_ref(x.view(m, h), wg, wu, wd, bg, None, None, approximate="tanh")
    assert torch.allclose(y, ref.float(), rtol=1e-4, atol=1e-4) and torch.allclose(gate, F.linear(x.view(m, h), wg, bg))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(37, 200), (4, 8), (3, 13)], ids=str)
def test_backward_pointwise_into_own_buffers(kernel, device, backend, dtype, shape):
    """``_bwd_h`` (the traced backward's pointwise: gradients to buffers of their own, h over dh)
    gives the in-place pointwise's bits and leaves gate/up as they were, on every backend; (3, 13)
    is not a whole number of 16-byte packs, the kernels' unvectorized branch."""
    _skip_unless(kernel, device, backend, dtype)
    geglu = importlib.import_module(kernel.__name__ + ".geglu")
    gate, up, dh = (randn(*shape, dtype=dtype, device=device) for _ in range(3))
    kept = [gate.clone(), up.clone()]
    dgate, dup, h = torch.empty_like(gate), torch.empty_like(up), dh.clone()
    geglu._bwd_h(dgate, dup, h, gate, up, "tanh", backend)
    assert torch.equal(gate, kept[0]) and torch.equal(up, kept[1])
    g2, u2, d2 = kept[0].clone(), kept[1].clone(), dh.clone()
    geglu._bwd_inplace(g2, u2, d2, "tanh", backend)
    assert torch.equal(dgate, g2) and torch.equal(dup, u2) and torch.equal(h, d2)
    ref_h = F.gelu(gate.double(), approximate="tanh") * up.double()
    assert_close(h, ref_h, (F.gelu(gate, approximate="tanh") * up), "h")


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("one_call", [True, False], ids=["one_call_size", "above_bound"])
def test_traced_backward_keeps_the_saved_preactivations(kernel, device, monkeypatch, backend, dtype, one_call):
    """The functional backward (``geglu_mlp_bwd_op``, what a compiled training step runs) leaves the
    saved gate/up as they were and gives the bits of the eager backward, which overwrites them with
    their gradients in place. On either side of the one-call bound it writes the gradients to buffers
    of their own in one pass: no copy of gate/up first (``aten::clone``), which cost a compiled Gemma
    training step 2 x M x I copies per layer; with the CUDA pointwise that is one compiled call
    (``geglu_mlp_gemm_bwd_keep``) at any size."""
    if backend != "auto":
        _skip_unless(kernel, device, backend, dtype)
    mlp = importlib.import_module(kernel.__name__ + ".mlp")
    monkeypatch.delenv("FUSED_GEGLU_BACKEND", raising=False)
    m, h, i = 37, 48, 200
    if not one_call:
        monkeypatch.setattr(mlp, "ONE_CALL_BWD_MAX_ELEMS", m * i - 1)
    x = randn(m, h, dtype=dtype, device=device)
    wg, wu, wd, bg, bu, bd = [p.detach() for p in _params(h, i, dtype, device, True)]
    gate, up = F.linear(x, wg, bg), F.linear(x, wu, bu)
    kept = [gate.clone(), up.clone()]
    dy = randn(m, h, dtype=dtype, device=device)
    op = getattr(torch.ops, kernel.OPS_ID).geglu_mlp_bwd_op
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        traced = op(dy, x, wg, wu, wd, bg, bu, gate, up, "tanh", False, True, backend)
    assert torch.equal(gate, kept[0]) and torch.equal(up, kept[1]), "the saved gate/up were overwritten"
    eager = mlp._mlp_backward(dy, x, wg, wu, wd, bg, bu, [kept[0].clone(), kept[1].clone()], "tanh", False, True,
                              backend, inplace=True)
    names = ["dx", "dW_gate", "dW_up", "dW_down", "db_gate", "db_up", "db_down"]
    for name, a, b in zip(names, traced, eager):
        assert torch.equal(a, b), f"{name}: the traced backward differs from the in-place one"
    keys = [e.key for e in prof.key_averages()]
    assert "aten::clone" not in keys, "gate/up were copied before the backward's pointwise"
    if backend == "cuda" and device == "cuda":
        assert any(k.endswith("::geglu_mlp_gemm_bwd_keep") for k in keys), "not the one-call keep form"
    if backend == "cuda" and device == "cuda":  # the kernel refuses gradients written over its inputs
        ops = getattr(torch.ops, kernel.OPS_ID)
        with pytest.raises(RuntimeError, match="single memory location"):
            ops.geglu_bwd_h(gate, torch.empty_like(up), torch.empty_like(gate), gate, up, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("biases", ["all", "up_only", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
def test_geglu_mlp_cublas_training_one_call_matches_python(kernel, device, monkeypatch, biases, dtype, recompute):
    """The cuBLAS + pointwise training step from compiled calls (geglu_mlp_gemm_train forward,
    geglu_mlp_gemm_bwd backward) gives the bits of the same sequence issued from Python
    (mlp.ONE_CALL = False), and is right against float64. Any CUDA GPU; the auto policy with the sm90
    GEMM switched off takes this path at this size."""
    _skip_without_compiled_cuda(kernel, device)
    monkeypatch.setenv("FUSED_GEGLU_SM90_MLP", "no")
    monkeypatch.delenv("FUSED_GEGLU_BACKEND", raising=False)
    mlp = importlib.import_module(kernel.__name__ + ".mlp")
    m, h, i = 45, 264, 392
    x, wg, wu, wd, bg, bu, bd = _inference_operands(dtype, device, (3, m), h, i, biases)
    args = [x, wg, wu, wd, bg, bu, bd]
    grad = randn(3, m, h, dtype=dtype, device=device)
    results = {}
    for one_call in (True, False):
        monkeypatch.setattr(mlp, "ONE_CALL", one_call)
        leaves = [None if a is None else a.clone().requires_grad_() for a in args]
        y = kernel.geglu_mlp(*leaves, approximate="tanh", recompute=recompute)
        assert kernel.last_backend("geglu_mlp") == "cuda+gemm"
        grads = torch.autograd.grad(y, [a for a in leaves if a is not None], grad)
        assert kernel.last_backend("geglu_mlp_backward") == "cuda"
        results[one_call] = (y.detach(), *grads)
        if one_call:
            _assert_output_and_grads(kernel, kernel.geglu_mlp(*leaves, approximate="tanh", recompute=recompute),
                                     leaves, "tanh", f"one-call training, biases {biases}")
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b), "compiled calls and the Python sequence differ"


def _assert_output_and_grads(kernel, y, args, approximate, what):
    """y and the gradient of every tensor in ``args`` = [x, w_gate, w_up, w_down, b_gate, b_up,
    b_down] (a bias may be None: no gradient for it), for a random upstream gradient, against
    float64, with eager's error in y's dtype as the yardstick."""
    names = ["dx", "dW_gate", "dW_up", "dW_down", "db_gate", "db_up", "db_down"]
    present = [k for k, a in enumerate(args) if a is not None]
    leaves = [args[k] for k in present]
    grad = randn(*y.shape, dtype=y.dtype, device=y.device)
    ours = torch.autograd.grad(y, leaves, grad)
    a64 = [None if a is None else a.detach().double().requires_grad_() for a in args]
    ref_y = kernel.reference.geglu_mlp_ref(*a64, approximate=approximate)
    eager_y = _eager(*args, approximate)
    assert_close(y, ref_y, eager_y, f"{what} y")
    refs = torch.autograd.grad(ref_y, [a64[k] for k in present], grad.double())
    eagers = torch.autograd.grad(eager_y, leaves, grad)
    for k, o, r, e in zip(present, ours, refs, eagers):
        assert_close(o, r, e, f"{what} {names[k]}")


@pytest.mark.gpu
def test_geglu_mlp_sm90_sees_in_place_weight_updates(kernel, device):
    """After an in-place update of a weight (what an optimizer step does) the CUTLASS path must
    compute with the new values (it reads the weights where they are; an earlier version kept a
    repacked copy, keyed on the weights' version counters)."""
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS gate+up GEMM is sm_90 only")
    m, h, i = 256, 128, 192
    x = randn(m, h, dtype=torch.bfloat16, device=device)
    params = [p.detach() for p in _params(h, i, torch.bfloat16, device, biases=False)[:3]]
    wg, wu, wd = params
    with torch.no_grad():
        for step, update in enumerate((None, lambda: wg.mul_(-0.5), lambda: wu.add_(randn(i, h, device=device,
                                                                                       dtype=wu.dtype, scale=0.1)))):
            if update is not None:
                update()
            y = kernel.geglu_mlp(x, wg, wu, wd, approximate="tanh", backend="cuda")
            assert kernel.last_backend("geglu_mlp") == "cuda:sm90"
            ref = kernel.reference.geglu_mlp_ref(x, wg, wu, wd, approximate="tanh")
            assert_close(y, ref, _eager(x, wg, wu, wd, None, None, None, "tanh"), f"after update {step}")


def _inference_operands(dtype, device, lead, h, i, biases):
    """x [*lead, h] and the MLP's weights, detached, with the biases ``biases`` names ("all",
    "gate_only", "up_only" or "none"; the others None)."""
    x = randn(*lead, h, dtype=dtype, device=device)
    wg, wu, wd, bg, bu, bd = [p.detach() for p in _params(h, i, dtype, device, biases=True)]
    keep = {"all": (1, 1, 1), "gate_only": (1, 0, 0), "up_only": (0, 1, 0), "none": (0, 0, 0)}[biases]
    return (x, wg, wu, wd, *(b if k else None for b, k in zip((bg, bu, bd), keep)))


@pytest.mark.gpu
@pytest.mark.parametrize("biases", ["all", "up_only", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_geglu_mlp_sm90_one_call_matches_two(kernel, device, biases, dtype):
    """The inference forward runs both GEMMs from one compiled call (geglu_mlp_sm90: host time per
    call is what an eager decode step waits on). It must give the bits of the gate+up op followed
    by F.linear, which it replaces, and be right against float64; a w_down of the wrong shape is
    an error naming it."""
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS gate+up GEMM is sm_90 only")
    m, h, i = 77, 264, 392
    x, wg, wu, wd, bg, bu, bd = _inference_operands(dtype, device, (3, m), h, i, biases)
    ops = getattr(torch.ops, kernel.OPS_ID)
    with torch.no_grad():
        y = kernel.geglu_mlp(x, wg, wu, wd, bg, bu, bd, approximate="tanh", backend="cuda")
        assert kernel.last_backend("geglu_mlp") == "cuda:sm90"
        x2 = x.reshape(-1, h)
        sm90 = importlib.import_module(kernel.__name__ + ".sm90_weights")
        hid, _, _ = sm90.gateup_sm90(ops, x2, wg, wu, bg, bu, "tanh")
        two = F.linear(hid, wd, bd)
    assert y.shape == (3, m, h)
    assert torch.equal(y.reshape(-1, h), two), "one call and two calls differ"
    ref = kernel.reference.geglu_mlp_ref(x, wg, wu, wd, bg, bu, bd, approximate="tanh")
    assert_close(y, ref, _eager(x, wg, wu, wd, bg, bu, bd, "tanh"), f"one call, biases {biases}")
    with pytest.raises(RuntimeError, match="w_down must be"):
        ops.geglu_mlp_sm90(x2, wg, wu, wd[:, :-8], bg, bu, bd, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("biases", ["all", "gate_only", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_geglu_mlp_cublas_one_call_matches_four(kernel, device, monkeypatch, biases, dtype):
    """The cuBLAS + pointwise inference forward also runs from one compiled call (geglu_mlp_gemm):
    the same bits as F.linear, F.linear, geglu_fwd writing h over gate, F.linear, and right
    against float64. Any CUDA GPU. The auto policy with the sm90 GEMM switched off takes it (a
    forced backend="cuda" runs the CUTLASS GEMM wherever its operands allow)."""
    _skip_without_compiled_cuda(kernel, device)
    monkeypatch.setenv("FUSED_GEGLU_SM90_MLP", "no")
    monkeypatch.delenv("FUSED_GEGLU_BACKEND", raising=False)
    m, h, i = 45, 264, 392
    x, wg, wu, wd, bg, bu, bd = _inference_operands(dtype, device, (2, m), h, i, biases)
    ops = getattr(torch.ops, kernel.OPS_ID)
    with torch.no_grad():
        y = kernel.geglu_mlp(x, wg, wu, wd, bg, bu, bd, approximate="none")
        assert kernel.last_backend("geglu_mlp") == "cuda+gemm"
        x2 = x.reshape(-1, h)
        gate, up = F.linear(x2, wg, bg), F.linear(x2, wu, bu)
        ops.geglu_fwd(gate, gate, up, 0)
        four = F.linear(gate, wd, bd)
    assert torch.equal(y.reshape(-1, h), four), "one call and four calls differ"
    ref = kernel.reference.geglu_mlp_ref(x, wg, wu, wd, bg, bu, bd, approximate="none")
    assert_close(y, ref, _eager(x, wg, wu, wd, bg, bu, bd, "none"), f"cuBLAS one call, biases {biases}")


@pytest.mark.gpu
def test_sm90_knobs_reject_bad_values(kernel, device, monkeypatch):
    """A misspelt tile or order is an error naming the variable, not a silent default."""
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS gate+up GEMM is sm_90 only")
    x = randn(16, 64, dtype=torch.bfloat16, device=device)
    params = [p.detach() for p in _params(64, 64, torch.bfloat16, device, biases=False)[:3]]
    for var, bad in (("FUSED_GEGLU_SM90_TILE", "64x64"), ("FUSED_GEGLU_SM90_SWIZZLE", "3"),
                     ("FUSED_GEGLU_SM90_RASTER", "diagonal")):
        with monkeypatch.context() as mp:
            mp.setenv(var, bad)
            with pytest.raises(RuntimeError, match=var), torch.no_grad():
                kernel.geglu_mlp(x, *params, backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("launch", ["s1", "s8", "s2n"])
@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
def test_geglu_mlp_sm90_dh_backward(kernel, device, monkeypatch, dtype, approximate, launch, recompute):
    """The backward's dh GEMM with the GeGLU-backward epilogue (kernel_src/gemm_sm90/geglu_dh_sm90.h),
    forced at each tile order: every gradient against float64, M and I not multiples of the tile."""
    _skip_unless_sm90_compiled(kernel, device, "the CUTLASS dh GEMM is sm_90 only")
    monkeypatch.setenv("FUSED_GEGLU_SM90_DH", launch)
    m, h, i = 333, 264, 392
    x = randn(m, h, dtype=dtype, device=device, requires_grad=True)
    params = _params(h, i, dtype, device, biases=True)
    y = kernel.geglu_mlp(x, *params, approximate=approximate, recompute=recompute, backend="cuda")
    _assert_output_and_grads(kernel, y, [x, *params], approximate, f"geglu_mlp sm90 dh {launch}")
    assert kernel.last_backend("geglu_mlp_backward") == "cuda:sm90"


@pytest.mark.gpu
def test_geglu_mlp_sm90_dh_off_is_the_pointwise_path(kernel, device, monkeypatch):
    """$FUSED_GEGLU_SM90_DH=0 turns the fused dh off: cuBLAS dh + the in-place pointwise kernel."""
    _skip_without_compiled_cuda(kernel, device)
    monkeypatch.setenv("FUSED_GEGLU_SM90_DH", "0")
    x = randn(40, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    params = _params(64, 96, torch.bfloat16, device, biases=False)[:3]
    kernel.geglu_mlp(x, *params, backend="cuda").sum().backward()
    assert kernel.last_backend("geglu_mlp_backward") == "cuda"


@pytest.mark.parametrize("seed", range(32))
def test_geglu_mlp_random_operands(kernel, device, seed):
    """What a user gets (``backend=None``) on operands drawn at random per seed, in combinations the
    grids above do not cross: dtype, GELU flavour, odd or model-like sizes, 1- to 3-D x (sequence-first
    views included), x and weights contiguous, row-padded or strided, each bias present or not, any
    subset of leaves needing a gradient (or none), ``recompute``. Forward and every gradient against
    float64, within the dtype's bound relative to eager."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = rng.choice(DTYPES)
    approximate = rng.choice(["tanh", "none"])
    if device == "cuda" and rng.random() < 0.5:  # sizes where the compiled and CUTLASS paths run
        h, i, lead = 8 * rng.randint(8, 64), 8 * rng.randint(8, 96), (rng.randint(17, 300),)
    else:
        h, i = rng.randint(1, 70), rng.randint(1, 90)
        lead = rng.choice([(rng.randint(0, 9),), (rng.randint(1, 4), rng.randint(1, 7)), (2, 1, 3)])
    if seed == 0:
        lead = (2, 0)  # no rows, every gradient asked for
    layouts = ["contiguous", "row_padded", "strided"]
    x = laid_out((*lead, h), dtype, device, rng.choice(layouts), gen)
    if x.dim() == 3 and rng.random() < 0.3:
        x = x.transpose(0, 1)  # a sequence-first tensor seen batch-first
    wl = rng.choice(layouts)
    params = [laid_out((i, h), dtype, device, wl, gen, h**-0.5), laid_out((i, h), dtype, device, wl, gen, h**-0.5),
              laid_out((h, i), dtype, device, rng.choice(layouts), gen, i**-0.5)]
    params += [randn(n, dtype=dtype, device=device, scale=0.5, gen=gen) if rng.random() < 0.5 else None
               for n in (i, i, h)]
    operands = [x, *params]
    needs = [t is not None and (seed == 0 or rng.random() < 0.6) for t in operands]
    for t, need in zip(operands, needs):
        if need:
            t.requires_grad_()
    recompute = any(needs) and rng.random() < 0.3
    case = (f"seed {seed}: {dtype}, {approximate}, x {tuple(x.shape)} strides {x.stride()}, I {i}, weights {wl}, "
            f"biases {[p is not None for p in params[3:]]}, grads {needs}, recompute {recompute}")

    y = kernel.geglu_mlp(*operands, approximate=approximate, recompute=recompute)
    assert y.shape == (*x.shape[:-1], h) and y.dtype == dtype, case
    o64 = [None if t is None else t.detach().double().requires_grad_(need) for t, need in zip(operands, needs)]
    ref = kernel.reference.geglu_mlp_ref(*o64, approximate=approximate)
    eager = _eager(*operands, approximate)
    names = ("dx", "dW_gate", "dW_up", "dW_down", "db_gate", "db_up", "db_down")
    assert_step_close(y, ref, eager, operands, o64, names, case, gen)


@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_geglu_mlp_under_autocast_casts_as_f_linear(kernel, device, backend, amp_dtype, bias):
    """Under torch.autocast, geglu_mlp computes what the eager MLP computes there (each projection's
    operands cast to the autocast dtype by F.linear, GELU and the product on its outputs): the result in
    the autocast dtype, float32 gradients for float32 leaves, each within twice eager's error against
    float64, on every backend (until 2026-12-05 the dtype depended on the backend)."""
    if backend is not None:
        _skip_unless(kernel, device, backend, amp_dtype)
    g = torch.Generator().manual_seed(7)
    h, i = 40, 72
    x = randn(4, 16, h, device=device, requires_grad=True, gen=g)
    ws = [randn(i, h, device=device, scale=h**-0.5, requires_grad=True, gen=g),
          randn(i, h, device=device, scale=h**-0.5, requires_grad=True, gen=g),
          randn(h, i, device=device, scale=i**-0.5, requires_grad=True, gen=g)]
    bs = [randn(n, device=device, requires_grad=True, gen=g) if bias else None for n in (i, i, h)]
    leaves = [x, *ws, *(t for t in bs if t is not None)]
    dy = randn(4, 16, h, device=device, gen=g)

    def run(fn):
        for t in leaves:
            t.grad = None
        with torch.autocast(device, dtype=amp_dtype):
            y = fn()
        y.backward(dy.to(y.dtype))
        return y.detach(), [t.grad.clone() for t in leaves]

    def eager():
        return F.linear(F.gelu(F.linear(x, ws[0], bs[0]), approximate="tanh") * F.linear(x, ws[1], bs[1]), ws[2], bs[2])

    expected, eager_grads = run(eager)
    got, grads = run(lambda: kernel.geglu_mlp(x, *ws, *bs, approximate="tanh", backend=backend))
    assert got.dtype == expected.dtype == amp_dtype
    assert all(g.dtype == torch.float32 for g in grads)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(leaves64[4:])
    b64 = [next(it) if t is not None else None for t in bs]
    ref = kernel.reference.geglu_mlp_ref(leaves64[0], *leaves64[1:4], *b64, "tanh")
    ref_grads = torch.autograd.grad(ref, leaves64, dy.double())
    assert_close(got, ref, expected, "output")
    for k, (g, r, e) in enumerate(zip(grads, ref_grads, eager_grads)):
        assert_close(g, r, e, f"gradient {k}")


@pytest.mark.parametrize("backend", [None, *BACKENDS])
@pytest.mark.parametrize("op", ["geglu_mlp", "linear"])
@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cache", [True, False], ids=["cache", "nocache"])
def test_autocast_casts_each_float32_parameter_once_per_region_as_f_linear(kernel, device, backend, op,
                                                                          amp_dtype, cache):
    """Under one ``torch.autocast`` region, ``geglu_mlp`` and ``linear`` cast each float32 parameter as
    often as autocast's ``F.linear`` does: once for the region through autocast's weight cache (a decode
    loop inside one region then reads the half-precision copy each step), once per call with
    ``cache_enabled=False``. Until 2026-12-05 they cast every call (2.7x eager's time for a decode-sized
    MLP on the development CPU). The noarch variant has no compiled library and casts per call."""
    if backend is not None:
        _skip_unless(kernel, device, backend, amp_dtype)
    if not kernel._ops.HAS_COMPILED_OPS:
        pytest.skip("the noarch variant has no compiled autocast_cast op: it casts per call")
    h, i = 24, 40
    params = _params(h, i, torch.float32, device, biases=True)
    if op == "linear":
        params = [params[0], params[3]]
        ours = lambda x: kernel.linear(x, *params, activation="gelu_tanh", backend=backend)  # noqa: E731
        eager = lambda x: F.gelu(F.linear(x, *params), approximate="tanh")  # noqa: E731
    else:
        ours = lambda x: kernel.geglu_mlp(x, *params, approximate="tanh", backend=backend)  # noqa: E731
        eager = lambda x: _eager(x, *params, "tanh")  # noqa: E731
    xs = [randn(3, h, device=device) for _ in range(3)]

    def casts(fn):
        counter = CastCounter(params)
        with torch.autocast(device, dtype=amp_dtype, cache_enabled=cache), counter:
            ys = [fn(x) for x in xs]
        return counter.casts, ys

    (n_eager, ys_eager), (n_ours, ys_ours) = casts(eager), casts(ours)
    assert n_eager == len(params) * (1 if cache else len(xs))  # the premise: what autocast's cache does
    assert n_ours == n_eager
    for y, e in zip(ys_ours, ys_eager):
        assert y.dtype == e.dtype == amp_dtype
        torch.testing.assert_close(y.float(), e.float(), rtol=0.05, atol=0.05)  # sanity; accuracy: tests above
    # The copies the cache made carry autograd: a backward from the last call reaches every parameter.
    with torch.autocast(device, dtype=amp_dtype, cache_enabled=cache):
        ours(xs[0])
        y = ours(xs[1])
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)


def test_autocast_state_survives_an_error_inside(kernel, device):
    """The autocast paths switch autocast off around the fused call and back on (eagerly, by the flag
    itself): an error raised inside (a bad shape here) must leave autocast as it was."""
    params = _params(24, 40, torch.float32, device, biases=False)[:3]
    with torch.autocast(device, dtype=torch.bfloat16):
        with pytest.raises(ValueError):
            kernel.geglu_mlp(randn(3, 23, device=device), *params)
        with pytest.raises(ValueError):
            kernel.linear(randn(3, 23, device=device), params[0])
        assert torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16
        assert kernel.geglu_mlp(randn(3, 24, device=device), *params).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled(device)
