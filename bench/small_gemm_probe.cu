// Our small-M bf16 GEMM (src/kernels/cuda/gemm_small.cu) beside cuBLASLt: same bits? how fast?
// The decode step's projections have M <= 64 rows, where cuBLASLt's workspace-free kernels give a
// [1024, K] weight 8-16 CTAs (docs/cuda.md). For each of Qwen3.5-0.8B's decode shapes at several
// M it prints cuBLASLt's first workspace-free algorithm (the pinned algorithms all agree) and each
// of our configurations: the time per call of 30 calls back to back, each reading a different copy
// of the weight (128 MB of copies or more, so the weight comes from memory as in a decode step),
// and the results that differ from cuBLASLt's, written (beta 0) and accumulated (beta 1). Not
// part of the build; on the GPU machine:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I src \
//     bench/small_gemm_probe.cu -lcublasLt -o /tmp/small_gemm_probe && /tmp/small_gemm_probe
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/gemm_small.cu"
#include "lt_probe.cuh"

namespace {

// Microseconds per call of fn(i): 30 calls between two events (after 3 warm-up calls), as a
// decode step runs its kernels back to back; the median of 5 such batches.
template <class Fn>
double per_call_us(Fn fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn(i);
  std::vector<float> ms;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < 30; ++i) fn(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float m = 0;
    CK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[2] / 30;
}

}  // namespace

int main() {
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  // Qwen3.5-0.8B's projections (N, K): in_proj (stacked), out_proj / o_proj, gate|up, down, q,
  // k / v; at decode's row counts.
  const int shapes[][2] = {{8224, 1024}, {1024, 2048}, {7168, 1024},
                           {1024, 3584}, {4096, 1024}, {512, 1024}};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s\n", prop.name);
  double sum_lt[2] = {0, 0}, sum_best[2] = {0, 0};
  for (int M : {64, 1}) {
    for (auto& s : shapes) {
      const int N = s[0], K = s[1];
      const size_t wbytes = size_t(N) * K * 2;
      const int copies = int(std::min<size_t>(64, (size_t(128) << 20) / wbytes + 1));
      std::vector<__nv_bfloat16> hx(size_t(M) * K), hw(size_t(N) * K);
      std::vector<float> hy(size_t(M) * N);
      for (auto& v : hx) v = __float2bfloat16(nd(rng));
      for (auto& v : hw) v = __float2bfloat16(0.05f * nd(rng));
      for (auto& v : hy) v = nd(rng);
      __nv_bfloat16 *x, *w;
      float *y0, *d0, *d1;
      CK(cudaMalloc(&x, hx.size() * 2));
      CK(cudaMalloc(&w, wbytes * copies));
      CK(cudaMalloc(&y0, hy.size() * 4));
      CK(cudaMalloc(&d0, hy.size() * 4));
      CK(cudaMalloc(&d1, hy.size() * 4));
      CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
      for (int c = 0; c < copies; ++c)
        CK(cudaMemcpy(reinterpret_cast<char*>(w) + c * wbytes, hw.data(), wbytes,
                      cudaMemcpyHostToDevice));
      CK(cudaMemcpy(y0, hy.data(), hy.size() * 4, cudaMemcpyHostToDevice));
      auto wcopy = [&](int c) {
        return reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<char*>(w) + c * wbytes);
      };
      const LtProduct lp = lt_product(M, N, K);
      // The pinned algorithm: the first the heuristic offers at n = 1024 (as the backend's).
      cublasLtMatrixLayout_t lbp, lcp;
      CK(cublasLtMatrixLayoutCreate(&lbp, CUDA_R_16BF, K, 1024, K));
      CK(cublasLtMatrixLayoutCreate(&lcp, CUDA_R_32F, N, 1024, N));
      cublasLtMatmulHeuristicResult_t res{};
      int found = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, lp.desc, lp.w, lbp, lcp, lcp, lp.pref, 1, &res,
                                        &found));
      int rot = 0;
      const float one = 1.0f;
      auto lt_call = [&](float beta, int c) {
        CK(cublasLtMatmul(lt, lp.desc, &one, wcopy(c), lp.w, x, lp.x, &beta, d0, lp.y, d0, lp.y,
                          &res.algo, nullptr, 0, 0));
      };
      const double lt_us = per_call_us([&](int) { lt_call(0.0f, rot++ % copies); });
      std::vector<float> ref0(hy.size()), ref1(hy.size()), mine(hy.size());
      lt_call(0.0f, 0);
      CK(cudaMemcpy(ref0.data(), d0, ref0.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(d0, y0, hy.size() * 4, cudaMemcpyDeviceToDevice));
      lt_call(1.0f, 0);
      CK(cudaMemcpy(ref1.data(), d0, ref1.size() * 4, cudaMemcpyDeviceToHost));
      const double gb = double(wbytes) / 1e9;
      printf("M=%d N=%d K=%d: cuBLASLt %.1f us (weight at %.2f TB/s)\n", M, N, K, lt_us,
             gb / lt_us * 1e3);
      double best = 1e30;
      for (int cfg = 0; cfg < deg::cuda::kSmallGemmConfigs; ++cfg) {
        auto run = [&](bool accumulate, int c) {
          deg::cuda::SmallGemmLaunch a{.x = reinterpret_cast<const uint16_t*>(x),
                                       .ldx = K,
                                       .w = reinterpret_cast<const uint16_t*>(wcopy(c)),
                                       .y = d1,
                                       .ldy = N,
                                       .m = M,
                                       .n = N,
                                       .k = K,
                                       .accumulate = accumulate};
          CK(deg::cuda::launch_small_gemm(a, cfg, 0));
          CK(cudaGetLastError());
        };
        const double us = per_call_us([&](int) { run(false, rot++ % copies); });
        size_t differ = 0;
        run(false, 0);
        CK(cudaMemcpy(mine.data(), d1, mine.size() * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < mine.size(); ++i) differ += std::memcmp(&mine[i], &ref0[i], 4) != 0;
        CK(cudaMemcpy(d1, y0, hy.size() * 4, cudaMemcpyDeviceToDevice));
        run(true, 0);
        CK(cudaMemcpy(mine.data(), d1, mine.size() * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < mine.size(); ++i) differ += std::memcmp(&mine[i], &ref1[i], 4) != 0;
        if (differ == 0) best = std::min(best, us);
        printf("  %-44s %6.1f us (%.2f TB/s, x%.2f), %zu of %zu differ\n",
               deg::cuda::small_gemm_config_name(cfg), us, gb / us * 1e3, lt_us / us, differ,
               2 * mine.size());
      }
      sum_lt[M == 1] += lt_us;
      sum_best[M == 1] += best;
      cudaFree(x);
      cudaFree(w);
      cudaFree(y0);
      cudaFree(d0);
      cudaFree(d1);
    }
  }
  printf("sum over the shapes, M=64: cuBLASLt %.1f us, ours (best each) %.1f us\n", sum_lt[0],
         sum_best[0]);
  printf("sum over the shapes, M=1:  cuBLASLt %.1f us, ours (best each) %.1f us\n", sum_lt[1],
         sum_best[1]);
  return 0;
}
