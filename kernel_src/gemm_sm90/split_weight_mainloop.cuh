// The mainloop collective of the gate+up GEMM: it reads w_gate and w_up where they are, with no
// repacked copy of the two weights.
//
// The B tile of output tile j (BN columns) is rows [j*BN/2, (j+1)*BN/2) of w_gate followed by the
// same rows of w_up. Both weights are one TMA tensor of shape (K, I, 2) with strides
// (1, ldw, delta), where delta = w_second - w_first in elements (two separate allocations: TMA only
// ever forms first + i*ldw + s*delta for s in {0, 1}, and bounds-checks i against I, so a partial
// last tile reads zeros). The box is (BK, BN/2, 2), which lands in shared memory as BN contiguous
// rows: the MMA sees an ordinary [BN, BK] B tile whose first half is gate and second half up, and
// the epilogue pairs accumulator column n with n + BN/2 (one thread holds both in the wgmma layout).
//
// Everything but the B operand's global view is the builder's collective (Base): its shared
// storage, pipeline and MMA are used as they are; load_init/load and the TMA set-up are this file's.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace fused_geglu_sm90::detail {

template <class Base>
struct SplitWeightMainloop : Base {
  using typename Base::ElementA;
  using typename Base::ElementB;
  using typename Base::GmemTiledCopyA;
  using typename Base::GmemTiledCopyB;
  using typename Base::InternalElementA;
  using typename Base::InternalElementB;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::StrideA;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using DispatchPolicy = typename Base::DispatchPolicy;
  using ClusterShape = typename DispatchPolicy::ClusterShape;

  static constexpr int kBM = cute::size<0>(TileShape{});
  static constexpr int kBN = cute::size<1>(TileShape{});
  static constexpr int kBK = cute::size<2>(TileShape{});
  static constexpr int kHalf = kBN / 2;
  static_assert(kHalf % 8 == 0, "each weight's half of a tile must be whole 8-column chunks");

  // The CTA tile with its N mode split into (rows of one weight, which weight).
  using CtaTiler = cute::Shape<cute::Int<kBM>, cute::Shape<cute::Int<kHalf>, cute::_2>, cute::Int<kBK>>;
  // B as ((I, 2), K, L): strides ((ldw, delta), 1, 0).
  using StrideBSplit = cute::Stride<cute::Stride<int64_t, int64_t>, cute::Int<1>, int64_t>;

  struct Arguments {
    ElementA const *ptr_A;
    StrideA dA;
    ElementB const *ptr_first;   // the weight at the lower address (gate, unless gate_second)
    int64_t ldw;                 // row stride of both weights, in elements
    int64_t delta;               // second weight's address - first's, in elements (>= 0)
    uint32_t mma_promotion_interval = 4;
  };

  template <class T>
  static auto b_tensor(T const *ptr, int I, int K, int L, int64_t ldw, int64_t delta) {
    using namespace cute;
    return make_tensor(ptr, make_layout(make_shape(make_shape(I, _2{}), K, L),
                                        StrideBSplit{make_stride(ldw, delta), _1{}, int64_t(0)}));
  }

  using TmaBSplit = decltype(make_tma_copy_B_sm90(
      GmemTiledCopyB{}, b_tensor(static_cast<InternalElementB const *>(nullptr), 0, 0, 0, 0, 0),
      SmemLayoutB{}(cute::_, cute::_, cute::Int<0>{}), CtaTiler{}, ClusterShape{}));

  // The base's Params (A's TMA and the transaction byte counts, which are unchanged: the box holds
  // the same BN x BK values) plus B's split view; the base's own B descriptor is left empty.
  struct Params : Base::Params {
    TmaBSplit tma_load_b_split;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const &problem_shape, Arguments const &args, void *) {
    using namespace cute;
    auto [M, N, K, L] = append<4>(problem_shape, 1);
    auto ptr_a = reinterpret_cast<InternalElementA const *>(args.ptr_A);
    auto ptr_b = reinterpret_cast<InternalElementB const *>(args.ptr_first);
    Params p{};
    p.tma_load_a = make_tma_copy_A_sm90(GmemTiledCopyA{}, make_tensor(ptr_a, make_layout(make_shape(M, K, L), args.dA)),
                                        SmemLayoutA{}(_, _, Int<0>{}), TileShape{}, ClusterShape{});
    p.tma_load_b_split = make_tma_copy_B_sm90(GmemTiledCopyB{}, b_tensor(ptr_b, N / 2, K, L, args.ldw, args.delta),
                                              SmemLayoutB{}(_, _, Int<0>{}), CtaTiler{}, ClusterShape{});
    p.tma_transaction_bytes = Base::TmaTransactionBytes;
    p.tma_transaction_bytes_mk = Base::TmaTransactionBytesMK;
    p.tma_transaction_bytes_nk = Base::TmaTransactionBytesNK;
    return p;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem_shape, Arguments const &args) {
    auto [M, N, K, L] = cute::append<4>(problem_shape, 1);
    constexpr int kAlign = 16 / int(sizeof(ElementB));  // TMA: 16-byte strides and base
    const int64_t max_stride = (int64_t(1) << 40) / int64_t(sizeof(ElementB));
    return N % 16 == 0 && K % kAlign == 0 && args.ldw % kAlign == 0 && args.delta % kAlign == 0 &&
           args.delta >= 0 && args.delta < max_stride && reinterpret_cast<uintptr_t>(args.ptr_first) % 16 == 0 &&
           Base::can_implement(problem_shape, typename Base::Arguments{args.ptr_A, args.dA, args.ptr_first,
                                                                       typename Base::StrideB{}});
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const &params) {
    cute::prefetch_tma_descriptor(params.tma_load_a.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_load_b_split.get_tma_descriptor());
  }

  // (BLK_M, BLK_K, m, k, l) tiles of A and ((BN/2, 2), BLK_K, n, k, l) tiles of B.
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const &problem_shape_mnkl, Params const &params) const {
    using namespace cute;
    auto [M, N, K, L] = problem_shape_mnkl;
    Tensor mA = params.tma_load_a.get_tma_tensor(make_shape(M, K, L));
    Tensor mB = params.tma_load_b_split.get_tma_tensor(make_shape(make_shape(N / 2, _2{}), K, L));
    Tensor gA = local_tile(mA, TileShape{}, make_coord(_, _, _), Step<_1, Underscore, _1>{});
    Tensor gB2 = local_tile(mB, CtaTiler{}, make_coord(_, _, _), Step<Underscore, _1, _1>{});
    // The tiler's (rows, which weight) split leaves the N-tile mode as (tiles, 1): keep the tiles
    // only, so that the scheduler's N index (and the epilogue's block coordinate) stays an int.
    auto lay = gB2.layout();
    Tensor gB = make_tensor(gB2.data(), make_layout(layout<0>(lay), layout<1>(lay), layout<0>(layout<2>(lay)),
                                                    layout<3>(lay), layout<4>(lay)));
    return make_tuple(gA, gB);
  }

  // The producer: one elected thread issues A's and B's TMA loads for every k-tile into the
  // pipeline's stages (multicast masks as the builder's schedule asks).
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const &params, MainloopPipeline pipeline, PipelineState write_state,
                           cute::tuple<TensorA, TensorB> const &load_inputs, BlockCoord const &blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, TensorStorage &shared_tensors) {
    using namespace cute;
    if (!elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    constexpr uint32_t kClusterM = size<0>(ClusterShape{});
    const uint32_t cta_m = block_rank_in_cluster % kClusterM, cta_n = block_rank_in_cluster / kClusterM;
    auto tma_a = params.tma_load_a.get_slice(cta_n);
    auto tma_b = params.tma_load_b_split.get_slice(cta_m);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor tAgA = tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord));
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgB = tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord));
    Tensor tBsB = tma_b.partition_D(sB);

    // A is shared by the CTAs of a cluster row (same m), B by those of a cluster column (same n).
    auto cluster = Layout<ClusterShape>{};
    uint16_t mask_a = 0, mask_b = 0;
    if constexpr (is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      for (int n = 0; n < size<1>(cluster); ++n) mask_a |= uint16_t(1) << cluster(cta_m, n, Int<0>{});
    }
    if constexpr (is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      for (int m = 0; m < size<0>(cluster); ++m) mask_b |= uint16_t(1) << cluster(m, cta_n, Int<0>{});
    }

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++write_state) {
      pipeline.producer_acquire(write_state);
      auto *barrier = pipeline.producer_get_barrier(write_state);
      const int stage = write_state.index();
      copy(params.tma_load_a.with(*barrier, mask_a), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      copy(params.tma_load_b_split.with(*barrier, mask_b), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
    }
  }
};

}  // namespace fused_geglu_sm90::detail
