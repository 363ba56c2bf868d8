"""transformers integration of fused-geglu (implementation of :mod:`fused_geglu_tools.transformers`).

``families``: which classes, and when an instance must keep its own forward; ``marking``: marking
classes for ``kernels.kernelize`` and undoing it; ``repos``: hub / locked / local repositories
and the kernel mapping; ``kernelize``: the one-call entry point and its report; ``config``: the
``transformers.KernelConfig`` route.
"""
