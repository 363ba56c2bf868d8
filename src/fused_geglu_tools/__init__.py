"""Tooling for the fused-geglu kernel repository: the Nix-free builder, Hub staging, locking,
verification, publishing, benchmarks and the transformers integration.

The kernel itself lives in ``torch-ext/fused_geglu`` and is loaded through ``kernels``; nothing
here is imported by the kernel.
"""

__version__ = "0.1.0"
