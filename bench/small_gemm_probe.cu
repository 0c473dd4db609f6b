// A small-M bf16 GEMM of our own beside cuBLASLt: same bits? how fast? The decode step's
// projections have M <= 64 rows, where cuBLASLt's workspace-free kernels give a [1024, K] weight
// 8-16 CTAs and stream it at ~0.5 TB/s (docs/cuda.md). mma_bits_probe.cu found that mma.sync
// m16n8k16 over k ascending into one accumulator gives cuBLASLt's bits; this kernel keeps that
// order and spreads the weight's columns over every SM instead:
//   a CTA of 4 warps owns kCols columns (kCols / 8 n8 tiles) and all M <= 64 rows, warp w the
//   rows 16 w .. 16 w + 15; K streams through shared memory in stages of 128 (x and the
//   weight's rows by cp.async, kStages in flight, rows padded to 136 so that the fragments'
//   32-bit loads hit 32 banks); each stage's 8 k16 steps run in order.
// For each shape it prints the results differing from cuBLASLt's first workspace-free algorithm
// (the pinned algorithms all agree) and the median of 20 timed launches of each. Not part of the
// build; on the GPU machine:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a bench/small_gemm_probe.cu \
//     -lcublasLt -o /tmp/small_gemm_probe && /tmp/small_gemm_probe
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kStageK = 128;           // k per stage
constexpr int kPitch = kStageK + 8;    // a staged row's bf16 elements (272 bytes)
constexpr int kMaxRows = 64;           // M at most
constexpr int kWarps = kMaxRows / 16;  // one per m16 tile
constexpr int kStages = 4;

__device__ inline void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: zero-fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ inline void cp_commit() {
  asm volatile("cp.async.commit_group;\n");
}
template <int kLeft>
__device__ inline void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kLeft));
}

__device__ inline uint32_t lds32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// D [M, N] (f32, row stride N) = x [M, K] (bf16, row stride K) * w [N, K]^T; K % kStageK == 0.
template <int kCols>
__global__ void __launch_bounds__(kWarps * 32)
    small_gemm_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w, float* d, int M, int N,
                      int K) {
  constexpr int kTiles = kCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* xs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kStages][kMaxRows][kPitch]
  __nv_bfloat16* ws = xs + kStages * kMaxRows * kPitch;   // [kStages][kCols][kPitch]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * kCols;
  const int stages = K / kStageK;

  auto stage = [&](int s) {
    const int slot = s % kStages, k0 = s * kStageK;
    __nv_bfloat16* xd = xs + slot * kMaxRows * kPitch;
    __nv_bfloat16* wd = ws + slot * kCols * kPitch;
    constexpr int kChunks = kStageK / 8;  // 16-byte pieces per row
    for (int c = tid; c < kMaxRows * kChunks; c += kWarps * 32) {
      const int r = c / kChunks, q = c % kChunks;
      const bool ok = r < M;
      cp_async16(xd + r * kPitch + q * 8, x + size_t(ok ? r : 0) * K + k0 + q * 8, ok);
    }
    for (int c = tid; c < kCols * kChunks; c += kWarps * 32) {
      const int r = c / kChunks, q = c % kChunks;
      cp_async16(wd + r * kPitch + q * 8, w + size_t(n0 + r) * K + k0 + q * 8, true);
    }
  };

  float acc[kTiles][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) stage(s);
    cp_commit();
  }
  for (int s = 0; s < stages; ++s) {
    cp_wait<kStages - 2>();
    __syncthreads();
    if (s + kStages - 1 < stages) stage(s + kStages - 1);
    cp_commit();
    const __nv_bfloat16* xa = xs + (s % kStages) * kMaxRows * kPitch + (warp * 16) * kPitch;
    const __nv_bfloat16* wb = ws + (s % kStages) * kCols * kPitch;
    if (warp * 16 < M) {
#pragma unroll
      for (int ks = 0; ks < kStageK / 16; ++ks) {
        const int k = ks * 16 + 2 * t;
        const uint32_t a0 = lds32(xa + g * kPitch + k), a1 = lds32(xa + (g + 8) * kPitch + k),
                       a2 = lds32(xa + g * kPitch + k + 8),
                       a3 = lds32(xa + (g + 8) * kPitch + k + 8);
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          const uint32_t b0 = lds32(wb + (8 * j + g) * kPitch + k),
                         b1 = lds32(wb + (8 * j + g) * kPitch + k + 8);
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
              "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
              : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
              : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
      }
    }
  }
  const int r0 = warp * 16 + g, r1 = r0 + 8;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int n = n0 + 8 * j + 2 * t;
    if (r0 < M)
      *reinterpret_cast<float2*>(d + size_t(r0) * N + n) = make_float2(acc[j][0], acc[j][1]);
    if (r1 < M)
      *reinterpret_cast<float2*>(d + size_t(r1) * N + n) = make_float2(acc[j][2], acc[j][3]);
  }
}

template <int kCols>
void launch_small_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, float* d, int M, int N,
                       int K) {
  const int bytes = kStages * (kMaxRows + kCols) * kPitch * 2;
  cudaFuncSetAttribute(small_gemm_kernel<kCols>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       bytes);
  small_gemm_kernel<kCols><<<N / kCols, kWarps * 32, bytes>>>(x, w, d, M, N, K);
}

#define CK(x)                                                     \
  do {                                                            \
    auto e_ = (x);                                                \
    if (e_ != 0) {                                                \
      printf("error %d at %s:%d\n", int(e_), __FILE__, __LINE__); \
      exit(1);                                                    \
    }                                                             \
  } while (0)

// Median of 20 timed runs of fn (after one warm-up), in microseconds.
template <class Fn>
double median_us(Fn fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  fn();
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float m = 0;
    CK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

}  // namespace

int main() {
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  // Qwen3.5-0.8B's projections: in_proj (stacked), out_proj / o_proj, gate|up, down, q.
  const int shapes[][3] = {{64, 8224, 1024}, {64, 1024, 2048}, {64, 7168, 1024}, {64, 1024, 3584},
                           {64, 4096, 1024}, {1, 1024, 3584},  {37, 7168, 1024}};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s\n", prop.name);
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
    cublasLtMatmulDesc_t desc;
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, N));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t none = 0;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &none,
                                            sizeof(none)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
    const float alpha = 1, beta = 0;
    auto lt_run = [&] {
      CK(cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, d0, lc, d0, lc, &res.algo, nullptr,
                        0, 0));
    };
    const double lt_us = median_us(lt_run);
    std::vector<float> ref(size_t(M) * N), mine(ref.size());
    CK(cudaMemcpy(ref.data(), d0, ref.size() * 4, cudaMemcpyDeviceToHost));
    const double gb = (double(N) * K * 2 + double(M) * K * 2 + double(M) * N * 4) / 1e9;
    printf("M=%d N=%d K=%d: cuBLASLt %.1f us (%.2f TB/s)\n", M, N, K, lt_us, gb / lt_us * 1e3);
    for (int cols : {8, 16, 32}) {
      auto mine_run = [&] {
        if (cols == 8) launch_small_gemm<8>(x, w, d1, M, N, K);
        if (cols == 16) launch_small_gemm<16>(x, w, d1, M, N, K);
        if (cols == 32) launch_small_gemm<32>(x, w, d1, M, N, K);
        CK(cudaGetLastError());
      };
      const double us = median_us(mine_run);
      CK(cudaMemcpy(mine.data(), d1, mine.size() * 4, cudaMemcpyDeviceToHost));
      size_t differ = 0;
      for (size_t i = 0; i < mine.size(); ++i) differ += std::memcmp(&mine[i], &ref[i], 4) != 0;
      printf(
          "  ours, %2d columns a CTA (%5d CTAs): %.1f us (%.2f TB/s), %zu of %zu results differ\n",
          cols, N / cols, us, gb / us * 1e3, differ, mine.size());
    }
    cudaFree(x);
    cudaFree(w);
    cudaFree(d0);
    cudaFree(d1);
  }
  return 0;
}
