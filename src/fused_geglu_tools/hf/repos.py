"""Where the kernel layers come from, and the kernel mapping built from that, in one place.

Sources:

- ``"hub"``: ``LayerRepository(REPO_ID, version=VERSION)`` (the ``v<VERSION>`` branch; offline,
  with ``HF_HUB_OFFLINE=1``, the ``refs/v<VERSION>`` of the local Hub cache). ``version=`` asks for
  another major version, ``revision=`` pins a branch, tag or commit instead. ``REPO_ID`` and
  ``VERSION`` are this checkout's ``build.toml`` ``[general.hub] repo-id`` and ``[general] version``
  (``org/fused-geglu`` and 1 here), read when asked; ``repo_id=`` names another repository.
- ``"locked"``: ``LockedLayerRepository`` reading the commit from a ``kernels.lock`` (kernels 0.17
  format); ``lockfile=None`` lets kernels look in the calling package's metadata.
- ``"local"``: ``LocalLayerRepository`` on this checkout's ``build/`` (or ``build_dir=``); kernels
  picks the variant for the running torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Literal

from kernels import LayerRepository, LocalLayerRepository, LockedLayerRepository, Mode

from ..buildconfig import hub_repo_id, hub_version
from .families import GEGLU_MLP, KERNEL_LAYERS, LINEAR_BIAS, PACKED_GEGLU_MLP, T5_GEGLU_DENSE

Source = Literal["hub", "locked", "local"]
SOURCES: tuple[str, ...] = ("hub", "locked", "local")

# Every kernel layer has a backward and compiles without graph breaks, so one repository serves
# every mode; the modes are still listed so a mode-specific layer can be slotted in here later.
MODES: tuple[Mode, ...] = (
    Mode.INFERENCE,
    Mode.TRAINING,
    Mode.INFERENCE | Mode.TORCH_COMPILE,
    Mode.TRAINING | Mode.TORCH_COMPILE,
)
# The kernel ships CUDA and CPU variants (no ROCm/XPU/MPS build).
DEVICES: tuple[str, ...] = ("cuda", "cpu")

# The checkout this file lives in: src/fused_geglu_tools/hf/repos.py -> repo root.
CHECKOUT = Path(__file__).resolve().parents[3]


def default_build_dir() -> Path:
    return CHECKOUT / "build"


def default_repo_id() -> str:
    """This checkout's ``build.toml`` ``[general.hub] repo-id`` (the ``"hub"`` and ``"locked"`` default)."""
    return hub_repo_id(CHECKOUT)


def default_version() -> int:
    """This checkout's ``build.toml`` ``[general] version`` (the ``"hub"`` default: branch ``v<version>``)."""
    return hub_version(CHECKOUT)


def __getattr__(name: str):
    # REPO_ID and VERSION are read from build.toml when asked for (not at import: a build.toml without
    # a repo id must not break importing the integration, and a fork's build.toml is what counts).
    if name == "REPO_ID":
        return default_repo_id()
    if name == "VERSION":
        return default_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def layer_repository(layer: str, *, source: Source = "hub", repo_id: str | None = None, version: int | None = None,
                     revision: str | None = None, lockfile: Path | None = None, build_dir: Path | None = None,
                     trust_remote_code: bool = True):
    """The kernels repository object for mapping name ``layer`` (e.g. ``"FusedGeGLUMLP"``).

    ``source="hub"`` loads major version ``version`` (``None``: ``build.toml``'s, :data:`VERSION`)
    of ``repo_id`` (``None``: ``build.toml``'s, :data:`REPO_ID`); ``revision=`` overrides the version.
    ``trust_remote_code`` defaults to True because ``org`` is not a trusted kernel publisher;
    offline (``HF_HUB_OFFLINE=1``) kernels skips that check anyway.
    """
    if layer not in KERNEL_LAYERS:
        raise ValueError(f"unknown layer {layer!r}; expected one of {sorted(KERNEL_LAYERS)}")
    layer_name = KERNEL_LAYERS[layer]
    if source in ("hub", "locked") and repo_id is None:
        repo_id = default_repo_id()
    if source == "hub":
        if revision is not None:
            version = None
        elif version is None:
            version = default_version()
        return LayerRepository(repo_id, layer_name=layer_name, version=version, revision=revision,
                               trust_remote_code=trust_remote_code)
    if source == "locked":
        return LockedLayerRepository(repo_id, lockfile=None if lockfile is None else Path(lockfile),
                                     layer_name=layer_name, trust_remote_code=trust_remote_code)
    if source == "local":
        path = Path(build_dir) if build_dir is not None else default_build_dir()
        if not path.is_dir():
            raise FileNotFoundError(f"no kernel build at {path}: run `make build` (or pass build_dir=)")
        return LocalLayerRepository(repo_path=path.resolve(), layer_name=layer_name)
    raise ValueError(f"source must be one of {SOURCES}, got {source!r}")


def layer_names(*, linear_bias: bool = False) -> tuple[str, ...]:
    return (GEGLU_MLP, T5_GEGLU_DENSE, PACKED_GEGLU_MLP) + ((LINEAR_BIAS,) if linear_bias else ())


def kernel_mapping(*, source: Source = "hub", layers: Iterable[str] | None = None, linear_bias: bool = False,
                   devices: Iterable[str] = DEVICES, modes: Iterable[Mode] = MODES, **repo_kwargs) -> dict:
    """``{mapping name: {device: {mode: repository}}}`` for ``kernels.use_kernel_mapping``.

    ``layers`` defaults to the three MLP layers, plus the bias linear when ``linear_bias``;
    ``repo_kwargs`` go to :func:`layer_repository` (``version``, ``revision``, ``lockfile``, ...).
    """
    names = tuple(layers) if layers is not None else layer_names(linear_bias=linear_bias)
    modes = tuple(modes)
    mapping: dict = {}
    for name in names:
        repo = layer_repository(name, source=source, **repo_kwargs)
        mapping[name] = {device: {mode: repo for mode in modes} for device in devices}
    return mapping


def describe_source(source: Source, *, repo_id: str | None = None, version: int | None = None,
                    revision: str | None = None, lockfile: Path | None = None, build_dir: Path | None = None,
                    **_ignored) -> str:
    """Short human label for a report line, e.g. ``org/fused-geglu@v1``; defaults as :func:`layer_repository`."""
    if source in ("hub", "locked") and repo_id is None:
        repo_id = default_repo_id()
    if source == "hub":
        if revision is not None:
            return f"{repo_id}@{revision}"
        return f"{repo_id}@v{version if version is not None else default_version()}"
    if source == "locked":
        return f"{repo_id} locked by {lockfile or 'package metadata'}"
    return str(Path(build_dir) if build_dir is not None else default_build_dir())
