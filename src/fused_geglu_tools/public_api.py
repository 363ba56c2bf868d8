"""The kernel's public API, read from a variant's sources without importing them (``ast``).

What ``publish`` compares between a build and its version branch (``__all__`` per variant), what the
Hub card lists (``card.py``), and what each variant's ``symbols.json`` records for kernels 0.19's
``kernels describe-api``: the functions of ``__all__`` with their signatures and first doc lines, and
the layers with the two flags kernels' layer contract reads (``has_backward``, ``can_torch_compile``).
Reading, not importing, keeps these usable for variants this machine cannot load (a CUDA build on a
CPU machine) and keeps a guessed API out of them: anything not written as a literal is an error.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from .verify import find_variants

SYMBOLS = "symbols.json"  # beside metadata.json in every variant; the digest covers it
SYMBOLS_SCHEMA_VERSION = 1  # the one kernels 0.19's reader accepts
LAYER_FLAGS = ("has_backward", "can_torch_compile")


class ApiError(ValueError):
    """The API cannot be read truthfully from the sources (computed ``__all__``, no ``__init__.py``, ...)."""


def read_all(init_py: Path) -> list[str]:
    """The names of ``__all__`` in ``init_py``, in order, without importing it.

    Accepts ``__all__ = [...]`` / ``(...)`` (also annotated) and ``__all__ += [...]`` with string
    literals only; anything computed raises :class:`ApiError`, since the card (and the version
    check of ``publish``) must not guess the API.
    """
    tree = ast.parse(Path(init_py).read_text(), filename=str(init_py))
    names: list[str] | None = None
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names = _literal_names(node.value, init_py)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == "__all__":
            if names is None:
                raise ApiError(f"{init_py}: `__all__ +=` before `__all__ =`")
            names += _literal_names(node.value, init_py)
    if names is None:
        raise ApiError(f"{init_py} defines no __all__ (the kernel's public API)")
    return names


def _literal_names(value: ast.expr | None, where: Path) -> list[str]:
    if isinstance(value, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
    ):
        return [e.value for e in value.elts]
    raise ApiError(f"{where}: __all__ must be a literal list of strings to be read without importing the kernel")


def read_layers(variant_dir: Path) -> list[str]:
    """Names of the public ``nn.Module`` subclasses the variant's ``layers`` module defines.

    A class counts when a base is ``nn.Module`` / ``torch.nn.Module`` / ``Module`` or another
    counted class of the same module (so ``class GeGLUMLPTanh(GeGLUMLP)`` counts). For a
    ``layers/`` package, names ``__init__.py`` imports from its submodules are followed one level.
    """
    variant_dir = Path(variant_dir)
    if (variant_dir / "layers.py").is_file():
        return _module_layers(variant_dir / "layers.py")
    package = variant_dir / "layers" / "__init__.py"
    if not package.is_file():
        return []
    found = _module_layers(package)
    tree = ast.parse(package.read_text(), filename=str(package))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            sub = package.parent / (node.module.replace(".", "/") + ".py")
            if sub.is_file():
                sub_layers = set(_module_layers(sub))
                found += [a.asname or a.name for a in node.names if a.name in sub_layers]
    return sorted(set(found), key=found.index)


def _module_layers(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    layers: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        if any(_is_module_base(b) or (isinstance(b, ast.Name) and b.id in layers) for b in node.bases):
            layers.append(node.name)
    return layers


def _is_module_base(base: ast.expr) -> bool:
    return ast.unparse(base) in {"nn.Module", "torch.nn.Module", "Module"}


def variant_api(variant_dir: Path) -> list[str]:
    init_py = Path(variant_dir) / "__init__.py"
    if not init_py.is_file():
        raise ApiError(f"{variant_dir} has no __init__.py")
    return read_all(init_py)


def exported_modules(variant_dir: Path) -> set[str]:
    """Names the variant's ``__init__.py`` binds to submodules (``from . import layers, reference``).
    (A name such as ``geglu``, imported as ``from .geglu import geglu``, is the function.)"""
    tree = ast.parse((Path(variant_dir) / "__init__.py").read_text())
    return {(a.asname or a.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module is None and node.level == 1 for a in node.names}


def tree_api(build_dir: Path) -> dict[str, list[str]]:
    """``{variant: __all__}`` for every variant under ``build_dir``."""
    return {v.name: variant_api(v) for v in find_variants(build_dir)}


# --- symbols.json: the API as kernels describe-api reads it ----------------------------------------


def _summary(node: ast.AST) -> str | None:
    """The docstring's first paragraph, as one line."""
    doc = ast.get_docstring(node)
    return " ".join(doc.strip().split("\n\n")[0].split()) if doc else None


def _module_file(package: Path, module: str) -> Path | None:
    base = package / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported_from(init_py: Path) -> dict[str, tuple[str, str]]:
    """``{bound name: (relative module, name there)}`` for the ``from .mod import name`` lines of ``init_py``."""
    tree = ast.parse(init_py.read_text(), filename=str(init_py))
    return {(a.asname or a.name): (node.module, a.name) for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module for a in node.names}


def _function_symbol(variant_dir: Path, name: str, origins: dict[str, tuple[str, str]]) -> dict:
    """A function's entry: its name, and where its ``def`` is found its signature and first doc line."""
    entry: dict = {"name": name}
    if name not in origins:
        return entry
    module, original = origins[name]
    path = _module_file(variant_dir, module)
    if path is None:
        return entry
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == original:
            entry["signature"] = f"({ast.unparse(node.args)})" + (f" -> {ast.unparse(node.returns)}" if node.returns else "")
            entry["doc"] = _summary(node)
            break
    return entry


def _layer_sources(variant_dir: Path) -> list[Path]:
    if (variant_dir / "layers.py").is_file():
        return [variant_dir / "layers.py"]
    package = variant_dir / "layers"
    return sorted(package.glob("*.py")) if package.is_dir() else []


def _class_flags(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> dict[str, bool | None]:
    """``has_backward`` / ``can_torch_compile`` as literal class attributes, inherited from a base of the
    same module where the class does not set one; ``None`` where neither says (kernels reads it as unknown)."""
    flags: dict[str, bool | None] = {}
    for node in cls.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id in LAYER_FLAGS:
                value = node.value
                if not (isinstance(value, ast.Constant) and isinstance(value.value, bool)):
                    raise ApiError(f"{cls.name}.{target.id} must be a literal True/False to be read without importing")
                flags[target.id] = value.value
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            for key, value in _class_flags(classes[base.id], classes).items():
                flags.setdefault(key, value)
    return {key: flags.get(key) for key in LAYER_FLAGS}


def symbols(variant_dir: Path) -> dict:
    """The ``symbols.json`` content for ``variant_dir`` (schema 1, the one kernels 0.19 reads)."""
    variant_dir = Path(variant_dir)
    modules = exported_modules(variant_dir)
    origins = _imported_from(variant_dir / "__init__.py")
    functions = [_function_symbol(variant_dir, name, origins) for name in variant_api(variant_dir) if name not in modules]
    classes: dict[str, ast.ClassDef] = {}
    for path in _layer_sources(variant_dir):
        tree = ast.parse(path.read_text(), filename=str(path))
        classes.update({node.name: node for node in tree.body if isinstance(node, ast.ClassDef)})
    layers = []
    for name in read_layers(variant_dir):
        if name not in classes:
            raise ApiError(f"{variant_dir}: layer {name} has no class definition in its layers sources")
        layers.append({"name": name, "attributes": _class_flags(classes[name], classes),
                       "doc": _summary(classes[name])})
    return {"schema_version": SYMBOLS_SCHEMA_VERSION, "functions": functions, "layers": layers}


def write_symbols(variant_dir: Path) -> Path:
    """Write ``symbols.json`` into ``variant_dir`` (before its metadata.json, whose digest covers it)."""
    path = Path(variant_dir) / SYMBOLS
    path.write_text(json.dumps(symbols(variant_dir), indent=2, ensure_ascii=False) + "\n")
    return path
