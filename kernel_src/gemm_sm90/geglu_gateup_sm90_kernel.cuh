// CUTLASS 3.x kernel definition for geglu_gateup_sm90 (layout spec and contract in
// geglu_gateup_sm90.h). Included only by the per-dtype instantiation TUs, which are the slow ones.
#pragma once

#include "geglu_gateup_sm90.h"
#include "sm90_common.cuh"

namespace fused_geglu_sm90 {

namespace detail {

// Epilogue collective (the "no-smem" kind: it reads the accumulators from registers and stores to
// global memory directly); Sm90TmaWarpSpecializedAdapter turns it into a warp-specialised epilogue
// that the cooperative kernel accepts.
template <class Element_>
class GegluEpilogue {
 public:
  using Element = Element_;
  using ElementC = void;  // no source operand
  using ElementD = Element;
  using StrideC = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using StrideD = StrideC;
  using ThreadEpilogueOp = void;  // GemmUniversalAdapter names it; nothing uses it here
  using V2 = Vec2<Element>;
  using V2T = typename V2::type;

  struct Arguments {
    Element *h = nullptr;
    int64_t ldh = 0;
    Element *preact = nullptr;  // may be null
    int64_t ldp = 0;
    Element const *bias = nullptr;  // may be null
    int approximate = 0;
  };
  FUSED_GEGLU_SM90_NO_SMEM_EPILOGUE(GegluEpilogue)

  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem_shape, Arguments const &args) {
    auto N = cute::get<1>(problem_shape);
    return args.h != nullptr && N % 16 == 0 && args.ldh % 2 == 0 && args.ldp % 2 == 0;
  }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const &accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char *) {
    using namespace cute;
    static_assert(is_static<BlockShapeMNK>::value, "tile shape must be static");
    constexpr int BM = size<0>(BlockShapeMNK{});
    constexpr int BN = size<1>(BlockShapeMNK{});
    static_assert(BN % 16 == 0, "the gate/up pairing needs tile N % 16 == 0");

    // The pairing relies on the wgmma accumulator layout (accumulator_layout_is_wgmma): gate
    // columns n, n+1 of chunk k and up columns n+8, n+9 of chunk k+1 sit in one thread.
    static_assert(accumulator_layout_is_wgmma<TiledMma>());
    using CLayout = typename TiledMma::Atom::CLayout;
    static_assert(size<1, 2>(CLayout{}) % 2 == 0, "atom N must hold whole 16-column groups");
    static_assert(rank<0>(typename cute::remove_cvref_t<decltype(accumulators)>::layout_type{}) == 3,
                  "accumulator mode 0 must be (2, 2, N/8)");

    const int M = int(get<0>(problem_shape_mnkl));
    const int N = int(get<1>(problem_shape_mnkl));
    const int m0 = int(get<0>(blk_coord_mnkl)) * BM;
    const int n0 = int(get<1>(blk_coord_mnkl)) * BN;

    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor cD = make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{}));
    Tensor tCcD = thr_mma.partition_C(cD);  // ((2,2,N/8), MMA_M, MMA_N) -> (m, n) in the tile
    static_assert(decltype(size(tCcD))::value == decltype(size(accumulators))::value,
                  "coordinate / accumulator partition mismatch");

    constexpr int kChunks = size<0, 2>(decltype(accumulators.layout()){});
    constexpr int kMmaM = size<1>(decltype(accumulators.layout()){});
    constexpr int kMmaN = size<2>(decltype(accumulators.layout()){});
    const bool tanh_gelu = params.approximate != 0;
    Element *__restrict__ h = params.h;
    Element *__restrict__ preact = params.preact;
    Element const *__restrict__ bias = params.bias;

    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kMmaM; ++mi) {
      CUTLASS_PRAGMA_UNROLL
      for (int ni = 0; ni < kMmaN; ++ni) {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kChunks; k += 2) {
          // Gate columns (n, n+1) of chunk k, rows m and m+8; up columns n+8, n+9 of chunk k+1.
          auto c0 = tCcD(make_coord(make_coord(0, 0, k), mi, ni));
          const int n = n0 + int(get<1>(c0));
          if (n >= N) continue;
          float bg0 = 0.f, bg1 = 0.f, bu0 = 0.f, bu1 = 0.f;
          if (bias != nullptr) {
            const float2 bg = V2::unpack(*reinterpret_cast<V2T const *>(bias + n));
            const float2 bu = V2::unpack(*reinterpret_cast<V2T const *>(bias + n + 8));
            bg0 = bg.x; bg1 = bg.y; bu0 = bu.x; bu1 = bu.y;
          }
          // Output column of gate column n: 16-col group n/16 -> 8 output cols; n%16 in [0, 8).
          const int j = (n >> 4) * 8 + (n & 15);
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < 2; ++r) {
            auto cr = tCcD(make_coord(make_coord(0, r, k), mi, ni));
            const int m = m0 + int(get<0>(cr));
            if (m >= M) continue;
            const float g0 = accumulators(make_coord(make_coord(0, r, k), mi, ni)) + bg0;
            const float g1 = accumulators(make_coord(make_coord(1, r, k), mi, ni)) + bg1;
            const float u0 = accumulators(make_coord(make_coord(0, r, k + 1), mi, ni)) + bu0;
            const float u1 = accumulators(make_coord(make_coord(1, r, k + 1), mi, ni)) + bu1;
            if (preact != nullptr) {
              Element *p = preact + int64_t(m) * params.ldp + n;
              *reinterpret_cast<V2T *>(p) = V2::pack(g0, g1);
              *reinterpret_cast<V2T *>(p + 8) = V2::pack(u0, u1);
            }
            const float a0 = tanh_gelu ? gelu_tanh(g0) : gelu_erf(g0);
            const float a1 = tanh_gelu ? gelu_tanh(g1) : gelu_erf(g1);
            *reinterpret_cast<V2T *>(h + int64_t(m) * params.ldh + j) = V2::pack(a0 * u0, a1 * u1);
          }
        }
      }
    }
  }

 private:
  Params params;
};

// The kernel for one (dtype, tile) configuration.
template <class Element, TileCfg Cfg>
struct GateUpKernel {
  // Tile, cluster and schedule of each TileCfg (geglu_gateup_sm90.h lists them).
  using TileShape = cute::conditional_t<
      Cfg == TileCfg::k128x256, cute::Shape<cute::_128, cute::_256, cute::_64>,
      cute::conditional_t<Cfg == TileCfg::k256x128, cute::Shape<cute::_256, cute::_128, cute::_64>,
                          cute::conditional_t<Cfg == TileCfg::k128x192pp,
                                              cute::Shape<cute::_128, cute::_192, cute::_64>,
                                              cute::Shape<cute::_128, cute::_128, cute::_64>>>>;
  using ClusterShape = cute::conditional_t<
      Cfg == TileCfg::k128x128, cute::Shape<cute::_1, cute::_1, cute::_1>,
      cute::conditional_t<Cfg == TileCfg::k256x128 || Cfg == TileCfg::k128x192pp,
                          cute::Shape<cute::_1, cute::_2, cute::_1>,
                          cute::Shape<cute::_2, cute::_1, cute::_1>>>;
  static constexpr bool kPingpong = Cfg == TileCfg::k128x128pp || Cfg == TileCfg::k128x192pp;
  using Schedule = cute::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                       cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using Epi = GegluEpilogue<Element>;
  // w [N, K] row-major == (K x N) column-major
  using G = Sm90Gemm<Element, cutlass::layout::ColumnMajor, TileShape, ClusterShape, Schedule, Epi>;
  using Gemm = typename G::Gemm;
  using Kernel = typename G::Kernel;

  static typename Gemm::Arguments make_args(GateUpArgs const &a) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    StrideA sa{};
    cute::get<0>(sa) = a.ldx;  // (M, K, L) strides: (ldx, 1, 0)
    StrideB sb{};
    cute::get<0>(sb) = a.ldw;  // (N, K, L) strides: (ldw, 1, 0)
    typename Epi::Arguments epi;
    epi.h = static_cast<Element *>(a.h);
    epi.ldh = a.ldh;
    epi.preact = static_cast<Element *>(a.preact);
    epi.ldp = a.ldp;
    epi.bias = static_cast<Element const *>(a.bias);
    epi.approximate = a.approximate;
    return G::arguments(a.M, a.N2, a.K, a.x, sa, a.w, sb, epi, a.device, a.sm_count, a.swizzle, a.raster);
  }

  static size_t workspace_bytes(GateUpArgs const &a) { return Gemm::get_workspace_size(make_args(a)); }
  static const char *launch(GateUpArgs const &a) { return G::launch(make_args(a), a.workspace, a.stream); }
};

}  // namespace detail

template <class Element, TileCfg Cfg>
const char *launch_geglu_gateup(GateUpArgs const &a) {
  return detail::GateUpKernel<Element, Cfg>::launch(a);
}
template <class Element, TileCfg Cfg>
size_t geglu_gateup_workspace_bytes(GateUpArgs const &a) {
  return detail::GateUpKernel<Element, Cfg>::workspace_bytes(a);
}

#define FUSED_GEGLU_SM90_INSTANTIATE(ELEM, CFG)                                      \
  template const char *launch_geglu_gateup<ELEM, CFG>(GateUpArgs const &);           \
  template size_t geglu_gateup_workspace_bytes<ELEM, CFG>(GateUpArgs const &);

}  // namespace fused_geglu_sm90
