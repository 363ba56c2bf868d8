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


def test_backend_environment_is_read_on_every_call(kernel, device, compiled, monkeypatch):
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
    assert type(yp.grad_fn).__name__ == "FusedLinearBackward", yp.grad_fn.name()
    assert torch.equal(yp.detach(), y)
    # Its backward is the op path's own GEMMs and fp32 bias sum, not ATen's: right, not the same bits.
    for name, g, r, e in zip(("dx", "dW", "db"), torch.autograd.grad(yp, leaves, torch.ones_like(yp)), r64, re):
        assert_close(g, r, e, f"linear {activation} {layout} {name}, Python node")


# ---- geglu_mlp: the no-graph call as one compiled entry (kernel_src/autograd_nodes/mlp_infer.cpp) ----

def _skip_without_mlp_entry(kernel, device):
    if not _mod(kernel, "_dispatch").compiled_has_autograd("geglu_mlp_infer", device):
        pytest.skip(f"this variant has no compiled MLP entry for {device} tensors")


def _mlp_params(h, i, dtype, device, biases: str, requires_grad: bool = True):
    """Weights with the scale of an initialised layer (the module's own tensors need grad); biases
    ``"none"``, ``"gate"`` (only b_gate: the sm90 kernel takes both or neither, so the entry zero-fills
    b_up) or ``"all"``."""
    ws = [randn(*s, dtype=dtype, device=device, scale=s[1] ** -0.5, requires_grad=requires_grad)
          for s in ((i, h), (i, h), (h, i))]
    present = {"none": (), "gate": (0,), "all": (0, 1, 2)}[biases]
    bs = [randn(n, dtype=dtype, device=device, scale=0.5, requires_grad=requires_grad) if k in present else None
          for k, n in enumerate((i, i, h))]
    return [*(torch.nn.Parameter(w, requires_grad=requires_grad) for w in ws), *bs]


def _mlp_eager(x, wg, wu, wd, bg, bu, bd, approximate):
    return F.linear(F.gelu(F.linear(x, wg, bg), approximate=approximate) * F.linear(x, wu, bu), wd, bd)


def _refuse_general_path(monkeypatch, mlp_mod):
    def refuse(*args):
        raise AssertionError("geglu_mlp's general path ran where the compiled entry should have")

    monkeypatch.setattr(mlp_mod, "_forward", refuse)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [((3, 5), 64, 128), ((37,), 67, 45), ((1,), 8, 16)], ids=str)
@pytest.mark.parametrize("biases", ["none", "gate", "all"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "no_leaf"])
def test_mlp_no_graph_call_runs_one_compiled_entry(kernel, device, monkeypatch, dtype, approximate, shape, biases,
                                                   mode):
    """geglu_mlp with nothing to record, under the auto policy: one geglu_mlp_infer call, which runs the
    sequence the general path picks at this size (the sm90 gate+up GEMM + cuBLAS on Hopper where the
    policy names a launch, else vendor GEMMs around the compiled pointwise) with the same bits, right
    against float64; and no general-path Python ran."""
    _skip_without_mlp_entry(kernel, device)
    for name in ("FUSED_GEGLU_BACKEND", "FUSED_GEGLU_CUBLASLT", "FUSED_GEGLU_SM90_MLP"):
        monkeypatch.delenv(name, raising=False)
    mlp = _mod(kernel, "mlp")
    lead, h, i = shape
    x = randn(*lead, h, dtype=dtype, device=device)
    params = _mlp_params(h, i, dtype, device, biases, requires_grad=mode != "no_leaf")
    with torch.no_grad():
        general = mlp._forward(x, *params, approximate, False, "auto")[0]
    general_backend = kernel.last_backend("geglu_mlp")
    ctx = torch.inference_mode() if mode == "inference_mode" else torch.no_grad() if mode == "no_grad" \
        else torch.enable_grad()
    with monkeypatch.context() as m, ctx:
        _refuse_general_path(m, mlp)
        y = kernel.geglu_mlp(x, *params, approximate=approximate)
    assert kernel.last_backend("geglu_mlp") == general_backend
    assert general_backend in ("cpu+gemm", "cuda+gemm", "cuda:sm90"), general_backend
    assert y.shape == (*lead, h) and y.grad_fn is None
    assert torch.equal(y, general), "the compiled entry and the general path differ"
    det = [None if p is None else p.detach() for p in params]
    ref = kernel.reference.geglu_mlp_ref(x.double(), *(None if p is None else p.double() for p in det),
                                         approximate=approximate)
    assert_close(y, ref, _mlp_eager(x, *det, approximate), f"geglu_mlp entry {biases}")


def test_mlp_entry_declines_to_the_general_path(kernel, device, monkeypatch):
    """What the entry does not take runs the general path, with its results and its named errors: a
    call that records a graph, a non-contiguous x (copied there), a weight with a strided last dim, a
    backend or an environment override, a tensor subclass; mixed devices reach the named check."""
    _skip_without_mlp_entry(kernel, device)
    for name in ("FUSED_GEGLU_BACKEND", "FUSED_GEGLU_CUBLASLT", "FUSED_GEGLU_SM90_MLP"):
        monkeypatch.delenv(name, raising=False)
    mlp = _mod(kernel, "mlp")
    calls = []
    general = mlp._forward
    monkeypatch.setattr(mlp, "_forward", lambda *a: calls.append(1) or general(*a))
    h, i = 64, 128
    params = _mlp_params(h, i, torch.float32, device, "all")
    x = randn(4, 3, h, device=device)
    det = [p.detach() for p in params]
    ref = _mlp_eager(x.double(), *(p.double() for p in det), "tanh")

    def check(y, what, ran_general=True):
        assert_close(y, ref, _mlp_eager(x, *det, "tanh"), what)
        assert calls == ([1] if ran_general else []), f"{what}: general path ran {len(calls)} times"
        calls.clear()

    with torch.no_grad():
        check(kernel.geglu_mlp(x, *params), "entry", ran_general=False)
        check(kernel.geglu_mlp(x.transpose(0, 1).contiguous().transpose(0, 1), *params), "non-contiguous x")
        wg_t = det[0].t().contiguous().t()  # same values, last-dim stride I
        check(kernel.geglu_mlp(x, wg_t, *det[1:]), "strided w_gate")
        check(kernel.geglu_mlp(x, *params, backend=kernel.last_backend("geglu_mlp").split("+")[0].split(":")[0]),
              "explicit backend")
        monkeypatch.setenv("FUSED_GEGLU_BACKEND", "torch")
        check(kernel.geglu_mlp(x, *params), "environment backend")
        assert kernel.last_backend("geglu_mlp") == "torch+gemm"
        monkeypatch.delenv("FUSED_GEGLU_BACKEND")
        monkeypatch.setenv("FUSED_GEGLU_SM90_MLP", "no")
        check(kernel.geglu_mlp(x, *params), "sm90 launch override")
        monkeypatch.delenv("FUSED_GEGLU_SM90_MLP")

        class Marked(torch.Tensor):
            pass

        assert mlp._infer(x.as_subclass(Marked), *det, "tanh") is None
        with pytest.raises(ValueError, match="w_gate is on meta"):
            kernel.geglu_mlp(x, det[0].to("meta"), *det[1:])
        calls.clear()
        with pytest.raises(ValueError, match="approximate must be"):
            kernel.geglu_mlp(x, *params, approximate="fast")
        for bad_args, message in (((det[0].reshape(-1), *det[1:]), "w_gate"),
                                  ((det[0][:, :-1], *det[1:]), "features"),
                                  ((det[0], det[1][:-1], *det[2:]), "w_up")):
            with pytest.raises((ValueError, TypeError), match=message):
                kernel.geglu_mlp(x, *bad_args)
        calls.clear()
    # Grad enabled and the weights require grad: a graph. The entry would decline it after its
    # dispatch, so it is not asked at all (host time that every small training step waited on).
    real_ops = mlp.ops

    class NoEntry:
        def __getattr__(self, name):
            if name == "geglu_mlp_infer":
                raise AssertionError("a call that records a graph was offered to geglu_mlp_infer")
            return getattr(real_ops, name)

    monkeypatch.setattr(mlp, "ops", NoEntry())
    for what, args in (("weights require grad", (x, *params)),
                       ("only x requires grad", (x.detach().requires_grad_(), *det))):
        y = kernel.geglu_mlp(*args)
        assert y.grad_fn is not None, what
        assert_close(y, ref, _mlp_eager(x, *det, "tanh"), f"recorded graph, {what}")
    calls.clear()


def test_mlp_entry_op_declines_instead_of_raising(kernel, device):
    """geglu_mlp_infer itself returns None (never raises, never computes) for every call its general
    path has to check or handle: each operand's dtype, device, rank, shape and layout, the GELU code,
    grad, an empty x, and a launch the variant cannot run on this device."""
    _skip_without_mlp_entry(kernel, device)
    ops = _mod(kernel, "_ops").ops
    h, i = 16, 24
    wg, wu, wd, bg, bu, bd = (p.detach() for p in _mlp_params(h, i, torch.float32, device, "all"))
    x = randn(5, h, device=device)
    gemm = (-2, 1, 0)

    def call(*args, code=1, launch=gemm):
        return ops.geglu_mlp_infer(*args, code, *launch)

    with torch.no_grad():
        y = call(x, wg, wu, wd, bg, bu, bd)
        assert y is not None and y.shape == (5, h)
        bad = {
            "GELU code": dict(code=2),
            "x dtype": dict(args=(x.half(), wg, wu, wd, bg, bu, bd)),
            "integer x": dict(args=(x.long(), wg.long(), wu.long(), wd.long(), None, None, None)),
            "float64": dict(args=(x.double(), wg.double(), wu.double(), wd.double(), None, None, None)),
            "x features": dict(args=(x[:, :-1].contiguous(), wg, wu, wd, bg, bu, bd)),
            "w_up shape": dict(args=(x, wg, wu[:-1], wd, bg, bu, bd)),
            "w_down shape": dict(args=(x, wg, wu, wd.t().contiguous(), bg, bu, bd)),
            "w_gate rank": dict(args=(x, wg.reshape(-1), wu, wd, bg, bu, bd)),
            "b_up shape": dict(args=(x, wg, wu, wd, bg, bu[:-1], bd)),
            "b_down 2-D": dict(args=(x, wg, wu, wd, bg, bu, bd[None])),
            "b_gate dtype": dict(args=(x, wg, wu, wd, bg.half(), bu, bd)),
            "x strided": dict(args=(randn(h, 5, device=device).t(), wg, wu, wd, bg, bu, bd)),
            "w_up strided": dict(args=(x, wg, wu.t().contiguous().t(), wd, bg, bu, bd)),
            "empty x": dict(args=(x[:0], wg, wu, wd, bg, bu, bd)),
            "x on meta": dict(args=(x.to("meta"), wg, wu, wd, bg, bu, bd)),
            "w_down on meta": dict(args=(x, wg, wu, wd.to("meta"), bg, bu, bd)),
        }
        if device == "cpu":
            bad["sm90 launch on CPU"] = dict(launch=(5, 1, 0))
        for what, case in bad.items():
            args = case.get("args", (x, wg, wu, wd, bg, bu, bd))
            assert call(*args, code=case.get("code", 1), launch=case.get("launch", gemm)) is None, what
    leaf = wg.clone().requires_grad_()
    assert call(x, leaf, wu, wd, bg, bu, bd) is None, "grad needed"
    with torch.no_grad():
        assert call(x, leaf, wu, wd, bg, bu, bd) is not None, "grad mode off"
