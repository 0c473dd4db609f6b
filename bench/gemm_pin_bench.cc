// The pinned GEMM algorithm against the others it could have been (GPU). The CUDA backend runs
// every projection through one cuBLASLt algorithm per weight shape, for every M (no workspace,
// no split-K; docs/cuda.md), so a row's bits never depend on its batch. This bench lists, for
// each projection shape of Qwen3.5-0.8B (bf16 weights, x rounded to bf16, f32 accumulation and
// output, as `--gemm bf16` runs them), every algorithm cuBLASLt's heuristic offers under those
// rules at M = 1, 64 and 1024, and for each one:
//   - its time on the GPU at M = 1, 64, 1536 and 4096 (median of --repeats launches of a CUDA
//     graph of 20 calls: host overhead left out);
//   - whether a row computed alone has the same bits as the same row in a batch of 4096;
//   - whether its results are bitwise those of the algorithm pinned today (marked *).
//   gemm_pin_bench [--repeats N]
#include <cstdio>
#include <cstring>
#include <string>

#ifdef DEG_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_ops.h"

namespace {

void need(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "gemm_pin_bench: %s failed\n", what);
    std::exit(1);
  }
}
void cu(cudaError_t e, const char* what) {
  need(e == cudaSuccess, what);
}
void lt(cublasStatus_t s, const char* what) {
  need(s == CUBLAS_STATUS_SUCCESS, what);
}

struct Shape {
  const char* what;
  int64_t n, k;  // weight [n, k]
  bool accumulate;
};

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  Layouts(const Shape& s, int64_t m) {
    lt(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.n), s.k), "layout");
    lt(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, uint64_t(s.k), uint64_t(m), s.k), "layout");
    lt(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, uint64_t(s.n), uint64_t(m), s.n), "layout");
  }
  ~Layouts() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
  }
};

std::string describe(const cublasLtMatmulAlgo_t& a) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written);
    return v;
  };
  char buf[160];
  std::snprintf(buf, sizeof buf, "id %u tile %u stages %u cluster %u swizzle %u custom %u",
                get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                get(CUBLASLT_ALGO_CONFIG_STAGES_ID), get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::printf("usage: gemm_pin_bench [--repeats N]\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  const Shape shapes[] = {
      {"linear attention in_proj (qkv|z|b|a)", 8224, 1024, false},
      {"linear attention out_proj (+=)", 1024, 2048, true},
      {"attention q_proj (q|gate)", 4096, 1024, false},
      {"attention k|v", 1024, 1024, false},
      {"attention o_proj (+=)", 1024, 2048, true},
      {"MLP gate|up", 7168, 1024, false},
      {"MLP down (+=)", 1024, 3584, true},
  };
  const int64_t kMax = 4096, kTimed[] = {1, 64, 1536, 4096};
  cudaDeviceProp prop{};
  cu(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("gemm_pin_bench on %s (%d SMs), cuBLASLt %zu\n", prop.name, prop.multiProcessorCount,
              cublasLtGetVersion());
  cublasLtHandle_t h;
  lt(cublasLtCreate(&h), "cublasLtCreate");
  const deg::cuda_backend::MatmulDesc md(CUBLAS_OP_T, CUBLAS_OP_N);  // the projections' form
  const cublasLtMatmulDesc_t desc = md.h;
  const deg::cuda_backend::PinnedPreference pref(16, 16);  // the backend's rules, aligned buffers
  cudaStream_t stream;
  cu(cudaStreamCreate(&stream), "stream");
  cudaEvent_t e0, e1;
  cu(cudaEventCreate(&e0), "event");
  cu(cudaEventCreate(&e1), "event");

  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Shape& s : shapes) {
    std::vector<uint16_t> wh(size_t(s.n * s.k)), xh(size_t(kMax * s.k));
    for (auto& v : wh) v = to_bf16(u(rng) * 0.05f);
    for (auto& v : xh) v = to_bf16(u(rng));
    void *w, *x, *x1;
    float *d, *d1;
    cu(cudaMalloc(&w, wh.size() * 2), "malloc");
    cu(cudaMalloc(&x, xh.size() * 2), "malloc");
    cu(cudaMalloc(&x1, size_t(s.k) * 2), "malloc");
    cu(cudaMalloc(&d, size_t(s.n * kMax) * 4), "malloc");
    cu(cudaMalloc(&d1, size_t(s.n) * 4), "malloc");
    cu(cudaMemcpy(w, wh.data(), wh.size() * 2, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice), "copy");
    const int64_t probe_row = 1234;
    cu(cudaMemcpy(x1, xh.data() + probe_row * s.k, size_t(s.k) * 2, cudaMemcpyHostToDevice),
       "copy");

    // The candidates: the heuristic's answers at M = 1024 (first: the pinned rule), 64 and 1.
    std::vector<cublasLtMatmulAlgo_t> algos;
    int pinned = -1;
    Layouts one(s, 1), big(s, kMax);
    for (int64_t probe : {int64_t(1024), int64_t(64), int64_t(1)}) {
      Layouts l(s, probe);
      cublasLtMatmulHeuristicResult_t res[32] = {};
      int found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(h, desc, l.a, l.b, l.d, l.d, pref.h, 32, res, &found);
      int kept = 0;
      for (int i = 0; i < found; ++i) {
        if (res[i].workspaceSize != 0) continue;
        cublasLtMatmulHeuristicResult_t r1{}, r2{};
        const cublasStatus_t c1 =
            cublasLtMatmulAlgoCheck(h, desc, one.a, one.b, one.d, one.d, &res[i].algo, &r1);
        const cublasStatus_t c2 =
            cublasLtMatmulAlgoCheck(h, desc, big.a, big.b, big.d, big.d, &res[i].algo, &r2);
        // (At M = 4096 the check asks for 4 bytes of workspace; the backend runs every M without
        // any, as the pinned rule does.)
        if (c1 != CUBLAS_STATUS_SUCCESS || r1.workspaceSize != 0 || c2 != CUBLAS_STATUS_SUCCESS) {
          std::fprintf(stderr,
                       "  M=%lld candidate %d: check at M=1 %d (%zu B), at M=%lld %d (%zu B)\n",
                       (long long)probe, i, int(c1), r1.workspaceSize, (long long)kMax, int(c2),
                       r2.workspaceSize);
          continue;
        }
        ++kept;
        bool seen = false;
        for (const auto& a : algos) seen = seen || std::memcmp(&a, &res[i].algo, sizeof(a)) == 0;
        if (seen) continue;
        if (probe == 1024 && pinned < 0) pinned = int(algos.size());
        algos.push_back(res[i].algo);
      }
      if (kept == 0)
        std::fprintf(stderr, "  heuristic at M=%lld: status %d, %d found, none kept\n",
                     (long long)probe, int(st), found);
    }
    std::printf("\n%s: [%lld, %lld] weight%s, %zu algorithms\n", s.what, (long long)s.n,
                (long long)s.k, s.accumulate ? ", accumulating" : "", algos.size());
    std::printf("  %-58s %9s %9s %9s %9s  %-7s %s\n", "algorithm", "M=1 us", "M=64", "M=1536",
                "M=4096", "row==", "bits==pinned");
    const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
    std::vector<float> ref, out(size_t(s.n * kMax)), row(size_t(s.n));
    std::map<int64_t, std::unique_ptr<Layouts>> layouts;  // by M, made once
    auto run = [&](const cublasLtMatmulAlgo_t& a, int64_t m, const void* xp, float* dp) {
      auto& l = layouts[m];
      if (!l) l = std::make_unique<Layouts>(s, m);
      return cublasLtMatmul(h, desc, &alpha, w, l->a, xp, l->b, &beta, dp, l->d, dp, l->d, &a,
                            nullptr, 0, stream);
    };
    std::vector<int> order(algos.size());
    for (size_t i = 0; i < algos.size(); ++i) order[i] = int(i);
    if (pinned > 0) std::swap(order[0], order[size_t(pinned)]);
    double best[4] = {1e30, 1e30, 1e30, 1e30}, pinned_us[4] = {};
    for (int i : order) {
      double us[4] = {};
      bool ok = true;
      for (int t = 0; t < 4 && ok; ++t) {
        const int64_t m = kTimed[t];
        // 20 calls as one CUDA graph: the GPU's time, not the host's cost of issuing them.
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        cu(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
        for (int c = 0; c < 20 && ok; ++c) ok = run(algos[size_t(i)], m, x, d) == 0;
        cu(cudaStreamEndCapture(stream, &graph), "capture");
        if (!ok) break;
        cu(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
        cu(cudaGraphLaunch(exec, stream), "warm-up");
        std::vector<float> times;
        for (int r = 0; r < repeats; ++r) {
          cu(cudaEventRecord(e0, stream), "record");
          cu(cudaGraphLaunch(exec, stream), "launch");
          cu(cudaEventRecord(e1, stream), "record");
          cu(cudaEventSynchronize(e1), "sync");
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          times.push_back(ms * 1e3f / 20);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        if (!ok) break;
        std::sort(times.begin(), times.end());
        us[t] = times[times.size() / 2];
      }
      if (!ok) {
        std::printf("  %-58s failed to run\n", describe(algos[size_t(i)]).c_str());
        continue;
      }
      for (int t = 0; t < 4; ++t) {
        best[t] = std::min(best[t], us[t]);
        if (i == pinned) pinned_us[t] = us[t];
      }
      // Bits: the batch of 4096 (from zero), the probe row alone (from zero).
      cu(cudaMemsetAsync(d, 0, size_t(s.n * kMax) * 4, stream), "memset");
      cu(cudaMemsetAsync(d1, 0, size_t(s.n) * 4, stream), "memset");
      need(run(algos[size_t(i)], kMax, x, d) == 0 && run(algos[size_t(i)], 1, x1, d1) == 0, "run");
      cu(cudaMemcpy(out.data(), d, out.size() * 4, cudaMemcpyDeviceToHost), "copy");
      cu(cudaMemcpy(row.data(), d1, row.size() * 4, cudaMemcpyDeviceToHost), "copy");
      const bool row_same =
          std::memcmp(row.data(), out.data() + probe_row * s.n, size_t(s.n) * 4) == 0;
      if (ref.empty()) ref = out;
      const bool same = std::memcmp(ref.data(), out.data(), out.size() * 4) == 0;
      std::printf("  %c %-56s %9.2f %9.2f %9.2f %9.2f  %-7s %s\n", i == pinned ? '*' : ' ',
                  describe(algos[size_t(i)]).c_str(), us[0], us[1], us[2], us[3],
                  row_same ? "yes" : "NO", same ? "yes" : "no");
    }
    if (pinned >= 0)
      std::printf("  fastest / pinned: M=1 %.2f, M=64 %.2f, M=1536 %.2f, M=4096 %.2f\n",
                  best[0] / pinned_us[0], best[1] / pinned_us[1], best[2] / pinned_us[2],
                  best[3] / pinned_us[3]);
    cudaFree(w);
    cudaFree(x);
    cudaFree(x1);
    cudaFree(d);
    cudaFree(d1);
  }
  return 0;
}

#else
int main() {
  std::printf("gemm_pin_bench: built without CUDA (nothing to measure)\n");
  return 0;
}
#endif
