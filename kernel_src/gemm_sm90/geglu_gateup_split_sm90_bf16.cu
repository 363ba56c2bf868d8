// bf16 instantiations of the gate+up GEMM over w_gate / w_up in place (EXPERIMENTAL,
// split_weight_mainloop.cuh), every tile, in their own TU so they build in parallel.
#ifndef NDEBUG
#define NDEBUG  // see geglu_gateup_sm90_bf16.cu
#endif
#include "geglu_gateup_sm90_kernel.cuh"

namespace fused_geglu_sm90 {
#define FUSED_GEGLU_SM90_INSTANTIATE_SPLIT(ELEM, CFG) \
  template const char *launch_geglu_gateup_split<ELEM, CFG>(GateUpArgs const &);
FUSED_GEGLU_SM90_INSTANTIATE_SPLIT(cutlass::bfloat16_t, TileCfg::k128x128)
FUSED_GEGLU_SM90_INSTANTIATE_SPLIT(cutlass::bfloat16_t, TileCfg::k128x256)
FUSED_GEGLU_SM90_INSTANTIATE_SPLIT(cutlass::bfloat16_t, TileCfg::k128x128pp)
FUSED_GEGLU_SM90_INSTANTIATE_SPLIT(cutlass::bfloat16_t, TileCfg::k256x128)
FUSED_GEGLU_SM90_INSTANTIATE_SPLIT(cutlass::bfloat16_t, TileCfg::k128x192pp)
}  // namespace fused_geglu_sm90
