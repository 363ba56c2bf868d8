// The cuBLASLt linear for eager calls that record no autograd graph (inference, no_grad), as one op call
// that allocates its output and launches the GEMM: `linear_lt_infer` (CUDA variant only), beside the
// training node of linear_lt_train.cpp. It runs what fused_geglu/linear.py's cuBLASLt path runs for a
// contiguous x and a [N] bias or none: the BIAS epilogue, or GELU_BIAS (activation 1, tanh GELU) in
// half precision; in fp32 the tanh GELU is ATen's, in place after the BIAS epilogue (cuBLASLt's fp32
// GELU is ~20x less accurate than ATen's: linear.py says where that was measured). Same kernels,
// same bits as that path.
//
// Why: at decode sizes the GEMM is a few µs of GPU time and the Python around it (row views, the output
// allocation, the op call, the reshape) made `linear(x, w, b, activation="gelu_tanh")` 7-15 µs slower
// than eager's F.gelu(F.linear(...)) without CUDA graphs (H200 harness, 9416396), where it is faster
// with them.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <c10/core/DeviceGuard.h>

#include "torch_binding.h"

at::Tensor linear_lt_infer(at::Tensor const &x, at::Tensor const &weight, std::optional<at::Tensor> const &bias,
                           int64_t activation) {
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.numel() > 0 && weight.dim() == 2 &&
                  x.size(-1) == weight.size(1),
              "linear_lt_infer: x must be non-empty and contiguous with weight's ", weight.size(-1),
              " features in its last dimension, got shape ", x.sizes(), " and strides ", x.strides());
  TORCH_CHECK(!bias.has_value() || !bias->defined() || bias->dim() == 1,
              "linear_lt_infer: bias must be a vector [N] or None (an addend takes linear's general path)");
  TORCH_CHECK(activation == 0 || activation == 1,
              "linear_lt_infer: activation must be 0 (none) or 1 (tanh GELU), got ", activation);
  const c10::OptionalDeviceGuard guard(x.device());
  const int64_t n = weight.size(0), k = weight.size(1);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  at::Tensor out = at::empty(shape, x.options());
  if (n == 0) return out;
  at::Tensor out2 = out.view({-1, n});
  const bool gelu_after = activation == 1 && x.scalar_type() == at::kFloat;
  linear_lt(out2, x.view({-1, k}), weight, bias, gelu_after ? 0 : activation, std::nullopt);
  if (gelu_after) at::gelu_(out, "tanh");
  return out;
}
