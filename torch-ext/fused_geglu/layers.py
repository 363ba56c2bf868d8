"""Kernel layers for ``kernels.kernelize``: stateless ``forward`` replacements.

Rules (kernels' ``_validate_layer``): subclasses of ``nn.Module`` with no ``__init__`` and no
members but ``forward``, ``has_backward`` and ``can_torch_compile``; ``forward`` has the same
arity as the forward it replaces; all state is read from the host module's own attributes.

Every layer checks, per call, that the fused computation is exactly what the host would compute
(a GELU it recognises, plain dense weights, no dropout active, no activation sparsity) and
otherwise calls the host class's own ``forward`` (kernelize replaces the instance's
``forward`` only), so a replacement can never change results. The
transformers integration also refuses such modules up front (``condition=``), so this is a
backstop, not the plan.

Under autocast (a float32 model trained with ``torch.autocast``, Trainer's ``bf16=True``) the host's
projections run autocast's ``linear``: every operand cast to the autocast dtype, the output in it, and
the GELU and product on those outputs. The layers hand the host's operands to ``geglu_mlp`` / ``linear``,
which make the same casts and run fused with autocast off (``_autocast.py``); the casts are
differentiable, so float32 parameters get float32 gradients as they do from autocast's casts. (Until
2026-12-05 autocast sent every call to the host.)
"""

from __future__ import annotations

import torch
from torch import nn

from . import _autocast
from ._checks import FLOAT_DTYPES
from .geglu import geglu, geglu_packed
from .linear import linear
from .mlp import geglu_mlp
from ._opdef import _PLAIN

try:  # the parameters as a non-strict torch.export trace (torch.export's default) hands them to forward
    from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
except ImportError:  # pragma: no cover - private module moved
    _FakeTensor = None
# Weight types the layers take as plain dense tensors. A FakeTensor is a plain tensor's stand-in while
# a non-strict torch.export traces forward (a tensor subclass such as DTensor stays its own type there);
# until 2026-12-05 the layers took it for a subclass, so the exported program held the host's unfused ops.
_WEIGHT_PLAIN = (*_PLAIN, _FakeTensor) if _FakeTensor is not None else _PLAIN

# transformers activation classes by behaviour (matched by name: the kernel may not import
# transformers). All tanh-form GELUs are the same function: 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))).
_TANH_GELU_CLASSES = {"GELUTanh", "PytorchGELUTanh", "GELUPytorchTanh", "NewGELUActivation", "FastGELUActivation"}
_EXACT_GELU_CLASSES = {"GELUActivation"}


def gelu_approximation(act) -> str | None:
    """"none" / "tanh" for an activation module that is exactly GELU of that flavour, else None."""
    if isinstance(act, nn.GELU):
        return act.approximate if act.approximate in ("none", "tanh") else None
    name = type(act).__name__
    if name in _TANH_GELU_CLASSES:
        return "tanh"
    if name in _EXACT_GELU_CLASSES:
        return "none"
    return None


_MISSING = object()


def _hooked(module) -> bool:
    """A host submodule the fused op would not call (its activation, its dropout) has hooks, which would
    then never fire: an activation hook that patches or records h is common (steering, probing)."""
    return isinstance(module, nn.Module) and bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks)


def _host_attr(module: nn.Module, name: str, default=None):
    """``getattr(module, name, default)`` without ``Module.__getattr__``'s exception for a missing
    name (about 1 µs each, and a decode step asks for two per MLP): the instance's dict and its
    module, parameter and buffer stores, in ``nn.Module``'s order. A name the class itself defines
    (a property, a class attribute) takes the plain ``getattr``."""
    if torch.compiler.is_compiling() or hasattr(type(module), name):
        return getattr(module, name, default)
    d = module.__dict__
    value = d.get(name, _MISSING)
    if value is _MISSING:
        for store in (d["_parameters"], d["_buffers"], d["_modules"]):
            value = store.get(name, _MISSING)
            if value is not _MISSING:
                break
    return default if value is _MISSING else value


def _projection_operands(module: nn.Module, x: torch.Tensor, names: tuple[str, ...],
                         cast: torch.dtype | None = None) -> list | None:
    """``[weight, bias, weight, bias, ...]`` of the host's projections ``names`` when a fused op
    computes exactly what they would, else None: each a plain dense ``nn.Linear`` (no subclass, no
    parametrization, no DTensor) without hooks, on x's device, in a dtype the kernels compute (a
    float64 model keeps its own forward) and, without autocast (``cast`` None), in x's dtype. Under
    autocast (``cast``: its dtype, from ``_autocast.target``) any of those dtypes will do, since autocast's
    ``linear`` casts every operand, and so does the fused op they are passed to (``_autocast``).

    Hooks matter: tensor parallelism (transformers' TP plans, ``parallelize_module``) and
    offloading do their communication in forward hooks on the projections, which calling the
    fused op directly would skip, so a hooked projection always takes the host's path; a backward
    hook would not fire either.

    Eager calls read ``_modules`` and ``_parameters`` directly: through ``Module.__getattr__`` each
    projection and each parameter costs about 0.5 µs, and this ran to about 20 µs per GeGLU MLP
    call on the development CPU (2026-12-04), more than the op's own Python.
    """
    compiling = torch.compiler.is_compiling()  # dynamo traces the plain attributes
    mods = None if compiling else module.__dict__["_modules"]
    dtype, device = x.dtype, x.device
    if dtype not in FLOAT_DTYPES:
        return None
    out = []
    for name in names:
        lin = getattr(module, name, None) if compiling else mods.get(name)
        if (type(lin) is not nn.Linear or lin._forward_hooks or lin._forward_pre_hooks
                or lin._backward_hooks or lin._backward_pre_hooks):
            return None
        if compiling:
            weight, bias = lin.weight, lin.bias
        else:
            params = lin.__dict__["_parameters"]
            weight, bias = params.get("weight"), params.get("bias", _MISSING)
            if bias is _MISSING:  # moved out of the parameters by someone: not plain
                return None
        if type(weight) not in _WEIGHT_PLAIN or weight.device != device:
            return None
        if weight.dtype != dtype if cast is None else (
                weight.dtype not in FLOAT_DTYPES or (bias is not None and bias.dtype not in FLOAT_DTYPES)):
            return None
        out += (weight, bias)
    return out


def _activation_and_cast(module: nn.Module, x: torch.Tensor, act_name: str, dropout_name: str):
    """``(approx, cast, dropout)`` for a host whose activation and dropout are the modules named: the GELU
    flavour the fused op computes (None where the activation is not a GELU, or it or the dropout has hooks the
    fused op would not fire), ``_autocast.target``'s value, and the host's dropout."""
    act, dropout = _host_attr(module, act_name), _host_attr(module, dropout_name)
    approx = None if _hooked(act) or _hooked(dropout) else gelu_approximation(act)
    return approx, _autocast.target(x.device), dropout


def _host_forward(module: nn.Module, layer_cls: type, plain, *args):
    """The host class's own forward; ``plain`` (the same math in PyTorch) when there is no host,
    i.e. the layer class itself is being used as a module."""
    forward = type(module).forward
    if forward is layer_cls.forward:
        return plain(*args)
    return forward(module, *args)


# ---- tensor parallelism ----------------------------------------------------------------------
# gate_proj/up_proj sharded column-wise (Shard(0) of the [I, H] weights) and down_proj row-wise
# (Shard(1) of [H, I]), as torch's ColwiseParallel/RowwiseParallel and transformers' TP plans lay
# them out: each rank runs the fused MLP on its own I/world slice and one all-reduce sums the
# partial outputs. No weight is gathered.


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; the backward sums dx over the ranks (each saw only its slice of I)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce (sum) of the partial down-projection outputs; identity backward."""

    @staticmethod
    def forward(ctx, y, group):
        torch.distributed.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _tensor_parallel_mlp(module: nn.Module, x: torch.Tensor, approx: str):
    """The fused MLP on local shards when the projections are tensor-parallel DTensors laid out
    column-wise / column-wise / row-wise on one 1-D mesh; None for any other layout."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor, Replicate, Shard

    gate, up, down = module.gate_proj, module.up_proj, module.down_proj
    if type(gate) is not nn.Linear or type(up) is not nn.Linear or type(down) is not nn.Linear:
        # A parametrized projection (its class is swapped for "ParametrizedLinear") computes its weight
        # on every read; spectral_norm also advances its power iteration in training, so one read here
        # and the host's own made the fallback differ from the host (found 2026-12-05).
        return None
    weights = (gate.weight, up.weight, down.weight)
    if not all(isinstance(w, DTensor) for w in weights):
        return None
    mesh = weights[0].device_mesh
    if mesh.ndim != 1 or any(w.device_mesh != mesh for w in weights):
        return None
    if tuple(w.placements for w in weights) != ((Shard(0),), (Shard(0),), (Shard(1),)):
        return None
    biases = (gate.bias, up.bias, down.bias)
    want = ((Shard(0),), (Shard(0),), (Replicate(),))
    if any(b is not None and (not isinstance(b, DTensor) or b.placements != p) for b, p in zip(biases, want)):
        return None
    if isinstance(x, DTensor):
        if x.placements != (Replicate(),):
            return None
        x = x.to_local()
    cast = _autocast.target(x.device)  # autocast: the local shards cast as autocast's linear casts them
    if cast is False or x.dtype not in FLOAT_DTYPES or (cast is None and x.dtype != weights[0].dtype) or (
            cast is not None and any(t is not None and t.dtype not in FLOAT_DTYPES for t in weights + biases)):
        return None
    if cast is not None:
        # As autocast's linear casts the DTensor parameters: through its weight cache, once per region (a
        # cast of the local shards, which are views, would be made again every call).
        *weights, b_gate, b_up, b_down = _autocast.cast(cast, *weights, *biases)
        biases = (b_gate, b_up, b_down)
    group = mesh.get_group()
    x = _CopyToTensorParallel.apply(x, group)
    local = [w.to_local() for w in weights]
    b_gate, b_up, b_down = (None if b is None else b.to_local() for b in biases)
    y = geglu_mlp(x, *local, b_gate, b_up, None, approximate=approx)  # under autocast: x cast inside
    y = _ReduceFromTensorParallel.apply(y, group)
    if b_down is not None:
        y = y + b_down
    return y


class GeGLUMLP(nn.Module):
    """``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` for Gemma-style MLPs (biases optional).

    Host attributes: ``gate_proj``, ``up_proj``, ``down_proj`` (``nn.Linear``), ``act_fn``
    (a GELU: exact or tanh).
    """

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear
    act_fn: nn.Module

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = _host_attr(self, "act_fn")
        approx = None if _hooked(act) else gelu_approximation(act)
        sparsity = _host_attr(self, "activation_sparsity", 0.0)  # Gemma3n: top-k on gate first
        # T5Gemma, GTE: dropout between act*up and down, which only training applies (and its hooks fire always).
        dropout = _host_attr(self, "dropout")
        cast = _autocast.target(x.device)
        # The dropout's p before self.training: a graph of a host without dropout (Gemma) then does not
        # guard on training, which the host's own forward never reads (a train/eval toggle recompiled it).
        dropout_active = getattr(dropout, "p", 0.0) > 0 and self.training
        if approx is not None and cast is not False and not sparsity and not _hooked(dropout):
            if not dropout_active:
                operands = _projection_operands(self, x, ("gate_proj", "up_proj", "down_proj"), cast)
                if operands is not None:
                    w_gate, b_gate, w_up, b_up, w_down, b_down = operands
                    # Under autocast geglu_mlp casts every operand, as the host's projections would be cast.
                    return geglu_mlp(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate=approx)
                y = _tensor_parallel_mlp(self, x, approx)
                if y is not None:
                    return y
            elif type(self).__name__ in _DROPOUT_BEFORE_DOWN and isinstance(dropout, nn.Module):
                # The host's projections, the fused GeGLU, then the host's dropout and down_proj: the host's
                # modules in the host's order, so the same dropout masks (under autocast the projections cast
                # as the host's do).
                return self.down_proj(dropout(geglu(self.gate_proj(x), self.up_proj(x), approximate=approx)))
        return _host_forward(self, GeGLUMLP,
                             lambda t: self.down_proj(self.act_fn(self.gate_proj(t)) * self.up_proj(t)), x)


# Gemma-style host classes whose forward is ``down_proj(dropout(act_fn(gate_proj(x)) * up_proj(x)))`` (matched by
# name, as the activations are): with the dropout active, GeGLUMLP runs that order itself. Any other host with an
# active dropout keeps its own forward, since where its dropout sits is not known here.
_DROPOUT_BEFORE_DOWN = frozenset({"T5GemmaMLP", "T5Gemma2MLP", "GteMLP"})


class T5GeGLUDense(nn.Module):
    """T5-family gated-GELU feed-forward: ``wo(dropout(act(wi_0(x)) * wi_1(x)))``.

    Host attributes: ``wi_0``, ``wi_1``, ``wo`` (``nn.Linear``), ``act``, ``dropout``. Like the
    host, the product is cast to ``wo``'s dtype when T5 keeps ``wo`` in float32; a host that does not
    cast (LongT5) keeps its own forward while the dtypes differ.
    """

    wi_0: nn.Linear
    wi_1: nn.Linear
    wo: nn.Linear
    act: nn.Module
    dropout: nn.Module

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        approx, cast, dropout = _activation_and_cast(self, hidden_states, "act", "dropout")
        inner = None if approx is None or cast is False else \
            _projection_operands(self, hidden_states, ("wi_0", "wi_1"), cast)
        wo = _host_attr(self, "wo")
        if inner is not None and isinstance(wo, nn.Module) and _host_attr(wo, "parametrizations") is not None:
            # A parametrized wo: its weight is computed on each read, and spectral_norm advances its
            # state in training, so only the host's forward reads it as often as the host does. (A
            # quantised wo keeps the fused GeGLU below: reading its weight has no side effect.)
            inner = None
        if (inner is not None and cast is None and type(self).__name__ in _T5_NO_CAST
                and _wo_dtype(self) != hidden_states.dtype):
            inner = None  # this host does not cast h to wo's dtype (F.linear then refuses): its forward decides
            # (under autocast its wo casts h, as every other operand, to the autocast dtype)
        if inner is None:
            return _host_forward(self, T5GeGLUDense,
                                 lambda t: _t5_tail(self, self.act(self.wi_0(t)) * self.wi_1(t)), hidden_states)
        dropout_active = self.training and getattr(dropout, "p", 0.0) > 0
        outer = None if dropout_active else _projection_operands(self, hidden_states, ("wo",), cast)
        if outer is not None:
            w_0, b_0, w_1, b_1 = inner
            return geglu_mlp(hidden_states, w_0, w_1, outer[0], b_0, b_1, outer[1], approximate=approx)
        # Dropout between the product and wo: the host's projections (under autocast, autocast's linear),
        # the fused GeGLU on their outputs, then T5's tail.
        return _t5_tail(self, geglu(self.wi_0(hidden_states), self.wi_1(hidden_states), approximate=approx))


# T5-family classes whose forward calls wo on h as it is, without T5's cast to wo's dtype (matched by name,
# as the activations are: the kernel may not import transformers).
_T5_NO_CAST = {"LongT5DenseGatedActDense"}


def _wo_dtype(module: nn.Module):
    wo = _host_attr(module, "wo")
    return getattr(getattr(wo, "weight", None), "dtype", None)


def _t5_tail(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """T5's dropout, the cast to ``wo``'s dtype when ``wo`` is kept in float32, then ``wo``."""
    h = module.dropout(h)
    wo_weight = module.wo.weight
    if isinstance(wo_weight, torch.Tensor) and h.dtype != wo_weight.dtype and wo_weight.dtype != torch.int8:
        h = h.to(wo_weight.dtype)
    return module.wo(h)


class PackedGeGLUMLP(nn.Module):
    """ModernBERT-style GeGLU MLP with one packed input projection:
    ``Wo(drop(act(a) * b))`` where ``a, b = Wi(x).chunk(2, dim=-1)`` (biases optional).

    Host attributes: ``Wi`` (``nn.Linear`` to ``2 * I``), ``act`` (a GELU: exact or tanh), ``drop``,
    ``Wo`` (``nn.Linear`` from ``I``). The GELU takes the first half of ``Wi``'s output, so the fused op
    gets ``Wi``'s first ``I`` rows as ``w_gate`` and the last ``I`` as ``w_up``: views of the host's own
    weight (``torch.chunk``'s backward puts their gradients back into one ``[2I, H]`` gradient). With
    dropout active in training the layer runs the host's ``Wi``, the fused packed GeGLU and the host's
    ``drop`` and ``Wo``: the same modules in the same order, so the same dropout masks.
    """

    Wi: nn.Linear
    act: nn.Module
    drop: nn.Module
    Wo: nn.Linear

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        approx, cast, drop = _activation_and_cast(self, hidden_states, "act", "drop")
        wi = None if approx is None or cast is False else \
            _projection_operands(self, hidden_states, ("Wi",), cast)
        # An odd width: the host's chunk gives halves of different sizes and its product fails; so must we.
        if wi is not None and wi[0].shape[0] % 2 == 0:
            dropout_active = getattr(drop, "p", 0.0) > 0 and self.training  # p first: see GeGLUMLP
            wo = None if dropout_active else _projection_operands(self, hidden_states, ("Wo",), cast)
            if wo is not None and wo[0].shape[1] * 2 == wi[0].shape[0]:
                w_in, b_in, w_out, b_out = (*wi, *wo)
                if cast is not None:
                    # Cast the packed weight before splitting it: autocast's weight cache keeps a cast of a
                    # parameter (once per region), not of the views a split makes (cast again every call).
                    w_in, b_in, w_out, b_out = _autocast.cast(cast, w_in, b_in, w_out, b_out)
                w_gate, w_up = w_in.chunk(2)
                b_gate, b_up = (None, None) if b_in is None else b_in.chunk(2)
                return geglu_mlp(hidden_states, w_gate, w_up, w_out, b_gate, b_up, b_out, approximate=approx)
            if dropout_active:
                # The host's own modules around the fused packed GeGLU (under autocast, autocast's linear).
                return self.Wo(drop(geglu_packed(self.Wi(hidden_states), approximate=approx)))
        return _host_forward(self, PackedGeGLUMLP, lambda t: _packed_mlp_plain(self, t), hidden_states)


def _packed_mlp_plain(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    a, b = module.Wi(x).chunk(2, dim=-1)
    return module.Wo(module.drop(module.act(a) * b))


class LinearBias(nn.Module):
    """``nn.Linear`` with the bias added in the GEMM epilogue (host: ``weight``, ``bias``)."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # The host's own hooks run around this forward (Module.__call__) either way, so only the
        # weight's kind, dtype and device and autocast decide; the parameters are read from
        # _parameters, as _projection_operands does, since a decode step makes this call for every
        # projection it replaces.
        if type(self) is nn.Linear:
            if torch.compiler.is_compiling():  # dynamo traces the plain attributes
                weight, bias = self.weight, self.bias
            else:
                params = self.__dict__["_parameters"]
                # A bias moved out of the parameters (a plain tensor attribute now) is still the host's
                # bias: the host's F.linear reads it, so the layer leaves the call to F.linear too.
                weight, bias = params.get("weight"), params.get("bias", _MISSING)
            if (type(weight) in _WEIGHT_PLAIN and bias is not _MISSING and input.device == weight.device
                    and input.dtype in FLOAT_DTYPES):
                if input.dtype == weight.dtype and not _autocast.enabled(input.device):
                    return linear(input, weight, bias)
                # Under autocast linear casts every operand, as F.linear does.
                if _autocast.target(input.device) and _autocast.castable(weight, bias):
                    return linear(input, weight, bias)
        return nn.functional.linear(input, self.weight, self.bias)


class GeluAndMul(nn.Module):
    """``gelu(x[..., :d]) * x[..., d:]`` (exact GELU) for packed ``x = [..., 2d]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in FLOAT_DTYPES:
            return geglu_packed(x, approximate="none")
        return _host_forward(self, GeluAndMul, lambda t: _packed_plain(t, "none"), x)


class GeluTanhAndMul(nn.Module):
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` for packed ``x = [..., 2d]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in FLOAT_DTYPES:
            return geglu_packed(x, approximate="tanh")
        return _host_forward(self, GeluTanhAndMul, lambda t: _packed_plain(t, "tanh"), x)


def _packed_plain(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """The packed GeGLU in PyTorch, for a dtype the kernels do not compute (float64)."""
    d = x.shape[-1] // 2
    return nn.functional.gelu(x[..., :d], approximate=approximate) * x[..., d:]


__all__ = ["GeGLUMLP", "T5GeGLUDense", "PackedGeGLUMLP", "LinearBias", "GeluAndMul", "GeluTanhAndMul", "gelu_approximation"]
