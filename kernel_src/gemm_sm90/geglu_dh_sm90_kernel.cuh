// CUTLASS 3.x kernel definition for geglu_dh_sm90 (contract in geglu_dh_sm90.h). Included only by
// the per-dtype instantiation TUs.
#pragma once

#include "geglu_dh_sm90.h"
#include "sm90_common.cuh"

namespace fused_geglu_sm90 {

namespace detail {

// Epilogue: the accumulators are dh. The tile goes in two column halves; for each, the gate and up
// pre-activations come in through shared memory as 16-byte row vectors, every thread turns its own
// fragment's pairs into dgate / dup in place there (no thread reads another's values, so no barrier
// between) and keeps h in registers, the gradients go back out as 16-byte row vectors, then h the
// same way through the gate buffer. Loading the pairs straight into the wgmma fragment would touch
// 8 rows per warp instruction with 4-byte accesses, for five M x I streams.
template <class Element_, class TileShape_>
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

  static constexpr int kBM = cute::size<0>(TileShape_{});
  static constexpr int kBN = cute::size<1>(TileShape_{});
  static constexpr int kHalf = kBN / 2;  // columns per pass
  static constexpr int kLd = kHalf + 8;  // +16 bytes per row: fragment accesses hit 32 banks
  static constexpr int kThreads = 128;   // ping-pong: one consumer warp group runs an epilogue
  static_assert((kLd * int(sizeof(Element)) / 4) % 8 == 4, "staged row pitch must be an odd multiple of 4 banks");

  struct SharedStorage {
    cute::array_aligned<Element, kBM * kLd, 128> gate;  // gate -> dgate -> h
    cute::array_aligned<Element, kBM * kLd, 128> up;    // up -> dup
  };

  struct Arguments {
    Element *gate = nullptr;
    int64_t ldg = 0;
    Element *up = nullptr;
    int64_t ldu = 0;
    Element *h = nullptr;
    int64_t ldh = 0;
    int approximate = 0;
  };
  FUSED_GEGLU_SM90_EPILOGUE_BOILERPLATE(DGegluEpilogue)

  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem_shape, Arguments const &args) {
    auto N = cute::get<1>(problem_shape);
    // 16-byte row vectors (the host op checks the pointers' alignment).
    return args.gate != nullptr && args.up != nullptr && args.h != nullptr && N % 8 == 0 &&
           args.ldg % 8 == 0 && args.ldu % 8 == 0 && args.ldh % 8 == 0;
  }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const &accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char *smem) {
    using namespace cute;
    static_assert(is_static<BlockShapeMNK>::value, "tile shape must be static");
    static_assert(size<0>(BlockShapeMNK{}) == kBM && size<1>(BlockShapeMNK{}) == kBN,
                  "the kernel's tile is not the one the staging buffers were sized for");
    static_assert(size(TiledMma{}) == kThreads, "one warp group per epilogue (ping-pong)");
    static_assert(accumulator_layout_is_wgmma<TiledMma>());  // values (0|1, r, k): columns n, n+1
    static_assert(rank<0>(typename cute::remove_cvref_t<decltype(accumulators)>::layout_type{}) == 3,
                  "accumulator mode 0 must be (2, 2, N/8)");
    constexpr int kChunks = size<0, 2>(decltype(accumulators.layout()){});
    constexpr int kMmaM = size<1>(decltype(accumulators.layout()){});
    static_assert(size<2>(decltype(accumulators.layout()){}) == 1 && kChunks * 8 == kBN,
                  "one wgmma atom spans the tile's N: chunk k holds columns 8k..8k+7");
    constexpr int kHalfChunks = kChunks / 2;

    const int M = int(get<0>(problem_shape_mnkl));
    const int N = int(get<1>(problem_shape_mnkl));
    const int m0 = int(get<0>(blk_coord_mnkl)) * kBM;
    const int n0 = int(get<1>(blk_coord_mnkl)) * kBN;
    const int rows = min(kBM, M - m0);
    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor cD = make_identity_tensor(make_shape(Int<kBM>{}, Int<kBN>{}));
    Tensor tCcD = thr_mma.partition_C(cD);
    const bool tanh_gelu = params.approximate != 0;
    SharedStorage &st = *reinterpret_cast<SharedStorage *>(smem);
    Element *__restrict__ sg = st.gate.data();
    Element *__restrict__ su = st.up.data();
    constexpr int kVecs = kHalf / 8;  // 16-byte vectors per staged row

    // Global window [m0, m0 + rows) x [c0, c0 + cols) <-> staged tile, 16-byte row vectors.
    auto load = [&](Element *stage, Element const *src, int64_t ld, int c0, int cols) {
      for (int idx = thread_idx; idx < kBM * kVecs; idx += kThreads) {
        const int m = idx / kVecs, v = (idx % kVecs) * 8;
        uint4 val = make_uint4(0, 0, 0, 0);  // outside the problem: zeros (finite, never stored)
        if (m < rows && v < cols) val = *reinterpret_cast<uint4 const *>(src + int64_t(m0 + m) * ld + c0 + v);
        *reinterpret_cast<uint4 *>(stage + m * kLd + v) = val;
      }
    };
    auto store = [&](Element const *stage, Element *dst, int64_t ld, int c0, int cols) {
      for (int idx = thread_idx; idx < kBM * kVecs; idx += kThreads) {
        const int m = idx / kVecs, v = (idx % kVecs) * 8;
        if (m < rows && v < cols)
          *reinterpret_cast<uint4 *>(dst + int64_t(m0 + m) * ld + c0 + v) =
              *reinterpret_cast<uint4 const *>(stage + m * kLd + v);
      }
    };

    CUTLASS_PRAGMA_UNROLL
    for (int p = 0; p < 2; ++p) {
      const int c0 = n0 + p * kHalf;
      const int cols = N - c0;  // valid columns from c0 (a multiple of 8; <= 0: none)
      cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, kBarrier);  // last pass's reads done
      load(sg, params.gate, params.ldg, c0, cols);
      load(su, params.up, params.ldu, c0, cols);
      cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, kBarrier);
      V2T hreg[kMmaM][kHalfChunks][2];
      CUTLASS_PRAGMA_UNROLL
      for (int mi = 0; mi < kMmaM; ++mi) {
        CUTLASS_PRAGMA_UNROLL
        for (int kk = 0; kk < kHalfChunks; ++kk) {
          const int k = p * kHalfChunks + kk;
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < 2; ++r) {
            auto c = tCcD(make_coord(make_coord(0, r, k), mi, 0));
            const int off = int(get<0>(c)) * kLd + int(get<1>(c)) - p * kHalf;
            const float dh0 = accumulators(make_coord(make_coord(0, r, k), mi, 0));
            const float dh1 = accumulators(make_coord(make_coord(1, r, k), mi, 0));
            const float2 gv = V2::unpack(*reinterpret_cast<V2T const *>(sg + off));
            const float2 uv = V2::unpack(*reinterpret_cast<V2T const *>(su + off));
            float d0, d1;
            const float a0 = tanh_gelu ? gelu_tanh_grad(gv.x, &d0) : gelu_erf_grad(gv.x, &d0);
            const float a1 = tanh_gelu ? gelu_tanh_grad(gv.y, &d1) : gelu_erf_grad(gv.y, &d1);
            *reinterpret_cast<V2T *>(sg + off) = V2::pack(dh0 * uv.x * d0, dh1 * uv.y * d1);
            *reinterpret_cast<V2T *>(su + off) = V2::pack(dh0 * a0, dh1 * a1);
            hreg[mi][kk][r] = V2::pack(a0 * uv.x, a1 * uv.y);
          }
        }
      }
      cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, kBarrier);
      store(sg, params.gate, params.ldg, c0, cols);
      store(su, params.up, params.ldu, c0, cols);
      cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, kBarrier);  // dgate is out of sg
      CUTLASS_PRAGMA_UNROLL
      for (int mi = 0; mi < kMmaM; ++mi) {
        CUTLASS_PRAGMA_UNROLL
        for (int kk = 0; kk < kHalfChunks; ++kk) {
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < 2; ++r) {
            auto c = tCcD(make_coord(make_coord(0, r, p * kHalfChunks + kk), mi, 0));
            *reinterpret_cast<V2T *>(sg + int(get<0>(c)) * kLd + int(get<1>(c)) - p * kHalf) = hreg[mi][kk][r];
          }
        }
      }
      cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, kBarrier);
      store(sg, params.h, params.ldh, c0, cols);
    }
  }

 private:
  // The kernel orders the two warp groups' epilogues, so they share the barrier and the buffers.
  static constexpr uint32_t kBarrier = 0;  // a user barrier id (CUTLASS offsets past its own)
  Params params;
};

template <class Element>
struct DhKernel {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using Epi = DGegluEpilogue<Element, TileShape>;
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
