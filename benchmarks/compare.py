"""Side-by-side comparison (GPU only): ``python benchmarks/compare.py [--quick] [--out DIR] ...``.

A thin entry point for ``fused_geglu_tools.bench`` (also ``fused-geglu bench`` and ``make bench``)
that works from a plain checkout without installing the tools. Not named ``benchmark*.py`` on
purpose: ``kernels benchmark`` loads every such file and expects ``Benchmark`` classes in it.
``--plot-only RESULTS.json`` redraws the PNG from saved results on any machine.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fused_geglu_tools.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
