// What the CUDA delta rule's kernels share: sizes, the row lists a launch hands each kernel,
// cp.async and vector loads.
// delta_rule.cu (the chunked form and the launch) says how the pieces fit;
// delta_rule_recurrent.cu holds the recurrence for decode, short rows and short last chunks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda::dr {

constexpr int kChunk = 64;  // tokens per chunk (kDeltaRuleChunk)
// A last partial chunk of at most this many tokens runs the recurrence: every partial chunk (the
// chunked form runs full chunks only).
constexpr int kRecurTokens = kChunk - 1;
constexpr int kThreads = 256;    // the chunked form's kernels
constexpr int kCols = 16;        // value columns of S per state_kernel CTA
constexpr int kLdm = 68;         // row stride of A, T (float4 rows, 4 banks apart)
constexpr int kMaxDim = 256;     // largest Dk, Dv
constexpr int kHalfTiles = 36;   // 8 x 8 tiles on and below the diagonal of a 64 x 64 matrix
constexpr int kDecStride = 196;  // e^c [64], e^(c_last - c) [64], beta [64], e^(c_last), pad
constexpr int kRecWarps = 4;     // recur_kernel: warps per CTA, 16 value columns each
constexpr int kRecThreads = 32 * kRecWarps;
constexpr int kRecCols = 16 * kRecWarps;

static_assert(kCols == 16 && kChunk == 64 && kThreads == 256, "index arithmetic assumes these");

// Tokens of a row of n that the chunked form runs: all but a last partial chunk of at most
// kRecurTokens tokens.
__host__ __device__ inline int64_t chunked_tokens(int64_t n) {
  const int64_t tail = n % kChunk;
  return tail <= kRecurTokens ? n - tail : n;
}

// The rows of the launch one kernel handles.
struct RowList {
  int count;
  int index[kRows];
};

// ---- PTX helpers: cp.async ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 4 or 16 bytes global -> shared, zero-filled when !valid (src must still be a mapped address).
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ __forceinline__ float4 ld4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
// acc[0..3] += x * (b.x, b.y, b.z, b.w)
__device__ __forceinline__ void fma4(float* acc, float x, float4 b) {
  acc[0] = fmaf(x, b.x, acc[0]);
  acc[1] = fmaf(x, b.y, acc[1]);
  acc[2] = fmaf(x, b.z, acc[2]);
  acc[3] = fmaf(x, b.w, acc[3]);
}
// acc += a · b over 4 terms, in order.
__device__ __forceinline__ float dot4(float acc, float4 a, float4 b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// Four consecutive columns col.. of a row at p (p points at column col), columns >= dv read as
// zero. vec: dv % 4 == 0 and p 16-byte aligned, so the four are all in or all out.
__device__ __forceinline__ float4 load_cols(const float* p, int col, int dv, bool vec) {
  if (vec) return col < dv ? ld4(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  return make_float4(col < dv ? p[0] : 0.0f, col + 1 < dv ? p[1] : 0.0f, col + 2 < dv ? p[2] : 0.0f,
                     col + 3 < dv ? p[3] : 0.0f);
}
__device__ __forceinline__ void store_cols(float* p, int col, int dv, bool vec, float4 x) {
  if (vec) {
    if (col < dv) *reinterpret_cast<float4*>(p) = x;
    return;
  }
  if (col < dv) p[0] = x.x;
  if (col + 1 < dv) p[1] = x.y;
  if (col + 2 < dv) p[2] = x.z;
  if (col + 3 < dv) p[3] = x.w;
}

__host__ __device__ inline int round_up(int x, int m) {
  return (x + m - 1) / m * m;
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The recurrence over `rows` of the launch (delta_rule_recurrent.cu): tmax is the most tokens a
// row hands it. fold: the rows run no tokens; each replays its history over rec_in and stores the
// state to rec_out (for a row whose chunked form runs next).
cudaError_t launch_recurrent(const DeltaRuleLaunch& a, const RowList& rows, int tmax, bool fold,
                             cudaStream_t stream);

}  // namespace deg::cuda::dr
