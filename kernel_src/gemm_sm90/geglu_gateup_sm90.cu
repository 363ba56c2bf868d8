// Host op for the sm90 gate+up GeGLU GEMM (kernel in geglu_gateup_sm90_kernel.cuh; how it reads
// w_gate and w_up in place is in geglu_gateup_sm90.h):
//
//   h_out[M, I] = gelu(x @ w_gate^T + b_gate) * (x @ w_up^T + b_up)    (math on fp32 accumulators)
//   gate_out[M, I], up_out[M, I] (optional, both or neither) = the two pre-activations.
//
// This TU holds only checks and dispatch; it does not include CUTLASS kernels, so it builds fast.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>

#include "geglu_gateup_sm90.h"
#include "sm90_host.h"

namespace {

using fused_geglu_sm90::GateUpArgs;
using fused_geglu_sm90::TileCfg;

void check_operand(const at::Tensor &t, const char *name, at::ScalarType dtype, int64_t row_align,
                   int64_t ptr_align) {
  TORCH_CHECK(t.is_cuda(), "geglu_gateup_sm90: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == 2, "geglu_gateup_sm90: ", name, " must be 2-D, got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, "geglu_gateup_sm90: ", name, " dtype ", t.scalar_type(),
              " != x dtype ", dtype);
  TORCH_CHECK(t.stride(1) == 1, "geglu_gateup_sm90: ", name,
              " needs a contiguous last dimension (stride 1), got strides ", t.strides());
  TORCH_CHECK(t.stride(0) >= t.size(1) && t.stride(0) % row_align == 0, "geglu_gateup_sm90: ",
              name, " row stride must be >= its row length and a multiple of ", row_align,
              " elements (", row_align * t.element_size(), " bytes), got ", t.stride(0));
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % ptr_align == 0, "geglu_gateup_sm90: ",
              name, " data pointer must be ", ptr_align, "-byte aligned");
}

const char *tile_name(TileCfg c) {
  switch (c) {
    case TileCfg::k128x128: return "128x128";
    case TileCfg::k128x256: return "128x256";
    case TileCfg::k128x128pp: return "128x128pp";
    case TileCfg::k256x128: return "256x128";
    case TileCfg::k128x192pp: return "128x192pp";
    case TileCfg::k64x128pp: return "64x128pp";
    case TileCfg::k64x256pp: return "64x256pp";
    case TileCfg::k64x128k128pp: return "64x128k128pp";
  }
  return "?";
}

// Every tile, in TileCfg's order (the op's tile index; sm90_weights.TILES in Python). with()
// calls f(std::integral_constant<TileCfg, C>{}) for the C equal to a runtime cfg: the kernel is
// picked by comparing cfg with each C, so a tile can only reach its own instantiation (a
// hand-written switch could send one tile to another's kernel and still compute correct results).
template <TileCfg... Cs>
struct TileList {
  static constexpr TileCfg all[] = {Cs...};
  template <class F>
  static const char *with(TileCfg cfg, F &&f) {
    const char *result = "unknown tile";
    ((cfg == Cs ? (result = f(std::integral_constant<TileCfg, Cs>{}), true) : false) || ...);
    return result;
  }
};
using Tiles = TileList<TileCfg::k128x128, TileCfg::k128x256, TileCfg::k128x128pp, TileCfg::k256x128,
                       TileCfg::k128x192pp, TileCfg::k64x128pp, TileCfg::k64x256pp, TileCfg::k64x128k128pp>;
constexpr auto &kAllTiles = Tiles::all;

// $FUSED_GEGLU_SM90_SWIZZLE (1/2/4/8) and $FUSED_GEGLU_SM90_RASTER (m/n) override the tile
// scheduler's order the caller asked for, for measuring them side by side; read per call.
void scheduler_overrides(GateUpArgs &a) {
  if (const char *e = std::getenv("FUSED_GEGLU_SM90_SWIZZLE")) {
    const int v = std::atoi(e);
    TORCH_CHECK(v == 1 || v == 2 || v == 4 || v == 8,
                "FUSED_GEGLU_SM90_SWIZZLE must be 1, 2, 4 or 8, got '", e, "'");
    a.swizzle = v;
  }
  if (const char *e = std::getenv("FUSED_GEGLU_SM90_RASTER")) {
    TORCH_CHECK(std::strcmp(e, "m") == 0 || std::strcmp(e, "n") == 0,
                "FUSED_GEGLU_SM90_RASTER must be m or n, got '", e, "'");
    a.raster = e[0] == 'm' ? 1 : 2;
  }
  // $FUSED_GEGLU_SM90_DIAG_NO_EPILOGUE=1: time the mainloop alone (h is NOT written; never for use).
  if (const char *e = std::getenv("FUSED_GEGLU_SM90_DIAG_NO_EPILOGUE")) {
    TORCH_CHECK(std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0,
                "FUSED_GEGLU_SM90_DIAG_NO_EPILOGUE must be 0 or 1, got '", e, "'");
    a.skip_epilogue = e[0] == '1';
  }
}

TileCfg pick_tile(int64_t M, int64_t N2, int sm_count, int64_t asked) {
  // $FUSED_GEGLU_SM90_TILE forces a tile (for measuring them side by side); read per call.
  if (const char *e = std::getenv("FUSED_GEGLU_SM90_TILE")) {
    for (TileCfg c : kAllTiles) {
      if (std::strcmp(e, tile_name(c)) == 0) return c;
    }
    TORCH_CHECK(false, "FUSED_GEGLU_SM90_TILE must be one of 128x128, 128x256, 128x128pp, 256x128, "
                "128x192pp, 64x128pp, 64x256pp, 64x128k128pp, got '", e, "'");
  }
  if (asked >= 0) {
    TORCH_CHECK(asked < int64_t(sizeof(kAllTiles) / sizeof(kAllTiles[0])),
                "geglu_gateup_sm90: tile must be -1 or a tile index below ",
                sizeof(kAllTiles) / sizeof(kAllTiles[0]), ", got ", asked);
    return kAllTiles[asked];
  }
  // Without a measured choice: the wide tile halves B traffic per output but needs enough tiles
  // to fill the machine.
  const int64_t big_tiles = ((M + 127) / 128) * ((N2 + 255) / 256);
  return big_tiles >= sm_count ? TileCfg::k128x256 : TileCfg::k128x128;
}

template <class Element>
const char *dispatch(GateUpArgs &a, TileCfg cfg, at::Tensor &ws_holder, const at::Device &dev) {
  using namespace fused_geglu_sm90;
  return Tiles::with(cfg, [&](auto tile) {
    constexpr TileCfg C = decltype(tile)::value;
    if (const size_t ws = geglu_gateup_workspace_bytes<Element, C>(a); ws > 0) {
      ws_holder = at::empty({int64_t(ws)}, at::TensorOptions().dtype(at::kByte).device(dev));
      a.workspace = ws_holder.data_ptr();
    }
    return launch_geglu_gateup<Element, C>(a);
  });
}

}  // namespace

// w_gate [I, H] and w_up [I, H] read where they are; b_gate / b_up [I] (both or neither).
void geglu_gateup_sm90(at::Tensor &h_out, at::Tensor const &x, at::Tensor const &w_gate,
                       at::Tensor const &w_up, std::optional<at::Tensor> const &b_gate,
                       std::optional<at::Tensor> const &b_up, int64_t approximate,
                       std::optional<at::Tensor> const &gate_out,
                       std::optional<at::Tensor> const &up_out, int64_t tile, int64_t swizzle,
                       int64_t raster) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf,
              "geglu_gateup_sm90: x must be bfloat16 or float16, got ", dtype);
  TORCH_CHECK(approximate == 0 || approximate == 1,
              "geglu_gateup_sm90: approximate must be 0 (erf) or 1 (tanh), got ", approximate);
  TORCH_CHECK(swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8,
              "geglu_gateup_sm90: swizzle must be 1, 2, 4 or 8, got ", swizzle);
  TORCH_CHECK(raster >= 0 && raster <= 2,
              "geglu_gateup_sm90: raster must be 0 (heuristic), 1 (along M) or 2 (along N), got ", raster);
  check_operand(x, "x", dtype, 8, 16);
  check_operand(w_gate, "w_gate", dtype, 8, 16);
  check_operand(w_up, "w_up", dtype, 8, 16);
  const int64_t M = x.size(0), H = x.size(1), I = w_gate.size(0), N2 = 2 * I;
  TORCH_CHECK(w_gate.size(1) == H && w_up.sizes() == w_gate.sizes(), "geglu_gateup_sm90: w_gate and "
              "w_up must both be [I, H=", H, "], got ", w_gate.sizes(), " and ", w_up.sizes());
  TORCH_CHECK(w_up.stride(0) == w_gate.stride(0), "geglu_gateup_sm90: w_gate and w_up must have "
              "the same row stride (one TMA view), got ", w_gate.stride(0), " and ", w_up.stride(0));
  TORCH_CHECK(I % 8 == 0 && H % 8 == 0, "geglu_gateup_sm90: I and H must be multiples of 8, got I=",
              I, " H=", H);
  check_operand(h_out, "h_out", dtype, 8, 16);
  TORCH_CHECK(h_out.size(0) == M && h_out.size(1) == I, "geglu_gateup_sm90: h_out must be [", M,
              ", ", I, "], got ", h_out.sizes());
  TORCH_CHECK(M <= INT32_MAX && N2 <= INT32_MAX && H <= INT32_MAX,
              "geglu_gateup_sm90: sizes must fit in int32, got M=", M, " 2I=", N2, " H=", H);
  const bool has_bias = b_gate.has_value() && b_gate->defined();
  TORCH_CHECK(has_bias == (b_up.has_value() && b_up->defined()),
              "geglu_gateup_sm90: b_gate and b_up go together (pass zeros for a missing one)");
  // The epilogue reads each bias as a contiguous, 4-byte aligned [I] vector. Any other [I] bias (a
  // strided slice of a packed [2I] bias, a bf16 view at an odd offset) is copied first: I elements,
  // so no caller has to refuse one or route around this kernel for it.
  auto epilogue_bias = [&](at::Tensor const &b, const char *name) {
    TORCH_CHECK(b.dim() == 1 && b.size(0) == I && b.scalar_type() == dtype && b.device() == x.device(),
                "geglu_gateup_sm90: ", name, " must be a [", I, "] ", dtype, " tensor on ", x.device(),
                ", got ", b.sizes(), " ", b.scalar_type(), " on ", b.device());
    const bool direct = b.stride(0) == 1 && reinterpret_cast<uintptr_t>(b.data_ptr()) % 4 == 0;
    return direct ? b : b.clone(at::MemoryFormat::Contiguous);
  };
  at::Tensor bg, bu;
  if (has_bias) {
    bg = epilogue_bias(*b_gate, "b_gate");
    bu = epilogue_bias(*b_up, "b_up");
  }
  const bool has_pre = gate_out.has_value() && gate_out->defined();
  TORCH_CHECK(has_pre == (up_out.has_value() && up_out->defined()),
              "geglu_gateup_sm90: gate_out and up_out go together (both or neither)");
  if (has_pre) {
    for (auto const *t : {&*gate_out, &*up_out}) {
      const char *name = t == &*gate_out ? "gate_out" : "up_out";
      check_operand(*t, name, dtype, 8, 16);
      TORCH_CHECK(t->size(0) == M && t->size(1) == I && t->device() == x.device(),
                  "geglu_gateup_sm90: ", name, " must be [", M, ", ", I, "] on ", x.device());
    }
  }
  TORCH_CHECK(w_gate.device() == x.device() && w_up.device() == x.device() && h_out.device() == x.device(),
              "geglu_gateup_sm90: tensors on different devices");
  if (M == 0 || I == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  fused_geglu_sm90::bind_primary_context(x.get_device(), at::cuda::getCurrentCUDAStream());
  const auto *prop = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(prop->major == 9, "geglu_gateup_sm90: needs an sm_90 (Hopper) GPU, got sm_",
              prop->major, prop->minor);
  if (H == 0) {  // empty reduction: pre-activations are the biases (or zero)
    at::Tensor g = has_bias ? bg.unsqueeze(0).expand({M, I}).to(at::kFloat)
                            : at::zeros({M, I}, x.options().dtype(at::kFloat));
    at::Tensor u = has_bias ? bu.unsqueeze(0).expand({M, I}).to(at::kFloat) : at::zeros_like(g);
    if (has_pre) {
      gate_out->copy_(g);
      up_out->copy_(u);
    }
    h_out.copy_(at::gelu(g, approximate ? "tanh" : "none") * u);
    return;
  }
  const int64_t delta_bytes = std::abs(static_cast<const char *>(w_up.data_ptr()) -
                                       static_cast<const char *>(w_gate.data_ptr()));
  TORCH_CHECK(delta_bytes > 0 && delta_bytes < (int64_t(1) << 40), "geglu_gateup_sm90: w_gate and w_up "
              "are ", delta_bytes, " bytes apart; one TMA view needs two distinct tensors at most 2^40 apart");

  GateUpArgs a{};
  a.x = x.data_ptr();
  a.w_gate = w_gate.data_ptr();
  a.w_up = w_up.data_ptr();
  a.b_gate = has_bias ? bg.data_ptr() : nullptr;
  a.b_up = has_bias ? bu.data_ptr() : nullptr;
  a.h = h_out.data_ptr();
  a.gate = has_pre ? gate_out->data_ptr() : nullptr;
  a.up = has_pre ? up_out->data_ptr() : nullptr;
  a.M = M;
  a.N2 = N2;
  a.K = H;
  a.ldx = x.stride(0);
  a.ldw = w_gate.stride(0);
  a.ldh = h_out.stride(0);
  a.ldg = has_pre ? gate_out->stride(0) : 0;
  a.ldu = has_pre ? up_out->stride(0) : 0;
  a.approximate = int(approximate);
  a.device = x.get_device();
  a.sm_count = prop->multiProcessorCount;
  a.stream = at::cuda::getCurrentCUDAStream();
  a.swizzle = int(swizzle);
  a.raster = int(raster);
  a.workspace = nullptr;
  scheduler_overrides(a);
  const TileCfg cfg = pick_tile(M, N2, a.sm_count, tile);
  at::Tensor ws_holder;
  const char *err = dtype == at::kBFloat16 ? dispatch<cutlass::bfloat16_t>(a, cfg, ws_holder, x.device())
                                           : dispatch<cutlass::half_t>(a, cfg, ws_holder, x.device());
  if (err != nullptr) {
    const cudaError_t ce = cudaGetLastError();
    TORCH_CHECK(false, "geglu_gateup_sm90: ", err, " (", cudaGetErrorString(ce), ") for x ", x.sizes(),
                ", w_gate ", w_gate.sizes(), " strides ", w_gate.strides(), ", tile ", tile_name(cfg));
  }
}

// The inference forward of the whole MLP on sm90 in one op call: h from the gate+up GEMM above, then
// y = h @ w_down^T + b_down through ATen's linear (cuBLAS, as F.linear). Without gradients this is
// what a decode step without CUDA graphs runs per layer, and there the host time per call is what
// the GPU waits on: one call instead of two op calls and a Python-side allocation saves the
// dispatcher and Python argument parsing twice.
at::Tensor geglu_mlp_sm90(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                          at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                          std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                          int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster) {
  TORCH_CHECK(x.dim() == 2, "geglu_mlp_sm90: x must be 2-D [M, H], got ", x.sizes());
  TORCH_CHECK(w_gate.dim() == 2, "geglu_mlp_sm90: w_gate must be 2-D [I, H], got ", w_gate.sizes());
  const int64_t I = w_gate.size(0);
  TORCH_CHECK(w_down.dim() == 2 && w_down.size(0) == x.size(1) && w_down.size(1) == I,
              "geglu_mlp_sm90: w_down must be [H=", x.size(1), ", I=", I, "], got ", w_down.sizes());
  TORCH_CHECK(w_down.scalar_type() == x.scalar_type() && w_down.device() == x.device(),
              "geglu_mlp_sm90: w_down must be ", x.scalar_type(), " on ", x.device(), ", got ",
              w_down.scalar_type(), " on ", w_down.device());
  at::Tensor h = at::empty({x.size(0), I}, x.options());
  // The gate+up kernel takes both biases or neither: a missing one of the two becomes zeros.
  const bool has_bg = b_gate.has_value() && b_gate->defined();
  const bool has_bu = b_up.has_value() && b_up->defined();
  std::optional<at::Tensor> bg, bu;
  if (has_bg) bg = *b_gate;
  if (has_bu) bu = *b_up;
  if (has_bg != has_bu) {
    if (has_bg) bu = at::zeros_like(*b_gate);
    else bg = at::zeros_like(*b_up);
  }
  geglu_gateup_sm90(h, x, w_gate, w_up, bg, bu, approximate, std::nullopt, std::nullopt, tile, swizzle, raster);
  return at::linear(h, w_down, b_down);
}
