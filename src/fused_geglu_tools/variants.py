"""Build-variant names: the ``build/<variant>`` folder names the ``kernels`` loader selects from.

One dataclass parses and formats every name this project produces, so the builder, the stager
and the tests agree on them:

- compiled: ``torch{M}{m}-cxx11-{compute}-{arch}-{os}``, e.g. ``torch213-cxx11-cpu-x86_64-linux``,
  ``torch211-cxx11-cu130-x86_64-linux``;
- noarch (pure Python/Triton): ``torch-{backend}``, e.g. ``torch-cuda``.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass

_ARCH_RE = re.compile(
    r"^torch(?P<major>\d)(?P<minor>\d+)(?P<cxx>-cxx11|-cxx98)?-(?P<compute>cpu|cu\d{3,4})"
    r"-(?P<arch>x86_64|aarch64)-(?P<os>linux)$"
)
_NOARCH_RE = re.compile(r"^torch-(?P<backend>cpu|cuda|rocm|xpu|metal)$")


@dataclass(frozen=True)
class Variant:
    """A build variant. ``torch`` is None for noarch variants."""

    backend: str  # "cpu" | "cuda"
    torch: tuple[int, int] | None = None
    cxx11: bool = True
    cuda: tuple[int, int] | None = None  # CUDA major, minor (compiled CUDA variants only)
    arch: str = "x86_64"
    os: str = "linux"

    @property
    def noarch(self) -> bool:
        return self.torch is None

    @property
    def compute(self) -> str:
        if self.backend == "cuda":
            if self.cuda is None:
                raise ValueError("a compiled CUDA variant needs its CUDA version")
            return f"cu{self.cuda[0]}{self.cuda[1]}"
        return self.backend

    @property
    def name(self) -> str:
        if self.noarch:
            return f"torch-{self.backend}"
        major, minor = self.torch
        cxx = "-cxx11" if self.cxx11 else "-cxx98"
        return f"torch{major}{minor}{cxx}-{self.compute}-{self.arch}-{self.os}"

    @classmethod
    def parse(cls, name: str) -> "Variant":
        m = _NOARCH_RE.match(name)
        if m:
            return cls(backend=m["backend"])
        m = _ARCH_RE.match(name)
        if not m:
            raise ValueError(f"not a build variant name: {name!r}")
        compute = m["compute"]
        if compute == "cpu":
            backend, cuda = "cpu", None
        else:
            digits = compute[2:]
            backend, cuda = "cuda", (int(digits[:-1]), int(digits[-1]))
        return cls(
            backend=backend,
            torch=(int(m["major"]), int(m["minor"])),
            cxx11=m["cxx"] != "-cxx98",
            cuda=cuda,
            arch=m["arch"],
            os=m["os"],
        )

    @classmethod
    def for_this_torch(cls, backend: str) -> "Variant":
        """The compiled variant of ``backend`` that the installed torch would load."""
        import torch

        major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
        cuda = None
        if backend == "cuda":
            if torch.version.cuda is None:
                raise ValueError("the installed torch has no CUDA support")
            cuda = tuple(int(p) for p in torch.version.cuda.split(".")[:2])
        machine = platform.machine().lower()
        arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
        return cls(
            backend=backend,
            torch=(major, minor),
            cxx11=bool(torch.compiled_with_cxx11_abi()),
            cuda=cuda,
            arch=arch,
        )
