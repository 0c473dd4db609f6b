// Our small-M bf16 GEMM (src/kernels/cuda/gemm_small.cu) beside cuBLASLt: same bits? how fast?
// The decode step's projections have M <= 64 rows, where cuBLASLt's workspace-free kernels give a
// [1024, K] weight 8-16 CTAs (docs/cuda.md). For each of Qwen3.5-0.8B's decode shapes at several
// M it prints cuBLASLt's first workspace-free algorithm (the pinned algorithms all agree) and each
// of our configurations (and the forms under evaluation below, not yet in the build): the time
// per call of 30 calls back to back, each reading a different copy
// of the weight (128 MB of copies or more, so the weight comes from memory as in a decode step),
// and the results that differ from cuBLASLt's, written (beta 0) and accumulated (beta 1). The
// ratios are against that pinned algorithm; the backend runs what CudaOps::tune picks per class
// of n among the algorithms with its bits, 1.5-2.6x faster at 64 rows (docs/cuda.md, session 12):
// beat tune's times (deg --log-level debug bench prints them), not these. Not part of the build;
// on the GPU machine:
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
#include "lt_probe.h"

namespace {

// Forms under evaluation (not in the build yet), the direct ones: no shared memory and no
// barrier on a chain's path. A CTA owns 16 MT rows and NW n8 column tiles; warp w the columns
// [n0 + 8 w, n0 + 8 w + 8) of all MT m16 tiles: MT chains sharing one B fragment, whose
// fragments it loads itself from global memory (x's through L1, which the CTA's warps share:
// they hold the same rows) kAhead k16 steps before their mma, in a ring of registers. kWide: one
// 8-byte load per row and k16 step instead of two 4-byte ones, so a lane's four k of a row are
// [4t, 4t + 4) where the mma's layout wants {2t, 2t + 1, 2t + 8, 2t + 9}: the same 16 products
// in each step, in other lanes of the tensor core (whether the bits survive is what it tests).
__device__ __forceinline__ uint32_t ldg32(const uint16_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}
__device__ __forceinline__ uint2 ldg64(const uint16_t* p) {
  return __ldg(reinterpret_cast<const uint2*>(p));
}

template <int MT, int NW, int kAhead, bool kWide>
__global__ void __launch_bounds__(NW * 32)
    small_gemm_direct_kernel(const deg::cuda::SmallGemmLaunch a) {
  const int m_blocks = static_cast<int>((a.m + 16 * MT - 1) / (16 * MT));
  const int64_t m0 = int64_t(blockIdx.x % m_blocks) * 16 * MT;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n0 = int64_t(blockIdx.x / m_blocks) * (8 * NW) + 8 * warp;
  if (n0 >= a.n) return;  // warp-uniform; no barrier follows
  const int g = lane / 4, t = lane % 4;
  const int kk = kWide ? 4 * t : 2 * t;
  bool ok[MT][2];
  const uint16_t* xr[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = m0 + 16 * i + g + 8 * h;
      ok[i][h] = r < a.m;
      xr[i][h] = a.x + (ok[i][h] ? r : 0) * a.ldx + kk;
    }
  const uint16_t* w0 = a.w + (n0 + g) * a.k + kk;
  const int steps = static_cast<int>(a.k / 16);

  uint32_t fa[kAhead][MT][4], fb[kAhead][2];
  auto load = [&](int slot, int s) {
    if (s >= steps) return;
    const int64_t k = int64_t(s) * 16;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (kWide) {
        const uint2 u0 = ok[i][0] ? ldg64(xr[i][0] + k) : make_uint2(0, 0);
        const uint2 u1 = ok[i][1] ? ldg64(xr[i][1] + k) : make_uint2(0, 0);
        fa[slot][i][0] = u0.x, fa[slot][i][2] = u0.y, fa[slot][i][1] = u1.x, fa[slot][i][3] = u1.y;
      } else {
        fa[slot][i][0] = ok[i][0] ? ldg32(xr[i][0] + k) : 0u;
        fa[slot][i][1] = ok[i][1] ? ldg32(xr[i][1] + k) : 0u;
        fa[slot][i][2] = ok[i][0] ? ldg32(xr[i][0] + k + 8) : 0u;
        fa[slot][i][3] = ok[i][1] ? ldg32(xr[i][1] + k + 8) : 0u;
      }
    }
    if (kWide) {
      const uint2 u = ldg64(w0 + k);
      fb[slot][0] = u.x, fb[slot][1] = u.y;
    } else {
      fb[slot][0] = ldg32(w0 + k);
      fb[slot][1] = ldg32(w0 + k + 8);
    }
  };
#pragma unroll
  for (int j = 0; j < kAhead; ++j) load(j, j);
  float acc[MT][4] = {};
  for (int s0 = 0; s0 < steps; s0 += kAhead) {
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (s0 + j >= steps) break;
#pragma unroll
      for (int i = 0; i < MT; ++i)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(acc[i][0]), "+f"(acc[i][1]), "+f"(acc[i][2]), "+f"(acc[i][3])
            : "r"(fa[j][i][0]), "r"(fa[j][i][1]), "r"(fa[j][i][2]), "r"(fa[j][i][3]), "r"(fb[j][0]),
              "r"(fb[j][1]));
      load(j, s0 + j + kAhead);
    }
  }
  const int64_t n = n0 + 2 * t;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = m0 + 16 * i + g + 8 * h;
      if (r >= a.m) continue;
      float* y = a.y + r * a.ldy + n;
#pragma unroll
      for (int e = 0; e < 2; ++e)
        y[e] = a.accumulate ? __fadd_rn(acc[i][2 * h + e], y[e]) : acc[i][2 * h + e];
    }
}

template <int MT, int NW, int kAhead, bool kWide>
cudaError_t launch_direct(const deg::cuda::SmallGemmLaunch& a, cudaStream_t stream) {
  const int64_t m_blocks = (a.m + 16 * MT - 1) / (16 * MT),
                n_blocks = (a.n + 8 * NW - 1) / (8 * NW);
  small_gemm_direct_kernel<MT, NW, kAhead, kWide>
      <<<static_cast<unsigned>(m_blocks * n_blocks), NW * 32, 0, stream>>>(a);
  return cudaGetLastError();
}

struct DirectForm {
  const char* name;
  cudaError_t (*launch)(const deg::cuda::SmallGemmLaunch&, cudaStream_t);
};
const DirectForm kDirect[] = {
    {"direct: 16 x 32 (4 warps), 8 ahead", launch_direct<1, 4, 8, false>},
    {"direct: 16 x 32 (4 warps), 16 ahead", launch_direct<1, 4, 16, false>},
    {"direct: 16 x 32 (4 warps), 8 ahead, 8-byte", launch_direct<1, 4, 8, true>},
    {"direct: 32 x 32 (4 warps), 8 ahead", launch_direct<2, 4, 8, false>},
    {"direct: 32 x 16 (2 warps), 12 ahead", launch_direct<2, 2, 12, false>},
    {"direct: 64 x 32 (4 warps), 8 ahead", launch_direct<4, 4, 8, false>},
    {"direct: 64 x 64 (8 warps), 6 ahead", launch_direct<4, 8, 6, false>},
    {"direct: 64 x 16 (2 warps), 8 ahead, 8-byte", launch_direct<4, 2, 8, true>},
};
constexpr int kDirectForms = sizeof(kDirect) / sizeof(kDirect[0]);

// Configuration c of the build's kernel, or past them the direct forms.
cudaError_t launch_any(const deg::cuda::SmallGemmLaunch& a, int c) {
  if (c < deg::cuda::kSmallGemmConfigs) return deg::cuda::launch_small_gemm(a, c, 0);
  return kDirect[c - deg::cuda::kSmallGemmConfigs].launch(a, 0);
}
const char* name_of(int c) {
  return c < deg::cuda::kSmallGemmConfigs ? deg::cuda::small_gemm_config_name(c)
                                          : kDirect[c - deg::cuda::kSmallGemmConfigs].name;
}

// The latency of a chain of dependent mma.sync m16n8k16 (bf16, f32 accumulation) and the cost
// of C independent chains interleaved: clock cycles per mma, one warp alone on the GPU.
template <int C>
__global__ void mma_chain_kernel(int iters, long long* cycles, float* sink) {
  const uint32_t av = 0x3f803f80u + threadIdx.x, bv = 0x3c003c00u + threadIdx.x;
  float acc[C][4] = {};
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int c = 0; c < C; ++c)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
          "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
          : "r"(av), "r"(av), "r"(av), "r"(av), "r"(bv), "r"(bv));
  const long long t1 = clock64();
  float s = 0;
  for (int c = 0; c < C; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  sink[threadIdx.x] = s;
  if (threadIdx.x == 0) *cycles = t1 - t0;
}

template <int C>
void print_chain() {
  long long* cyc;
  float* sink;
  CK(cudaMalloc(&cyc, 8));
  CK(cudaMalloc(&sink, 128));
  const int iters = 4096;
  mma_chain_kernel<C><<<1, 32>>>(iters, cyc, sink);
  mma_chain_kernel<C><<<1, 32>>>(iters, cyc, sink);
  long long h = 0;
  CK(cudaMemcpy(&h, cyc, 8, cudaMemcpyDeviceToHost));
  printf("mma.sync m16n8k16 bf16: %d chain(s) interleaved, %.1f cycles per step (%.1f per mma)\n",
         C, double(h) / iters, double(h) / iters / C);
  cudaFree(cyc);
  cudaFree(sink);
}

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
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("%s, SM clock %d MHz, %d SMs, L2 %d MB\n", prop.name, clock_khz / 1000,
         prop.multiProcessorCount, prop.l2CacheSize >> 20);
  print_chain<1>();
  print_chain<2>();
  print_chain<4>();
  print_chain<8>();
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
      for (int cfg = 0; cfg < deg::cuda::kSmallGemmConfigs + kDirectForms; ++cfg) {
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
          CK(launch_any(a, cfg));
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
        printf("  %-44s %6.1f us (%.2f TB/s, x%.2f), %zu of %zu differ\n", name_of(cfg), us,
               gb / us * 1e3, lt_us / us, differ, 2 * mine.size());
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
