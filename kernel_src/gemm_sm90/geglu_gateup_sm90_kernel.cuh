// CUTLASS 3.x kernel definition for geglu_gateup_sm90 (layout spec and contract in
// geglu_gateup_sm90.h). Included only by the per-dtype instantiation TUs, which are the slow ones.
#pragma once

#include "geglu_gateup_sm90.h"
#include "sm90_common.cuh"
#include "split_weight_mainloop.cuh"

namespace fused_geglu_sm90 {

namespace detail {

// Epilogue collective: GeGLU on the accumulators in registers, then every output tile (h, and gate
// and up when asked) staged through shared memory so that global stores are whole 16-byte
// vectors along rows. Storing straight from the wgmma fragment would write 4 bytes per thread
// scattered over 8 rows per warp instruction (8 L1 wavefronts each), which the cooperative tiles
// pay in full because their epilogue does not overlap a mainloop. Sm90TmaWarpSpecializedAdapter
// turns the collective into a warp-specialised epilogue the kernel schedules accept.
// The B tile is [BN/2 rows of the lower-addressed weight; the same rows of the other]
// (split_weight_mainloop.cuh), so accumulator column n pairs with column n + BN/2.
template <class Element_, class TileShape_, int kThreads_>
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

  static constexpr int kBM = cute::size<0>(TileShape_{});
  static constexpr int kBN = cute::size<1>(TileShape_{});
  static constexpr int kHalf = kBN / 2;  // output columns of a tile (of h, gate and up alike)
  // +8 elements (16 bytes) per staged row: a warp's fragment store covers 8 rows x 4 threads, and
  // with the row pitch = 4 banks (mod 32) those land in 32 distinct banks; 16-byte reads stay aligned.
  static constexpr int kLd = kHalf + 8;
  static constexpr int kThreads = kThreads_;  // the consumer threads that run this epilogue together
  static_assert(kHalf % 16 == 0, "the staged tile must hold whole 16-column pairs");
  static_assert((kLd * int(sizeof(Element)) / 4) % 8 == 4, "staged row pitch must be an odd multiple of 4 banks");

  struct SharedStorage {
    cute::array_aligned<Element, kBM * kLd, 128> tile;
  };

  struct Arguments {
    Element *h = nullptr;
    int64_t ldh = 0;
    Element *gate = nullptr;  // may be null (then so is up)
    int64_t ldg = 0;
    Element *up = nullptr;
    int64_t ldu = 0;
    Element const *b_gate = nullptr;  // [I] or null (then so is b_up)
    Element const *b_up = nullptr;
    int gate_second = 0;  // the tile's first half is up (w_up sits below w_gate in memory)
    int approximate = 0;
    int skip = 0;  // timing only: leave the outputs unwritten ($FUSED_GEGLU_SM90_DIAG_NO_EPILOGUE)
  };
  FUSED_GEGLU_SM90_EPILOGUE_BOILERPLATE(GegluEpilogue)

  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem_shape, Arguments const &args) {
    auto N = cute::get<1>(problem_shape);
    // 16-byte row vectors: output rows start 16-byte aligned (the host op checks the pointers).
    return args.h != nullptr && (args.gate == nullptr) == (args.up == nullptr) && N % 16 == 0 &&
           args.ldh % 8 == 0 && args.ldg % 8 == 0 && args.ldu % 8 == 0;
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
                  "the kernel's tile is not the one the staging buffer was sized for");
    static_assert(size(TiledMma{}) == kThreads, "kThreads must be the tiled MMA's thread count");

    // The pairing relies on the wgmma accumulator layout (accumulator_layout_is_wgmma): columns
    // n, n+1 of chunk k and n + BN/2, n + BN/2 + 1 of chunk k + kChunks/2 sit in one thread.
    static_assert(accumulator_layout_is_wgmma<TiledMma>());
    using CLayout = typename TiledMma::Atom::CLayout;
    static_assert(size<1, 2>(CLayout{}) % 2 == 0, "atom N must hold whole 16-column groups");
    static_assert(rank<0>(typename cute::remove_cvref_t<decltype(accumulators)>::layout_type{}) == 3,
                  "accumulator mode 0 must be (2, 2, N/8)");
    if (params.skip) return;

    const int M = int(get<0>(problem_shape_mnkl));
    const int N = int(get<1>(problem_shape_mnkl));
    const int m0 = int(get<0>(blk_coord_mnkl)) * kBM;
    const int n0 = int(get<1>(blk_coord_mnkl)) * kBN;

    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor cD = make_identity_tensor(make_shape(Int<kBM>{}, Int<kBN>{}));
    Tensor tCcD = thr_mma.partition_C(cD);  // ((2,2,N/8), MMA_M, MMA_N) -> (m, n) in the tile
    static_assert(decltype(size(tCcD))::value == decltype(size(accumulators))::value,
                  "coordinate / accumulator partition mismatch");

    constexpr int kChunks = size<0, 2>(decltype(accumulators.layout()){});
    constexpr int kMmaM = size<1>(decltype(accumulators.layout()){});
    constexpr int kMmaN = size<2>(decltype(accumulators.layout()){});
    Element *__restrict__ stage = reinterpret_cast<SharedStorage *>(smem)->tile.data();
    const int rows = min(kBM, M - m0);
    const int cols = N / 2 - n0 / 2;  // valid output columns from this tile's first; a multiple of 8

    // One pass per output (0: h, 1: gate, 2: up): every thread writes its fragment's values into
    // the staging tile, then the tile goes out as 16-byte row vectors. All three outputs map
    // accumulator column n < BN/2 (with its partner n + BN/2) to output column n0/2 + n.
    // The output, the GELU flavour and whether there is a bias are compile-time here, so the
    // unrolled loop is one basic block (see gelu<> in sm90_common.cuh).
    auto pass = [&](auto which_c, auto tanh_c, auto bias_c, auto swap_c, Element *dst, int64_t ld) {
      constexpr int kWhich = decltype(which_c)::value;
      constexpr bool kTanh = decltype(tanh_c)::value;
      constexpr bool kBias = decltype(bias_c)::value;
      constexpr bool kSwap = decltype(swap_c)::value;
      cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, kBarrier);  // the last pass's reads are done
      // One accumulator pair: gate columns (n, n+1) of chunk kg and up columns of chunk ku, rows
      // m and m + 8, into staged column j.
      auto stage_pair = [&](int mi, int ni, int kg, int ku, int j, float bg0, float bg1, float bu0, float bu1) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 2; ++r) {
          const int m = int(get<0>(tCcD(make_coord(make_coord(0, r, kg), mi, ni))));
          const float g0 = accumulators(make_coord(make_coord(0, r, kg), mi, ni)) + bg0;
          const float g1 = accumulators(make_coord(make_coord(1, r, kg), mi, ni)) + bg1;
          const float u0 = accumulators(make_coord(make_coord(0, r, ku), mi, ni)) + bu0;
          const float u1 = accumulators(make_coord(make_coord(1, r, ku), mi, ni)) + bu1;
          V2T out;
          if constexpr (kWhich == 0) {
            out = V2::pack(gelu<kTanh>(g0) * u0, gelu<kTanh>(g1) * u1);
          } else if constexpr (kWhich == 1) {
            out = V2::pack(g0, g1);
          } else {
            out = V2::pack(u0, u1);
          }
          *reinterpret_cast<V2T *>(stage + m * kLd + j) = out;
        }
      };
      CUTLASS_PRAGMA_UNROLL
      for (int mi = 0; mi < kMmaM; ++mi) {
        CUTLASS_PRAGMA_UNROLL
        for (int ni = 0; ni < kMmaN; ++ni) {
          static_assert(kMmaN == 1, "the pairing assumes one MMA atom spans the tile's N");
          constexpr int kHalfChunks = kChunks / 2;
          // for_each over a compile-time sequence: the accumulator indices must be constants (a
          // loop the compiler declined to unroll, as it did for 24 chunks of the 192-wide tile,
          // moves the accumulators to the stack and halves the kernel's speed).
          cute::for_each(cute::make_int_sequence<kHalfChunks>{}, [&](auto k_c) {
            constexpr int k = decltype(k_c)::value;
            const int n = int(get<1>(tCcD(make_coord(make_coord(0, 0, k), mi, ni))));  // < kHalf
            float bg0 = 0.f, bg1 = 0.f, bu0 = 0.f, bu1 = 0.f;
            if constexpr (kBias) {
              // Columns past I (a partial last tile) are computed but never stored; pointing their
              // loads at column 0 keeps them in bounds without a branch.
              const int nb = n0 / 2 + n < N / 2 ? n0 / 2 + n : 0;
              const float2 bg = V2::unpack(*reinterpret_cast<V2T const *>(params.b_gate + nb));
              const float2 bu = V2::unpack(*reinterpret_cast<V2T const *>(params.b_up + nb));
              bg0 = bg.x; bg1 = bg.y; bu0 = bu.x; bu1 = bu.y;
            }
            // Which half holds gate follows from the two allocations' order (kSwap).
            stage_pair(mi, ni, kSwap ? k + kHalfChunks : k, kSwap ? k : k + kHalfChunks, n, bg0, bg1, bu0, bu1);
          });
        }
      }
      cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, kBarrier);  // the staged tile is complete
      constexpr int kVecs = kHalf / 8;  // 16-byte vectors per staged row
      for (int idx = thread_idx; idx < kBM * kVecs; idx += kThreads) {
        const int m = idx / kVecs, v = (idx % kVecs) * 8;
        if (m < rows && v < cols) {
          *reinterpret_cast<uint4 *>(dst + int64_t(m0 + m) * ld + n0 / 2 + v) =
              *reinterpret_cast<uint4 const *>(stage + m * kLd + v);
        }
      }
    };

    with_flag(params.gate_second != 0, [&](auto swap_c) {
      with_flag(params.b_gate != nullptr, [&](auto bias_c) {
        with_flag(params.approximate != 0,
                  [&](auto tanh_c) { pass(Int<0>{}, tanh_c, bias_c, swap_c, params.h, params.ldh); });
        if (params.gate != nullptr) {
          pass(Int<1>{}, cute::false_type{}, bias_c, swap_c, params.gate, params.ldg);
          pass(Int<2>{}, cute::false_type{}, bias_c, swap_c, params.up, params.ldu);
        }
      });
    });
  }

 private:
  // Ping-pong: the two consumer warp groups' epilogues never overlap (the kernel orders them), so
  // they share this barrier and the staging tile; cooperative: both groups run it together.
  // (user barrier 0: CUTLASS offsets user ids past the ones its kernels reserve).
  static constexpr uint32_t kBarrier = 0;
  Params params;
};

template <class Mainloop>
struct SplitWeights {
  using type = SplitWeightMainloop<Mainloop>;
};

// Tile shape, cluster shape and schedule of each TileCfg (geglu_gateup_sm90.h lists them).
template <int kM, int kN, int kK, int kClusterM, int kClusterN, bool kPingpong_>
struct TileTraitsOf {
  using TileShape = cute::Shape<cute::Int<kM>, cute::Int<kN>, cute::Int<kK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  static constexpr bool kPingpong = kPingpong_;
};
template <TileCfg Cfg> struct TileTraits;
template <> struct TileTraits<TileCfg::k128x128> : TileTraitsOf<128, 128, 64, 1, 1, false> {};
template <> struct TileTraits<TileCfg::k128x256> : TileTraitsOf<128, 256, 64, 2, 1, false> {};
template <> struct TileTraits<TileCfg::k128x128pp> : TileTraitsOf<128, 128, 64, 2, 1, true> {};
template <> struct TileTraits<TileCfg::k256x128> : TileTraitsOf<256, 128, 64, 1, 2, false> {};
template <> struct TileTraits<TileCfg::k128x192pp> : TileTraitsOf<128, 192, 64, 1, 2, true> {};
template <> struct TileTraits<TileCfg::k64x128pp> : TileTraitsOf<64, 128, 64, 1, 1, true> {};
template <> struct TileTraits<TileCfg::k64x256pp> : TileTraitsOf<64, 256, 64, 1, 1, true> {};
template <> struct TileTraits<TileCfg::k64x128k128pp> : TileTraitsOf<64, 128, 128, 1, 1, true> {};

// The kernel for one (dtype, tile) configuration.
template <class Element, TileCfg Cfg>
struct GateUpKernel {
  using TileShape = typename TileTraits<Cfg>::TileShape;
  using ClusterShape = typename TileTraits<Cfg>::ClusterShape;
  static constexpr bool kPingpong = TileTraits<Cfg>::kPingpong;
  using Schedule = cute::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                       cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  // Consumer threads that run one epilogue: one warp group (ping-pong) or two (cooperative).
  using Epi = GegluEpilogue<Element, TileShape, kPingpong ? 128 : 256>;
  // B is (K x N) column-major as far as the builder knows; SplitWeights replaces its global view.
  using G = Sm90Gemm<Element, cutlass::layout::ColumnMajor, TileShape, ClusterShape, Schedule, Epi, SplitWeights>;
  using Gemm = typename G::Gemm;
  using Kernel = typename G::Kernel;
  using Mainloop = typename G::CollectiveMainloop;

  static typename Gemm::Arguments make_args(GateUpArgs const &a) {
    using StrideA = typename Kernel::StrideA;
    StrideA sa{};
    cute::get<0>(sa) = a.ldx;  // (M, K, L) strides: (ldx, 1, 0)
    const bool gate_second = a.w_up < a.w_gate;  // TMA strides are unsigned: the lower address is "first"
    auto const *first = static_cast<Element const *>(gate_second ? a.w_up : a.w_gate);
    auto const *second = static_cast<Element const *>(gate_second ? a.w_gate : a.w_up);
    typename Mainloop::Arguments ml{static_cast<Element const *>(a.x), sa, first, a.ldw, int64_t(second - first)};
    typename Epi::Arguments epi;
    epi.h = static_cast<Element *>(a.h);
    epi.ldh = a.ldh;
    epi.gate = static_cast<Element *>(a.gate);
    epi.ldg = a.ldg;
    epi.up = static_cast<Element *>(a.up);
    epi.ldu = a.ldu;
    epi.b_gate = static_cast<Element const *>(a.b_gate);
    epi.b_up = static_cast<Element const *>(a.b_up);
    epi.gate_second = gate_second;
    epi.approximate = a.approximate;
    epi.skip = a.skip_epilogue;
    return G::arguments(a.M, a.N2, a.K, ml, epi, a.device, a.sm_count, a.swizzle, a.raster);
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
