// What CUDA devices this process sees, and device memory. Without a CUDA build (DEG_HAVE_CUDA
// unset) there are no devices and the memory functions throw, so callers need no #ifdef.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"

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
bool cuda_available();                       // built, and a GPU is visible
// The first GPU's dense bf16 tensor-core rate in FLOP/s, for MFU: the H100 SXM's and the H200
// SXM's 989.5 TFLOP/s (their datasheets' 1,979 "with sparsity", halved; the two share the compute
// die, and the PyTorch reference divides by the same); 0 without a GPU or for one deg does not
// know.
double cuda_bf16_peak_flops();

// A device by name: cpu, cuda, or auto ($DEG_DEVICE when set, else cuda when a GPU is visible,
// else cpu). Throws deg::Error for another name, or cuda without a CUDA build.
Device pick_device(const std::string& name);

// Device memory of the current GPU; throw deg::Error naming the size when it cannot be had.
void* cuda_malloc(size_t bytes);
void cuda_free(void* p) noexcept;  // null: nothing
// Zero-filled device memory as a tensor buffer (Device::cuda).
std::shared_ptr<Buffer> cuda_buffer(size_t bytes);
// A profile of the CUDA backend's ops: from start to stop, each op's device time is taken with
// CUDA events (nothing waits), summed per op; stop returns the sums, the largest first. The same
// range is the CUDA profiler's (cudaProfilerStart / Stop), so `ncu --profile-from-start off`
// measures the kernels of exactly the profiled work.
// Each op's calls are also summed by call site: `where` is "MODULE+0xOFFSET" (the op method's
// return address in the binary that called it; `addr2line -f -C -e MODULE 0xOFFSET` names the
// function and, with debug lines, the line), the largest first.
struct OpSite {
  std::string where;
  double ms = 0;
  int64_t calls = 0;
};
struct OpTime {
  std::string op;
  double ms = 0;
  int64_t calls = 0;
  std::vector<OpSite> sites;
};
void cuda_profile_start();
std::vector<OpTime> cuda_profile_stop();
// Benchmarks only: GEMMs with cuBLASLt's own algorithm choice for each M (split-K, workspace)
// instead of the pinned one — faster for some shapes, but a row's bits then depend on its batch.
void cuda_gemm_heuristic(bool on);
// Tests only: config >= 0 runs our small-M product's configuration `config` for every bf16
// product of at most 64 rows it takes, whatever the tuning chose (so that its bits can be held to
// cuBLASLt's through the op); -1, the default, leaves the choice to the tuning.
void cuda_gemm_small_config(int config);

// Memory both the host and the GPU address (the op table's buffers in tests).
void* cuda_managed_alloc(size_t bytes);
void cuda_managed_free(void* p) noexcept;

}  // namespace deg
