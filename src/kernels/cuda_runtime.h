// What CUDA devices this process sees. Without a CUDA build (DEG_HAVE_CUDA unset) the answer is
// always "none", so callers need no #ifdef.
#pragma once

#include <string>
#include <vector>

namespace deg {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  int compute_capability = 0;  // major * 10 + minor
  size_t memory_bytes = 0;
};

bool cuda_built();                           // compiled with DEG_CUDA
std::vector<CudaDeviceInfo> cuda_devices();  // empty without a driver or GPU

}  // namespace deg
