// The cuBLASLt linear's autograd node in C++ (CUDA variant only): `linear_lt_train`, registered for
// AutogradCUDA. Forward: linear_lt with the BIAS epilogue, or GELU_AUX_BIAS keeping the pre-activation
// (activation 1, tanh GELU). Backward: ATen's gelu_backward on the saved pre-activation (activation 1),
// dx = g w (cuBLAS), and dW with db from linear_lt_bwd_weight (BGRADB). These are the kernels of the
// Python node's cuBLASLt path in fused_geglu/linear.py, which routes here only where it would run that
// path with the GELU in the epilogue (not fp32, N % 8 == 0) and a contiguous x; see mlp_train.cpp for why.
// With an addend for a bias (a contiguous tensor of the output's shape, cuBLASLt's C operand) the GELU
// (activation 1: tanh, 2: exact) runs after the GEMM, as ATen's gelu on its output, which is the
// pre-activation kept; the addend's gradient is the gradient at the pre-activation itself.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_unsafe_view.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/mm.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "torch_binding.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearLtTrain : public torch::autograd::Function<LinearLtTrain> {
  static at::Tensor forward(AutogradContext *ctx, at::Tensor const &x, at::Tensor const &weight,
                            std::optional<at::Tensor> const &bias, int64_t activation) {
    const c10::OptionalDeviceGuard guard(x.device());
    const int64_t n = weight.size(0), k = weight.size(1);
    const at::Tensor x2 = x.view({-1, k});
    at::Tensor out = at::empty({x2.size(0), n}, x.options());
    std::optional<at::Tensor> preact;
    const bool addend = bias.has_value() && bias->defined() && bias->dim() > 1;
    if (addend) {
      linear_lt(out, x2, weight, bias->view({-1, n}), 0, std::nullopt);
      if (activation != 0) {
        preact = out;
        out = at::gelu(out, activation == 1 ? "tanh" : "none");
      }
      ctx->saved_data["bias_shape"] = bias->sizes().vec();
    } else {
      if (activation == 1) preact = at::empty_like(out);
      linear_lt(out, x2, weight, bias, activation, preact);
    }
    ctx->save_for_backward({x, weight, preact.value_or(at::Tensor())});
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->saved_data["addend"] = addend;
    if (x.dim() == 2) return out;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = n;
    return at::_unsafe_view(out, shape);  // not a view: in-place ops on the output stay allowed
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "linear: create_graph=True (double backward) is not supported by the compiled training node; its "
                "backward kernels record no graph (for second derivatives: plain PyTorch ops, or a kernelized "
                "model's own module forward)");
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &preact = saved[2];
    const c10::OptionalDeviceGuard guard(x.device());
    const int64_t n = weight.size(0), k = weight.size(1);
    at::Tensor g = grads[0].reshape({-1, n}).contiguous();
    const int64_t activation = ctx->saved_data["activation"].toInt();
    if (activation != 0) g = at::gelu_backward(g, preact, activation == 1 ? "tanh" : "none");
    at::Tensor dx = at::mm(g, weight);
    at::Tensor dw = at::empty({n, k}, weight.options());
    const bool addend = ctx->saved_data["addend"].toBool();
    std::optional<at::Tensor> db;
    if (ctx->saved_data["has_bias"].toBool() && !addend) db = at::empty({n}, weight.options());
    linear_lt_bwd_weight(dw, db, g, x.view({-1, k}));
    if (addend) db = g.view(ctx->saved_data["bias_shape"].toIntVector());
    return {dx.view(x.sizes()), dw, db.value_or(at::Tensor()), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_lt_train(at::Tensor const &x, at::Tensor const &weight, std::optional<at::Tensor> const &bias,
                           int64_t activation) {
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.numel() > 0 && weight.dim() == 2 &&
                  x.size(-1) == weight.size(1),
              "linear_lt_train: x must be non-empty and contiguous with weight's ", weight.size(-1),
              " features in its last dimension, got shape ", x.sizes(), " and strides ", x.strides());
  const bool addend = bias.has_value() && bias->defined() && bias->dim() > 1;
  if (addend) {
    std::vector<int64_t> out_shape = x.sizes().vec();
    out_shape.back() = weight.size(0);
    TORCH_CHECK(bias->sizes() == at::IntArrayRef(out_shape) && bias->is_contiguous(),
                "linear_lt_train: an addend bias must be contiguous with the output's shape ", out_shape,
                ", got ", bias->sizes(), " strides ", bias->strides());
  }
  TORCH_CHECK(activation == 0 || activation == 1 || (addend && activation == 2),
              "linear_lt_train: activation must be 0 (none) or 1 (tanh GELU), or 2 (exact GELU) with an addend; got ",
              activation);
  return LinearLtTrain::apply(x, weight, bias, activation);
}
