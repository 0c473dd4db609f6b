// The CPU-only build's answer for kernels/cuda_runtime.h: no CUDA.
#ifndef DEG_HAVE_CUDA
#include "kernels/cuda_runtime.h"

namespace deg {

bool cuda_built() {
  return false;
}
std::vector<CudaDeviceInfo> cuda_devices() {
  return {};
}

}  // namespace deg
#endif
