// What the two sm90 GEMMs (geglu_gateup_sm90: GeGLU epilogue; geglu_dh_sm90: dGeGLU epilogue) share:
// bf16/fp16 pair packing, the fp32 GELU math their epilogues run on the accumulators, and the
// assembly of a CUTLASS 3.x warp-specialised kernel around a register ("no-smem") epilogue.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>

// CUTLASS resolves the driver's cuTensorMapEncodeTiled through cudaGetDriverEntryPoint on every
// TMA descriptor it builds (two per launch here) unless the library links libcuda directly. The
// entry point is process-wide, so it is looked up once: CUTLASS's call macro is pointed at a cached
// copy before any header that uses it is read (this header comes first in every sm90 TU; the
// adapter header is include-guarded, so its definition of the macro is not read again).
#include "cutlass/cuda_host_adapter.hpp"
#if !defined(CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL) && !defined(__CUDACC_RTC__)
namespace fused_geglu_sm90::driver {
#if (__CUDACC_VER_MAJOR__ > 12)
#define FUSED_GEGLU_SM90_DRIVER_LOOKUP(func, ver, p, q) \
  cudaGetDriverEntryPointByVersion(#func, &p, ver, cudaEnableDefault, &q)
#else
#define FUSED_GEGLU_SM90_DRIVER_LOOKUP(func, ver, p, q) cudaGetDriverEntryPoint(#func, &p, cudaEnableDefault, &q)
#endif
#define FUSED_GEGLU_SM90_CACHED_DRIVER_CALL(func, ver)                                     \
  template <typename... Args>                                                              \
  CUresult call_##func(Args... args) {                                                     \
    static const auto pfn = [] {                                                           \
      void *p = nullptr;                                                                   \
      cudaDriverEntryPointQueryResult q{};                                                 \
      if (FUSED_GEGLU_SM90_DRIVER_LOOKUP(func, ver, p, q) != cudaSuccess ||               \
          q != cudaDriverEntryPointSuccess) {                                              \
        (void)cudaGetLastError();                                                          \
        p = nullptr;                                                                       \
      }                                                                                    \
      return reinterpret_cast<decltype(&::func)>(p); /* cuda.h declares it; not linked */ \
    }();                                                                                   \
    return pfn != nullptr ? pfn(args...) : CUDA_ERROR_UNKNOWN;                             \
  }
FUSED_GEGLU_SM90_CACHED_DRIVER_CALL(cuTensorMapEncodeTiled, 12000)
FUSED_GEGLU_SM90_CACHED_DRIVER_CALL(cuTensorMapEncodeIm2col, 12000)
#undef FUSED_GEGLU_SM90_CACHED_DRIVER_CALL
#undef FUSED_GEGLU_SM90_DRIVER_LOOKUP
}  // namespace fused_geglu_sm90::driver
#undef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#define CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) ::fused_geglu_sm90::driver::call_##func
#endif

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace fused_geglu_sm90::detail {

template <class T> struct Vec2;
template <> struct Vec2<cutlass::bfloat16_t> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ __forceinline__ float2 unpack(type v) { return __bfloat1622float2(v); }
};
template <> struct Vec2<cutlass::half_t> {
  using type = __half2;
  static __device__ __forceinline__ type pack(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float2 unpack(type v) { return __half22float2(v); }
};

// fp32 GELU on the accumulators, stored as bf16/fp16: the SFU exp and divide (a few ulp of fp32)
// are far below the output rounding and keep the epilogue short, which matters because the
// consumer warps run it between mainloops.
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.398942280401432678f;  // 1 / sqrt(2 pi)
constexpr float kTanhK0 = 1.59576912160573071f;       // 2 sqrt(2 / pi)
constexpr float kTanhK1 = 0.0713548162726008322f;     // 2 sqrt(2 / pi) * 0.044715

__device__ __forceinline__ float gelu_erf(float v) { return v * fmaf(0.5f, erff(v * kInvSqrt2), 0.5f); }
__device__ __forceinline__ float gelu_tanh(float v) {
  // 0.5 (1 + tanh(u)) = sigmoid(2u), 2u = 2 sqrt(2/pi) (v + 0.044715 v^3); the clamp keeps 1 + e finite.
  const float two_u = v * fmaf(kTanhK1, v * v, kTanhK0);
  return __fdividef(v, 1.0f + __expf(fminf(-two_u, 88.0f)));
}

// gelu(v), and gelu'(v) into *d.
__device__ __forceinline__ float gelu_tanh_grad(float v, float *d) {
  const float v2 = v * v;
  const float two_u = v * fmaf(kTanhK1, v2, kTanhK0);
  const float e = __expf(fminf(-two_u, 88.0f));
  const float s = __fdividef(1.0f, 1.0f + e);
  // s + v s (1 - s) (2u)', with 1 - s formed as e s (no cancellation); e s is finite (clamp).
  *d = fmaf(v * s, (e * s) * fmaf(3.0f * kTanhK1, v2, kTanhK0), s);
  return v * s;
}
__device__ __forceinline__ float gelu_erf_grad(float v, float *d) {
  const float cdf = fmaf(0.5f, erff(v * kInvSqrt2), 0.5f);
  *d = fmaf(v, kInvSqrt2Pi * __expf(-0.5f * v * v), cdf);  // Phi(v) + v phi(v)
  return v * cdf;
}

// The GELU flavour as a template argument: the epilogues branch on it once per tile, outside their
// unrolled loops. A flag tested per element would end a basic block at every accumulator pair, and
// ptxas cannot interleave the SFU chains of neighbouring pairs across block boundaries, so each
// pair's exp -> reciprocal chain would run at full latency (ping-pong gives one warp per scheduler
// to the epilogue, so nothing else hides it).
template <bool kTanh>
__device__ __forceinline__ float gelu(float v) { return kTanh ? gelu_tanh(v) : gelu_erf(v); }
template <bool kTanh>
__device__ __forceinline__ float gelu_grad(float v, float *d) {
  return kTanh ? gelu_tanh_grad(v, d) : gelu_erf_grad(v, d);
}

// f(cute::true_type{}) when flag is set, f(cute::false_type{}) otherwise: one runtime test, two
// straight-line instantiations.
template <class F>
__device__ __forceinline__ void with_flag(bool flag, F &&f) {
  if (flag) {
    f(cute::true_type{});
  } else {
    f(cute::false_type{});
  }
}

// A persistent warp-specialised CUTLASS 3.x GEMM (TMA + wgmma) whose epilogue is Epi, a register
// epilogue collective that Sm90TmaWarpSpecializedAdapter makes acceptable to the kernel schedules.
// A is [M, K] K-major (row-major); LayoutB says how B is stored (ColumnMajor: [N, K] row-major,
// RowMajor: [K, N] row-major).
template <class Mainloop>
struct BuilderMainloop {
  using type = Mainloop;
};

template <class Element, class LayoutB, class TileShape, class ClusterShape, class Schedule, class Epi,
          template <class> class WrapMainloop = BuilderMainloop>
struct Sm90Gemm {
  static constexpr int kAlign = 16 / sizeof(Element);
  using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Epi>;
  // The builder's mainloop, or a collective derived from it (WrapMainloop<...>::type).
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlign,
      Element, LayoutB, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage) +
                           sizeof(typename CollectiveEpilogue::PipelineStorage))>,
      Schedule>::CollectiveOp;
  using CollectiveMainloop = typename WrapMainloop<BuiltMainloop>::type;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                      CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // The launch arguments of C[M, N] = A[M, K] B with the mainloop's and the epilogue's own
  // arguments; the tile scheduler order is swizzle 1/2/4/8 and raster 0 heuristic, 1 along M, 2
  // along N.
  template <class EpiArgs>
  static typename Gemm::Arguments arguments(int64_t M, int64_t N, int64_t K,
                                            typename CollectiveMainloop::Arguments const &mainloop,
                                            EpiArgs const &epi, int device, int sm_count, int swizzle,
                                            int raster) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sm_count;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {int(M), int(N), int(K), 1}, mainloop,
                                  epi, hw};
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.max_swizzle_size = swizzle;
    args.scheduler.raster_order = raster == 1 ? Raster::AlongM : raster == 2 ? Raster::AlongN : Raster::Heuristic;
    return args;
  }

  // The builder's mainloop: A and B from pointers and strides.
  template <class EpiArgs>
  static typename Gemm::Arguments arguments(int64_t M, int64_t N, int64_t K, void const *a,
                                            typename Kernel::StrideA sa, void const *b,
                                            typename Kernel::StrideB sb, EpiArgs const &epi,
                                            int device, int sm_count, int swizzle, int raster) {
    return arguments(M, N, K,
                     typename CollectiveMainloop::Arguments{static_cast<Element const *>(a), sa,
                                                            static_cast<Element const *>(b), sb},
                     epi, device, sm_count, swizzle, raster);
  }

  // The launch, with the host work a decode-size call waits on kept small: CUTLASS's adapter sets
  // two kernel attributes on every launch (dynamic shared memory; non-portable cluster sizes, which
  // a 2x1 cluster does not need), a driver call each. They belong to the kernel and the device, so
  // they are set once per device here and the kernel is launched directly with its cluster shape.
  static const char *launch(typename Gemm::Arguments const &args, void *workspace, cudaStream_t stream) {
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return "can_implement rejected the problem";
    if (Kernel::initialize_workspace(args, workspace, stream) != cutlass::Status::kSuccess) {
      return "initialize failed";
    }
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
    void const *kernel = reinterpret_cast<void const *>(&cutlass::device_kernel<Kernel>);
    constexpr int kSmem = int(Kernel::SharedStorageSize);
    const int device = args.hw_info.device_id;
    static std::atomic<uint64_t> attributes_set{0};  // one bit per device (ordinals < 64)
    const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
    if (bit == 0 || (attributes_set.load(std::memory_order_acquire) & bit) == 0) {
      if (kSmem >= (48 << 10) &&
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess) {
        return "setting the kernel's shared memory size failed";
      }
      attributes_set.fetch_or(bit, std::memory_order_release);
    }
    static_assert(cute::is_static_v<ClusterShape> && cute::size(ClusterShape{}) <= 8,
                  "portable cluster shapes only (no non-portable cluster attribute is set)");
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = cute::size<0>(ClusterShape{});
    cluster.val.clusterDim.y = cute::size<1>(ClusterShape{});
    cluster.val.clusterDim.z = cute::size<2>(ClusterShape{});
    cudaLaunchConfig_t config{};
    config.gridDim = Gemm::get_grid_shape(params);
    config.blockDim = Kernel::get_block_shape();
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    void *kernel_params[] = {&params};
    if (cudaLaunchKernelExC(&config, kernel, kernel_params) != cudaSuccess) return "kernel launch failed";
    return nullptr;
  }
};

// The boilerplate CUTLASS's adapter asks of an epilogue collective that needs no workspace; the
// class declares its own SharedStorage (empty for a pure register epilogue, a staging tile
// otherwise). The adapter constructs the collective from Params alone, so neither constructor
// builds a SharedStorage (a staging tile as a default argument would be a stack temporary).
#define FUSED_GEGLU_SM90_EPILOGUE_BOILERPLATE(CLASS)                                               \
  using TensorStorage = SharedStorage;                                                             \
  using Params = Arguments;                                                                        \
  template <class ProblemShape>                                                                    \
  static constexpr Params to_underlying_arguments(ProblemShape const &, Arguments const &args,     \
                                                  void *) {                                        \
    return args;                                                                                   \
  }                                                                                                \
  template <class ProblemShape>                                                                    \
  static size_t get_workspace_size(ProblemShape const &, Arguments const &) { return 0; }         \
  template <class ProblemShape>                                                                    \
  static cutlass::Status initialize_workspace(ProblemShape const &, Arguments const &, void *,     \
                                              cudaStream_t, cutlass::CudaHostAdapter * = nullptr) { \
    return cutlass::Status::kSuccess;                                                              \
  }                                                                                                \
  CUTLASS_HOST_DEVICE CLASS(Params const &params_) : params(params_) {}                            \
  CUTLASS_HOST_DEVICE CLASS(Params const &params_, SharedStorage const &) : params(params_) {}     \
  CUTLASS_DEVICE bool is_source_needed() { return false; }

// A register epilogue with no shared memory at all.
#define FUSED_GEGLU_SM90_NO_SMEM_EPILOGUE(CLASS) \
  struct SharedStorage {};                       \
  FUSED_GEGLU_SM90_EPILOGUE_BOILERPLATE(CLASS)

// The wgmma accumulator layout both epilogues rely on: value mode (2, 2, N/8) with strides
// (n+1, m+8, n+8) (CLayout_64xN in cute/atom/mma_traits_sm90_gmma.hpp: col-major 64 x N index,
// so n+1 = 64, m+8 = 8, n+8 = 512): value (0, r, k) and (1, r, k) are adjacent columns of one row.
template <class TiledMma>
constexpr bool accumulator_layout_is_wgmma() {
  using namespace cute;
  using CLayout = typename TiledMma::Atom::CLayout;
  static_assert(rank<1>(CLayout{}) == 3, "unexpected accumulator value layout");
  static_assert(size<1, 0>(CLayout{}) == 2 && size<1, 1>(CLayout{}) == 2, "unexpected layout");
  static_assert(stride<1, 0>(CLayout{}) == 64 && stride<1, 1>(CLayout{}) == 8 &&
                    stride<1, 2>(CLayout{}) == 512,
                "unexpected accumulator value strides: the column pairing would be wrong");
  return true;
}

}  // namespace fused_geglu_sm90::detail
