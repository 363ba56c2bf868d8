"""Mark transformers classes for ``kernels.kernelize``, and undo it.

``kernels.replace_kernel_forward_from_hub`` writes two class attributes (``kernel_layer_name``,
``kernel_condition``) and keeps no record, so this module remembers what each class had before
and restores it exactly: marking is idempotent and :func:`unmark_classes` / :func:`marked` leave
no state behind (transformers' own decorators, should a later release add one, come back too).

The condition given to kernels is :func:`~.families.refusal` plus one side effect: when it
refuses a module whose ``forward`` is still a fused-geglu layer from an earlier kernelize, it puts
the class's forward back. kernels itself skips a refused module without touching it, so without
this a module kernelized in eval would keep the kernel after ``model.train()`` made it refusable
(dropout), through our :func:`kernelize` and through transformers' re-kernelize on ``train()``.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MethodType
from typing import Iterable, Iterator

from kernels import replace_kernel_forward_from_hub
from torch import nn

from .families import FAMILIES, KERNEL_LAYERS, LINEAR_BIAS, Family, family_of, refusal
from .fsdp import original_class

_MISSING = object()
# class -> (kernel_layer_name, kernel_condition) as they were in cls.__dict__ before we marked it.
_SAVED: dict[type, tuple[object, object]] = {}
_KERNEL_FORWARDS = {f"{name}.forward" for name in KERNEL_LAYERS.values()}


def is_kernel_forward(module: nn.Module) -> bool:
    """Whether ``module``'s instance ``forward`` is one of fused-geglu's kernel layers."""
    fwd = module.__dict__.get("forward")
    return isinstance(fwd, MethodType) and getattr(fwd.__func__, "__qualname__", "") in _KERNEL_FORWARDS


def restore_forward(module: nn.Module) -> bool:
    """Drop a fused-geglu instance ``forward`` (and the repository kernels 0.19 records beside it) so the
    class's runs again; True if there was one."""
    if is_kernel_forward(module):
        del module.__dict__["forward"]
        module.__dict__.pop("_kernel_repo", None)
        return True
    return False


def class_refusal(module: nn.Module, cls: type, family: Family | None) -> str | None:
    """:func:`refusal` for an instance of marked class ``cls`` (or of one of its subclasses)."""
    if type(module) is not cls and type(module).forward is not cls.forward:
        return f"{type(module).__name__} subclasses {cls.__name__} and overrides forward"
    return refusal(module, family)


def _condition(cls: type, family: Family | None):
    def condition(module: nn.Module) -> bool:
        if class_refusal(module, cls, family) is None:
            return True
        restore_forward(module)
        return False

    condition.__qualname__ = f"fused_geglu_condition[{cls.__name__}]"
    return condition


def is_marked(cls: type) -> bool:
    return cls in _SAVED


def mark_class(cls: type, family: Family | None = None) -> None:
    """Mark one class (``family=None``: ``nn.Linear`` for the bias-epilogue layer). Idempotent."""
    if cls in _SAVED:
        return
    layer = LINEAR_BIAS if family is None else family.layer
    _SAVED[cls] = (cls.__dict__.get("kernel_layer_name", _MISSING), cls.__dict__.get("kernel_condition", _MISSING))
    replace_kernel_forward_from_hub(cls, layer, condition=_condition(cls, family))


def unmark_class(cls: type) -> None:
    saved = _SAVED.pop(cls, None)
    if saved is None:
        return
    for attr, old in zip(("kernel_layer_name", "kernel_condition"), saved):
        if old is _MISSING:
            if attr in cls.__dict__:
                delattr(cls, attr)
        else:
            setattr(cls, attr, old)


def unmark_classes() -> None:
    """Restore every class this module marked."""
    for cls in list(_SAVED):
        unmark_class(cls)


@dataclass
class MarkResult:
    marked: list[tuple[Family | None, type]] = field(default_factory=list)  # None family = nn.Linear
    skipped: list[tuple[Family, str]] = field(default_factory=list)  # families the installed transformers lacks


def find_class(family: Family) -> type | str:
    """The family's class in the installed transformers, or a note saying why it is missing."""
    try:
        module = importlib.import_module(family.module)
    except Exception as exc:  # ImportError, or an optional dependency failing at import time
        return f"{family.module} not importable ({type(exc).__name__}: {exc})"
    cls = getattr(module, family.class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        return f"{family.module} has no class {family.class_name}"
    return cls


def mark_classes(families: Iterable[Family | str] | None = None, *, linear_bias: bool = False) -> MarkResult:
    """Mark the GeGLU classes of the installed transformers (all families, or the given ones).

    Families whose module or class this transformers lacks are skipped with a note, not an
    error. Needed before ``from_pretrained(..., kernel_config=...)``; :func:`kernelize` marks
    what it needs by itself.
    """
    by_key = {f.key: f for f in FAMILIES}
    selected = FAMILIES if families is None else tuple(by_key[f] if isinstance(f, str) else f for f in families)
    result = MarkResult()
    for family in selected:
        found = find_class(family)
        if isinstance(found, str):
            result.skipped.append((family, found))
            continue
        mark_class(found, family)
        result.marked.append((family, found))
    if linear_bias:
        mark_class(nn.Linear, None)
        result.marked.append((None, nn.Linear))
    return result


def mark_model_classes(model: nn.Module, *, linear_bias: bool = False) -> list[tuple[Family | None, type]]:
    """Mark the family classes that occur in ``model`` (no imports; exact classes only, or the class
    an FSDP2 ``FSDP<Class>`` was generated from: fully_shard swaps a module's class for that subclass,
    which inherits the marks and the forward)."""
    marked: dict[type, Family | None] = {}
    for module in model.modules():
        cls = original_class(type(module))
        family = family_of(cls)
        if family is not None and cls not in marked:
            marked[cls] = family
    if linear_bias:
        marked[nn.Linear] = None
    for cls, family in marked.items():
        mark_class(cls, family)
    return [(family, cls) for cls, family in marked.items()]


@contextmanager
def marked(families: Iterable[Family | str] | None = None, *, linear_bias: bool = False) -> Iterator[MarkResult]:
    """:func:`mark_classes` for the duration of a ``with`` block; restores the classes after."""
    before = set(_SAVED)
    try:
        yield mark_classes(families, linear_bias=linear_bias)
    finally:
        for cls in list(_SAVED):
            if cls not in before:
                unmark_class(cls)
