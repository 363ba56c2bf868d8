// GeGLU pointwise's autograd nodes in C++, for eager training steps: `geglu_train` (separate gate, up)
// and `geglu_packed_train` (x = [..., 2d], gate first). Registered for this variant's Autograd key only.
//
// Why: a pointwise call costs a few µs of GPU time at the sizes small training steps use, and the
// Python of an autograd.Function (tens of µs per step) is what such a step waits on. The kernels are
// the ones the Python node runs where the policy names this variant's compiled pointwise kernel
// (geglu_fwd / geglu_bwd of kernel_src/geglu_cuda or kernel_src/geglu_cpu); fused_geglu/geglu.py routes
// here only then, with contiguous operands, so the bits are the Python node's (the tests compare them).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "torch_binding.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [prod(leading dims), last dim] view of a contiguous tensor (the caller checks contiguity).
at::Tensor rows(at::Tensor const &t) { return t.view({-1, t.size(-1)}); }

void refuse_create_graph(const char *op) {
  TORCH_CHECK(!at::GradMode::is_enabled(), op,
              ": create_graph=True (double backward) is not supported by the compiled training node; its "
              "backward kernels record no graph (for second derivatives: plain PyTorch ops, or a kernelized "
              "model's own module forward)");
}

struct GegluTrain : public torch::autograd::Function<GegluTrain> {
  static at::Tensor forward(AutogradContext *ctx, at::Tensor const &gate, at::Tensor const &up,
                            int64_t approximate) {
    const c10::OptionalDeviceGuard guard(gate.device());
    at::Tensor out = at::empty(gate.sizes(), gate.options());
    at::Tensor out2 = rows(out);
    geglu_fwd(out2, rows(gate), rows(up), approximate);
    ctx->save_for_backward({gate, up});
    ctx->saved_data["approximate"] = approximate;
    return out;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    refuse_create_graph("geglu");
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1];
    const c10::OptionalDeviceGuard guard(gate.device());
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor dgate = at::empty(gate.sizes(), gate.options()), dup = at::empty(up.sizes(), up.options());
    at::Tensor dgate2 = rows(dgate), dup2 = rows(dup);
    geglu_bwd(dgate2, dup2, rows(grad), rows(gate), rows(up), ctx->saved_data["approximate"].toInt());
    return {dgate, dup, at::Tensor()};
  }
};

struct GegluPackedTrain : public torch::autograd::Function<GegluPackedTrain> {
  static at::Tensor forward(AutogradContext *ctx, at::Tensor const &x, int64_t approximate) {
    const c10::OptionalDeviceGuard guard(x.device());
    const int64_t d = x.size(-1) / 2;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = d;
    at::Tensor out = at::empty(shape, x.options());
    at::Tensor out2 = rows(out);
    const at::Tensor x2 = rows(x);
    geglu_fwd(out2, x2.narrow(1, 0, d), x2.narrow(1, d, d), approximate);
    ctx->save_for_backward({x});
    ctx->saved_data["approximate"] = approximate;
    return out;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    refuse_create_graph("geglu_packed");
    const at::Tensor x = ctx->get_saved_variables()[0];
    const c10::OptionalDeviceGuard guard(x.device());
    const int64_t d = x.size(-1) / 2;
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor dx = at::empty_like(x);  // one [..., 2d] buffer: dgate and dup are its halves
    const at::Tensor x2 = rows(x), dx2 = rows(dx);
    at::Tensor dgate2 = dx2.narrow(1, 0, d), dup2 = dx2.narrow(1, d, d);
    geglu_bwd(dgate2, dup2, rows(grad), x2.narrow(1, 0, d), x2.narrow(1, d, d),
              ctx->saved_data["approximate"].toInt());
    return {dx, at::Tensor()};
  }
};

}  // namespace

at::Tensor geglu_train(at::Tensor const &gate, at::Tensor const &up, int64_t approximate) {
  TORCH_CHECK(gate.dim() >= 1 && gate.is_contiguous() && up.is_contiguous() && gate.sizes() == up.sizes() &&
                  gate.numel() > 0,
              "geglu_train: gate and up must be non-empty, contiguous and of one shape, got ", gate.sizes(),
              " and ", up.sizes());
  return GegluTrain::apply(gate, up, approximate);
}

at::Tensor geglu_packed_train(at::Tensor const &x, int64_t approximate) {
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.numel() > 0 && x.size(-1) % 2 == 0,
              "geglu_packed_train: x must be non-empty, contiguous, with an even last dimension, got shape ",
              x.sizes());
  return GegluPackedTrain::apply(x, approximate);
}
