"""The ``transformers.KernelConfig`` route, for the transformers versions that allow it.

transformers only runs its hub-kernel path when the installed ``kernels`` is inside the window its
release pins (5.20.2-5.22.2: kernels 0.17.2; 5.23-5.24: 0.18.2-0.18.3; 5.25: 0.19.1, now a required
dependency); outside it the path is off. Where it runs::

    from fused_geglu_tools.transformers import kernel_config, mark_classes
    mark_classes()                                   # before from_pretrained: transformers marks no MLP
    model = AutoModelForCausalLM.from_pretrained(path, use_kernels=True, device_map="cuda",
                                                 kernel_config=kernel_config())
    model.train()                                    # transformers re-kernelizes for TRAINING, but
    model.set_use_kernels(True, kernel_config())     # its stored mapping holds only INFERENCE

Limits of that route (``utils/kernel_config.py``, the same file from 5.17 to 5.25):

- the mapping is built for one mode, the model's at the time (``create_compatible_mapping``), so
  after ``model.train()`` / ``model.eval()`` the marked MLPs fall back to their own forward until
  ``set_use_kernels(True, <a new KernelConfig>)`` is called (the old one was rewritten in place);
- devices are limited to cuda/rocm/xpu/npu/neuron/tpu(/mps): a CPU model raises ``ValueError``;
- ``use_local_kernel=True`` fails inside ``from_pretrained`` (``'tuple' object has no attribute
  'split'``); it works after loading, via ``model.set_use_kernels(True, kernel_config(source="local"))``.
  For ``from_pretrained`` with a local build use ``LOCAL_KERNELS="<repo id>=<repo>/build"`` (the repo
  id is ``build.toml``'s ``[general.hub] repo-id``, e.g. ``org/fused-geglu``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Literal

from .families import GEGLU_MLP, KERNEL_LAYERS
from .repos import default_build_dir, default_repo_id, default_version


def kernel_config_support() -> str | None:
    """``None`` if the installed transformers runs its KernelConfig path, else the reason it won't."""
    try:
        import transformers
        from transformers.utils.import_utils import is_kernels_available
    except ImportError as exc:
        return f"transformers is not importable: {exc}"
    if not hasattr(transformers, "KernelConfig"):
        return f"transformers {transformers.__version__} has no KernelConfig"
    if not is_kernels_available():
        import kernels

        return (f"transformers {transformers.__version__} does not accept kernels {kernels.__version__} "
                "(outside its KERNELS_MIN/MAX_VERSION window), so its hub-kernel path is off")
    return None


def kernel_config(layers: Iterable[str] = (GEGLU_MLP,), *, source: Literal["hub", "local"] = "hub",
                  repo_id: str | None = None, version: int | None = None, revision: str | None = None,
                  build_dir: Path | None = None, trust_remote_code: bool = True):
    """A ``transformers.KernelConfig`` mapping the given marked layer names to fused-geglu.

    ``layers`` must name layers the model has (transformers rejects the others): ``FusedGeGLUMLP``
    for Gemma-style models, ``FusedT5GeGLUDense`` for the T5 family, ``FusedPackedGeGLUMLP`` for
    ModernBERT, ``FusedLinearBias`` when
    ``nn.Linear`` is marked. ``inherit_mapping=False``: transformers' default mapping would
    try to download kernels-community repos. A fresh config is needed for every
    ``set_use_kernels`` call. ``repo_id`` defaults to ``build.toml``'s ``[general.hub] repo-id`` and
    ``version`` to its ``[general] version``; ``revision=`` replaces the version.
    """
    from transformers import KernelConfig

    reason = kernel_config_support()
    if reason is not None:
        raise RuntimeError(reason)
    mapping: dict = {}
    for name in layers:
        layer = KERNEL_LAYERS[name]
        if source == "local":
            mapping[name] = f"{Path(build_dir or default_build_dir()).resolve()}:{layer}"
        elif source == "hub":
            if revision is not None:
                meta = {"revision": revision}
            else:
                meta = {"version": version if version is not None else default_version()}
            mapping[name] = (f"{repo_id or default_repo_id()}:{layer}", {**meta, "trust_remote_code": trust_remote_code})
        else:
            raise ValueError(f"KernelConfig supports source='hub' or 'local', got {source!r}")
    return KernelConfig(mapping, use_local_kernel=source == "local", inherit_mapping=False)
