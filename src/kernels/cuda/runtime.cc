// CUDA device discovery and device memory (the CUDA half of kernels/cuda_runtime.h).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/stream.h"
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

namespace cuda {

cudaStream_t stream() {
  static const cudaStream_t s = [] {
    cudaStream_t made = nullptr;
    if (cudaSetDevice(0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking) != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorKind::io, "cannot create a CUDA stream on GPU 0");
    }
    // Memory released to the pool stays there for the next allocation.
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) {
      uint64_t keep = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    return made;
  }();
  return s;
}

int sm_count() {
  static const int sms = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n > 0 ? n : 132;
  }();
  return sms;
}

}  // namespace cuda

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
  if (cudaError_t e = cudaMallocAsync(&p, bytes, cuda::stream()); e != cudaSuccess) {
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
  if (p) cudaFreeAsync(p, cuda::stream());  // once the work queued before it is done
}

std::shared_ptr<Buffer> cuda_buffer(size_t bytes) {
  auto* p = static_cast<std::byte*>(cuda_malloc(bytes));
  if (cudaError_t e = cudaMemsetAsync(p, 0, bytes, cuda::stream()); e != cudaSuccess) {
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
