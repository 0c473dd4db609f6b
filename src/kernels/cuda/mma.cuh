// The tensor-core and asynchronous-copy pieces of the CUDA kernels that multiply bf16 tiles in
// shared memory (attention_mma.cu, attention_bf16.cu; attention.cu and gemm_small.cu take the
// copies): PTX wrappers, no state.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace deg::cuda {

// ---- tensor cores (lane l: g = l / 4, t = l % 4) ----
//
// mma.sync m16n8k16: A (16 x 16, row-major) registers hold (row g, k 2t..2t+1), (row g + 8, k
// 2t..), (row g, k 2t + 8..), (row g + 8, k 2t + 8..); B (16 x 8): (k 2t..2t+1, n g), (k 2t +
// 8.., n g); C: (row g, n 2t..2t+1) then (row g + 8, n 2t..2t+1).

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4],
                                                         const __nv_bfloat16* row) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

// ---- asynchronous copies ----

// A 16-byte copy into shared memory; `bytes` 0 writes zeros (nothing is read).
__device__ __forceinline__ void copy16_or_zero(void* dst, const void* src, int bytes) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace deg::cuda
