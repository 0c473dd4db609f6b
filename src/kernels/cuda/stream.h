// The one CUDA stream of the process's GPU work (the backend's ops, its copies and its memory:
// allocations are stream-ordered (cudaMallocAsync from the device's pool, kept cached), so taking
// and releasing state buffers costs no device-wide synchronisation.
#pragma once

#include <cuda_runtime.h>

namespace deg::cuda {

cudaStream_t stream();

// The GPU's multiprocessors (132 when the driver cannot say).
int sm_count();

}  // namespace deg::cuda
