// Small-M bf16 products of our own (launch.h's SmallGemmLaunch): y [M, N] (=|+=) x [M, K] w [N,
// K]^T for the few rows of a decode step, where cuBLASLt's workspace-free kernels give a [1024, K]
// weight a handful of CTAs and run at a fraction of the bandwidth (docs/cuda.md).
//
// Bits. Every output is one mma.sync m16n8k16 chain over k = 0, 16, 32, ... in order into one f32
// accumulator that starts at zero; accumulate adds the old y to the finished sum. That is the
// order cuBLASLt's pinned bf16 kernels use (bench/mma_bits_probe.cu: 0 of 1.0M results differ),
// so a row's bits are the same here as in a prefill's product; the backend still checks each
// shape against the pinned algorithm before it uses this kernel (gemm_algos.cc, tune).
//
// Layout. A CTA owns kRowsCta = 16 MT rows and kColsCta = NW CW columns; warp w the columns
// [w CW, (w + 1) CW) of the CTA's and all its m16 tiles: MT x CW / 8 independent chains. K streams
// through shared memory in stages of kStageK (x's rows and the weight's rows by cp.async, kStages
// - 1 in flight: a narrow weight's few CTAs need many bytes in flight each; rows padded to kPitch
// so that the fragments' 32-bit loads hit 32 banks). CTAs of the same columns are adjacent in the
// grid, so the weight comes from memory once.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.cuh"

namespace deg::cuda {

namespace {

constexpr int kStageK = 128;         // k per stage
constexpr int kPitch = kStageK + 8;  // a staged row's bf16 elements (272 bytes)

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <int MT, int NW, int CW, int kStages>
__global__ void __launch_bounds__(NW * 32) small_gemm_kernel(const SmallGemmLaunch a) {
  constexpr int kRowsCta = 16 * MT, kColsCta = NW * CW, kTilesN = CW / 8;
  constexpr int kPieces = kStageK / 8;  // 16-byte pieces of a staged row
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* const xs = reinterpret_cast<uint16_t*>(smem);  // [kStages][kRowsCta][kPitch]
  uint16_t* const ws = xs + kStages * kRowsCta * kPitch;   // [kStages][kColsCta][kPitch]

  const int m_blocks = static_cast<int>((a.m + kRowsCta - 1) / kRowsCta);
  const int m0 = static_cast<int>(blockIdx.x % m_blocks) * kRowsCta;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / m_blocks) * kColsCta;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t K = a.k;
  const int stages = static_cast<int>((K + kStageK - 1) / kStageK);

  auto stage = [&](int s) {
    const int slot = s % kStages;
    const int64_t k0 = int64_t(s) * kStageK;
    const int64_t width = K - k0 < kStageK ? K - k0 : kStageK;
    uint16_t* xd = xs + slot * kRowsCta * kPitch;
    uint16_t* wd = ws + slot * kColsCta * kPitch;
    for (int c = tid; c < kRowsCta * kPieces; c += NW * 32) {
      const int r = c / kPieces, q = c % kPieces;
      const bool ok = m0 + r < a.m && 8 * q < width;
      copy16_or_zero(xd + r * kPitch + 8 * q, ok ? a.x + (m0 + r) * a.ldx + k0 + 8 * q : a.x,
                     ok ? 16 : 0);
    }
    for (int c = tid; c < kColsCta * kPieces; c += NW * 32) {
      const int r = c / kPieces, q = c % kPieces;
      const bool ok = n0 + r < a.n && 8 * q < width;
      copy16_or_zero(wd + r * kPitch + 8 * q, ok ? a.w + (n0 + r) * K + k0 + 8 * q : a.w,
                     ok ? 16 : 0);
    }
  };

  // The m16 tiles holding rows (warp-uniform) and whether this warp's columns exist.
  const int live = static_cast<int>(a.m - m0 < kRowsCta ? (a.m - m0 + 15) / 16 : MT);
  const bool cols = n0 + warp * CW < a.n;
  float acc[MT][kTilesN][4] = {};

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) stage(s);
    commit_copies();
  }
  for (int s = 0; s < stages; ++s) {
    wait_copies<kStages - 2>();
    __syncthreads();
    if (s + kStages - 1 < stages) stage(s + kStages - 1);
    commit_copies();
    if (!cols) continue;
    const uint16_t* xa = xs + (s % kStages) * kRowsCta * kPitch;
    const uint16_t* wb = ws + (s % kStages) * kColsCta * kPitch + warp * CW * kPitch;
    const int64_t k0 = int64_t(s) * kStageK;
    const int steps = static_cast<int>((K - k0 < kStageK ? K - k0 : kStageK) / 16);
#pragma unroll
    for (int ks = 0; ks < kStageK / 16; ++ks) {
      if (ks >= steps) break;
      const int k = 16 * ks + 2 * t;
      uint32_t b[kTilesN][2];
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        b[j][0] = lds32(wb + (8 * j + g) * kPitch + k);
        b[j][1] = lds32(wb + (8 * j + g) * kPitch + k + 8);
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i >= live) break;
        const uint16_t* xr = xa + 16 * i * kPitch;
        const uint32_t a0 = lds32(xr + g * kPitch + k), a1 = lds32(xr + (g + 8) * kPitch + k),
                       a2 = lds32(xr + g * kPitch + k + 8),
                       a3 = lds32(xr + (g + 8) * kPitch + k + 8);
#pragma unroll
        for (int j = 0; j < kTilesN; ++j)
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
              "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
              : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
              : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b[j][0]), "r"(b[j][1]));
      }
    }
  }
  if (!cols) return;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      const int64_t n = n0 + warp * CW + 8 * j + 2 * t;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = m0 + 16 * i + g + 8 * h;
        if (r >= a.m) continue;
        float* y = a.y + r * a.ldy + n;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (n + e >= a.n) continue;
          const float v = acc[i][j][2 * h + e];
          y[e] = a.accumulate ? __fadd_rn(v, y[e]) : v;
        }
      }
    }
  }
}

template <int MT, int NW, int CW, int kStages>
cudaError_t launch_config(const SmallGemmLaunch& a, cudaStream_t stream) {
  constexpr int kRowsCta = 16 * MT, kColsCta = NW * CW;
  const int bytes = kStages * (kRowsCta + kColsCta) * kPitch * 2;
  if (bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        small_gemm_kernel<MT, NW, CW, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
  }
  const int64_t m_blocks = (a.m + kRowsCta - 1) / kRowsCta;
  const int64_t n_blocks = (a.n + kColsCta - 1) / kColsCta;
  small_gemm_kernel<MT, NW, CW, kStages>
      <<<static_cast<unsigned>(m_blocks * n_blocks), NW * 32, bytes, stream>>>(a);
  return cudaGetLastError();
}

// The configurations that were fastest for some decode shape in bench/small_gemm_probe.cu
// (H100, 2026-12-06): one row and the wide projections; 64 rows and q_proj.
struct Config {
  const char* name;
  cudaError_t (*launch)(const SmallGemmLaunch&, cudaStream_t);
};
constexpr Config kConfigs[kSmallGemmConfigs] = {
    {"16 rows x 32 columns (4 warps), 8 stages", launch_config<1, 4, 8, 8>},
    {"16 rows x 64 columns (8 warps), 6 stages", launch_config<1, 8, 8, 6>},
    {"32 rows x 64 columns (8 warps), 4 stages", launch_config<2, 8, 8, 4>},
};

}  // namespace

const char* small_gemm_config_name(int config) {
  return config >= 0 && config < kSmallGemmConfigs ? kConfigs[config].name : nullptr;
}

bool small_gemm_fits(const SmallGemmLaunch& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.m >= 1 && a.m <= kSmallGemmRows && a.n >= 8 && a.n % 8 == 0 && a.k >= 16 &&
         a.k % 16 == 0 && a.ldx >= a.k && a.ldx % 8 == 0 && a.ldy >= a.n && aligned(a.x) &&
         aligned(a.w);
}

cudaError_t launch_small_gemm(const SmallGemmLaunch& a, int config, cudaStream_t stream) {
  if (!small_gemm_fits(a) || config < 0 || config >= kSmallGemmConfigs)
    return cudaErrorInvalidValue;
  return kConfigs[config].launch(a, stream);
}

}  // namespace deg::cuda
