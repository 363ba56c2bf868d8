"""One call: mark, map, kernelize, and report what was replaced and what was refused.

:func:`kernelize` wraps ``kernels.kernelize`` with a scoped mapping (``use_kernel_mapping(...,
inherit_mapping=False)``, so transformers' default hub mapping never applies) and leaves the
process as it found it: the classes it marks are unmarked afterwards, and modules that are not
ours (transformers' hub-decorated activations, rotary functions, ...) keep whatever forward they
had, since kernels would otherwise reset them to their class forward for lack of a mapping.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from kernels import Mode, use_kernel_mapping
from kernels import kernelize as _kernels_kernelize
from torch import nn

from .. import kernels_internals
from . import marking
from .families import KERNEL_LAYERS, LINEAR_BIAS, Family
from .repos import Source, describe_source, kernel_mapping

_MISSING = object()


@dataclass(frozen=True)
class Replaced:
    class_name: str
    count: int
    layer: str  # e.g. "GeGLUMLP from org/fused-geglu@v1"
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused:
    class_name: str
    count: int
    reason: str
    modules: tuple[str, ...] = ()


@dataclass
class KernelizeReport:
    mode: Mode
    device: str
    source: str
    replaced: list[Replaced] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)

    @property
    def replaced_count(self) -> int:
        return sum(r.count for r in self.replaced)

    def count(self, class_name: str) -> int:
        return sum(r.count for r in self.replaced if r.class_name == class_name)

    def __str__(self) -> str:
        lines = [f"fused-geglu kernelize ({self.mode}, {self.device}, {self.source}):"]
        lines += [f"  replaced {r.class_name} x{r.count} -> {r.layer}" for r in self.replaced]
        lines += [f"  refused  {r.class_name} x{r.count}: {r.reason}" for r in self.refused]
        if not self.replaced and not self.refused:
            lines.append("  no fused-geglu candidate in this model")
        return "\n".join(lines)


def _infer_device(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    if param is None:
        raise ValueError("cannot infer the device of a model without parameters: pass device=")
    if param.device.type == "cuda" and torch.version.hip is not None:
        return "rocm"
    return param.device.type


class _DropForeignNoMapping(logging.Filter):
    """Silence kernels' "No kernel mapping found" warning for layers that are not ours."""

    def __init__(self, ours: set[str]):
        super().__init__()
        self.ours = ours

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return "No kernel mapping found for layer" not in msg or any(f"`{n}`" in msg for n in self.ours)


@contextmanager
def preserve_forwards(model: nn.Module) -> Iterator[None]:
    """Restore every instance ``forward`` of ``model`` (and its kernel functions) on exit.

    An "unkernelize" for tests and experiments: whatever kernelize does inside the block is
    undone, including the instance ``forward`` that kernels sets on modules it leaves original.
    """
    saved = [(m, _kernels_state(m)) for m in _modules_and_funcs(model)]
    try:
        yield
    finally:
        for module, state in saved:
            _restore_kernels_state(module, state)


# What kernelize sets on an instance: its forward, and since kernels 0.19 the repository the forward came
# from (``_kernel_repo``, which ``kernels.get_kernelized_layers`` reports). Restored together, or a module
# running its class forward would still be reported as kernelized.
_KERNELS_INSTANCE_ATTRS = ("forward", "_kernel_repo")


def _kernels_state(module: nn.Module) -> tuple:
    return tuple(module.__dict__.get(name, _MISSING) for name in _KERNELS_INSTANCE_ATTRS)


def _restore_kernels_state(module: nn.Module, state: tuple) -> None:
    for name, value in zip(_KERNELS_INSTANCE_ATTRS, state):
        if value is _MISSING:
            module.__dict__.pop(name, None)
        else:
            module.__dict__[name] = value


def unkernelize(model: nn.Module) -> int:
    """Put the class forward back on every module fused-geglu replaced; returns how many."""
    return sum(marking.restore_forward(m) for m in model.modules())


def _modules_and_funcs(model: nn.Module) -> list[nn.Module]:
    out, seen = [], set()
    for module in model.modules():
        for m in (module, *getattr(module, "_kernel_funcs", {}).values()):
            if id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


def kernelize(model: nn.Module, *, mode: Mode | None = None, device: str | torch.device | None = None,
              source: Source = "hub", linear_bias: bool = False, use_fallback: bool = True,
              **repo_kwargs) -> KernelizeReport:
    """Replace the forward of every GeGLU MLP in ``model`` the kernel computes exactly; report.

    Args:
        mode: a ``kernels.Mode``; default ``TRAINING`` if ``model.training`` else ``INFERENCE``.
            Add ``Mode.TORCH_COMPILE`` when the model will be compiled.
        device: ``"cuda"`` / ``"cpu"``; default inferred from the first parameter.
        source: ``"hub"`` (``build.toml``'s repo id and version), ``"locked"`` (a kernels.lock) or
            ``"local"`` (this checkout's ``build/``). ``repo_kwargs`` refine it: ``version``, ``revision``,
            ``lockfile``, ``build_dir``, ``repo_id``, ``trust_remote_code``.
        linear_bias: also replace plain ``nn.Linear`` modules that have a bias.
        use_fallback: passed to ``kernels.kernelize`` (True: keep the original forward when there
            is no mapping for the device/mode instead of raising). Passed as given, so kernels 0.19's
            ``kernels.KernelizeFallback`` flags work too.

    The kernel forward stays in place across ``model.train()`` / ``model.eval()`` (every layer
    has a backward). Call again after switching modes to re-check mode-dependent refusals
    (dropout active in training); a module refused then gets its class forward back.
    """
    if mode is None:
        mode = Mode.TRAINING if model.training else Mode.INFERENCE
    device_type = (device.type if isinstance(device, torch.device) else device) or _infer_device(model)
    mapping = kernel_mapping(source=source, linear_bias=linear_bias, **repo_kwargs)
    source_label = describe_source(source, **repo_kwargs)

    already = set(marking._SAVED)
    targets = marking.mark_model_classes(model, linear_bias=linear_bias)
    marked_classes = {cls: family for family, cls in targets}
    try:
        # Which modules are candidates, and which the condition will refuse (for the report).
        candidates: list[tuple[str, nn.Module, type, Family | None, str | None]] = []
        for name, module in model.named_modules():
            cls = next((c for c in type(module).__mro__ if c in marked_classes), None)
            if cls is not None:
                family = marked_classes[cls]
                candidates.append((name, module, cls, family, marking.class_refusal(module, cls, family)))
        candidate_ids = {id(m) for _, m, *_ in candidates}
        others = [(m, _kernels_state(m)) for m in _modules_and_funcs(model) if id(m) not in candidate_ids]

        log_filter = _DropForeignNoMapping(set(mapping))
        kernels_logger = logging.getLogger(kernels_internals.layer_logger_name())
        kernels_logger.addFilter(log_filter)
        try:
            with use_kernel_mapping(mapping, inherit_mapping=False):
                _kernels_kernelize(model, mode=mode, device=device_type, use_fallback=use_fallback)
        finally:
            kernels_logger.removeFilter(log_filter)
            for module, state in others:  # kernels reset them to their class forward: undo that
                _restore_kernels_state(module, state)
    finally:
        for cls in marked_classes:
            if cls not in already:
                marking.unmark_class(cls)

    return _report(candidates, mode=mode, device=device_type, source=source_label)


def _report(candidates, *, mode: Mode, device: str, source: str) -> KernelizeReport:
    replaced: dict[tuple[str, str], list[str]] = defaultdict(list)
    refused: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, module, cls, family, reason in candidates:
        class_name = type(module).__name__
        layer = KERNEL_LAYERS[LINEAR_BIAS if family is None else family.layer]
        if reason is None and marking.is_kernel_forward(module):
            replaced[(class_name, f"{layer} from {source}")].append(name)
        elif reason is None:
            why = f"kernels kept the original forward (no usable {layer} mapping for {device} / {mode})"
            if os.environ.get("DISABLE_KERNEL_MAPPING", "0") not in ("", "0"):
                why = "DISABLE_KERNEL_MAPPING is set"
            refused[(class_name, why)].append(name)
        else:
            refused[(class_name, reason)].append(name)
    return KernelizeReport(
        mode=mode, device=device, source=source,
        replaced=[Replaced(c, len(n), layer, tuple(n)) for (c, layer), n in replaced.items()],
        refused=[Refused(c, len(n), reason, tuple(n)) for (c, reason), n in refused.items()],
    )

