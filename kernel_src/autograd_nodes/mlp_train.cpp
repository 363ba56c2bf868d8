// The training MLP's autograd node in C++: `geglu_mlp_train`, registered for the Autograd key of
// this variant's device only (AutogradCPU or AutogradCUDA), so the graph node it records and its
// backward run without Python.
//
// Why: below M = 8192 a training step of one MLP is host-bound, and the Python of an
// autograd.Function (its forward, setup_context, backward and their argument handling) was what kept
// ours slower than eager there (README, "Small training steps"). The kernels are the ones the Python
// node issues for the same launch, in the same order (the tests compare the bits):
//   forward  - sm90 (CUDA variant, tile >= -1): the CUTLASS gate+up GEMM writing h, gate and up, then
//              y = h w_down^T + b_down (cuBLAS);
//            - tile == kGemmPointwise: geglu_mlp_gemm_train (vendor GEMMs around geglu_fwd);
//   backward - CUDA: geglu_mlp_gemm_bwd's sequence (cuBLAS + the in-place pointwise, gate/up become
//              dgate/dup);
//            - CPU: the same GEMMs around geglu_bwd / geglu_fwd (the CPU pointwise has no in-place form).
// The saved gate/up are overwritten by the backward, so a second backward through the same graph is
// refused (the Python node does the same), and so is create_graph=True (these kernels record no graph).
// Where no saved-tensor hooks are set (checkpointing, offloading), gate/up are this node's own buffers,
// never handed out: they are kept in saved_data rather than saved, so that the backward can take the
// only references and free each after its last reader, which keeps the peak at the Python sequence's
// three M x I buffers at any size. Under hooks they are saved, so the hooks see them.
#include <ATen/SavedTensorHooks.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_unsafe_view.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <tuple>

#include "torch_binding.h"

std::tuple<at::Tensor, at::Tensor, at::Tensor> geglu_mlp_gemm_train(
    at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up, at::Tensor const &w_down,
    std::optional<at::Tensor> const &b_gate, std::optional<at::Tensor> const &b_up,
    std::optional<at::Tensor> const &b_down, int64_t approximate) {
  TORCH_CHECK(x.dim() == 2, "geglu_mlp_gemm_train: x must be 2-D [M, H], got ", x.sizes());
  at::Tensor gate = at::linear(x, w_gate, b_gate);
  at::Tensor up = at::linear(x, w_up, b_up);
  at::Tensor h = at::empty_like(gate);  // gate/up are kept for the backward
  geglu_fwd(h, gate, up, approximate);
  at::Tensor y = at::linear(h, w_down, b_down);
  return {std::move(y), std::move(gate), std::move(up)};
}

void check_bwd_operands(const char *op, at::Tensor const &dy, at::Tensor const &x, at::Tensor const &gate,
                        at::Tensor const &up) {
  TORCH_CHECK(dy.dim() == 2 && x.dim() == 2 && gate.dim() == 2 && up.dim() == 2, op,
              ": dy, x, gate and up must be 2-D, got ", dy.sizes(), ", ", x.sizes(), ", ", gate.sizes(),
              ", ", up.sizes());
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.size(0) == x.size(0) && dy.size(0) == x.size(0), op,
              ": gate ", gate.sizes(), " and up ", up.sizes(), " must be [M, I] with M = x's rows (",
              x.size(0), ") = dy's rows (", dy.size(0), ")");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> geglu_mlp_bwd_gemms(
    at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up, at::Tensor hid,
    at::Tensor dgate, at::Tensor dup, bool has_b_gate, bool has_b_up, bool has_b_down) {
  // A bias's gradient: the rows' sum accumulated in fp32 and rounded once; 0 elements where the module
  // has no such bias.
  auto bias_grad = [](at::Tensor const &g, bool present) {
    return present ? g.sum(at::IntArrayRef{0}, /*keepdim=*/false, at::kFloat).to(g.scalar_type())
                   : at::empty({0}, g.options());
  };
  at::Tensor d_w_down = at::mm(dy.t(), hid);
  hid.reset();
  at::Tensor dx = at::mm(dgate, w_gate);
  dx.addmm_(dup, w_up);
  // Each M x I gradient goes after its last reader (mlp.py's order): freed here where the caller
  // handed over its references, a no-op where it kept them.
  at::Tensor d_w_gate = at::mm(dgate.t(), x);
  at::Tensor db_gate = bias_grad(dgate, has_b_gate);
  dgate.reset();
  at::Tensor d_w_up = at::mm(dup.t(), x);
  at::Tensor db_up = bias_grad(dup, has_b_up);
  dup.reset();
  return {std::move(dx),      std::move(d_w_gate), std::move(d_w_up), std::move(d_w_down),
          std::move(db_gate), std::move(db_up),    bias_grad(dy, has_b_down)};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `tile` for the vendor-GEMM forward (geglu_mlp_gemm_train); the sm90 tiles are >= 0, and -1 asks
// the CUTLASS op for its own size heuristic (fused_geglu/mlp.py passes the same numbers).
constexpr int64_t kGemmPointwise = -2;

constexpr const char *kSecondBackward =
    "geglu_mlp: a second backward through the same graph is not supported: the first one turned the "
    "saved gate/up pre-activations into their gradients in place (memory). Call "
    "geglu_mlp(..., recompute=True) (a kernelized model: its modules' own forward) to run backward "
    "through one graph more than once (retain_graph=True).";

#if !defined(CUDA_KERNEL)
// The CPU backward: dh = dy w_down, then dgate/dup and h from the CPU pointwise kernels (into buffers
// of their own: gate/up are only read), then the weight GEMMs. Returns what geglu_mlp_gemm_bwd does.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
    at::Tensor const &w_down, at::Tensor gate, at::Tensor up, int64_t approximate, bool has_b_gate,
    bool has_b_up, bool has_b_down) {
  at::Tensor hid = at::mm(dy, w_down);  // dh
  at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
  geglu_bwd(dgate, dup, hid, gate, up, approximate);
  geglu_fwd(hid, gate, up, approximate);  // hid <- h: dh is used up
  gate.reset();
  up.reset();
  return geglu_mlp_bwd_gemms(dy, x, w_gate, w_up, std::move(hid), std::move(dgate), std::move(dup), has_b_gate,
                             has_b_up, has_b_down);
}
#endif

// The training forward: (y [M, H], gate, up) for a contiguous x viewed as [M, H], by the launch named.
std::tuple<at::Tensor, at::Tensor, at::Tensor> train_forward(
    at::Tensor const &x2, at::Tensor const &w_gate, at::Tensor const &w_up, at::Tensor const &w_down,
    std::optional<at::Tensor> const &b_gate, std::optional<at::Tensor> const &b_up,
    std::optional<at::Tensor> const &b_down, int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster) {
#if defined(CUDA_KERNEL)
  if (tile != kGemmPointwise) {
    at::Tensor hid = at::empty({x2.size(0), w_gate.size(0)}, x2.options());
    at::Tensor gate = at::empty_like(hid), up = at::empty_like(hid);
    std::optional<at::Tensor> bg = b_gate, bu = b_up;  // the kernel takes both biases or neither
    if (bg.has_value() != bu.has_value()) {
      if (bg.has_value()) bu = at::zeros_like(*bg);
      else bg = at::zeros_like(*bu);
    }
    geglu_gateup_sm90(hid, x2, w_gate, w_up, bg, bu, approximate, gate, up, tile, swizzle, raster);
    return {at::linear(hid, w_down, b_down), std::move(gate), std::move(up)};
  }
#else
  (void)tile;
  (void)swizzle;
  (void)raster;
#endif
  return geglu_mlp_gemm_train(x2, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate);
}

// y [M, H] in x's leading shape. Not a view: autograd marks a view made inside a custom function,
// and an in-place op on the node's output (y += r) would raise where it works after F.linear.
at::Tensor in_shape_of(at::Tensor y, at::Tensor const &x) {
  if (x.dim() == 2) return y;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = y.size(1);
  return at::_unsafe_view(y, shape);
}

void check_x(const char *op, at::Tensor const &x, at::Tensor const &w_gate) {
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && w_gate.dim() == 2 && x.size(-1) == w_gate.size(1), op,
              ": x must be contiguous with w_gate's ", w_gate.size(-1), " features in its last dimension, got "
              "shape ", x.sizes(), " and strides ", x.strides());
}

struct GegluMlpTrain : public torch::autograd::Function<GegluMlpTrain> {
  static at::Tensor forward(AutogradContext *ctx, at::Tensor const &x, at::Tensor const &w_gate,
                            at::Tensor const &w_up, at::Tensor const &w_down,
                            std::optional<at::Tensor> const &b_gate, std::optional<at::Tensor> const &b_up,
                            std::optional<at::Tensor> const &b_down, int64_t approximate, int64_t tile,
                            int64_t swizzle, int64_t raster) {
    const c10::OptionalDeviceGuard guard(x.device());
    const at::Tensor x2 = x.view({-1, w_gate.size(1)});  // the caller passes a contiguous x
    auto [y, gate, up] = train_forward(x2, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, tile, swizzle,
                                       raster);
    if (at::SavedTensorDefaultHooks::get_tls_state().stack.empty()) {
      ctx->save_for_backward({x, w_gate, w_up, w_down});
      ctx->saved_data["gate"] = std::move(gate);
      ctx->saved_data["up"] = std::move(up);
    } else {
      ctx->save_for_backward({x, w_gate, w_up, w_down, gate, up});
    }
    ctx->saved_data["approximate"] = approximate;
    ctx->saved_data["biases"] = int64_t(b_gate.has_value()) | int64_t(b_up.has_value()) << 1 |
                                int64_t(b_down.has_value()) << 2;
    return in_shape_of(y, x);
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    TORCH_CHECK(!ctx->saved_data.count("consumed"), kSecondBackward);
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "geglu_mlp: create_graph=True (double backward) is not supported by the compiled training "
                "node; its backward kernels record no graph (for second derivatives: plain PyTorch ops, or a "
                "kernelized model's own module forward)");
    ctx->saved_data["consumed"] = true;
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w_gate = saved[1], &w_up = saved[2], &w_down = saved[3];
    at::Tensor gate, up;
    if (saved.size() == 6) {
      gate = std::move(saved[4]);
      up = std::move(saved[5]);
    } else {  // the only references: the backward frees each buffer after its last reader
      gate = ctx->saved_data["gate"].toTensor();
      up = ctx->saved_data["up"].toTensor();
      ctx->saved_data.erase("gate");
      ctx->saved_data.erase("up");
    }
    const c10::OptionalDeviceGuard guard(x.device());
    const int64_t approximate = ctx->saved_data["approximate"].toInt();
    const int64_t biases = ctx->saved_data["biases"].toInt();
    const bool has_bg = biases & 1, has_bu = biases & 2, has_bd = biases & 4;
    const int64_t h = w_gate.size(1);
    const at::Tensor dy = grads[0].reshape({-1, h}).contiguous();
    const at::Tensor x2 = x.view({-1, h});
#if defined(CUDA_KERNEL)
    auto [dx, dwg, dwu, dwd, dbg, dbu, dbd] =
        geglu_mlp_gemm_bwd_owned(dy, x2, w_gate, w_up, w_down, std::move(gate), std::move(up), /*keep=*/false,
                                 approximate, has_bg, has_bu, has_bd);
#else
    auto [dx, dwg, dwu, dwd, dbg, dbu, dbd] =
        backward_cpu(dy, x2, w_gate, w_up, w_down, std::move(gate), std::move(up), approximate, has_bg, has_bu,
                     has_bd);
#endif
    const at::Tensor none;
    return {dx.view(x.sizes()), dwg, dwu, dwd, has_bg ? dbg : none, has_bu ? dbu : none, has_bd ? dbd : none,
            none, none, none, none};
  }
};

}  // namespace

at::Tensor geglu_mlp_train(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                           at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                           std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                           int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster) {
  check_x("geglu_mlp_train", x, w_gate);
  return GegluMlpTrain::apply(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, tile, swizzle, raster);
}

// ---- the traced training step (torch.compile): the forward without a node, and on CPU the backward that
// leaves gate/up as they are (the CUDA one is in kernel_src/geglu_cuda/mlp_gemm.cpp). Why: a compiled
// graph calls these ops directly, where the Python custom ops cost their dispatch and the Python of the
// launch choice on every call; the choice is made once, when the graph is traced (fused_geglu/mlp.py).

std::tuple<at::Tensor, at::Tensor, at::Tensor> geglu_mlp_train_fwd(
    at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up, at::Tensor const &w_down,
    std::optional<at::Tensor> const &b_gate, std::optional<at::Tensor> const &b_up,
    std::optional<at::Tensor> const &b_down, int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster) {
  check_x("geglu_mlp_train_fwd", x, w_gate);
  const c10::OptionalDeviceGuard guard(x.device());
  const at::Tensor x2 = x.view({-1, w_gate.size(1)});
#if defined(CUDA_KERNEL)
  // Planned at trace time; the pointers are known only now.
  if (tile != kGemmPointwise && !sm90_gateup_takes(x2, w_gate, w_up)) tile = kGemmPointwise;
#endif
  auto [y, gate, up] = train_forward(x2, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, tile, swizzle,
                                     raster);
  return {in_shape_of(y, x), std::move(gate), std::move(up)};
}

#if !defined(CUDA_KERNEL)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
geglu_mlp_gemm_bwd_keep(at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate,
                        at::Tensor const &w_up, at::Tensor const &w_down, at::Tensor const &gate,
                        at::Tensor const &up, int64_t approximate, bool has_b_gate, bool has_b_up,
                        bool has_b_down) {
  check_bwd_operands("geglu_mlp_gemm_bwd_keep", dy, x, gate, up);
  const c10::OptionalDeviceGuard guard(x.device());
  // backward_cpu writes the gradients to buffers of its own and only reads gate/up (its copies of the
  // references are dropped, not the caller's).
  auto [dx, dwg, dwu, dwd, dbg, dbu, dbd] =
      backward_cpu(dy.contiguous(), x, w_gate, w_up, w_down, gate, up, approximate, has_b_gate, has_b_up, has_b_down);
  return {std::move(dx), std::move(dwg), std::move(dwu), std::move(dwd), std::move(dbg), std::move(dbu),
          std::move(dbd)};
}
#endif
