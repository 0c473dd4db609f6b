// Does a plain tensor-core product give cuBLASLt's bits? For bf16 operands and f32 results, a
// warp per 16 x 8 output tile running mma.sync m16n8k16 over k = 0, 16, 32, ... into one
// accumulator (variant k16), or each k16 step as two m16n8k8 (variant 2xk8), against every
// cuBLASLt algorithm the heuristic offers without workspace for the same product (the CUDA
// backend's D = W x^T of bf16 weights W [N, K] and rows x [M, K]). If k16 matches for every
// shape, a small-M GEMM of our own can keep the pinned algorithms' bits (a row's result the
// same in a decode step as in a prefill). Not part of the build; on the GPU machine:
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a bench/mma_bits_probe.cu \
//     -lcublasLt -o /tmp/mma_bits_probe && /tmp/mma_bits_probe
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "lt_probe.h"

__device__ inline uint32_t ld32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// one warp per 16 x 8 tile; variant 0: m16n8k16; variant 1: two m16n8k8 per k16
template <int kVariant>
__global__ void probe_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w, float* d, int M, int N,
                             int K) {
  const int tile_n = blockIdx.x, tile_m = blockIdx.y, lane = threadIdx.x, g = lane / 4,
            t = lane % 4;
  const int m0 = tile_m * 16, n0 = tile_n * 8;
  float c[4] = {0, 0, 0, 0};
  auto xr = [&](int r) { return x + (size_t)(m0 + r < M ? m0 + r : M - 1) * K; };
  const bool r0ok = m0 + g < M, r1ok = m0 + g + 8 < M;
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a0 = r0ok ? ld32(xr(g) + k0 + 2 * t) : 0, a1 = r1ok ? ld32(xr(g + 8) + k0 + 2 * t) : 0;
    uint32_t a2 = r0ok ? ld32(xr(g) + k0 + 2 * t + 8) : 0,
             a3 = r1ok ? ld32(xr(g + 8) + k0 + 2 * t + 8) : 0;
    const __nv_bfloat16* wr = w + (size_t)(n0 + g) * K + k0;
    uint32_t b0 = ld32(wr + 2 * t), b1 = ld32(wr + 2 * t + 8);
    if (kVariant == 0) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a0), "r"(a1), "r"(b0));
      asm volatile(
          "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a2), "r"(a3), "r"(b1));
    }
  }
  const int n = n0 + 2 * t;
  if (r0ok) {
    d[(size_t)(m0 + g) * N + n] = c[0];
    d[(size_t)(m0 + g) * N + n + 1] = c[1];
  }
  if (r1ok) {
    d[(size_t)(m0 + g + 8) * N + n] = c[2];
    d[(size_t)(m0 + g + 8) * N + n + 1] = c[3];
  }
}

int main() {
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  const int shapes[][3] = {{64, 1024, 3584}, {64, 8224 / 8 * 8, 1024}, {1, 1024, 2048},
                           {7, 7168, 1024},  {64, 4096, 1024},         {293, 384, 512}};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  for (auto& s : shapes) {
    const int M = s[0], N = s[1], K = s[2];
    std::vector<__nv_bfloat16> hx(size_t(M) * K), hw(size_t(N) * K);
    for (auto& v : hx) v = __float2bfloat16(nd(rng));
    for (auto& v : hw) v = __float2bfloat16(0.05f * nd(rng));
    __nv_bfloat16 *x, *w;
    float *d0, *d1;
    CK(cudaMalloc(&x, hx.size() * 2));
    CK(cudaMalloc(&w, hw.size() * 2));
    CK(cudaMalloc(&d0, size_t(M) * N * 4));
    CK(cudaMalloc(&d1, size_t(M) * N * 4));
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    const LtProduct lp = lt_product(M, N, K);
    cublasLtMatmulHeuristicResult_t res[16];
    int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, lp.desc, lp.w, lp.x, lp.y, lp.y, lp.pref, 16, res,
                                      &found));
    float alpha = 1, beta = 0;
    std::vector<float> ref(size_t(M) * N), mine(size_t(M) * N);
    int algos_same = 0, algos = 0;
    for (int i = 0; i < found; ++i) {
      if (cublasLtMatmul(lt, lp.desc, &alpha, w, lp.w, x, lp.x, &beta, d0, lp.y, d0, lp.y,
                         &res[i].algo, nullptr, 0, 0) != 0)
        continue;
      CK(cudaDeviceSynchronize());
      std::vector<float> r(size_t(M) * N);
      CK(cudaMemcpy(r.data(), d0, r.size() * 4, cudaMemcpyDeviceToHost));
      if (algos == 0) ref = r;
      ++algos;
      algos_same += memcmp(r.data(), ref.data(), r.size() * 4) == 0;
    }
    for (int v = 0; v < 2; ++v) {
      dim3 grid(N / 8, (M + 15) / 16);
      if (v == 0)
        probe_kernel<0><<<grid, 32>>>(x, w, d1, M, N, K);
      else
        probe_kernel<1><<<grid, 32>>>(x, w, d1, M, N, K);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(mine.data(), d1, mine.size() * 4, cudaMemcpyDeviceToHost));
      size_t diff = 0;
      double md = 0;
      for (size_t i = 0; i < mine.size(); ++i)
        if (mine[i] != ref[i]) {
          ++diff;
          md = std::max(md, double(std::fabs(mine[i] - ref[i])));
        }
      printf(
          "M=%d N=%d K=%d: cuBLASLt algos %d of %d same bits; mma variant %s: %zu of %zu differ "
          "(max %.3g)\n",
          M, N, K, algos_same, algos, v == 0 ? "k16" : "2xk8", diff, mine.size(), md);
    }
    cudaFree(x);
    cudaFree(w);
    cudaFree(d0);
    cudaFree(d1);
  }
  return 0;
}
