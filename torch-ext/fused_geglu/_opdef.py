"""Custom ops with a cheap eager path.

Every op is a ``torch.library`` custom op in the kernel's namespace, with a fake implementation
and autograd, so ``torch.compile(fullgraph=True)`` sees one opaque node. Calling a Python custom op
in eager mode costs tens of microseconds of dispatcher work per call, though, which at decode sizes
is more than the kernels themselves (measured on the H200, 2026-12-02: 55-90 us per pointwise call
against ~6 us of GPU time). So the same implementation is reachable three ways:

- under ``torch.compile`` tracing: the registered custom op;
- in eager mode with autograd needed: a ``torch.autograd.Function`` built from the *same*
  ``setup_context``/``backward`` functions the custom op registers;
- in eager mode without autograd: the implementation function itself.
"""

from __future__ import annotations

from typing import Callable

import torch

from ._ops import add_op_namespace_prefix


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default


def _own_output(o, args):
    """``o`` as an output autograd will let the caller modify in place. An implementation returns a
    result of x's leading shape as a view of the 2-D buffer its kernels wrote; a view made inside an
    ``autograd.Function`` is marked so that ``y += r`` on it raises ("a view ... being modified
    inplace"), where the same line after ``F.linear`` works. ``_unsafe_view`` (ATen's own way out,
    used by ``matmul``) gives the same memory as a tensor of its own. A view of an input stays a
    view: autograd must see that alias."""
    if not isinstance(o, torch.Tensor) or not o._is_view():
        return o
    base = o._base
    for a in args:
        if isinstance(a, torch.Tensor) and (a is base or a._base is base):
            return o
    return _UNSAFE_VIEW(o, o.shape)


_PEEK_TRANSFORMS = getattr(torch._C._functorch, "peek_interpreter_stack", None)


def transformed() -> bool:
    """A ``torch.func`` transform (grad, vjp, jacrev, vmap, ...) or forward-mode AD is active. The
    kernels' autograd nodes (C++ ``torch::autograd::Function`` and this module's ``autograd.Function``)
    do not compose with them, so the public functions compute the same math with ATen ops there, which
    do. 0.07 µs per call; not asked while dynamo traces (it has its own handling of these)."""
    return ((_PEEK_TRANSFORMS is not None and _PEEK_TRANSFORMS() is not None)
            or torch.autograd.forward_ad._current_level >= 0)


def _tracing(args) -> bool:
    """Whether anything traces this call (dynamo, AOT/make_fx, fake or functional tensors): then
    only the registered custom op will do, since the implementation needs real data."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return True
    for a in args:  # a plain loop: this runs on every eager call
        if isinstance(a, torch.Tensor) and type(a) not in _PLAIN:
            return True
    return False


def backward_outside_dynamo(backward: Callable) -> Callable:
    """``backward`` with dynamo kept out of it. The autograd engine calls a Python backward as a frame of
    its own, and when ``loss.backward()`` runs inside a compiled function (a whole training step compiled,
    graph-breaking at the backward call) dynamo's frame callback is still set: it compiled each of these
    backwards as a function, guarded on ``ctx.saved_tensors`` (one more compile per saved size), and under
    non-reentrant activation checkpointing reading them for that guard raised "Unpack is being triggered
    for a tensor that was already unpacked once" (transformers' Gemma with gradient checkpointing, inductor,
    2026-12-05). Tracers other than dynamo (AOTAutograd's, make_fx) still trace through it."""
    return torch.compiler.disable(backward, recursive=True)


class DualOp:
    def __init__(self, name: str, impl: Callable, mutates_args=()):
        self.name = name
        self.impl = impl
        self.op = torch.library.custom_op(add_op_namespace_prefix(name), mutates_args=mutates_args)(impl)
        self._function: type[torch.autograd.Function] | None = None

    def register_fake(self, fake: Callable) -> Callable:
        self.op.register_fake(fake)
        return fake

    def register_autograd(self, backward: Callable, setup_context: Callable, private_outputs=()) -> None:
        """``private_outputs``: indices of outputs that exist only to be saved for backward. On the
        eager path the caller gets empty placeholders for them and ``ctx.private_saved`` is True
        (already during ``setup_context``), so ``backward`` knows no one else holds those tensors
        and may reuse or free their memory."""
        self.op.register_autograd(backward_outside_dynamo(backward), setup_context=setup_context)
        impl = self.impl
        private = frozenset(private_outputs)

        name = self.name.removesuffix("_op").removesuffix("_fwd")  # the public function's name

        def forward(ctx, *args):
            ctx.set_materialize_grads(False)  # unused outputs (saved pre-activations) get None
            out = impl(*args)
            ctx.private_saved = bool(private)  # setup_context may keep them outside the graph
            setup_context(ctx, args, out)
            if isinstance(out, tuple):
                return tuple(o.new_empty((0,)) if i in private else _own_output(o, args)
                             for i, o in enumerate(out))
            return _own_output(out, args)

        def checked_backward(ctx, *grads):
            if torch.is_grad_enabled():  # create_graph=True: the engine runs backward with grad mode on
                raise RuntimeError(
                    f"{name}: create_graph=True (double backward) is not supported: its backward "
                    "kernels record no graph, so second derivatives would be silently wrong (for them: "
                    "plain PyTorch ops, or a kernelized model's own module forward)")
            return backward(ctx, *grads)

        # Made with type() so that autograd's node class, which torch.autograd.Function's metaclass names
        # when the class is created, carries the op's name: grad_fn.name() is "FusedGegluMlpBackward" for
        # geglu_mlp (renaming a class statement's __name__ afterwards left every node "_FunctionBackward"
        # until 2026-12-05, which graph readers, and tests that count fused nodes, could not tell apart).
        cls_name = "Fused" + "".join(part.capitalize() for part in name.split("_"))
        self._function = type(cls_name, (torch.autograd.Function,),
                              {"forward": staticmethod(forward),
                               "backward": staticmethod(backward_outside_dynamo(checked_backward))})

    def __call__(self, *args):
        if _tracing(args):
            return self.op(*args)
        if self._function is not None and torch.is_grad_enabled():
            for a in args:
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    return self._function.apply(*args)
        return self.impl(*args)


def custom_op(name: str, mutates_args=()):
    """Decorator: ``@custom_op("geglu_fwd_op", mutates_args=())`` -> a :class:`DualOp`."""
    return lambda impl: DualOp(name, impl, mutates_args)
