// CUDA device discovery and device memory (the CUDA half of kernels/cuda_runtime.h).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda_runtime.h"

namespace deg {

namespace {

// Device memory owned by a tensor buffer.
class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(std::byte* data, size_t size) : Buffer(data, size, true, Device::cuda) {}
  ~CudaBuffer() override { cuda_free(data()); }
};

std::string gib(size_t bytes) {
  return fmt::format("{:.2f} GiB", double(bytes) / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace

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

bool cuda_available() {
  static const bool any = !cuda_devices().empty();
  return any;
}

void* cuda_malloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) bytes = 256;
  if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw Error(ErrorKind::io,
                fmt::format("could not allocate {} of GPU memory ({}; {} of {} free)", gib(bytes),
                            cudaGetErrorString(e), gib(free), gib(total)));
  }
  return p;
}

void cuda_free(void* p) noexcept {
  if (p) cudaFree(p);
}

std::shared_ptr<Buffer> cuda_buffer(size_t bytes) {
  auto* p = static_cast<std::byte*>(cuda_malloc(bytes));
  if (cudaError_t e = cudaMemset(p, 0, bytes); e != cudaSuccess) {
    cuda_free(p);
    throw Error(ErrorKind::internal, fmt::format("cudaMemset: {}", cudaGetErrorString(e)));
  }
  return std::make_shared<CudaBuffer>(p, bytes);
}

void* cuda_managed_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaError_t e = cudaMallocManaged(&p, bytes ? bytes : 256); e != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorKind::io, fmt::format("could not allocate {} bytes of managed memory ({})",
                                           bytes, cudaGetErrorString(e)));
  }
  return p;
}

void cuda_managed_free(void* p) noexcept {
  if (p) cudaFree(p);
}

}  // namespace deg
