"""Kernel layers: accepted by kernels' own layer validation, and exact where they cannot fuse."""

from __future__ import annotations

import contextlib
import copy
import importlib
from types import MethodType

import pytest
import torch
from fused_geglu_tools import kernels_internals
from torch import nn
from _numerics import assert_close, randn
from conftest import REPO_ID


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


class _PackedHost(nn.Module):
    """ModernBERT's MLP as transformers writes it: one packed ``Wi``, GELU on the first half."""

    calls = 0

    def __init__(self, h, i, act, bias=False, p=0.0):
        super().__init__()
        self.Wi = nn.Linear(h, 2 * i, bias=bias)
        self.act = act
        self.drop = nn.Dropout(p)
        self.Wo = nn.Linear(i, h, bias=bias)

    def forward(self, hidden_states):
        _PackedHost.calls += 1
        input, gate = self.Wi(hidden_states).chunk(2, dim=-1)
        return self.Wo(self.drop(self.act(input) * gate))


@pytest.mark.parametrize("name", ["GeGLUMLP", "T5GeGLUDense", "PackedGeGLUMLP", "LinearBias", "GeluAndMul",
                                  "GeluTanhAndMul"])
def test_layers_pass_kernels_validation(kernel, name):
    _validate_layer = kernels_internals.validate_layer()

    cls = getattr(kernel.layers, name)
    host = {"GeGLUMLP": _HostMLP, "PackedGeGLUMLP": _PackedHost, "LinearBias": nn.Linear}.get(name)
    if host is None:
        class host(nn.Module):  # noqa: N801 - same arity as the layer's forward
            def forward(self, x):
                return x
    _validate_layer(check_cls=host, cls=cls, repo=REPO_ID)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("bias", [False, True])
def test_geglu_mlp_layer_matches_host(kernel, device, approximate, bias):
    host = _HostMLP(24, 40, nn.GELU(approximate=approximate), bias).to(device)
    x = randn(3, 5, 24, device=device)
    expected = host(x)
    host.forward = MethodType(kernel.layers.GeGLUMLP.forward, host)  # what kernelize does
    importlib.import_module(f"{kernel.__name__}._dispatch")._last.pop("geglu_mlp", None)
    got = host(x)
    # The fused op ran (not the host's forward, which gives the same values): what auto picks here.
    want = "cpu+gemm" if device == "cpu" and "cpu" in kernel.available_backends("cpu") else None
    ran = kernel.last_backend("geglu_mlp")
    assert ran is not None and (want is None or ran == want), ran
    ref = kernel.reference.geglu_mlp_ref(x, host.gate_proj.weight, host.up_proj.weight, host.down_proj.weight,
                                         host.gate_proj.bias, host.up_proj.bias, host.down_proj.bias, approximate)
    assert_close(got, ref, expected, "GeGLUMLP layer")


class _SpyHost(_HostMLP):
    """Records every call of the host's own forward."""

    calls = 0

    def forward(self, x):
        _SpyHost.calls += 1  # subclasses count here too
        return super().forward(x)


class _SparsityProperty(_SpyHost):
    @property
    def activation_sparsity(self):  # a class-level name: the layer must see it as getattr does
        return 0.95


class _SparsityBuffer(_SpyHost):
    def __init__(self, *args):
        super().__init__(*args)
        self.register_buffer("activation_sparsity", torch.tensor(0.95))


_DEFER_CASES = ["silu", "sparsity", "sparsity-property", "sparsity-buffer", "dropout-training", "hooked-down-proj",
                "backward-hooked-up-proj", "bias-outside-parameters", "gate-proj-subclass", "float64",
                "spectral-norm-up-proj"]


@pytest.mark.parametrize("case", _DEFER_CASES)
def test_geglu_mlp_layer_defers_to_the_host_where_it_cannot_fuse(kernel, device, case):
    cls = {"sparsity-property": _SparsityProperty, "sparsity-buffer": _SparsityBuffer}.get(case, _SpyHost)
    host = cls(16, 32, nn.SiLU() if case == "silu" else nn.GELU(approximate="tanh"), True).to(device)
    dtype = torch.float64 if case == "float64" else torch.float32  # a dtype the kernels do not compute
    host.to(dtype)
    if case == "sparsity":
        host.activation_sparsity = 0.95  # Gemma3n: the host applies a top-k to gate first
    if case == "dropout-training":
        host.dropout = nn.Dropout(0.5)
        host.train()
    if case == "hooked-down-proj":  # e.g. a tensor-parallel all-reduce after a row-wise down_proj
        host.down_proj.register_forward_hook(lambda mod, args, out: out * 2)
    if case == "backward-hooked-up-proj":  # the fused op would never fire it
        host.up_proj.register_full_backward_hook(lambda mod, gin, gout: None)
    if case == "bias-outside-parameters":  # a plain tensor attribute now: the layer must not drop it
        bias = host.up_proj.bias.detach() + 1
        del host.up_proj.bias
        host.up_proj.bias = bias
    if case == "gate-proj-subclass":
        lin = type("Scaled", (nn.Linear,), {"forward": lambda self, t: 2 * nn.Linear.forward(self, t)})(16, 32)
        host.gate_proj = lin.to(device)
    if case == "spectral-norm-up-proj":  # added after kernelize; in training each read of the weight
        nn.utils.parametrizations.spectral_norm(host.up_proj)  # advances a power iteration
    # Autocast to a dtype the kernels do not compute in (float32 is accepted by autocast on CPU and CUDA).
    autocast = torch.autocast(device, dtype=torch.float32) if case == "autocast-float32" else contextlib.nullcontext()
    x = randn(4, 16, device=device, dtype=dtype)
    twin = copy.deepcopy(host)  # the host's state before the call (spectral_norm's vectors change in it)
    with autocast:
        expected = _HostMLP.forward(twin, x)
        _SpyHost.calls = 0
        got = MethodType(kernel.layers.GeGLUMLP.forward, host)(x)
    assert _SpyHost.calls == 1, "the layer must run the host's own forward here"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_host_attr_is_getattr_without_the_exception(kernel):
    """The layers read host attributes through ``_host_attr`` (no exception for a missing name):
    it must give what ``getattr(module, name, default)`` gives for every place a name can live."""
    layers = importlib.import_module(f"{kernel.__name__}.layers")

    class Host(nn.Module):
        class_level = 3

        def __init__(self):
            super().__init__()
            self.plain = 1.5
            self.sub = nn.ReLU()
            self.param = nn.Parameter(torch.ones(2))
            self.register_buffer("buf", torch.zeros(3))

        @property
        def prop(self):
            return "property"

    host = Host()
    host.class_level = 4  # the instance's value shadows the class's, as getattr sees it
    for name in ("plain", "sub", "param", "buf", "class_level", "prop", "missing", "training"):
        want = getattr(host, name, "default")
        got = layers._host_attr(host, name, "default")
        assert got is want, name


class _T5Host(nn.Module):
    def forward(self, x):
        return self.wo(self.dropout(self.act(self.wi_0(x)) * self.wi_1(x)))


def test_layers_keep_a_float64_host_exact(kernel, device):
    """A float64 model (a reference run, a gradient check) is computed by its own forward through every
    layer, as eager would, rather than refused by the kernels' dtype check."""
    x = randn(3, 5, 24, device=device, dtype=torch.float64)
    host = nn.Linear(24, 40).to(device, torch.float64)
    expected = host(x)
    got = MethodType(kernel.layers.LinearBias.forward, host)(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for cls, approx in (("GeluAndMul", "none"), ("GeluTanhAndMul", "tanh")):
        got = getattr(kernel.layers, cls)()(x)  # the layer class used as a module: the plain math
        want = nn.functional.gelu(x[..., :12], approximate=approx) * x[..., 12:]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    t5 = _T5Host()
    t5.wi_0, t5.wi_1, t5.wo = nn.Linear(24, 32, bias=False), nn.Linear(24, 32, bias=False), nn.Linear(32, 24, bias=False)
    t5.act, t5.dropout = nn.GELU(approximate="tanh"), nn.Dropout(0.0)
    t5.to(device, torch.float64)
    want = t5.wo(t5.dropout(t5.act(t5.wi_0(x)) * t5.wi_1(x)))
    torch.testing.assert_close(MethodType(kernel.layers.T5GeGLUDense.forward, t5)(x), want, rtol=0, atol=0)


@pytest.mark.parametrize("case", ["plain", "no-bias", "autocast", "dtype-mismatch", "forward-hook",
                                  "bias-outside-parameters"])
def test_linear_bias_layer_matches_its_host(kernel, device, case):
    """``LinearBias`` on an ``nn.Linear`` host gives what the host gives: the kernel's linear where it
    computes the same function (under autocast on the operands autocast's linear would cast), the host's
    F.linear on another dtype (where F.linear refuses) or with a bias that is no longer a parameter, and
    the host's own forward hooks either way."""
    host = nn.Linear(24, 40, bias=case != "no-bias").to(device)
    x = randn(3, 5, 24, device=device, dtype=torch.float16 if case == "dtype-mismatch" else torch.float32)
    if case == "forward-hook":
        host.register_forward_hook(lambda mod, args, out: out * 2)
    if case == "bias-outside-parameters":  # a plain tensor attribute: F.linear(x, w, self.bias) still adds it
        bias = host.bias.detach() + 1
        del host.bias
        host.bias = bias
    autocast = torch.autocast(device, dtype=torch.bfloat16) if case == "autocast" else contextlib.nullcontext()
    with autocast:
        if case == "dtype-mismatch":
            with pytest.raises(RuntimeError):
                host(x)
        else:
            expected = host(x)
        host.forward = MethodType(kernel.layers.LinearBias.forward, host)  # what kernelize does
        importlib.import_module(f"{kernel.__name__}._dispatch")._last.pop("linear", None)
        if case == "dtype-mismatch":
            with pytest.raises(RuntimeError):  # F.linear's own refusal, as the host's
                host(x)
            return
        got = host(x)
    assert got.dtype == expected.dtype
    assert (kernel.last_backend("linear") is None) == (case == "bias-outside-parameters"), "which path ran"
    if case == "bias-outside-parameters":  # the host's own F.linear: the same call
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        return
    ref = kernel.reference.linear_ref(x, host.weight.detach(), None if host.bias is None else host.bias.detach())
    assert_close(got, ref * (2 if case == "forward-hook" else 1), expected, case)


@pytest.mark.parametrize("where", ["act_fn", "dropout"])
def test_geglu_mlp_layer_keeps_hooks_on_the_activation(kernel, device, where):
    """A hook on the host's activation (or dropout), added after kernelize as activation patching and
    steering tools do: the fused op never calls that module, so the layer runs the host's forward and
    the hook fires, as before kernelize. Until then the hook was silently skipped."""
    host = _SpyHost(16, 32, nn.GELU(approximate="tanh"), False).to(device)
    host.dropout = nn.Dropout(0.0)
    fired = []
    getattr(host, where).register_forward_hook(lambda mod, args, out: fired.append(1) or out * 0.5)
    x = randn(4, 16, device=device)
    expected = host(x) if where == "act_fn" else host.down_proj(host.act_fn(host.gate_proj(x)) * host.up_proj(x))
    fired.clear()
    _SpyHost.calls = 0
    got = MethodType(kernel.layers.GeGLUMLP.forward, host)(x)
    assert _SpyHost.calls == 1 and fired == ([1] if where == "act_fn" else []), (fired, _SpyHost.calls)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


class _LongT5Like(_T5Host):
    """A T5-family host that calls wo on h without casting it to wo's dtype (LongT5's forward)."""


_LongT5Like.__name__ = "LongT5DenseGatedActDense"


class _T5Like(_T5Host):
    """transformers' T5DenseGatedActDense.forward as it is (it reads wo.weight for its cast)."""

    def forward(self, x):
        h = self.dropout(self.act(self.wi_0(x)) * self.wi_1(x))
        if isinstance(self.wo.weight, torch.Tensor) and h.dtype != self.wo.weight.dtype and self.wo.weight.dtype != torch.int8:
            h = h.to(self.wo.weight.dtype)
        return self.wo(h)


def test_t5_layer_keeps_a_non_casting_host_exact_when_wo_dtype_differs(kernel, device):
    """LongT5 does not cast h to wo's dtype: with wo moved to float32 after kernelize its forward raises,
    and so must the layer (it keeps the host's forward), not return a result the host would not."""
    host = _LongT5Like()
    host.wi_0, host.wi_1 = nn.Linear(16, 32, bias=False), nn.Linear(16, 32, bias=False)
    host.wo = nn.Linear(32, 16, bias=False)
    host.act, host.dropout = nn.GELU(approximate="tanh"), nn.Dropout(0.0)
    host.to(device, torch.bfloat16)
    x = randn(4, 16, device=device, dtype=torch.bfloat16)
    layer_forward = MethodType(kernel.layers.T5GeGLUDense.forward, host)
    torch.testing.assert_close(layer_forward(x).float(), host(x).float(), rtol=2e-2, atol=2e-2)
    host.wo.float()
    with pytest.raises(RuntimeError, match="dtype"):
        host(x)
    with pytest.raises(RuntimeError, match="dtype"):
        layer_forward(x)


@pytest.mark.parametrize("host_cls", ["T5", "LongT5"])
def test_t5_layer_reads_a_parametrized_wo_as_often_as_its_host(kernel, device, host_cls):
    """spectral_norm put on wo after kernelize: in training every read of wo.weight advances its power
    iteration, so the layer must leave wo to the host's forward (until 2026-12-05 it ran the fused GeGLU
    and then T5's tail, which reads wo.weight fewer times than T5's forward; LongT5's dtype check read it
    once more)."""
    host = _LongT5Like() if host_cls == "LongT5" else _T5Like()
    host.wi_0, host.wi_1 = nn.Linear(16, 32, bias=False), nn.Linear(16, 32, bias=False)
    host.wo = nn.Linear(32, 16, bias=False)
    host.act, host.dropout = nn.GELU(approximate="tanh"), nn.Dropout(0.0)
    host.to(device)
    nn.utils.parametrizations.spectral_norm(host.wo)
    twin = copy.deepcopy(host)
    x = randn(4, 16, device=device)
    got = MethodType(kernel.layers.T5GeGLUDense.forward, host)(x)
    torch.testing.assert_close(got, twin(x), rtol=0, atol=0)
    torch.testing.assert_close(host.wo.parametrizations.weight[0]._u, twin.wo.parametrizations.weight[0]._u,
                               rtol=0, atol=0)


@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", ["gemma-tanh", "gemma-exact-bias", "t5", "t5-dropout", "packed-bias", "packed-dropout"])
def test_layers_run_fused_under_autocast(kernel, device, amp_dtype, case):
    """A float32 model under torch.autocast (Trainer's bf16=True): the host's projections run autocast's
    linear (every operand cast to the autocast dtype), and so does the layer, fused: the output in the
    autocast dtype, float32 gradients for float32 parameters, and each within twice the error of the host's
    own autocast forward against float64. (Until 2026-12-05 autocast sent every call to the host.)"""
    torch.manual_seed(0)
    h, i = 48, 96
    if case.startswith("gemma"):
        approx = "tanh" if case == "gemma-tanh" else "none"
        host = _HostMLP(h, i, nn.GELU(approximate=approx), bias=case.endswith("bias")).to(device)
        names, op, layer = ("gate_proj", "up_proj", "down_proj"), "geglu_mlp", kernel.layers.GeGLUMLP
    elif case.startswith("packed"):
        approx = "none"
        host = _PackedHost(h, i, nn.GELU(), bias=True, p=0.25 if case == "packed-dropout" else 0.0).to(device)
        names, layer = ("Wi", "Wo"), kernel.layers.PackedGeGLUMLP
        op = "gelu_and_mul" if case == "packed-dropout" else "geglu_mlp"  # dropout: host's Wi + fused GeGLU
    else:
        approx = "tanh"
        host = _T5Like()
        host.wi_0, host.wi_1 = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        host.wo = nn.Linear(i, h, bias=False)
        host.act = nn.GELU(approximate="tanh")
        host.dropout = nn.Dropout(0.25 if case == "t5-dropout" else 0.0)
        host.to(device)
        names, layer = ("wi_0", "wi_1", "wo"), kernel.layers.T5GeGLUDense
        op = "geglu" if case == "t5-dropout" else "geglu_mlp"  # dropout: the host's projections + fused GeGLU
    params = [p for n in names for p in getattr(host, n).parameters()]
    x = randn(4, 16, h, device=device, requires_grad=True)
    dy = randn(4, 16, h, device=device)

    def step(forward):
        for t in (x, *params):
            t.grad = None
        torch.manual_seed(1)  # the same dropout mask for both
        with torch.autocast(device, dtype=amp_dtype):
            y = forward(x)
        y.backward(dy.to(y.dtype))
        return y.detach(), [x.grad.clone()] + [p.grad.clone() for p in params]

    expected, eager_grads = step(host)
    importlib.import_module(f"{kernel.__name__}._dispatch")._last.pop(op, None)
    got, grads = step(MethodType(layer.forward, host))
    assert kernel.last_backend(op) is not None, "the fused op did not run"
    assert got.dtype == expected.dtype == amp_dtype
    assert [g.dtype for g in grads] == [g.dtype for g in eager_grads] == [torch.float32] * len(grads)

    x64 = x.detach().double().requires_grad_()
    p64 = [p.detach().double().requires_grad_() for p in params]
    w = dict(zip([f"{n}.{k}" for n in names for k, _ in getattr(host, n).named_parameters()], p64))
    if case.startswith("gemma"):
        ref = kernel.reference.geglu_mlp_ref(x64, w["gate_proj.weight"], w["up_proj.weight"], w["down_proj.weight"],
                                             w.get("gate_proj.bias"), w.get("up_proj.bias"), w.get("down_proj.bias"),
                                             approx)
    elif case.startswith("packed"):
        torch.manual_seed(1)
        a, b = (x64 @ w["Wi.weight"].t() + w["Wi.bias"]).chunk(2, dim=-1)
        hid = nn.functional.dropout(kernel.reference.gelu(a, approx) * b, host.drop.p, training=True)
        ref = hid @ w["Wo.weight"].t() + w["Wo.bias"]
    else:
        torch.manual_seed(1)
        hid = kernel.reference.gelu(x64 @ w["wi_0.weight"].t(), approx) * (x64 @ w["wi_1.weight"].t())
        ref = nn.functional.dropout(hid, host.dropout.p, training=True) @ w["wo.weight"].t()
    ref_grads = torch.autograd.grad(ref, [x64, *p64], dy.double())
    assert_close(got, ref, expected, f"{case} output")
    for k, (g, r, e) in enumerate(zip(grads, ref_grads, eager_grads)):
        assert_close(g, r, e, f"{case} gradient {k}")


# --- the packed (ModernBERT) MLP ----------------------------------------------------------------------

def _packed_ref(host, x64, approx):
    """float64 reference of a packed host with dropout off, and its parameters (leaves) in float64."""
    params = {n: p.detach().double().requires_grad_() for n, p in host.named_parameters()}
    a, b = (x64 @ params["Wi.weight"].t() + params.get("Wi.bias", 0)).chunk(2, dim=-1)
    y = (nn.functional.gelu(a, approximate=approx) * b) @ params["Wo.weight"].t() + params.get("Wo.bias", 0)
    return y, params


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", ["exact", "tanh-bias", "odd-sizes-2d", "strided-x"])
def test_packed_mlp_layer_matches_host(kernel, device, dtype, case):
    """ModernBERT's MLP (``Wi`` packed to 2I, GELU on its first half) through ``PackedGeGLUMLP``: the fused
    MLP runs (not the host's forward) on views of ``Wi``'s weight, the output and every gradient (``Wi``'s
    one [2I, H] gradient included) within twice the host's own error against float64."""
    torch.manual_seed(0)
    h, i = (40, 72) if case == "odd-sizes-2d" else (48, 96)
    approx = "tanh" if case.startswith("tanh") else "none"
    host = _PackedHost(h, i, nn.GELU(approximate=approx), bias=case.endswith("bias")).to(device, dtype)
    shape = (13, h) if case == "odd-sizes-2d" else (3, 7, h)
    x = randn(*shape, device=device, dtype=dtype)
    if case == "strided-x":  # every other element of a wider buffer (a view a caller may pass)
        x = randn(*shape[:-1], 2 * h, device=device, dtype=dtype)[..., ::2]
    x.requires_grad_()
    layer = kernel.layers.PackedGeGLUMLP
    importlib.import_module(f"{kernel.__name__}._dispatch")._last.pop("geglu_mlp", None)
    _PackedHost.calls = 0
    got = MethodType(layer.forward, host)(x)
    assert _PackedHost.calls == 0 and kernel.last_backend("geglu_mlp") is not None, "the fused MLP did not run"
    twin = copy.deepcopy(host)
    x_twin = x.detach().clone().requires_grad_()
    expected = twin(x_twin)
    x64 = x.detach().double().requires_grad_()
    ref, p64 = _packed_ref(host, x64, approx)
    assert got.dtype == dtype and got.shape == expected.shape
    assert_close(got, ref, expected, f"packed {case} output")
    dy = randn(*got.shape, device=device, dtype=dtype)
    names = list(p64)
    ours = torch.autograd.grad(got, [x, *(dict(host.named_parameters())[n] for n in names)], dy)
    eager = torch.autograd.grad(expected, [x_twin, *(dict(twin.named_parameters())[n] for n in names)], dy)
    refs = torch.autograd.grad(ref, [x64, *p64.values()], dy.double())
    for name, o, r, e in zip(["x", *names], ours, refs, eager):
        assert o.shape == r.shape, name
        assert_close(o, r, e, f"packed {case} grad {name}")


_PACKED_DEFER_CASES = ["silu", "odd-width", "hooked-act", "hooked-drop", "hooked-wo", "wi-subclass", "float64",
                       "width-mismatch"]


@pytest.mark.parametrize("case", _PACKED_DEFER_CASES)
def test_packed_mlp_layer_defers_to_the_host_where_it_cannot_fuse(kernel, device, case):
    """Wherever the fused MLP would compute something else, the layer runs the host's own forward: the same
    values, the same exception, the host's hooks fired."""
    h, i = 16, 32
    host = _PackedHost(h, i, nn.SiLU() if case == "silu" else nn.GELU(), bias=True).to(device)
    x = randn(4, h, device=device)
    if case == "odd-width":  # the host's chunk gives halves of 17 and 16 columns: its product fails
        host.Wi = nn.Linear(h, 33).to(device)
    if case == "width-mismatch":  # Wo takes another width than Wi's halves: the host fails too
        host.Wo = nn.Linear(24, h).to(device)
    if case == "hooked-act":
        host.act.register_forward_hook(lambda mod, args, out: out * 0.5)
    if case == "hooked-drop":
        host.drop.register_forward_hook(lambda mod, args, out: out * 0.5)
    if case == "hooked-wo":  # e.g. a row-wise tensor-parallel all-reduce
        host.Wo.register_forward_hook(lambda mod, args, out: out * 2)
    if case == "wi-subclass":
        lin = type("Scaled", (nn.Linear,), {"forward": lambda self, t: 2 * nn.Linear.forward(self, t)})(h, 2 * i)
        host.Wi = lin.to(device)
    if case == "float64":
        host.double()
        x = x.double()
    layer_forward = MethodType(kernel.layers.PackedGeGLUMLP.forward, host)
    if case in ("odd-width", "width-mismatch"):
        with pytest.raises(RuntimeError):
            host(x)
        _PackedHost.calls = 0
        with pytest.raises(RuntimeError):
            layer_forward(x)
        assert _PackedHost.calls == 1
        return
    expected = host(x)
    _PackedHost.calls = 0
    got = layer_forward(x)
    assert _PackedHost.calls == 1, "the layer must run the host's own forward here"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_packed_mlp_layer_runs_the_hosts_dropout_in_training(kernel, device):
    """Dropout active in training: the host's Wi, the fused packed GeGLU, then the host's drop and Wo, so the
    same RNG draws give the same masks as the host's forward; in eval the whole MLP is fused."""
    host = _PackedHost(16, 32, nn.GELU(approximate="tanh"), bias=True, p=0.5).to(device).train()
    x = randn(3, 5, 16, device=device)
    dispatch = importlib.import_module(f"{kernel.__name__}._dispatch")
    layer_forward = MethodType(kernel.layers.PackedGeGLUMLP.forward, host)
    for training, op in ((True, "gelu_and_mul"), (False, "geglu_mlp")):  # gelu_and_mul: the packed GeGLU
        host.train(training)
        torch.manual_seed(3)
        expected = host(x)
        dispatch._last.pop(op, None)
        _PackedHost.calls = 0
        torch.manual_seed(3)
        got = layer_forward(x)
        assert _PackedHost.calls == 0 and kernel.last_backend(op) is not None, (training, op)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "nocache"])
def test_packed_mlp_layer_casts_each_parameter_as_often_as_its_host(kernel, device, cache):
    """Under one autocast region the layer casts ``Wi``'s packed weight (then splits the copy) as often as the
    host's ``Wi`` is cast: once for the region with autocast's weight cache, once per call without. A cast of
    the split views would miss the cache (it keeps casts of leaf parameters only) and run every call."""
    if not kernel._ops.HAS_COMPILED_OPS:
        pytest.skip("the noarch variant has no compiled autocast_cast op: it casts per call")
    from _cast_count import CastCounter

    host = _PackedHost(24, 40, nn.GELU(), bias=True).to(device)
    params = list(host.parameters())
    xs = [randn(3, 24, device=device) for _ in range(3)]

    def casts(forward):
        counter = CastCounter(params)
        with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=cache), counter:
            ys = [forward(x) for x in xs]
        return counter.casts, ys

    n_host, ys_host = casts(host)
    _PackedHost.calls = 0
    n_ours, ys_ours = casts(MethodType(kernel.layers.PackedGeGLUMLP.forward, host))
    assert _PackedHost.calls == 0, "the layer ran the host's forward"
    assert n_host == len(params) * (1 if cache else len(xs))  # the premise: what autocast's cache does
    assert n_ours == n_host
    for y, e in zip(ys_ours, ys_host):
        torch.testing.assert_close(y.float(), e.float(), rtol=0.05, atol=0.05)  # sanity; accuracy: tests above
