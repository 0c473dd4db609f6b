// Programmatic dependent launch (sm_90): a kernel launched by pdl_launch may start while the
// kernel before it in the stream is still running, so that its CTAs are resident and past their
// launch when that kernel ends (a decode step is ~340 short kernels in a row, each ~2-5 µs, of
// which launch and ramp are a large part).
//
// The rule that keeps this safe: every kernel launched by pdl_launch calls pdl_enter() before it
// reads or writes global memory (and before any early return). pdl_enter lets the next kernel
// launch, then waits until the kernel before this one has completed and its memory is visible
// (griddepcontrol.wait), so nothing is read early; and since every such kernel waits before it
// completes, a kernel that depends on one two back is also safe. Kernels launched otherwise
// (cuBLASLt's, plain <<< >>>) are ordered as usual by the stream.
//
// Off by default until it has run on a GPU (written in a session that got no device time):
// DEG_CUDA_PDL=1 turns it on; otherwise every kernel launches plainly (pdl_enter is then a
// no-op).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace deg::cuda {

__device__ __forceinline__ void pdl_enter() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

inline bool pdl_on() {
  static const bool on = [] {
    const char* v = std::getenv("DEG_CUDA_PDL");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization allowed
// when pdl_on(); the launch's error (cudaSuccess when it was queued), also the runtime's last
// error (what the launchers' launched() reads).
template <class... Params, class... Args>
cudaError_t pdl_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = pdl_on() ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace deg::cuda
