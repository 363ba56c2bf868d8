"""``build.toml``: validated with the parser the ``kernels`` loader ships, then read as data."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path


class BuildConfigError(ValueError):
    pass


@dataclass(frozen=True)
class KernelSection:
    """One ``[kernel.<name>]`` table: a compiled source folder for one backend."""

    name: str
    backend: str
    depends: tuple[str, ...]
    src: tuple[str, ...]
    include: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()
    cuda_capabilities: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildConfig:
    root: Path
    name: str  # "fused-geglu"
    version: int
    license: str
    backends: tuple[str, ...]
    repo_id: str | None  # [general.hub] repo-id; None when build.toml has none (see hub_repo_id)
    torch_src: tuple[str, ...]
    pyext: tuple[str, ...]
    kernels: tuple[KernelSection, ...] = field(default_factory=tuple)
    python_depends: tuple[str, ...] = ()
    upstream: str | None = None

    @property
    def python_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def package_dir(self) -> Path:
        return self.root / "torch-ext" / self.python_name

    def kernels_for(self, backend: str) -> list[KernelSection]:
        return [k for k in self.kernels if k.backend == backend]


# Edition 6 names a kernel section's source language; edition 5 named its backend. Both are read.
_LANGUAGE_BACKENDS = {"cpp-cpu": "cpu", "cpp-cuda": "cuda"}


def _validate_with_kernels_parser(root: Path) -> None:
    try:
        from kernels._rust import Build
    except ImportError:  # the GPU box may lack kernels' compiled part: fall back to our checks
        return
    try:
        Build.open(root)
    except ValueError as exc:
        if "unsupported build edition" in str(exc):
            # kernels 0.17 (transformers 5.20-5.22) predates edition 6. Its loader never reads
            # build.toml, only metadata.json, so this builder's own checks below stand in for it.
            return
        raise BuildConfigError(f"{root / 'build.toml'} is invalid: {exc}") from exc


def _section_backend(name: str, table: dict) -> str:
    if "language" in table:
        backend = _LANGUAGE_BACKENDS.get(table["language"])
        if backend is None:
            raise BuildConfigError(f"build.toml [kernel.{name}]: language = {table['language']!r}; this builder "
                                   f"compiles {', '.join(map(repr, _LANGUAGE_BACKENDS))}")
        return backend
    if "backend" in table:
        return table["backend"]
    raise BuildConfigError(f"build.toml [kernel.{name}]: no language (edition 6) or backend (edition 5)")


def _repo_id_of(general: dict, path: Path) -> str | None:
    repo_id = general.get("hub", {}).get("repo-id")
    if repo_id is None:
        return None
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise BuildConfigError(f"{path}: [general.hub] repo-id = {repo_id!r} is not a Hub repository id (ORG/NAME)")
    return repo_id


def _version_of(general: dict, path: Path) -> int:
    version = general.get("version")
    if version is None:
        raise BuildConfigError(f"{path}: no [general] version: set it to the kernel's major version (e.g. version = 1)")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise BuildConfigError(
            f"{path}: [general] version = {version!r} is not a major version (a positive integer, the Hub branch v<N>)"
        )
    return version


def _read_general(root: Path | None) -> tuple[dict, Path]:
    """``build.toml``'s ``[general]`` table and the file's path; TOML only, no other checks."""
    if root is None:
        from .cli import repo_root

        root = repo_root()
    path = Path(root) / "build.toml"
    try:
        general = tomllib.loads(path.read_text())["general"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise BuildConfigError(f"{path}: cannot read [general]: {exc!r}") from exc
    return general, path


def hub_repo_id(root: Path | None = None) -> str:
    """``build.toml``'s ``[general.hub] repo-id``: the one place the Hub repository id is written.

    Every tool's default comes from here (stage, demo, publish, the card, the transformers
    helpers); their ``--repo-id`` / ``repo_id=`` arguments override it. ``root`` defaults to
    :func:`fused_geglu_tools.cli.repo_root`. Reads only the TOML (no kernels parser, no source
    checks), so it is cheap to call per command.
    """
    general, path = _read_general(root)
    repo_id = _repo_id_of(general, path)
    if repo_id is None:
        raise BuildConfigError(f'{path}: no repository id: set [general.hub] repo-id = "ORG/NAME" (or pass --repo-id)')
    return repo_id


def hub_version(root: Path | None = None) -> int:
    """``build.toml``'s ``[general] version``: the kernel's major version, whose Hub branch is ``v<version>``.

    The one place it is written: stage and publish name their branch after it, and the demo and
    the transformers helpers load that branch by default (``--ref`` / ``version=`` / ``revision=``
    override it where they take one). ``root`` defaults to :func:`fused_geglu_tools.cli.repo_root`;
    TOML only, like :func:`hub_repo_id`. Raises :class:`BuildConfigError` naming the file and the
    key when the key is missing or not a positive int (:func:`load_build_config` checks the same).
    """
    general, path = _read_general(root)
    return _version_of(general, path)


def load_build_config(root: Path) -> BuildConfig:
    root = Path(root).resolve()
    path = root / "build.toml"
    if not path.is_file():
        raise BuildConfigError(f"no build.toml in {root}")
    _validate_with_kernels_parser(root)
    data = tomllib.loads(path.read_text())
    general = data["general"]
    torch_table = data.get("torch")
    if torch_table is None:
        raise BuildConfigError("build.toml: this builder handles [torch] kernels only")
    sections = []
    for name, table in data.get("kernel", {}).items():
        sections.append(
            KernelSection(
                name=name,
                backend=_section_backend(name, table),
                depends=tuple(table.get("depends", ())),
                src=tuple(table["src"]),
                include=tuple(table.get("include", ())),
                cxx_flags=tuple(table.get("cxx-flags", ())),
                cuda_flags=tuple(table.get("cuda-flags", ())),
                cuda_capabilities=tuple(table.get("cuda-capabilities", ())),
            )
        )
    for section in sections:
        for src in section.src:
            if not (root / src).is_file():
                raise BuildConfigError(f"build.toml [kernel.{section.name}]: source {src} does not exist")
    return BuildConfig(
        root=root,
        name=general["name"],
        version=_version_of(general, path),
        license=general["license"],
        backends=tuple(general["backends"]),
        repo_id=_repo_id_of(general, path),
        torch_src=tuple(torch_table.get("src", ())),
        pyext=tuple(torch_table.get("pyext", ("py", "pyi"))),
        kernels=tuple(sections),
        python_depends=tuple(general.get("python-depends", ())),
        upstream=general.get("upstream"),
    )
