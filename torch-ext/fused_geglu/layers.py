"""Kernel layers for ``kernels.kernelize``: stateless ``forward`` replacements.

Rules (kernels' ``_validate_layer``): subclasses of ``nn.Module`` with no ``__init__`` and no
members but ``forward``, ``has_backward`` and ``can_torch_compile``; ``forward`` has the same
arity as the forward it replaces; all state is read from the host module's own attributes.

Every layer checks, per call, that the fused computation is exactly what the host would compute
(a GELU it recognises, plain dense weights, no autocast, no dropout active, no activation
sparsity) and otherwise calls the host class's own ``forward`` (kernelize replaces the instance's
``forward`` only), so a replacement can never change results. The
transformers integration also refuses such modules up front (``condition=``), so this is a
backstop, not the plan.
"""

from __future__ import annotations

import torch
from torch import nn

from .geglu import geglu, geglu_packed
from .linear import linear
from .mlp import geglu_mlp

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


def _dense(*linears) -> bool:
    """Plain dense ``nn.Linear``s on one dtype and device, with no hooks.

    Hooks matter: tensor parallelism (transformers' TP plans, ``parallelize_module``) and
    offloading do their communication in forward hooks on the projections, which calling the
    fused op directly would skip, so a hooked projection always takes the host's path.
    """
    ref = None
    for lin in linears:
        if type(lin) is not nn.Linear or type(lin.weight) not in (torch.Tensor, nn.Parameter):
            return False
        if lin._forward_hooks or lin._forward_pre_hooks:
            return False
        if ref is None:
            ref = lin.weight
        elif lin.weight.dtype != ref.dtype or lin.weight.device != ref.device:
            return False
    return True


def _fusable(x: torch.Tensor, *linears) -> bool:
    return (_dense(*linears) and x.dtype == linears[0].weight.dtype
            and x.device == linears[0].weight.device and not torch.is_autocast_enabled(x.device.type))


def _bias(lin: nn.Linear):
    return lin.bias


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
    if x.dtype != weights[0].dtype or torch.is_autocast_enabled(x.device.type):
        return None
    group = mesh.get_group()
    x = _CopyToTensorParallel.apply(x, group)
    local = [w.to_local() for w in weights]
    b_gate, b_up = (None if b is None else b.to_local() for b in biases[:2])
    y = geglu_mlp(x, *local, b_gate, b_up, None, approximate=approx)
    y = _ReduceFromTensorParallel.apply(y, group)
    if biases[2] is not None:
        y = y + biases[2].to_local()
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
        approx = gelu_approximation(self.act_fn)
        dropout = getattr(self, "dropout", None)  # T5Gemma: dropout between act*up and down
        if approx is not None and not getattr(self, "activation_sparsity", 0.0) \
                and not (self.training and getattr(dropout, "p", 0.0) > 0):
            y = _tensor_parallel_mlp(self, x, approx)
            if y is not None:
                return y
        if (approx is None or not _fusable(x, self.gate_proj, self.up_proj, self.down_proj)
                or getattr(self, "activation_sparsity", 0.0)  # Gemma3n: top-k on gate first
                or (self.training and getattr(dropout, "p", 0.0) > 0)):
            return _host_forward(self, GeGLUMLP,
                                 lambda t: self.down_proj(self.act_fn(self.gate_proj(t)) * self.up_proj(t)), x)
        return geglu_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                         _bias(self.gate_proj), _bias(self.up_proj), _bias(self.down_proj), approximate=approx)


class T5GeGLUDense(nn.Module):
    """T5-family gated-GELU feed-forward: ``wo(dropout(act(wi_0(x)) * wi_1(x)))``.

    Host attributes: ``wi_0``, ``wi_1``, ``wo`` (``nn.Linear``), ``act``, ``dropout``. Like the
    host, the product is cast to ``wo``'s dtype when T5 keeps ``wo`` in float32.
    """

    wi_0: nn.Linear
    wi_1: nn.Linear
    wo: nn.Linear
    act: nn.Module
    dropout: nn.Module

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        approx = gelu_approximation(self.act)
        if approx is None or not _fusable(hidden_states, self.wi_0, self.wi_1):
            return _host_forward(self, T5GeGLUDense,
                                 lambda t: _t5_tail(self, self.act(self.wi_0(t)) * self.wi_1(t)), hidden_states)
        dropout_active = self.training and getattr(self.dropout, "p", 0.0) > 0
        if not dropout_active and _fusable(hidden_states, self.wi_0, self.wi_1, self.wo):
            return geglu_mlp(hidden_states, self.wi_0.weight, self.wi_1.weight, self.wo.weight,
                             _bias(self.wi_0), _bias(self.wi_1), _bias(self.wo), approximate=approx)
        return _t5_tail(self, geglu(self.wi_0(hidden_states), self.wi_1(hidden_states), approximate=approx))


def _t5_tail(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """T5's dropout, the cast to ``wo``'s dtype when ``wo`` is kept in float32, then ``wo``."""
    h = module.dropout(h)
    wo_weight = module.wo.weight
    if isinstance(wo_weight, torch.Tensor) and h.dtype != wo_weight.dtype and wo_weight.dtype != torch.int8:
        h = h.to(wo_weight.dtype)
    return module.wo(h)


class LinearBias(nn.Module):
    """``nn.Linear`` with the bias added in the GEMM epilogue (host: ``weight``, ``bias``)."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not _fusable(input, self):
            return nn.functional.linear(input, self.weight, self.bias)
        return linear(input, self.weight, self.bias)


class GeluAndMul(nn.Module):
    """``gelu(x[..., :d]) * x[..., d:]`` (exact GELU) for packed ``x = [..., 2d]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return geglu_packed(x, approximate="none")


class GeluTanhAndMul(nn.Module):
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` for packed ``x = [..., 2d]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return geglu_packed(x, approximate="tanh")


__all__ = ["GeGLUMLP", "T5GeGLUDense", "LinearBias", "GeluAndMul", "GeluTanhAndMul", "gelu_approximation"]
