// The CPU-only build's answer for kernels/cuda_runtime.h and cuda_ops(): no CUDA.
#ifndef DEG_HAVE_CUDA
#include "core/error.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace deg {

namespace {

[[noreturn]] void no_cuda() {
  throw Error(ErrorKind::unsupported,
              "this deg was built without CUDA (nvcc was not found when it was compiled); "
              "use --device cpu, or rebuild where the CUDA toolkit is installed");
}

}  // namespace

bool cuda_built() {
  return false;
}
std::vector<CudaDeviceInfo> cuda_devices() {
  return {};
}
bool cuda_available() {
  return false;
}
void* cuda_malloc(size_t) {
  no_cuda();
}
void cuda_free(void*) noexcept {}
std::shared_ptr<Buffer> cuda_buffer(size_t) {
  no_cuda();
}
void* cuda_managed_alloc(size_t) {
  no_cuda();
}
void cuda_managed_free(void*) noexcept {}
const Ops& cuda_ops() {
  no_cuda();
}
void cuda_profile_start() {
  no_cuda();
}
std::vector<OpTime> cuda_profile_stop() {
  no_cuda();
}
void cuda_gemm_heuristic(bool) {
  no_cuda();
}
void cuda_gemm_small_config(int) {
  no_cuda();
}

}  // namespace deg
#endif
