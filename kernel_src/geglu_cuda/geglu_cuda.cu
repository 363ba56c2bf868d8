// GeGLU forward/backward for CUDA tensors: out = gelu(gate) * up and its gradients.
//
// Build: nvcc -O3 -std=c++17 -Xcompiler -fPIC, one -gencode per arch in build.toml (sm_80, sm_90), plus the
// torch/CUDA include paths. No -use_fast_math (the accuracy targets assume IEEE expf/normcdff/reciprocal).
//
// Memory-bound elementwise kernel; the design choices, in order of how much they matter:
//   * 16-byte accesses (8 bf16/fp16 or 4 fp32 per load/store) whenever every base pointer and every row
//     stride is a multiple of 16 bytes (the normal case, also for the two halves of a packed [rows, 2*cols]
//     tensor when cols * element size is a multiple of 16). Otherwise a 1-element path. The last
//     cols % 8 (resp. % 4) columns of a row are done by scalar code inside the vector kernel.
//   * ILP: each thread issues all its loads (kIlp packs per input) before any math, so several 16-byte
//     loads per thread are in flight.
//   * 2-D blocks (column threads x rows) and a 2-D grid (column chunks x row groups, grid-striding over
//     rows beyond 65535 groups), so both short rows and few rows still fill the GPU.
//   * fp32 math on upcast values with one rounding at the store: tanh GELU as x * sigmoid(2u),
//     whose derivative s + x s (1 - s) (2u)' is computed with 1 - s = e * s (no cancellation).
//     fp32 tensors get IEEE expf / normcdff / a correctly rounded reciprocal. bf16 / fp16 tensors
//     get the SFU forms (__expf, __fdividef, erff): their few-ulp fp32 error is far below the
//     one rounding to 8 / 11 mantissa bits at the store, and the IEEE forms cost enough issue
//     slots to make this kernel compute-bound (measured on the H200, 2026-12-02: 63% of copy
//     bandwidth with them on [8192, 16384] bf16).
//   * Work per thread follows the size: kIlp packs per thread for large tensors, 1 pack when that
//     would leave the GPU with too few blocks (decode-sized rows).
//   * Dense operands (every tensor contiguous and 16-byte aligned: the MLP's own buffers) take the
//     flat kernels instead: one 16-byte pack per thread over the whole tensor as one 1-D range,
//     128-thread blocks, no row arithmetic. That is the shape of torch.compile's generated pointwise
//     code, which measured 4.2-4.3 TB/s on the H200 where the row kernels reached 3.5-3.9
//     (benchmarks/results/pointwise-profile-h200-6ee2946.json).
//   * Launch on the current stream with the device guard; no allocation and no host sync, so it is safe
//     under CUDA graph capture.

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // what at::cuda::getCurrentCUDAStream forwards to; no cuBLAS/cuSPARSE headers
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "geglu_checks.h"

namespace {

// ---------------------------------------------------------------------------------------------------
// Element conversion: load upcasts to fp32, store rounds once (nearest-even).

template <typename T>
struct Conv;
template <>
struct Conv<float> {
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float f) { return f; }
};
template <>
struct Conv<__half> {
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float f) { return __float2half_rn(f); }
};
template <>
struct Conv<__nv_bfloat16> {
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float f) { return __float2bfloat16_rn(f); }
};

// N elements moved as one aligned access (N * sizeof(T) = 16 bytes -> one 128-bit load/store).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// ---------------------------------------------------------------------------------------------------
// GELU in fp32.

constexpr float kInvSqrt2Pi = 0.398942280401432678f;  // 1 / sqrt(2 pi)
constexpr float kTanhK0 = 1.59576912160573071f;       // 2 * sqrt(2 / pi)
constexpr float kTanhK1 = 0.0713548162726008322f;     // 2 * sqrt(2 / pi) * 0.044715

constexpr float kInvSqrt2 = 0.707106781186547524f;

// Returns gelu(x); with GRAD also writes gelu'(x) to *dgelu. FAST: SFU exp / divide and erff
// (used for 16-bit tensors, see the header).
template <bool TANH, bool GRAD, bool FAST>
__device__ __forceinline__ float gelu(float x, float *dgelu) {
  if constexpr (TANH) {
    // 0.5 * (1 + tanh(u)) = sigmoid(v), v = 2u = 2 sqrt(2/pi) (x + 0.044715 x^3).
    const float x2 = x * x;
    const float v = x * fmaf(kTanhK1, x2, kTanhK0);
    // clamp: 1 + e stays finite, so e * sig below is never inf * 0
    const float e = FAST ? __expf(fminf(-v, 88.0f)) : expf(fminf(-v, 88.0f));
    const float sig = FAST ? __fdividef(1.0f, 1.0f + e) : __frcp_rn(1.0f + e);
    if constexpr (GRAD) {
      const float dv = fmaf(3.0f * kTanhK1, x2, kTanhK0);
      *dgelu = fmaf(x * sig, (e * sig) * dv, sig);  // sig + x sig (1 - sig) v'
    }
    return x * sig;
  } else {
    // Phi(x): normcdff has no 1 + erf cancellation in the negative tail (fp32); for 16-bit
    // outputs the cancellation error (absolute, < 1e-7 * |x|) is below the output rounding.
    const float cdf = FAST ? fmaf(0.5f, erff(x * kInvSqrt2), 0.5f) : normcdff(x);
    if constexpr (GRAD) {
      const float pdf = kInvSqrt2Pi * (FAST ? __expf(-0.5f * x * x) : expf(-0.5f * x * x));
      *dgelu = fmaf(x, pdf, cdf);  // Phi(x) + x phi(x)
    }
    return x * cdf;
  }
}

template <typename T>
constexpr bool kFast = !std::is_same_v<T, float>;

// ---------------------------------------------------------------------------------------------------
// Kernels. A thread owns kIlp packs of one row, spaced blockDim.x packs apart (coalesced per k), and
// loads all of them before doing any math.

constexpr int kThreads = 256;  // per block, = blockDim.x * blockDim.y
// >= 4 resident blocks per SM caps registers at 64 (50% occupancy). With kFwdIlp * 2 inputs or
// kBwdIlp * 3 inputs 16-byte loads per thread that keeps ~96-128 KiB of loads in flight per SM, well
// above what HBM latency x bandwidth needs, without spills.
constexpr int kMinBlocks = 3;
constexpr int kFwdIlp = 2;  // packs per input per thread (2 inputs), large tensors (4 measured 78% of copy BW)
constexpr int kBwdIlp = 2;  // (3 inputs)
// Below this many blocks per SM at the large-tensor ILP, one pack per thread instead: 4x the
// blocks, so decode-sized inputs (16 rows) still reach every SM.
constexpr int kMinBlocksPerSm = 4;

template <typename T>
struct FwdArgs {
  T *out;
  const T *gate;
  const T *up;
  int64_t out_stride, gate_stride, up_stride;  // row strides, in elements
  int64_t rows;
  int cols;
};

// No __restrict__: the fused in-place variant passes grad_gate == gate, grad_up == up and
// h == grad_out (every element is read by the thread that later overwrites it, loads first).
template <typename T>
struct BwdArgs {
  T *grad_gate;
  T *grad_up;
  T *h;  // optional third output gelu(gate) * up (EMIT_H)
  const T *grad_out;
  const T *gate;
  const T *up;
  int64_t grad_gate_stride, grad_up_stride, h_stride, grad_out_stride, gate_stride, up_stride;
  int64_t rows;
  int cols;
};

template <typename T, int VW, bool TANH, int ILP>
__global__ void __launch_bounds__(kThreads, kMinBlocks) geglu_fwd_kernel(const FwdArgs<T> a) {
  using P = Pack<T, VW>;
  using C = Conv<T>;
  constexpr bool F = kFast<T>;
  const int npacks = a.cols / VW;
  const int first = blockIdx.x * blockDim.x * ILP + threadIdx.x;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < a.rows;
       row += int64_t(gridDim.y) * blockDim.y) {
    const T *gate = a.gate + row * a.gate_stride;
    const T *up = a.up + row * a.up_stride;
    T *out = a.out + row * a.out_stride;
    P g[ILP], u[ILP];
#pragma unroll
    for (int k = 0; k < ILP; ++k) {
      const int p = first + k * blockDim.x;
      if (p < npacks) {
        g[k] = reinterpret_cast<const P *>(gate)[p];
        u[k] = reinterpret_cast<const P *>(up)[p];
      }
    }
#pragma unroll
    for (int k = 0; k < ILP; ++k) {
      const int p = first + k * blockDim.x;
      if (p < npacks) {
        P o;
#pragma unroll
        for (int j = 0; j < VW; ++j) {
          o.v[j] = C::store(gelu<TANH, false, F>(C::load(g[k].v[j]), nullptr) * C::load(u[k].v[j]));
        }
        reinterpret_cast<P *>(out)[p] = o;
      }
    }
    if constexpr (VW > 1) {  // the cols % VW leftover columns (< VW <= blockDim.x)
      const int c = npacks * VW + threadIdx.x;
      if (blockIdx.x == 0 && c < a.cols) {
        out[c] = C::store(gelu<TANH, false, F>(C::load(gate[c]), nullptr) * C::load(up[c]));
      }
    }
  }
}

template <typename T, bool TANH, bool F>
struct BwdMath {
  // (grad_gate, grad_up, h) of one element.
  static __device__ __forceinline__ void run(T go_, T g_, T u_, T &dg, T &du, T &h) {
    using C = Conv<T>;
    float dgelu;
    const float gl = gelu<TANH, true, F>(C::load(g_), &dgelu);
    const float o = C::load(go_), u = C::load(u_);
    dg = C::store(o * u * dgelu);
    du = C::store(o * gl);
    h = C::store(gl * u);
  }
};

template <typename T, int VW, bool TANH, int ILP, bool EMIT_H>
__global__ void __launch_bounds__(kThreads, kMinBlocks) geglu_bwd_kernel(const BwdArgs<T> a) {
  using P = Pack<T, VW>;
  using M = BwdMath<T, TANH, kFast<T>>;
  const int npacks = a.cols / VW;
  const int first = blockIdx.x * blockDim.x * ILP + threadIdx.x;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < a.rows;
       row += int64_t(gridDim.y) * blockDim.y) {
    const T *grad_out = a.grad_out + row * a.grad_out_stride;
    const T *gate = a.gate + row * a.gate_stride;
    const T *up = a.up + row * a.up_stride;
    T *grad_gate = a.grad_gate + row * a.grad_gate_stride;
    T *grad_up = a.grad_up + row * a.grad_up_stride;
    T *h = EMIT_H ? a.h + row * a.h_stride : nullptr;
    P go[ILP], g[ILP], u[ILP];
#pragma unroll
    for (int k = 0; k < ILP; ++k) {
      const int p = first + k * blockDim.x;
      if (p < npacks) {
        go[k] = reinterpret_cast<const P *>(grad_out)[p];
        g[k] = reinterpret_cast<const P *>(gate)[p];
        u[k] = reinterpret_cast<const P *>(up)[p];
      }
    }
#pragma unroll
    for (int k = 0; k < ILP; ++k) {
      const int p = first + k * blockDim.x;
      if (p < npacks) {
        P dg, du, hh;
#pragma unroll
        for (int j = 0; j < VW; ++j) M::run(go[k].v[j], g[k].v[j], u[k].v[j], dg.v[j], du.v[j], hh.v[j]);
        reinterpret_cast<P *>(grad_gate)[p] = dg;
        reinterpret_cast<P *>(grad_up)[p] = du;
        if constexpr (EMIT_H) reinterpret_cast<P *>(h)[p] = hh;
      }
    }
    if constexpr (VW > 1) {
      const int c = npacks * VW + threadIdx.x;
      if (blockIdx.x == 0 && c < a.cols) {
        T dg, du, hh;
        M::run(grad_out[c], gate[c], up[c], dg, du, hh);
        grad_gate[c] = dg;
        grad_up[c] = du;
        if constexpr (EMIT_H) h[c] = hh;
      }
    }
  }
}

// Flat kernels: thread t of the grid owns pack t of the dense range; the threads past the last full
// pack take the numel % VW leftover elements one each (the grid is sized to include them).
constexpr int kFlatThreads = 128;

template <typename T, int VW, bool TANH>
__global__ void __launch_bounds__(kFlatThreads) geglu_fwd_flat_kernel(T *out, const T *gate, const T *up,
                                                                      int64_t numel) {
  using P = Pack<T, VW>;
  using C = Conv<T>;
  constexpr bool F = kFast<T>;
  const int64_t npacks = numel / VW;
  const int64_t p = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;
  if (p < npacks) {
    const P g = reinterpret_cast<const P *>(gate)[p];
    const P u = reinterpret_cast<const P *>(up)[p];
    P o;
#pragma unroll
    for (int j = 0; j < VW; ++j) o.v[j] = C::store(gelu<TANH, false, F>(C::load(g.v[j]), nullptr) * C::load(u.v[j]));
    reinterpret_cast<P *>(out)[p] = o;
  } else {
    const int64_t c = npacks * VW + (p - npacks);
    if (c < numel) out[c] = C::store(gelu<TANH, false, F>(C::load(gate[c]), nullptr) * C::load(up[c]));
  }
}

template <typename T, int VW, bool TANH, bool EMIT_H>
__global__ void __launch_bounds__(kFlatThreads) geglu_bwd_flat_kernel(const BwdArgs<T> a, int64_t numel) {
  using P = Pack<T, VW>;
  using M = BwdMath<T, TANH, kFast<T>>;
  const int64_t npacks = numel / VW;
  const int64_t p = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;
  if (p < npacks) {
    const P go = reinterpret_cast<const P *>(a.grad_out)[p];
    const P g = reinterpret_cast<const P *>(a.gate)[p];
    const P u = reinterpret_cast<const P *>(a.up)[p];
    P dg, du, hh;
#pragma unroll
    for (int j = 0; j < VW; ++j) M::run(go.v[j], g.v[j], u.v[j], dg.v[j], du.v[j], hh.v[j]);
    reinterpret_cast<P *>(a.grad_gate)[p] = dg;
    reinterpret_cast<P *>(a.grad_up)[p] = du;
    if constexpr (EMIT_H) reinterpret_cast<P *>(a.h)[p] = hh;
  } else {
    const int64_t c = npacks * VW + (p - npacks);
    if (c < numel) {
      T dg, du, hh;
      M::run(a.grad_out[c], a.gate[c], a.up[c], dg, du, hh);
      a.grad_gate[c] = dg;
      a.grad_up[c] = du;
      if constexpr (EMIT_H) a.h[c] = hh;
    }
  }
}

// Blocks covering numel / vw packs plus the numel % vw leftover elements, one thread each.
unsigned flat_blocks(int64_t numel, int vw) {
  const int64_t threads = numel / vw + numel % vw;
  return unsigned((threads + kFlatThreads - 1) / kFlatThreads);
}

// ---------------------------------------------------------------------------------------------------
// Host side.

struct Launch {
  dim3 grid, block;
  int64_t blocks() const { return int64_t(grid.x) * grid.y; }
};

// Column threads: enough to cover a row's packs ilp at a time (32..256, power of two); the rest of the
// block's 256 threads take further rows.
Launch launch_config(int64_t rows, int cols, int vw, int ilp) {
  const int npacks = std::max(cols / vw, 1);
  const int want = (npacks + ilp - 1) / ilp;
  int tx = 32;
  while (tx < kThreads && tx < want) tx *= 2;
  const int ty = kThreads / tx;
  const int64_t col_blocks = (npacks + int64_t(tx) * ilp - 1) / (int64_t(tx) * ilp);
  const int64_t row_blocks = std::min<int64_t>((rows + ty - 1) / ty, 65535);
  return {dim3(unsigned(col_blocks), unsigned(row_blocks)), dim3(unsigned(tx), unsigned(ty))};
}

// SMs of the current device, looked up once per device (cudaDeviceGetAttribute is cheap, but this
// runs on every launch).
int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= kMaxDevices) dev = kMaxDevices - 1;  // only a heuristic input; any positive count works
  int n = cache[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Whether the large-tensor ILP still gives every SM kMinBlocksPerSm blocks.
bool use_big_ilp(int64_t rows, int cols, int vw, int ilp) {
  return launch_config(rows, cols, vw, ilp).blocks() >= int64_t(kMinBlocksPerSm) * sm_count();
}

// 16-byte path only if every base pointer and every row stride is 16-byte aligned.
bool aligned16(std::initializer_list<const at::Tensor *> ts) {
  for (const at::Tensor *t : ts) {
    const auto bytes = t->element_size();
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) return false;
    if (t->size(0) > 1 && (t->stride(0) * bytes) % 16 != 0) return false;
  }
  return true;
}

// The flat kernels' condition: every tensor one dense 16-byte-aligned block (row stride == cols)
// and few enough packs for the 1-D grid.
bool dense16(std::initializer_list<const at::Tensor *> ts) {
  for (const at::Tensor *t : ts) {
    if (!t->is_contiguous() || reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  }
  return (*ts.begin())->numel() / 2 < int64_t(kFlatThreads) * INT_MAX;
}

template <typename F>
void with_cuda_dtype(at::ScalarType dtype, F &&f) {
  switch (dtype) {
    case at::kFloat: f(float{}); break;
    case at::kHalf: f(__half{}); break;
    case at::kBFloat16: f(__nv_bfloat16{}); break;
    default: TORCH_CHECK(false, "geglu (cuda): unsupported dtype ", dtype);
  }
}

template <typename T>
T *ptr(const at::Tensor &t) {
  return reinterpret_cast<T *>(t.data_ptr());
}

// geglu_checks' rules for a CUDA gate, and cols in int range (a row is indexed with int).
void check_all(const char *op, int64_t approximate, const at::Tensor &gate,
               std::initializer_list<std::pair<const char *, const at::Tensor *>> operands) {
  geglu_checks::all(op, c10::kCUDA, approximate, gate, operands);
  TORCH_CHECK(gate.size(1) <= INT_MAX, op, ": cols must be <= ", INT_MAX, ", got ", gate.size(1));
}

template <typename T, int VW, bool TANH>
void launch_fwd(const FwdArgs<T> &args, cudaStream_t stream) {
  if (use_big_ilp(args.rows, args.cols, VW, kFwdIlp)) {
    const Launch l = launch_config(args.rows, args.cols, VW, kFwdIlp);
    geglu_fwd_kernel<T, VW, TANH, kFwdIlp><<<l.grid, l.block, 0, stream>>>(args);
  } else {
    const Launch l = launch_config(args.rows, args.cols, VW, 1);
    geglu_fwd_kernel<T, VW, TANH, 1><<<l.grid, l.block, 0, stream>>>(args);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int VW, bool TANH, bool EMIT_H>
void launch_bwd(const BwdArgs<T> &args, cudaStream_t stream) {
  if (use_big_ilp(args.rows, args.cols, VW, kBwdIlp)) {
    const Launch l = launch_config(args.rows, args.cols, VW, kBwdIlp);
    geglu_bwd_kernel<T, VW, TANH, kBwdIlp, EMIT_H><<<l.grid, l.block, 0, stream>>>(args);
  } else {
    const Launch l = launch_config(args.rows, args.cols, VW, 1);
    geglu_bwd_kernel<T, VW, TANH, 1, EMIT_H><<<l.grid, l.block, 0, stream>>>(args);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <bool EMIT_H>
void dispatch_bwd(at::Tensor &grad_gate, at::Tensor &grad_up, at::Tensor *h, at::Tensor const &grad_out,
                  at::Tensor const &gate, at::Tensor const &up, int64_t approximate) {
  const int64_t rows = gate.size(0), cols = gate.size(1);
  if (rows == 0 || cols == 0) return;
  const c10::cuda::CUDAGuard device_guard(gate.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool vec = aligned16({&grad_gate, &grad_up, &grad_out, &gate, &up}) && (!EMIT_H || aligned16({h}));
  const bool flat = dense16({&grad_gate, &grad_up, &grad_out, &gate, &up}) && (!EMIT_H || dense16({h}));
  with_cuda_dtype(gate.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const BwdArgs<T> args{ptr<T>(grad_gate),   ptr<T>(grad_up),    EMIT_H ? ptr<T>(*h) : nullptr,
                          ptr<T>(grad_out),    ptr<T>(gate),       ptr<T>(up),
                          grad_gate.stride(0), grad_up.stride(0),  EMIT_H ? h->stride(0) : 0,
                          grad_out.stride(0),  gate.stride(0),     up.stride(0),
                          rows,                int(cols)};
    if (flat) {
      const int64_t numel = rows * cols;
      const unsigned blocks = flat_blocks(numel, kVec);
      if (approximate == 1) {
        geglu_bwd_flat_kernel<T, kVec, true, EMIT_H><<<blocks, kFlatThreads, 0, stream>>>(args, numel);
      } else {
        geglu_bwd_flat_kernel<T, kVec, false, EMIT_H><<<blocks, kFlatThreads, 0, stream>>>(args, numel);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else if (approximate == 1) {
      vec ? launch_bwd<T, kVec, true, EMIT_H>(args, stream) : launch_bwd<T, 1, true, EMIT_H>(args, stream);
    } else {
      vec ? launch_bwd<T, kVec, false, EMIT_H>(args, stream) : launch_bwd<T, 1, false, EMIT_H>(args, stream);
    }
  });
}

}  // namespace

void geglu_fwd(at::Tensor &out, at::Tensor const &gate, at::Tensor const &up, int64_t approximate) {
  constexpr const char *op = "geglu_fwd";
  check_all(op, approximate, gate, {{"gate", &gate}, {"up", &up}, {"out", &out}});
  // out == gate or out == up exactly is fine (each thread reads its elements before writing them).
  at::assert_no_partial_overlap(out, gate);
  at::assert_no_partial_overlap(out, up);
  const int64_t rows = gate.size(0), cols = gate.size(1);
  if (rows == 0 || cols == 0) return;

  const c10::cuda::CUDAGuard device_guard(gate.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool vec = aligned16({&out, &gate, &up});
  const bool flat = dense16({&out, &gate, &up});
  with_cuda_dtype(gate.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const FwdArgs<T> args{ptr<T>(out),     ptr<T>(gate),    ptr<T>(up), out.stride(0),
                          gate.stride(0), up.stride(0), rows,        int(cols)};
    if (flat) {
      const int64_t numel = rows * cols;
      const unsigned blocks = flat_blocks(numel, kVec);
      if (approximate == 1) {
        geglu_fwd_flat_kernel<T, kVec, true><<<blocks, kFlatThreads, 0, stream>>>(args.out, args.gate, args.up, numel);
      } else {
        geglu_fwd_flat_kernel<T, kVec, false><<<blocks, kFlatThreads, 0, stream>>>(args.out, args.gate, args.up, numel);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else if (approximate == 1) {
      vec ? launch_fwd<T, kVec, true>(args, stream) : launch_fwd<T, 1, true>(args, stream);
    } else {
      vec ? launch_fwd<T, kVec, false>(args, stream) : launch_fwd<T, 1, false>(args, stream);
    }
  });
}

// The checks geglu_bwd and geglu_bwd_h share: both write the two gradients to buffers of their own.
static void check_bwd_operands(const char *op, at::Tensor const &grad_gate, at::Tensor const &grad_up,
                               at::Tensor const &grad_out, at::Tensor const &gate, at::Tensor const &up,
                               int64_t approximate) {
  check_all(op, approximate, gate,
            {{"gate", &gate}, {"up", &up}, {"grad_out", &grad_out}, {"grad_gate", &grad_gate},
             {"grad_up", &grad_up}});
  // Each grad is stored independently of the other's inputs, so no in-place aliasing here.
  for (const at::Tensor *t : {&grad_up, &grad_out, &gate, &up}) at::assert_no_overlap(grad_gate, *t);
  for (const at::Tensor *t : {&grad_out, &gate, &up}) at::assert_no_overlap(grad_up, *t);
}

void geglu_bwd(at::Tensor &grad_gate, at::Tensor &grad_up, at::Tensor const &grad_out,
               at::Tensor const &gate, at::Tensor const &up, int64_t approximate) {
  check_bwd_operands("geglu_bwd", grad_gate, grad_up, grad_out, gate, up, approximate);
  dispatch_bwd<false>(grad_gate, grad_up, nullptr, grad_out, gate, up, approximate);
}

void geglu_bwd_h(at::Tensor &grad_gate, at::Tensor &grad_up, at::Tensor &grad_out, at::Tensor const &gate,
                 at::Tensor const &up, int64_t approximate) {
  check_bwd_operands("geglu_bwd_h", grad_gate, grad_up, grad_out, gate, up, approximate);
  // grad_out is also read and overwritten with h, element by element; gate and up are left as they
  // were (a traced graph may read them again).
  at::assert_no_overlap(grad_out, gate);
  at::assert_no_overlap(grad_out, up);
  // grad_gate <- dgate, grad_up <- dup, grad_out <- h = gelu(gate) * up.
  dispatch_bwd<true>(grad_gate, grad_up, &grad_out, grad_out, gate, up, approximate);
}

void geglu_bwd_inplace(at::Tensor &gate, at::Tensor &up, at::Tensor &grad_out, int64_t approximate) {
  constexpr const char *op = "geglu_bwd_inplace";
  check_all(op, approximate, gate, {{"gate", &gate}, {"up", &up}, {"grad_out", &grad_out}});
  // The three buffers are read and overwritten element by element; they must not share memory.
  at::assert_no_overlap(gate, up);
  at::assert_no_overlap(gate, grad_out);
  at::assert_no_overlap(up, grad_out);
  // gate <- grad_gate, up <- grad_up, grad_out <- h = gelu(gate) * up.
  dispatch_bwd<true>(gate, up, &grad_out, grad_out, gate, up, approximate);
}
