// GeGLU forward/backward for CPU tensors: out = gelu(gate) * up and its gradients.
//
// Build: no flags beyond the builder's defaults (-O3 -std=c++20 -fPIC, linked against c10/torch/torch_cpu).
//   * Do NOT add -mavx2/-march=native: the .so must load on any x86-64. The AVX2+FMA and AVX-512 code is
//     compiled through GCC `target(...)` function attributes and chosen at run time with
//     __builtin_cpu_supports; everything else is the SSE2 baseline. (Non-x86 builds get the baseline only.)
//     The AVX-512 clone (F/BW/VL/DQ, 512-bit vectors preferred) took the [1024, 2048] pointwise 1.3-1.6x
//     less time than the AVX2 one on the development machine's AMD EPYC (benchmarks/diag/cpu_mlp.py).
//   * Do NOT add -fopenmp (a second OpenMP runtime beside torch's): threads come from torch's own pool
//     through TensorIterator::for_each (for_each_span below says why not at::parallel_for).
//   * Do NOT add -ffast-math: the rounding tricks below (fp16 store, exp range reduction) rely on
//     IEEE evaluation order.
//
// Design.
//   * Each (dtype, gelu flavour, ISA) is one plain element loop that g++ -O3 auto-vectorises: loads are
//     upcast to fp32 with bit operations, all math is branchless fp32 (selects, no libm calls), and the
//     single rounding to the storage dtype happens at the store (round-to-nearest-even, NaN kept).
//   * Exact GELU needs Phi(x) = 0.5 * (1 + erf(x / sqrt 2)), computed from the tail T = Phi(-|x|):
//       T = exp(-x^2 / 2) * t * Q(t),  t = 1 / (1 + 0.26 |x|)   (Q: degree 8, fit_normal_tail.py beside this)
//       Phi(x) = 1 - T for x > 0, T otherwise;  gelu'(x) = Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi)
//     One exp and one division serve the value and the derivative, and the negative tail keeps its
//     relative accuracy: torch 2.13's own fp32 GELU forms 1 + erf and is off by 2e-4 relative in [-3, -1],
//     up to 27 % in [-5, -3], and mostly 0 below -5.4. Against float64 over [-13, 13]: within 4 eps of
//     gelu and of gelu' (the latter against |Phi| + |x phi|, as it is a difference) on the FMA paths;
//     the SSE2 baseline, without FMA to recover x^2's rounding inside exp, adds up to x^2 / 4 eps.
//     (tests/test_geglu.py::test_cpu_exact_gelu_is_accurate_in_the_tails holds it to 6 eps.)
//   * Tanh GELU uses 0.5 * (1 + tanh(u)) = sigmoid(2u): gelu = x / (1 + exp(-2u)), and
//     gelu' = s + x * s * (1 - s) * d(2u)/dx with 1 - s = e * s, again without cancellation.
//   * exp: Cody-Waite reduction by ln 2, degree-6 minimax polynomial, exponent built with integer ops;
//     no clamp inside: both GELUs cap |x| so that its input stays in [-87.6, 88] (results normal; NaN
//     propagates).
//   * Work is split by TensorIterator over elements (rows or parts of rows), with a grain of 32768
//     elements so that small tensors stay on the calling thread.
//   * FUSED_GEGLU_CPU_ISA=baseline|avx2|avx512|auto (read once, default auto: the widest the CPU has) forces
//     one code path; meant for tests (tests/test_geglu.py runs each in a process of its own).
//
// Known limits: denormal fp16 inputs are read as 0 if the process enables flush-to-zero/denormals-are-zero
// (torch.set_flush_denormal(True)). Both GELUs reach their limits for large |x| and at +-inf
// (gelu = x or ~0, gelu' = 1 or ~0); NaN stays NaN.
// Tanh GELU and exp are within ~1-2 ulp of fp32 on every path; exact GELU's bounds are above.

#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#if __cplusplus >= 202002L
#include <bit>
#endif
#include <cstdint>
#include <cstdlib>
#include <string>

#include "geglu_checks.h"

namespace {

// std::bit_cast is C++20, and the builder compiles with -std=c++17 for torch < 2.12 (torch 2.11 is the
// CUDA variant's; this file failed to compile there until 2026-12-05). There, the compiler builtin that
// std::bit_cast wraps (GCC >= 11, Clang >= 9), which every language mode has. Under C++20 std::bit_cast
// itself, so those builds keep their code byte for byte.
#if __cplusplus >= 202002L
using std::bit_cast;
#else
template <class To, class From>
inline __attribute__((always_inline)) To bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of one size");
  return __builtin_bit_cast(To, v);
}
#endif

// ---------------------------------------------------------------------------------------------------
// Branchless building blocks.

// c ? a : b as bit operations. Every select and clamp below uses these instead of ?: on purpose: GCC
// jump-threads a ?: (e.g. duplicates the exp polynomial for a clamped constant) or sinks an arm's fp
// arithmetic into a branch, then cannot if-convert it back (fp ops "may trap" under the default
// -ftrapping-math) and the loop is no longer vectorised. The and/or keeps both arms unconditional.
inline __attribute__((always_inline)) uint32_t blend_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}
inline __attribute__((always_inline)) float blend(bool c, float a, float b) {
  return bit_cast<float>(blend_bits(c, bit_cast<uint32_t>(a), bit_cast<uint32_t>(b)));
}

// ---------------------------------------------------------------------------------------------------
// Storage formats: load upcasts to fp32, store rounds once (nearest-even) to the storage type.

struct F32 {
  using T = float;
  static inline __attribute__((always_inline)) float load(T v) { return v; }
  static inline __attribute__((always_inline)) T store(float f) { return f; }
};

struct BF16 {
  using T = uint16_t;
  static inline __attribute__((always_inline)) float load(T v) {
    return bit_cast<float>(static_cast<uint32_t>(v) << 16);
  }
  static inline __attribute__((always_inline)) T store(float f) {
    const uint32_t u = bit_cast<uint32_t>(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest-even
    return static_cast<T>(blend_bits(f != f, 0x7fc0u, rounded));      // quiet NaN stays NaN
  }
};

struct F16 {
  using T = uint16_t;
  static inline __attribute__((always_inline)) float load(T v) {
    const uint32_t h = v;
    const uint32_t mag = h & 0x7fffu;
    // Put the 15 magnitude bits at fp32's exponent/mantissa position and rescale by 2^(127-15):
    // exact for normals and (as fp32 denormal * 2^112) for fp16 denormals. Inf/NaN get exponent 255.
    const float finite = bit_cast<float>(mag << 13) * 0x1.0p112f;
    const uint32_t special = 0x7f800000u | ((mag & 0x3ffu) << 13);
    const uint32_t bits = blend_bits(mag >= 0x7c00u, special, bit_cast<uint32_t>(finite));
    return bit_cast<float>(bits | ((h & 0x8000u) << 16));
  }
  static inline __attribute__((always_inline)) T store(float f) {
    const uint32_t u = bit_cast<uint32_t>(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int32_t a = static_cast<int32_t>(u & 0x7fffffffu);
    // Normal results: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to
    // nearest-even; a carry ripples into the exponent, and overflow saturates to inf below.
    const int32_t rebased = a - (112 << 23);
    const int32_t normal = (rebased + 0xfff + ((rebased >> 13) & 1)) >> 13;
    // Denormal results (|f| < 2^-14): adding 0.5 makes the FPU round |f| to a multiple of 2^-24
    // (fp32's ulp at 0.5); the integer difference of the bit patterns is the fp16 mantissa (a result
    // of exactly 2^-14 becomes 0x400, the smallest normal, which is the right encoding).
    const float absf = bit_cast<float>(static_cast<uint32_t>(a));
    const int32_t denormal =
        static_cast<int32_t>(bit_cast<uint32_t>(absf + 0.5f) - bit_cast<uint32_t>(0.5f));
    int32_t h = static_cast<int32_t>(blend_bits(a < (113 << 23), static_cast<uint32_t>(denormal),
                                                 static_cast<uint32_t>(normal)));
    h = static_cast<int32_t>(blend_bits(h > 0x7c00, 0x7c00u, static_cast<uint32_t>(h)));  // overflow: inf
    h = static_cast<int32_t>(blend_bits(a > 0x7f800000, 0x7e00u, static_cast<uint32_t>(h)));  // NaN
    return static_cast<T>(static_cast<uint32_t>(h) | sign);
  }
};

// ---------------------------------------------------------------------------------------------------
// Branchless fp32 math. FMA selects fused multiply-adds (only in the target("avx2,fma") clones).

template <bool FMA>
inline __attribute__((always_inline)) float madd(float a, float b, float c) {
  if constexpr (FMA) {
    return __builtin_fmaf(a, b, c);
  } else {
    return a * b + c;
  }
}

// e^x for x in [-87.6, 88] (results stay normal) or NaN; the callers keep x there.
template <bool FMA>
inline __attribute__((always_inline)) float exp_in_range(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = madd<FMA>(x, 1.44269502e+00f, kRound) - kRound;
  // Cody-Waite: ln2_hi has 16 significant bits, so n * ln2_hi is exact for |n| <= 128.
  float r = madd<FMA>(n, -6.93145752e-01f, x);
  r = madd<FMA>(n, -1.42860677e-06f, r);
  // e^r = 1 + r + r^2 * g(r), g a degree-4 minimax fit on [-0.3467, 0.3467] (rel. error 1.2e-7 on g).
  float g = 1.390127814e-03f;
  g = madd<FMA>(g, r, 8.363162167e-03f);
  g = madd<FMA>(g, r, 4.166685417e-02f);
  g = madd<FMA>(g, r, 1.666657776e-01f);
  g = madd<FMA>(g, r, 5.000000000e-01f);
  const float p = madd<FMA>(r * r, g, r) + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);  // in [-126, 127] for x in range
  const float scale = bit_cast<float>(static_cast<uint32_t>(ni + 127) << 23);
  return p * scale;
}

constexpr float kInvSqrt2Pi = 3.98942280e-01f;  // 1 / sqrt(2 pi)
constexpr float kFar = 13.1f;  // past |x| = 13.1, phi(x) < 1e-37: taken as 0

// Exact GELU's pieces (see the header comment).
struct NormalCdf {
  float cdf;       // Phi(x)
  float pdf;       // phi(x), 0 past kFar
  float x_capped;  // x, or +-kFar past it (so gelu'(+-inf) = Phi = 1 or 0, not inf * 0)
};

template <bool FMA>
inline __attribute__((always_inline)) NormalCdf normal_cdf(float x) {
  const float ax = bit_cast<float>(bit_cast<uint32_t>(x) & 0x7fffffffu);
  // exp(-x^2 / 2) with the product's rounding error put back: -x/2 is exact, so with FMA `lo` is the
  // exact residual of the rounded h, and e^(h + lo) = e^h (1 + lo). Without FMA lo is 0 (a few ulp more
  // error in the negative tail, where |h| is large). |x| is capped at 13.1 here, so h >= -85.9 needs no
  // clamp inside exp and +-inf gives a finite h (an inf's residual would be NaN); past 13.1 the density
  // is set to 0 (it is below 1e-37), and so is the tail T below.
  const bool far = ax > kFar;  // false for NaN, which stays NaN throughout
  const float xc = blend(far, kFar, ax);
  const float half_neg_x = -0.5f * xc;
  const float h = half_neg_x * xc;
  const float lo = madd<FMA>(half_neg_x, xc, -h);
  const float eh = exp_in_range<FMA>(h);
  const float gauss = blend(far, 0.0f, madd<FMA>(eh, lo, eh));
  // Phi(-|x|) = exp(-x^2 / 2) * t * Q(t), t = 1 / (1 + 0.26 |x|): Q a degree-8 fit of the scaled Mills
  // ratio over |x| in [0, 13.2], relative error 2e-8, with Q(1) = 0.5 in fp32 so that Phi(0) is exactly 1/2.
  const float t = 1.0f / madd<FMA>(0.26f, ax, 1.0f);
  float q = 3.103288449e-02f;
  q = madd<FMA>(q, t, -1.553747952e-01f);
  q = madd<FMA>(q, t, 2.567207813e-01f);
  q = madd<FMA>(q, t, -1.569129527e-01f);
  q = madd<FMA>(q, t, 1.650697887e-01f);
  q = madd<FMA>(q, t, 4.926337674e-02f);
  q = madd<FMA>(q, t, 1.034861356e-01f);
  q = madd<FMA>(q, t, 1.029518247e-01f);
  q = madd<FMA>(q, t, 1.037629545e-01f);
  const float tail = gauss * (t * q);
  // Phi(x) = 1 - T for x >= +0, T for x <= -0, as one multiply-add on the sign: s = -1 or +1 and
  // Phi = s T + (1 - s) / 2, where (1 - s) / 2 is exactly 1 or 0. (A NaN x has a NaN T.)
  const uint32_t sign = bit_cast<uint32_t>(x) & 0x80000000u;
  const float s = bit_cast<float>(0xbf800000u ^ sign);
  const float x_capped = bit_cast<float>(bit_cast<uint32_t>(xc) | sign);  // x, or +-kFar
  return {madd<FMA>(s, tail, madd<FMA>(-0.5f, s, 0.5f)), kInvSqrt2Pi * gauss, x_capped};
}

constexpr float kTanhK0 = 1.59576912e+00f;      // 2 * sqrt(2 / pi)
constexpr float kTanhK1 = 7.13548162e-02f;      // 2 * sqrt(2 / pi) * 0.044715

// gelu(x), and optionally gelu'(x) into *dgelu.
template <bool TANH, bool FMA, bool GRAD>
inline __attribute__((always_inline)) float gelu(float x, float *dgelu) {
  if constexpr (TANH) {
    // |x| capped at 10 (v = 87.3, so exp needs no clamp): past it sigmoid(v) is 1 or below 1.2e-38, and
    // the cap keeps x^3 and x * (1 - s) * v' finite, so gelu and gelu' reach x and 1, or ~0, for every
    // finite x and at +-inf, rather than the clamped exp's 6e-39 * x (gelu(-3e38) was -1.8).
    const bool low = x < -10.0f;  // false for NaN, which stays NaN throughout
    const float xt = blend(low, -10.0f, blend(x > 10.0f, 10.0f, x));
    const float x2 = xt * xt;
    const float v = xt * madd<FMA>(kTanhK1, x2, kTanhK0);  // v = 2u
    const float e = exp_in_range<FMA>(-v);
    const float sig = 1.0f / (1.0f + e);                   // sigmoid(v) = 0.5 * (1 + tanh u)
    if constexpr (GRAD) {
      const float dv = madd<FMA>(3.0f * kTanhK1, x2, kTanhK0);
      *dgelu = madd<FMA>(xt * sig, (e * sig) * dv, sig);   // s + x s (1 - s) v'
    }
    return blend(low, xt, x) * sig;
  } else {
    const NormalCdf n = normal_cdf<FMA>(x);
    if constexpr (GRAD) {
      *dgelu = madd<FMA>(n.x_capped, n.pdf, n.cdf);  // one rounding: the terms cancel near x = -0.75
    }
    // Below -kFar, Phi = 0 and gelu is -0: x is capped so that -inf gives -0 too, not -inf * 0.
    return blend(x < -kFar, -kFar, x) * n.cdf;
  }
}

// ---------------------------------------------------------------------------------------------------
// Contiguous spans of one row. These are the loops the compiler vectorises.

template <class D, bool TANH, bool FMA>
inline __attribute__((always_inline)) void fwd_span(void *out_v, const void *gate_v,
                                                    const void *up_v, int64_t n) {
  using T = typename D::T;
  // No __restrict: out may be gate or up itself (geglu_fwd admits that exact alias, each element read
  // before it is written at its own index). g++ vectorises this loop behind a runtime overlap check.
  T *out = static_cast<T *>(out_v);
  const T *gate = static_cast<const T *>(gate_v);
  const T *up = static_cast<const T *>(up_v);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = D::store(gelu<TANH, FMA, false>(D::load(gate[i]), nullptr) * D::load(up[i]));
  }
}

template <class D, bool TANH, bool FMA>
inline __attribute__((always_inline)) void bwd_span(void *grad_gate_v, void *grad_up_v,
                                                    const void *grad_out_v, const void *gate_v,
                                                    const void *up_v, int64_t n) {
  using T = typename D::T;
  T *__restrict grad_gate = static_cast<T *>(grad_gate_v);
  T *__restrict grad_up = static_cast<T *>(grad_up_v);
  const T *__restrict grad_out = static_cast<const T *>(grad_out_v);
  const T *__restrict gate = static_cast<const T *>(gate_v);
  const T *__restrict up = static_cast<const T *>(up_v);
  for (int64_t i = 0; i < n; ++i) {
    const float go = D::load(grad_out[i]);
    float dg;
    const float g = gelu<TANH, FMA, true>(D::load(gate[i]), &dg);
    grad_gate[i] = D::store(go * D::load(up[i]) * dg);
    grad_up[i] = D::store(go * g);
  }
}

using FwdFn = void (*)(void *, const void *, const void *, int64_t);
using BwdFn = void (*)(void *, void *, const void *, const void *, const void *, int64_t);

template <class D, bool TANH>
void fwd_baseline(void *o, const void *g, const void *u, int64_t n) {
  fwd_span<D, TANH, false>(o, g, u, n);
}
template <class D, bool TANH>
void bwd_baseline(void *gg, void *gu, const void *go, const void *g, const void *u, int64_t n) {
  bwd_span<D, TANH, false>(gg, gu, go, g, u, n);
}

#if defined(__x86_64__) || defined(__i386__)
#define GEGLU_HAVE_AVX2 1
template <class D, bool TANH>
__attribute__((target("avx2,fma"))) void fwd_avx2(void *o, const void *g, const void *u,
                                                  int64_t n) {
  fwd_span<D, TANH, true>(o, g, u, n);
}
template <class D, bool TANH>
__attribute__((target("avx2,fma"))) void bwd_avx2(void *gg, void *gu, const void *go,
                                                  const void *g, const void *u, int64_t n) {
  bwd_span<D, TANH, true>(gg, gu, go, g, u, n);
}
#define GEGLU_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,fma,prefer-vector-width=512"
template <class D, bool TANH>
__attribute__((target(GEGLU_AVX512_TARGET))) void fwd_avx512(void *o, const void *g, const void *u,
                                                             int64_t n) {
  fwd_span<D, TANH, true>(o, g, u, n);
}
template <class D, bool TANH>
__attribute__((target(GEGLU_AVX512_TARGET))) void bwd_avx512(void *gg, void *gu, const void *go,
                                                             const void *g, const void *u, int64_t n) {
  bwd_span<D, TANH, true>(gg, gu, go, g, u, n);
}
#else
#define GEGLU_HAVE_AVX2 0
#endif

enum class Isa { kBaseline, kAvx2, kAvx512 };

// Chosen once per process: the widest code path the CPU has (AVX-512 F/BW/VL/DQ, else AVX2+FMA, else the
// SSE2 baseline), unless FUSED_GEGLU_CPU_ISA names one (it must then be there).
Isa isa() {
  static const Isa value = [] {
    const char *env = std::getenv("FUSED_GEGLU_CPU_ISA");
    const std::string want = env != nullptr ? env : "auto";
    TORCH_CHECK(want == "auto" || want == "baseline" || want == "avx2" || want == "avx512",
                "FUSED_GEGLU_CPU_ISA must be auto, baseline, avx2 or avx512, got '", want, "'");
    if (want == "baseline") return Isa::kBaseline;
#if GEGLU_HAVE_AVX2
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    TORCH_CHECK(want != "avx2" || avx2, "FUSED_GEGLU_CPU_ISA=avx2 but this CPU lacks AVX2/FMA");
    TORCH_CHECK(want != "avx512" || avx512, "FUSED_GEGLU_CPU_ISA=avx512 but this CPU lacks AVX-512 F/BW/VL/DQ");
    if (want == "avx2" || !avx512) return avx2 ? Isa::kAvx2 : Isa::kBaseline;
    return Isa::kAvx512;
#else
    TORCH_CHECK(want == "auto", "FUSED_GEGLU_CPU_ISA=", want, ": this build has only the baseline code path");
    return Isa::kBaseline;
#endif
  }();
  return value;
}

template <class D, bool TANH>
FwdFn pick_fwd() {
  switch (isa()) {
#if GEGLU_HAVE_AVX2
    case Isa::kAvx512: return &fwd_avx512<D, TANH>;
    case Isa::kAvx2: return &fwd_avx2<D, TANH>;
#endif
    default: return &fwd_baseline<D, TANH>;
  }
}
template <class D, bool TANH>
BwdFn pick_bwd() {
  switch (isa()) {
#if GEGLU_HAVE_AVX2
    case Isa::kAvx512: return &bwd_avx512<D, TANH>;
    case Isa::kAvx2: return &bwd_avx2<D, TANH>;
#endif
    default: return &bwd_baseline<D, TANH>;
  }
}

// Calls f.template operator()<D>() with the storage format of `dtype`.
template <class F>
auto with_format(at::ScalarType dtype, F &&f) {
  switch (dtype) {
    case at::kFloat: return f.template operator()<F32>();
    case at::kHalf: return f.template operator()<F16>();
    case at::kBFloat16: return f.template operator()<BF16>();
    default: TORCH_CHECK(false, "geglu (cpu): unsupported dtype ", dtype);
  }
}

// ---------------------------------------------------------------------------------------------------
// The threaded row loop. (Validation, the backstop to the Python layer's checks: geglu_checks.h.)

// Runs span(ptrs, n) over every element of iter's operands, on torch's intra-op threads: ptrs holds one
// pointer per operand (outputs first), each to n consecutive elements of elem_size bytes. Threads come
// from TensorIterator::for_each, which is compiled inside libtorch_cpu: at::parallel_for is a header
// template whose OpenMP body compiles to a serial loop in a .so built without -fopenmp (this one must not
// link a second OpenMP runtime), so calling it here ran on one thread.
template <int N, class Span>
void for_each_span(at::TensorIterator &iter, int64_t elem_size, Span &&span) {
  constexpr int64_t kGrainElems = 32768;  // elements per task at least: small tensors stay on one thread
  iter.for_each(
      [&](char **data, const int64_t *strides, int64_t size0, int64_t size1) {
        // Inner dimension: the operands' last dim (unit stride, checked above), or a single column.
        bool unit = true;
        for (int k = 0; k < N; ++k) unit = unit && strides[k] == elem_size;
        char *ptrs[N];
        for (int64_t j = 0; j < size1; ++j) {
          for (int k = 0; k < N; ++k) ptrs[k] = data[k] + j * strides[N + k];
          if (unit) {
            span(ptrs, size0);
            continue;
          }
          for (int64_t i = 0; i < size0; ++i) {
            span(ptrs, 1);
            for (int k = 0; k < N; ++k) ptrs[k] += strides[k];
          }
        }
      },
      kGrainElems);
}

// The operands as one TensorIterator, without its overlap checks (ours are above: the forward admits out
// being gate or up itself) or any resizing.
at::TensorIterator iterate(std::initializer_list<const at::Tensor *> outputs,
                           std::initializer_list<const at::Tensor *> inputs) {
  at::TensorIteratorConfig config;
  config.set_check_mem_overlap(false).check_all_same_dtype(true).resize_outputs(false);
  for (const at::Tensor *t : outputs) config.add_output(*t);
  for (const at::Tensor *t : inputs) config.add_const_input(*t);
  return config.build();
}

}  // namespace

void geglu_fwd(at::Tensor &out, at::Tensor const &gate, at::Tensor const &up, int64_t approximate) {
  constexpr const char *op = "geglu_fwd";
  geglu_checks::all(op, c10::kCPU, approximate, gate, {{"gate", &gate}, {"up", &up}, {"out", &out}});
  at::assert_no_partial_overlap(out, gate);
  at::assert_no_partial_overlap(out, up);
  const int64_t rows = gate.size(0), cols = gate.size(1);
  if (rows == 0 || cols == 0) return;

  const FwdFn fn = with_format(gate.scalar_type(), [&]<class D>() {
    return approximate == 1 ? pick_fwd<D, true>() : pick_fwd<D, false>();
  });
  at::TensorIterator iter = iterate({&out}, {&gate, &up});
  for_each_span<3>(iter, gate.element_size(), [&](char *const *p, int64_t n) { fn(p[0], p[1], p[2], n); });
}

void geglu_bwd(at::Tensor &grad_gate, at::Tensor &grad_up, at::Tensor const &grad_out,
               at::Tensor const &gate, at::Tensor const &up, int64_t approximate) {
  constexpr const char *op = "geglu_bwd";
  geglu_checks::all(op, c10::kCPU, approximate, gate,
                    {{"gate", &gate}, {"up", &up}, {"grad_out", &grad_out}, {"grad_gate", &grad_gate},
                     {"grad_up", &grad_up}});
  // Each grad is stored independently of the other's inputs, so no in-place aliasing is allowed here
  // (unlike the forward, whose single store depends on both loads).
  using Operands = std::initializer_list<const at::Tensor *>;  // grad_up is non-const: name the type
  for (const at::Tensor *t : Operands{&grad_up, &grad_out, &gate, &up}) at::assert_no_overlap(grad_gate, *t);
  for (const at::Tensor *t : {&grad_out, &gate, &up}) at::assert_no_overlap(grad_up, *t);
  const int64_t rows = gate.size(0), cols = gate.size(1);
  if (rows == 0 || cols == 0) return;

  const BwdFn fn = with_format(gate.scalar_type(), [&]<class D>() {
    return approximate == 1 ? pick_bwd<D, true>() : pick_bwd<D, false>();
  });
  at::TensorIterator iter = iterate({&grad_gate, &grad_up}, {&grad_out, &gate, &up});
  for_each_span<5>(iter, gate.element_size(),
                   [&](char *const *p, int64_t n) { fn(p[0], p[1], p[2], p[3], p[4], n); });
}
