"""The parts of ``kernels`` below its public API that the tools and tests use, found where each release keeps them.

kernels 0.17 and 0.18 keep their modules at ``kernels.layer`` and ``kernels.variants`` (and the CLI at ``kernels.cli``);
0.19 moved them all under ``kernels._internals`` (its public names, ``kernels.kernelize`` and the rest, did
not move). transformers pins one kernels minor per release (5.20.2-5.22.2: 0.17.2, 5.23-5.24: 0.18.2-0.18.3,
5.25: 0.19.1), so a user's kernels can be any of the three and these lookups follow the installed one.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable


def _module(name: str) -> ModuleType:
    """``kernels.<name>`` from 0.19's ``kernels._internals`` or the older top-level package."""
    for prefix in ("kernels._internals.", "kernels."):
        try:
            return importlib.import_module(prefix + name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (prefix + name).startswith(exc.name):
                raise  # the module exists but one of its own imports is missing: say so
    raise ModuleNotFoundError(f"the installed kernels has no module {name!r} (looked in kernels._internals and kernels)")


def layer_logger_name() -> str:
    """The logger of the module that warns "No kernel mapping found for layer ..." during ``kernelize``."""
    return _module("layer.layer").__name__


def validate_layer() -> Callable:
    """kernels' own check of a layer class against the class it replaces (``_validate_layer``)."""
    return _module("layer.layer")._validate_layer


def parse_variant() -> Callable:
    """kernels' parser of a ``build/<variant>`` folder name (raises ``ValueError`` on one it rejects)."""
    return _module("variants").parse_variant


def resolve_for(names: list[str], backend: str, torch_version: str, cuda_version: str | None = None,
                cpu: str = "x86_64", os: str = "linux") -> list[str]:
    """The ``build/<variant>`` names kernels would accept on a described machine, best first.

    kernels' own choice (``_resolve_variant_for_system``, the function behind ``get_kernel``), asked about
    a torch version, backend and CUDA version that need not be the installed ones (a cxx11 Linux torch,
    no tvm-ffi): which build a user of torch 2.15 loads can be checked on any machine."""
    from packaging.version import Version

    variants = _module("variants")
    backends = _module("backends")
    selected = backends.CPU() if backend == "cpu" else getattr(backends, backend.upper())(version=Version(cuda_version))
    accepted, _trace = variants._resolve_variant_for_system(
        variants=[variants.parse_variant(n) for n in names], selected_backend=selected, cpu=cpu, os=os,
        torch_version=Version(torch_version), torch_cxx11_abi=True, tvm_ffi_version=None)
    return [v.variant_str for v in accepted]
