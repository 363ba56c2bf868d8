"""fused-geglu: a fused GeGLU MLP, GeGLU pointwise ops and a bias-epilogue linear.

Load it through ``kernels``::

    kernel = kernels.get_kernel("org/fused-geglu", version=1, trust_remote_code=True)
    y = kernel.geglu_mlp(x, w_gate, w_up, w_down, approximate="tanh")

Every op dispatches per call to the compiled kernels of the loaded variant (CUDA or C++), the
Triton kernels, or plain ATen; ``backend=`` or ``$FUSED_GEGLU_BACKEND`` forces one, and
``last_backend(op)`` says which ran.
"""

from . import layers, reference
from ._dispatch import available_backends, last_backend
from ._ops import OPS_ID, HAS_COMPILED_OPS
from .geglu import geglu, geglu_packed, gelu_and_mul, gelu_tanh_and_mul
from .linear import linear
from .mlp import geglu_mlp

__all__ = [
    "geglu",
    "geglu_packed",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "linear",
    "geglu_mlp",
    "available_backends",
    "last_backend",
    "reference",
    "layers",
]
