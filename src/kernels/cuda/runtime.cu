// CUDA device discovery (the CUDA half of kernels/cuda_runtime.h).
#include <cuda_runtime.h>

#include "kernels/cuda_runtime.h"

namespace deg {

bool cuda_built() {
  return true;
}

std::vector<CudaDeviceInfo> cuda_devices() {
  std::vector<CudaDeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.multiProcessorCount, p.major * 10 + p.minor, p.totalGlobalMem});
  }
  return out;
}

}  // namespace deg
