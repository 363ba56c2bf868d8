// Host op for the sm90 dh GEMM with the GeGLU-backward epilogue (kernel in geglu_dh_sm90_kernel.cuh,
// contract in geglu_dh_sm90.h): checks and dispatch only, so this TU builds fast.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <initializer_list>
#include <optional>

#include "geglu_dh_sm90.h"
#include "sm90_host.h"

namespace {

void check_2d(const at::Tensor &t, const char *name, at::ScalarType dtype, int64_t rows, int64_t cols,
              int64_t row_align, int64_t ptr_align) {
  TORCH_CHECK(t.is_cuda(), "geglu_dh_sm90: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, "geglu_dh_sm90: ", name,
              " must be [", rows, ", ", cols, "], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, "geglu_dh_sm90: ", name, " dtype ", t.scalar_type(),
              " != dy dtype ", dtype);
  TORCH_CHECK(t.stride(1) == 1 || cols <= 1, "geglu_dh_sm90: ", name,
              " needs a contiguous last dimension (stride 1), got strides ", t.strides());
  TORCH_CHECK(t.stride(0) >= cols && t.stride(0) % row_align == 0, "geglu_dh_sm90: ", name,
              " row stride must be >= its row length and a multiple of ", row_align, " elements, got ",
              t.stride(0));
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % ptr_align == 0, "geglu_dh_sm90: ", name,
              " data pointer must be ", ptr_align, "-byte aligned");
}

}  // namespace

void geglu_dh_sm90(at::Tensor &gate, at::Tensor &up, at::Tensor &h_out, at::Tensor const &dy,
                   at::Tensor const &w_down, int64_t approximate, int64_t swizzle, int64_t raster) {
  const auto dtype = dy.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf,
              "geglu_dh_sm90: dy must be bfloat16 or float16, got ", dtype);
  TORCH_CHECK(approximate == 0 || approximate == 1,
              "geglu_dh_sm90: approximate must be 0 (erf) or 1 (tanh), got ", approximate);
  TORCH_CHECK(swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8,
              "geglu_dh_sm90: swizzle must be 1, 2, 4 or 8, got ", swizzle);
  TORCH_CHECK(raster >= 0 && raster <= 2,
              "geglu_dh_sm90: raster must be 0 (heuristic), 1 (along M) or 2 (along N), got ", raster);
  TORCH_CHECK(dy.dim() == 2 && w_down.dim() == 2, "geglu_dh_sm90: dy and w_down must be 2-D, got ",
              dy.sizes(), " and ", w_down.sizes());
  const int64_t M = dy.size(0), H = dy.size(1), I = w_down.size(1);
  TORCH_CHECK(H % 8 == 0 && I % 8 == 0, "geglu_dh_sm90: H and I must be multiples of 8 (16-byte TMA "
              "rows), got H=", H, " I=", I);
  TORCH_CHECK(M <= INT32_MAX && H <= INT32_MAX && I <= INT32_MAX,
              "geglu_dh_sm90: sizes must fit in int32, got M=", M, " H=", H, " I=", I);
  check_2d(dy, "dy", dtype, M, H, 8, 16);
  check_2d(w_down, "w_down", dtype, H, I, 8, 16);
  check_2d(gate, "gate", dtype, M, I, 2, 4);
  check_2d(up, "up", dtype, M, I, 2, 4);
  check_2d(h_out, "h_out", dtype, M, I, 2, 4);
  for (const at::Tensor *t : std::initializer_list<const at::Tensor *>{&w_down, &gate, &up, &h_out}) {
    TORCH_CHECK(t->device() == dy.device(), "geglu_dh_sm90: tensors on different devices");
  }
  if (M == 0 || I == 0) return;
  const c10::cuda::CUDAGuard guard(dy.device());
  fused_geglu_sm90::bind_primary_context(dy.get_device(), at::cuda::getCurrentCUDAStream());
  const auto *prop = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(prop->major == 9, "geglu_dh_sm90: needs an sm_90 (Hopper) GPU, got sm_", prop->major,
              prop->minor);
  TORCH_CHECK(H > 0, "geglu_dh_sm90: H must be positive (an empty reduction has dh = 0)");

  fused_geglu_sm90::DhArgs a{};
  a.dy = dy.data_ptr();
  a.w = w_down.data_ptr();
  a.gate = gate.data_ptr();
  a.up = up.data_ptr();
  a.h = h_out.data_ptr();
  a.M = M;
  a.N = I;
  a.K = H;
  a.lddy = dy.stride(0);
  a.ldw = w_down.stride(0);
  a.ldg = gate.stride(0);
  a.ldu = up.stride(0);
  a.ldh = h_out.stride(0);
  a.approximate = int(approximate);
  a.device = dy.get_device();
  a.sm_count = prop->multiProcessorCount;
  a.swizzle = int(swizzle);
  a.raster = int(raster);
  a.stream = at::cuda::getCurrentCUDAStream();
  a.workspace = nullptr;

  const bool bf16 = dtype == at::kBFloat16;
  const size_t ws = bf16 ? fused_geglu_sm90::geglu_dh_workspace_bytes<cutlass::bfloat16_t>(a)
                         : fused_geglu_sm90::geglu_dh_workspace_bytes<cutlass::half_t>(a);
  at::Tensor ws_holder;
  if (ws > 0) {
    ws_holder = at::empty({int64_t(ws)}, dy.options().dtype(at::kByte));
    a.workspace = ws_holder.data_ptr();
  }
  const char *err = bf16 ? fused_geglu_sm90::launch_geglu_dh<cutlass::bfloat16_t>(a)
                         : fused_geglu_sm90::launch_geglu_dh<cutlass::half_t>(a);
  if (err != nullptr) {
    const cudaError_t ce = cudaGetLastError();
    TORCH_CHECK(false, "geglu_dh_sm90: ", err, " (", cudaGetErrorString(ce), ") for dy ", dy.sizes(),
                " strides ", dy.strides(), ", w_down ", w_down.sizes(), " strides ", w_down.strides());
  }
}
