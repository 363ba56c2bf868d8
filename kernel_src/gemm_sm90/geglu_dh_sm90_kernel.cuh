// CUTLASS 3.x kernel definition for geglu_dh_sm90 (contract in geglu_dh_sm90.h). Included only by
// the per-dtype instantiation TUs.
#pragma once

#include "geglu_dh_sm90.h"
#include "sm90_common.cuh"

namespace fused_geglu_sm90 {

namespace detail {

// Register epilogue: the accumulators are dh; per column pair it loads (gate, up), writes their
// gradients in place and writes h.
template <class Element_>
class DGegluEpilogue {
 public:
  using Element = Element_;
  using ElementC = void;
  using ElementD = Element;
  using StrideC = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using StrideD = StrideC;
  using ThreadEpilogueOp = void;
  using V2 = Vec2<Element>;
  using V2T = typename V2::type;

  struct Arguments {
    Element *gate = nullptr;
    int64_t ldg = 0;
    Element *up = nullptr;
    int64_t ldu = 0;
    Element *h = nullptr;
    int64_t ldh = 0;
    int approximate = 0;
  };
  FUSED_GEGLU_SM90_NO_SMEM_EPILOGUE(DGegluEpilogue)

  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem_shape, Arguments const &args) {
    auto N = cute::get<1>(problem_shape);
    return args.gate != nullptr && args.up != nullptr && args.h != nullptr && N % 2 == 0 &&
           args.ldg % 2 == 0 && args.ldu % 2 == 0 && args.ldh % 2 == 0;
  }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const &accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char *) {
    using namespace cute;
    static_assert(is_static<BlockShapeMNK>::value, "tile shape must be static");
    constexpr int BM = size<0>(BlockShapeMNK{});
    constexpr int BN = size<1>(BlockShapeMNK{});
    static_assert(accumulator_layout_is_wgmma<TiledMma>());  // values (0|1, r, k): columns n, n+1
    static_assert(rank<0>(typename cute::remove_cvref_t<decltype(accumulators)>::layout_type{}) == 3,
                  "accumulator mode 0 must be (2, 2, N/8)");

    const int M = int(get<0>(problem_shape_mnkl));
    const int N = int(get<1>(problem_shape_mnkl));
    const int m0 = int(get<0>(blk_coord_mnkl)) * BM;
    const int n0 = int(get<1>(blk_coord_mnkl)) * BN;
    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor cD = make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{}));
    Tensor tCcD = thr_mma.partition_C(cD);

    constexpr int kChunks = size<0, 2>(decltype(accumulators.layout()){});
    constexpr int kMmaM = size<1>(decltype(accumulators.layout()){});
    constexpr int kMmaN = size<2>(decltype(accumulators.layout()){});
    // The loads of a group are all issued before any of its stores: the stores go to the same
    // buffers, so the compiler may not move a later load above them, and one load at a time
    // would expose the memory latency per pair.
    constexpr int kGroup = kChunks % 8 == 0 ? 8 : kChunks;
    static_assert(kChunks % kGroup == 0, "chunk grouping");
    // Straight-line per tile: the GELU flavour is a template argument (gelu_grad<> in
    // sm90_common.cuh) and rows/columns past the problem are computed on zeros and not stored,
    // so the unrolled loop has no branch that would cut it into one latency chain per pair.
    with_flag(params.approximate != 0, [&](auto tanh_c) {
      constexpr bool kTanh = decltype(tanh_c)::value;
      CUTLASS_PRAGMA_UNROLL
      for (int mi = 0; mi < kMmaM; ++mi) {
        CUTLASS_PRAGMA_UNROLL
        for (int ni = 0; ni < kMmaN; ++ni) {
          CUTLASS_PRAGMA_UNROLL
          for (int k0 = 0; k0 < kChunks; k0 += kGroup) {
            V2T g[kGroup][2], u[kGroup][2];
            int64_t off_g[kGroup][2], off_u[kGroup][2], off_h[kGroup][2];
            bool live[kGroup][2];
            CUTLASS_PRAGMA_UNROLL
            for (int k = 0; k < kGroup; ++k) {
              CUTLASS_PRAGMA_UNROLL
              for (int r = 0; r < 2; ++r) {
                auto c = tCcD(make_coord(make_coord(0, r, k0 + k), mi, ni));
                const int m = m0 + int(get<0>(c));
                const int n = n0 + int(get<1>(c));
                live[k][r] = m < M && n < N;  // N is even and n is even: n + 1 < N too
                off_g[k][r] = int64_t(m) * params.ldg + n;
                off_u[k][r] = int64_t(m) * params.ldu + n;
                off_h[k][r] = int64_t(m) * params.ldh + n;
                g[k][r] = V2::pack(0.f, 0.f);
                u[k][r] = V2::pack(0.f, 0.f);
                if (live[k][r]) {
                  g[k][r] = *reinterpret_cast<V2T const *>(params.gate + off_g[k][r]);
                  u[k][r] = *reinterpret_cast<V2T const *>(params.up + off_u[k][r]);
                }
              }
            }
            CUTLASS_PRAGMA_UNROLL
            for (int k = 0; k < kGroup; ++k) {
              CUTLASS_PRAGMA_UNROLL
              for (int r = 0; r < 2; ++r) {
                const float dh0 = accumulators(make_coord(make_coord(0, r, k0 + k), mi, ni));
                const float dh1 = accumulators(make_coord(make_coord(1, r, k0 + k), mi, ni));
                const float2 gv = V2::unpack(g[k][r]), uv = V2::unpack(u[k][r]);
                float d0, d1;
                const float a0 = gelu_grad<kTanh>(gv.x, &d0);
                const float a1 = gelu_grad<kTanh>(gv.y, &d1);
                const V2T dg = V2::pack(dh0 * uv.x * d0, dh1 * uv.y * d1);
                const V2T du = V2::pack(dh0 * a0, dh1 * a1);
                const V2T hv = V2::pack(a0 * uv.x, a1 * uv.y);
                if (live[k][r]) {
                  *reinterpret_cast<V2T *>(params.gate + off_g[k][r]) = dg;
                  *reinterpret_cast<V2T *>(params.up + off_u[k][r]) = du;
                  *reinterpret_cast<V2T *>(params.h + off_h[k][r]) = hv;
                }
              }
            }
          }
        }
      }
    });
  }

 private:
  Params params;
};

template <class Element>
struct DhKernel {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using Epi = DGegluEpilogue<Element>;
  // w_down [H, I] row-major: B as (K x N) row-major, N contiguous (wgmma reads it MN-major).
  using G = Sm90Gemm<Element, cutlass::layout::RowMajor, TileShape, ClusterShape,
                     cutlass::gemm::KernelTmaWarpSpecializedPingpong, Epi>;
  using Gemm = typename G::Gemm;
  using Kernel = typename G::Kernel;

  static typename Gemm::Arguments make_args(DhArgs const &a) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    static_assert(cute::is_static<decltype(cute::get<0>(StrideB{}))>::value,
                  "w_down must be read N-major (unit stride along N)");
    StrideA sa{};
    cute::get<0>(sa) = a.lddy;  // (M, K, L) strides: (lddy, 1, 0)
    StrideB sb{};
    cute::get<1>(sb) = a.ldw;  // (N, K, L) strides: (1, ldw, 0)
    typename Epi::Arguments epi;
    epi.gate = static_cast<Element *>(a.gate);
    epi.ldg = a.ldg;
    epi.up = static_cast<Element *>(a.up);
    epi.ldu = a.ldu;
    epi.h = static_cast<Element *>(a.h);
    epi.ldh = a.ldh;
    epi.approximate = a.approximate;
    return G::arguments(a.M, a.N, a.K, a.dy, sa, a.w, sb, epi, a.device, a.sm_count, a.swizzle, a.raster);
  }
};

}  // namespace detail

template <class Element>
const char *launch_geglu_dh(DhArgs const &a) {
  using K = detail::DhKernel<Element>;
  return K::G::launch(K::make_args(a), a.workspace, a.stream);
}
template <class Element>
size_t geglu_dh_workspace_bytes(DhArgs const &a) {
  using K = detail::DhKernel<Element>;
  return K::Gemm::get_workspace_size(K::make_args(a));
}

#define FUSED_GEGLU_SM90_DH_INSTANTIATE(ELEM)                         \
  template const char *launch_geglu_dh<ELEM>(DhArgs const &);         \
  template size_t geglu_dh_workspace_bytes<ELEM>(DhArgs const &);

}  // namespace fused_geglu_sm90
