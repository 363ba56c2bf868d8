"""The Hub card: ``CARD.md`` (a Jinja template at the repository root) rendered as ``README.md``.

Everything the card states is read from what is published, without importing the kernel:

- ``functions``: the variant's ``__init__.py`` ``__all__`` (read with ``ast``), minus its submodules
  (``layers``, ``reference``);
- ``layers``: the ``nn.Module`` subclasses defined in the variant's ``layers.py`` (or the
  ``layers/`` package), also read with ``ast``;
- ``version``, ``repo_id``, ``license``, ``upstream``, ``source``: ``build.toml`` (``repo_id``: its
  ``[general.hub] repo-id``, unless ``--repo-id`` names another);
- ``variants``: the ``build/<variant>`` folders with their backend;
- ``benchmark``: the newest ``benchmarks/results/*.json``, when its shape is one this module
  understands (see :func:`load_benchmark_table`); otherwise the card says none is published.

The variable names of kernel-builder's ``fill-card`` (``repo_id``, ``version``, ``functions``,
``layers``, ``has_benchmark``, ``upstream``, ``source``, ``license``) mean the same here, so a
card template written for one renders with the other as far as those variables go.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .buildconfig import BuildConfigError, hub_repo_id
from .public_api import ApiError, exported_modules, read_layers, variant_api
from .verify import find_variants, read_metadata

CARD_TEMPLATE = "CARD.md"


class CardError(ApiError):
    """The card cannot be rendered truthfully (unreadable ``__all__``, variants disagree, ...)."""


# --- benchmarks ----------------------------------------------------------------------------------


@dataclass
class BenchmarkTable:
    source: str  # file name under benchmarks/results/
    columns: list[str]
    rows: list[list[str]]
    notes: list[str]  # "key: value" lines from top-level scalar fields (GPU, versions, date)


HARNESS_SCHEMA = "fused-geglu-bench/"  # benchmarks/compare.py's JSON (benchmarks/README.md)
_CARD_PROVIDERS = ("eager", "compile", "liger", "ours-auto")


def _full_mlp_run(data) -> bool:
    """A complete harness run of ``geglu_mlp`` over more than one token count (not --quick or a
    decode-only or single-op-width run): what the card's speed table is made from."""
    if not (isinstance(data, dict) and str(data.get("schema", "")).startswith(HARNESS_SCHEMA)
            and data.get("complete") and not data.get("quick") and not data.get("smoke")):
        return False
    rows = data.get("rows")
    return isinstance(rows, list) and len({r.get("M") for r in rows
                                           if isinstance(r, dict) and r.get("op") == "geglu_mlp"}) > 1


def _harness_table(name: str, data: dict, max_rows: int) -> BenchmarkTable:
    """One row per (op, shape, tokens, mode): median µs of eager, torch.compile, Liger and this kernel."""
    times: dict[tuple, dict[str, float]] = {}
    for r in data["rows"]:
        if r.get("status") == "ok" and r.get("provider") in _CARD_PROVIDERS and r.get("median_us") is not None:
            times.setdefault((r["op"], r["shape"], r["M"], r["mode"]), {})[r["provider"]] = r["median_us"]
    columns = ["op", "shape", "tokens", "mode", *(f"{p} µs" for p in _CARD_PROVIDERS), "eager / ours"]
    rows = []
    for (op, shape, m, mode), t in times.items():
        ours, eager = t.get("ours-auto"), t.get("eager")
        speedup = f"{eager / ours:.2f}x" if ours and eager else ""
        rows.append([op, shape, str(m), mode, *(_cell(t.get(p)) for p in _CARD_PROVIDERS), speedup])
    env = data.get("env", {})
    notes = [f"{k}: {v}" for k, v in (("device", env.get("device")), ("torch", env.get("torch")),
                                      ("triton", env.get("triton")), ("commit", str(env.get("commit", ""))[:7]),
                                      ("created", data.get("created"))) if v]
    if len(rows) > max_rows:
        notes.append(f"first {max_rows} of {len(rows)} rows shown")
    return BenchmarkTable(source=name, columns=columns, rows=rows[:max_rows], notes=notes)


def load_benchmark_table(results_dir: Path, max_rows: int = 40) -> BenchmarkTable | None:
    """The card's speed table: from the newest full ``geglu_mlp`` run of the harness (by the run's own
    ``created`` time: files in a fresh clone all have one mtime), else from the newest ``*.json``.

    Tolerant on purpose (the results schema is owned elsewhere): the file may be a list of row
    objects, or an object whose ``rows`` / ``results`` / ``benchmarks`` / ``data`` field is such a
    list; top-level scalar fields become notes. Columns are the union of the rows' scalar keys.
    Anything else (or no file) gives ``None`` and the card says no results are published.
    """
    files = sorted(Path(results_dir).glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    if not files:
        return None
    runs = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if _full_mlp_run(data):
            runs.append((str(data.get("created", "")), f.name, data))
    if runs:
        _, name, data = max(runs, key=lambda r: r[:2])
        return _harness_table(name, data, max_rows)
    newest = files[-1]
    try:
        data = json.loads(newest.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    notes: list[str] = []
    rows = data
    if isinstance(data, dict):
        notes = [f"{k}: {v}" for k, v in data.items() if _is_scalar(v) and v is not None]
        rows = next((data[k] for k in ("rows", "results", "benchmarks", "data") if isinstance(data.get(k), list)), None)
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return None
    columns: list[str] = []
    for r in rows:
        columns += [k for k, v in r.items() if _is_scalar(v) and k not in columns]
    if not columns:
        return None
    cells = [[_cell(r.get(c)) for c in columns] for r in rows[:max_rows]]
    if len(rows) > max_rows:
        notes.append(f"first {max_rows} of {len(rows)} rows shown")
    return BenchmarkTable(source=newest.name, columns=columns, rows=cells, notes=notes)


def _is_scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


# --- rendering -----------------------------------------------------------------------------------


def card_context(repo_root: Path, build_dir: Path, *, repo_id: str | None = None) -> dict:
    """The variables ``CARD.md`` is rendered with, for the variants under ``build_dir``."""
    repo_root = Path(repo_root)
    general = tomllib.loads((repo_root / "build.toml").read_text())["general"]
    variants = find_variants(build_dir)
    if not variants:
        raise CardError(f"no build variant under {build_dir}")
    apis = {v.name: variant_api(v) for v in variants}
    first = next(iter(apis.values()))
    differing = [name for name, api in apis.items() if api != first]
    if differing:
        raise CardError(f"variants disagree on __all__: {', '.join(differing)} differ from {variants[0].name}")
    layer_sets = {v.name: read_layers(v) for v in variants}
    layers = next(iter(layer_sets.values()))
    if any(ls != layers for ls in layer_sets.values()):
        raise CardError(f"variants disagree on their layers: {layer_sets}")

    variant_rows = []
    for v in variants:
        backend = read_metadata(v).get("backend", {})
        archs = ", ".join(backend.get("archs") or [])
        variant_rows.append({"name": v.name, "backend": backend.get("type", "?"), "archs": archs})

    benchmarks = repo_root / "benchmarks"
    return {
        "repo_id": repo_id or hub_repo_id(repo_root),
        "name": general["name"],
        "version": general["version"],
        "license": general.get("license", "").lower(),
        "upstream": general.get("upstream"),
        "source": general.get("source"),
        # __all__ minus the submodules it exports (layers, reference): the card lists callables.
        "functions": [n for n in first if n not in exported_modules(variants[0])],
        "layers": layers,
        "variants": variant_rows,
        "has_benchmark": any(benchmarks.glob("benchmark*.py")),
        "benchmark": load_benchmark_table(benchmarks / "results"),
    }


def render_card(template_text: str, context: dict) -> str:
    """Render ``template_text`` with Jinja (undefined variables are errors, not blanks)."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    try:
        return env.from_string(template_text).render(**context)
    except jinja2.TemplateError as e:
        raise CardError(f"{CARD_TEMPLATE}: {e}") from e


def render_repo_card(repo_root: Path, build_dir: Path, *, repo_id: str | None = None) -> str:
    repo_root = Path(repo_root)
    return render_card((repo_root / CARD_TEMPLATE).read_text(), card_context(repo_root, build_dir, repo_id=repo_id))


def main(argv: list[str]) -> int:
    """`fused-geglu card`: print (or write) the rendered card, for previewing what publish uploads."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="fused-geglu card",
        description="Render CARD.md for the variants under BUILD_DIR (what `publish` uploads as README.md).",
        epilog="exit codes: 0 rendered; 1 the card cannot be rendered truthfully (e.g. variants disagree on __all__)",
    )
    parser.add_argument("--repo-root", type=Path, default=None,
                        help="folder with build.toml and CARD.md (default: $FUSED_GEGLU_ROOT, else found from the cwd)")
    parser.add_argument("--build-dir", type=Path, default=None, help="default: REPO_ROOT/build")
    parser.add_argument("--repo-id", default=None, help="default: build.toml [general.hub] repo-id")
    parser.add_argument("-o", "--output", type=Path, default=None, help="write here instead of stdout")
    args = parser.parse_args(argv)
    if args.repo_root is None:
        from .cli import repo_root

        args.repo_root = repo_root()
    try:
        text = render_repo_card(args.repo_root, args.build_dir or args.repo_root / "build", repo_id=args.repo_id)
    except (CardError, BuildConfigError, OSError, KeyError) as e:
        print(f"fused-geglu card: {e}", file=sys.stderr)
        return 1
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
