// Host-side helper both sm90 ops (geglu_gateup_sm90.cu, geglu_dh_sm90.cu) call before CUTLASS
// builds its TMA descriptors.
#pragma once

#include <cuda_runtime.h>

namespace fused_geglu_sm90 {

// Autograd runs the backward on its own thread, where no CUDA context need be current yet; the TMA
// descriptors CUTLASS encodes on the host go through the driver API, which then fails (error 201,
// invalid context: seen on the H200 at cdb9034) and the kernel runs with a garbage descriptor.
// cudaSetDevice makes the device's primary context current on this thread. It is skipped while the
// stream is being captured into a CUDA graph (the capturing thread has a current context already,
// and the call is kept out of capture) and when the capture query itself is refused (the legacy
// stream while another stream captures): that query's error is cleared, not raised, so this never
// turns a call that used to work into one that fails.
inline void bind_primary_context(int device, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (status == cudaStreamCaptureStatusNone && cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();  // the launch below reports a real device problem
  }
}

}  // namespace fused_geglu_sm90
