"""Use fused-geglu in transformers models: ``kernelize(model)`` swaps every GeGLU MLP it can.

transformers decorates no MLP class for hub kernels, and its own hub-kernel switch only runs
with certain ``kernels`` versions, so this works through the kernels API directly (any
transformers 5.x)::

    from kernels import Mode
    from fused_geglu_tools.transformers import kernelize

    report = kernelize(model)                     # mode from model.training, device from the weights
    print(report)                                 # what was replaced (class, count, layer) and refused, why
    report = kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, source="local")

Sources: ``"hub"`` (``REPO_ID`` at ``VERSION``: ``build.toml``'s ``[general.hub] repo-id`` and ``version``),
``"locked"`` (``lockfile=`` a kernels.lock), ``"local"`` (this checkout's ``build/``).
``linear_bias=True`` also replaces biased ``nn.Linear``s with the bias-epilogue linear. The
families and their refusal rules are in :data:`FAMILIES` / :func:`refusal`; the KernelConfig route
is :func:`kernel_config` (see :mod:`fused_geglu_tools.hf.config` for its limits).
"""

from __future__ import annotations

from .hf.config import kernel_config, kernel_config_support
from .hf.families import (
    FAMILIES,
    GEGLU_MLP,
    KERNEL_LAYERS,
    LINEAR_BIAS,
    PACKED_GEGLU_MLP,
    T5_GEGLU_DENSE,
    Family,
    family_of,
    gelu_approximate,
    refusal,
)
from .hf.kernelize import KernelizeReport, Refused, Replaced, kernelize, preserve_forwards, unkernelize
from .hf.marking import (
    MarkResult,
    find_class,
    is_kernel_forward,
    is_marked,
    mark_classes,
    marked,
    unmark_classes,
)
from .hf.repos import DEVICES, MODES, kernel_mapping, layer_repository

__all__ = [
    "DEVICES",
    "FAMILIES",
    "GEGLU_MLP",
    "KERNEL_LAYERS",
    "LINEAR_BIAS",
    "MODES",
    "PACKED_GEGLU_MLP",
    "REPO_ID",
    "T5_GEGLU_DENSE",
    "VERSION",
    "Family",
    "KernelizeReport",
    "MarkResult",
    "Refused",
    "Replaced",
    "family_of",
    "find_class",
    "gelu_approximate",
    "is_kernel_forward",
    "is_marked",
    "kernel_config",
    "kernel_config_support",
    "kernel_mapping",
    "kernelize",
    "layer_repository",
    "mark_classes",
    "marked",
    "preserve_forwards",
    "refusal",
    "unkernelize",
    "unmark_classes",
]


def __getattr__(name: str):
    # REPO_ID and VERSION: build.toml's [general.hub] repo-id and [general] version, read when
    # asked for (see hf.repos).
    if name in ("REPO_ID", "VERSION"):
        from .hf import repos

        return getattr(repos, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
