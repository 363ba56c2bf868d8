"""fused-geglu workloads in the ``kernels benchmark`` format.

    kernels benchmark ./          # from the repository root, with build/ holding a variant

The runner (kernels.cli.benchmark) loads the kernel from build/, and for every ``benchmark_<w>``
method of every ``Benchmark`` subclass here: calls ``setup_<w>``, runs ``benchmark_<w>`` once,
compares ``self.out`` with what ``verify_<w>`` returns (``torch.allclose(..., atol=1e-2)``), times
``verify_<w>`` once as the reference, then times ``benchmark_<w>`` (host clock, synchronised per
iteration, so launch overhead is included). The references here are the eager bf16 PyTorch
computation the kernel replaces, so its "Speedup" column is speed-up over eager.

Data are random (never zeros) and scaled so that outputs stay below 1 in magnitude: a 1-ulp bf16
difference there is <= 0.004, inside the runner's fixed atol=1e-2, while a wrong result is not.
On a GPU the dtype is bf16 at the model shapes; on the CPU (the kernel's CPU variant) the dtype is
float32, tokens are capped at 32 and every shape is the blog one, so that the run stays short.

The side-by-side comparison with torch.compile and Liger, with L2-rotated inputs, CUDA-event
timing, roofline floors and memory, is ``fused-geglu bench`` (benchmarks/compare.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark

# (H, I) of the MLPs measured; "blog" is the H=768, I=3072 shape of the fused-MLP write-ups.
SHAPES = {"blog": (768, 3072), "gemma3_1b": (1152, 6912), "gemma_2b": (2048, 16384), "gemma2_9b": (3584, 14336)}
CPU_MAX_TOKENS = 32


def _dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device != "cpu" else torch.float32


def _tokens(device: str, m: int) -> int:
    return m if device != "cpu" else min(m, CPU_MAX_TOKENS)


def _dims(device: str, shape: str) -> tuple[int, int]:
    return SHAPES[shape] if device != "cpu" else SHAPES["blog"]


def _randn(*shape, std: float, device: str, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(*shape, device=device, dtype=torch.float32) * std).to(dtype)


# --------------------------------------------------------------------------------------------
# GeGLU pointwise: geglu(gate, up) and the packed kernels-community/activation form
# --------------------------------------------------------------------------------------------


class GegluBenchmark(Benchmark):
    seed: int = 42

    def _split(self, m: int, i: int) -> None:
        dt, dev = _dtype(self.device), self.device
        m = _tokens(dev, m)
        self.gate = _randn(m, i, std=1.0, device=dev, dtype=dt)
        self.up = _randn(m, i, std=0.05, device=dev, dtype=dt)  # |gelu(gate) * up| < 1

    def _packed(self, m: int, i: int) -> None:
        self._split(m, i)
        self.x = torch.cat([self.gate, self.up], dim=-1).contiguous()  # [m, 2i], gate first
        self.out = torch.full_like(self.gate, float("nan"))  # poisoned: every element must be written

    def _ref(self, approximate: str) -> torch.Tensor:
        # eager: GELU of the bf16 gate (computed in fp32 inside ATen), rounded, times up
        return F.gelu(self.gate, approximate=approximate) * self.up

    # blog shape, tanh (Gemma's gelu_pytorch_tanh)
    def setup_blog_tanh(self):
        self._split(8192, SHAPES["blog"][1])

    def benchmark_blog_tanh(self):
        self.out = self.kernel.geglu(self.gate, self.up, approximate="tanh")

    def verify_blog_tanh(self):
        return self._ref("tanh")

    # blog shape, exact erf GELU
    def setup_blog_erf(self):
        self._split(8192, SHAPES["blog"][1])

    def benchmark_blog_erf(self):
        self.out = self.kernel.geglu(self.gate, self.up, approximate="none")

    def verify_blog_erf(self):
        return self._ref("none")

    # Gemma-2B intermediate width, M=1024
    def setup_gemma_2b_tanh(self):
        self._split(1024, _dims(self.device, "gemma_2b")[1])

    def benchmark_gemma_2b_tanh(self):
        self.out = self.kernel.geglu(self.gate, self.up, approximate="tanh")

    def verify_gemma_2b_tanh(self):
        return self._ref("tanh")

    # packed, API of kernels-community/activation: gelu_tanh_and_mul(out, x)
    def setup_packed_tanh(self):
        self._packed(8192, SHAPES["blog"][1])

    def benchmark_packed_tanh(self):
        self.kernel.gelu_tanh_and_mul(self.out, self.x)

    def verify_packed_tanh(self):
        return self._ref("tanh")

    # packed, exact: gelu_and_mul(out, x)
    def setup_packed_erf(self):
        self._packed(8192, SHAPES["blog"][1])

    def benchmark_packed_erf(self):
        self.kernel.gelu_and_mul(self.out, self.x)

    def verify_packed_erf(self):
        return self._ref("none")


# --------------------------------------------------------------------------------------------
# Linear with the bias (and optionally GELU) in the epilogue
# --------------------------------------------------------------------------------------------


class LinearBenchmark(Benchmark):
    seed: int = 42

    def _make(self, m: int, k: int, n: int) -> None:
        dt, dev = _dtype(self.device), self.device
        m = _tokens(dev, m)
        self.x = _randn(m, k, std=1.0, device=dev, dtype=dt)
        self.w = _randn(n, k, std=0.1 * k**-0.5, device=dev, dtype=dt)  # y ~ N(0, 0.1^2)
        self.b = _randn(n, std=0.05, device=dev, dtype=dt)

    # blog up-projection (K=768 -> N=3072): the bias pass is a large share of a small-K GEMM
    def setup_blog_up_bias(self):
        self._make(8192, 768, 3072)

    def benchmark_blog_up_bias(self):
        self.out = self.kernel.linear(self.x, self.w, self.b)

    def verify_blog_up_bias(self):
        return F.linear(self.x, self.w, self.b)

    # blog down-projection (K=3072 -> N=768)
    def setup_blog_down_bias(self):
        self._make(8192, 3072, 768)

    def benchmark_blog_down_bias(self):
        self.out = self.kernel.linear(self.x, self.w, self.b)

    def verify_blog_down_bias(self):
        return F.linear(self.x, self.w, self.b)

    # bias + tanh-GELU epilogue against linear followed by a separate GELU
    def setup_blog_up_bias_gelu(self):
        self._make(8192, 768, 3072)

    def benchmark_blog_up_bias_gelu(self):
        self.out = self.kernel.linear(self.x, self.w, self.b, activation="gelu_tanh")

    def verify_blog_up_bias_gelu(self):
        return F.gelu(F.linear(self.x, self.w, self.b), approximate="tanh")

    # Gemma-2B gate projection at M=1024
    def setup_gemma_2b_bias(self):
        h, i = _dims(self.device, "gemma_2b")
        self._make(1024, h, i)

    def benchmark_gemma_2b_bias(self):
        self.out = self.kernel.linear(self.x, self.w, self.b)

    def verify_gemma_2b_bias(self):
        return F.linear(self.x, self.w, self.b)


# --------------------------------------------------------------------------------------------
# The whole GeGLU MLP: down(gelu_tanh(gate(x)) * up(x))
# --------------------------------------------------------------------------------------------


class GegluMLPBenchmark(Benchmark):
    seed: int = 42

    def _make(self, shape: str, m: int) -> None:
        h, i = _dims(self.device, shape)
        dt, dev = _dtype(self.device), self.device
        m = _tokens(dev, m)
        self.x = _randn(m, h, std=1.0, device=dev, dtype=dt)
        self.wg = _randn(i, h, std=h**-0.5, device=dev, dtype=dt)  # gate/up pre-activations ~ N(0, 1)
        self.wu = _randn(i, h, std=h**-0.5, device=dev, dtype=dt)
        self.wd = _randn(h, i, std=0.1 * i**-0.5, device=dev, dtype=dt)  # |y| well below 1

    def _eager(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(x, self.wg), approximate="tanh") * F.linear(x, self.wu), self.wd)

    def _ours(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.geglu_mlp(x, self.wg, self.wu, self.wd, approximate="tanh")

    # blog shape, M=8192: where the fused epilogue gains most
    def setup_blog(self):
        self._make("blog", 8192)

    def benchmark_blog(self):
        self.out = self._ours(self.x)

    def verify_blog(self):
        return self._eager(self.x)

    # Gemma3-1B, prefill M=8192
    def setup_gemma3_1b(self):
        self._make("gemma3_1b", 8192)

    def benchmark_gemma3_1b(self):
        self.out = self._ours(self.x)

    def verify_gemma3_1b(self):
        return self._eager(self.x)

    # Gemma-2B, M=1024
    def setup_gemma_2b(self):
        self._make("gemma_2b", 1024)

    def benchmark_gemma_2b(self):
        self.out = self._ours(self.x)

    def verify_gemma_2b(self):
        return self._eager(self.x)

    # Gemma2-9B decode, M=16: weight-read bound, launch count matters
    def setup_gemma2_9b_decode(self):
        self._make("gemma2_9b", 16)

    def benchmark_gemma2_9b_decode(self):
        self.out = self._ours(self.x)

    def verify_gemma2_9b_decode(self):
        return self._eager(self.x)

    # training step on the blog shape: forward + backward (all grads); compared on dx
    def setup_blog_train(self):
        self._make("blog", 8192)
        for t in (self.x, self.wg, self.wu, self.wd):
            t.requires_grad_(True)
        self.dy = _randn(*self.x.shape, std=0.3, device=self.device, dtype=self.x.dtype)

    def benchmark_blog_train(self):
        for t in (self.x, self.wg, self.wu, self.wd):
            t.grad = None
        self._ours(self.x).backward(self.dy)
        self.out = self.x.grad

    def verify_blog_train(self):
        x = self.x.detach().clone().requires_grad_(True)
        (dx,) = torch.autograd.grad(self._eager(x), x, self.dy)
        return dx
