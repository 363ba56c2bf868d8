// fp16 instantiations of the sm90 gate+up GeGLU GEMM (one TU per dtype so builds run in parallel).
// Device-side asserts in the CUTLASS headers become calls (CALL.ABS __assert_fail) that
// serialise the wgmma pipeline (ptxas C7510); release kernels compile them out.
#ifndef NDEBUG
#define NDEBUG
#endif
#include "geglu_gateup_sm90_kernel.cuh"

namespace fused_geglu_sm90 {
FUSED_GEGLU_SM90_INSTANTIATE(cutlass::half_t, TileCfg::k128x256)
FUSED_GEGLU_SM90_INSTANTIATE(cutlass::half_t, TileCfg::k128x128pp)
FUSED_GEGLU_SM90_INSTANTIATE(cutlass::half_t, TileCfg::k128x128)
}  // namespace fused_geglu_sm90
