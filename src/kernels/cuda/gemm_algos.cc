// The CUDA backend's GEMM algorithms (cuda_ops.h): cuBLASLt descriptors and layouts, the pinned
// algorithm of each shape, the per-class choices tune verifies to give the pinned bits, and
// cuBLASLt's own per-M choice for the benchmark's comparison.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/stream.h"

namespace deg::cuda_backend {

const MatmulDesc& CudaOps::desc(cublasOperation_t ta, cublasOperation_t tb) const {
  auto& d = descs_[size_t(ta == CUBLAS_OP_T) * 2 + size_t(tb == CUBLAS_OP_T)];
  if (!d) d = std::make_unique<MatmulDesc>(ta, tb);
  return *d;
}

const Layout& CudaOps::layout(cudaDataType t, int64_t rows, int64_t cols, int64_t ld) const {
  const auto key = std::make_tuple(int(t), rows, cols, ld);
  auto it = layouts_.find(key);
  if (it != layouts_.end()) return *it->second;
  return *layouts_.emplace(key, std::make_unique<Layout>(t, uint64_t(rows), uint64_t(cols), ld))
              .first->second;
}

const CudaOps::Heuristic& CudaOps::heuristic_algo(const MatmulDesc& desc, const Layout& la,
                                                  const Layout& lb, const Layout& lc,
                                                  const LtGemm& g) const {
  const GemmKey key = g.key(g.n, 0);
  if (auto it = heuristics_.find(key); it != heuristics_.end()) return it->second;
  cublasLtMatmulPreference_t pref = nullptr;
  check_blas(cuda::cublaslt().MatmulPreferenceCreate(&pref), "preference");
  const uint64_t workspace = uint64_t(64) << 20;
  cuda::cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof(workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cuda::cublaslt().MatmulAlgoGetHeuristic(blas_, desc.h, la.h, lb.h, lc.h,
                                                                    lc.h, pref, 1, &result, &found);
  cuda::cublaslt().MatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    check_blas(CUBLAS_STATUS_NOT_SUPPORTED, "heuristic");
  return heuristics_.emplace(key, Heuristic{result.algo, result.workspaceSize}).first->second;
}

void CudaOps::set_heuristic(bool on) const {
  std::lock_guard lock(mu_);
  heuristic_ = on;
}

void CudaOps::set_small_config(int config) const {
  DEG_CHECK(config >= -1 && config < cuda::kSmallGemmConfigs, "no small-M configuration {}",
            config);
  std::lock_guard lock(mu_);
  small_config_ = config;
}

const cublasLtMatmulAlgo_t& CudaOps::pinned_algo(const MatmulDesc& desc, const LtGemm& g, int align,
                                                 Pin pin, int* own) const {
  if (own) *own = kCublas;
  const GemmKey every = g.key(-1, align), exact = g.key(g.n, align);
  if (pin != Pin::this_n) {
    auto it = algos_.find(every);
    if (it == algos_.end()) {
      constexpr int64_t kProbeN = 1024;
      std::optional<cublasLtMatmulAlgo_t> a = first_running(desc, g, align, kProbeN, 1);
      if (!a) a = first_running(desc, g, align, 1, kProbeN);
      it = algos_.emplace(every, a).first;
    }
    if (it->second && pin == Pin::every_n) {
      auto t = tuned_.find(every);
      if (t == tuned_.end()) {
        // Inside a stream capture (a CUDA graph being recorded) nothing may synchronize or
        // allocate: the pinned choice serves, and the shape is tuned at its next use outside.
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream_, &capture) != cudaSuccess) {
          cudaGetLastError();
          return *it->second;
        }
        if (capture != cudaStreamCaptureStatusNone) return *it->second;
        std::optional<Tuned> made = tune(desc, g, align, *it->second);
        if (!made) return *it->second;  // not remembered: its next use tries again
        t = tuned_.emplace(every, *made).first;
      }
      size_t c = 0;
      while (g.n > kTunedUpTo[c]) ++c;
      if (own && c < kOwnClasses) *own = t->second.own[c];
      return t->second.by_class[c];
    }
    if (it->second) return *it->second;
    if (pin == Pin::every_n) no_algorithm(g, align, "for every n");
  }
  auto it = algos_.find(exact);
  if (it == algos_.end()) it = algos_.emplace(exact, first_running(desc, g, align, g.n, g.n)).first;
  if (!it->second) no_algorithm(g, align, "for this n");
  return *it->second;
}

namespace {

// Random operand values in [-1, 1) as t's bytes (bf16 or f32), from a fixed seed.
std::vector<uint8_t> random_operand(cudaDataType t, size_t count, uint32_t seed) {
  const size_t bytes = t == CUDA_R_32F ? 4 : 2;
  std::vector<uint8_t> out(count * bytes);
  uint32_t x = seed;
  for (size_t i = 0; i < count; ++i) {
    x = x * 1664525u + 1013904223u;
    const float v = float(int32_t(x >> 8) - (1 << 23)) / float(1 << 23);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if (bytes == 4) {
      std::memcpy(out.data() + i * 4, &u, 4);
    } else {
      const uint16_t h = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

// What tune allocates on the device, released whatever way it returns (a capture still open is
// closed first).
struct TuneScratch {
  cudaStream_t ts = nullptr;
  void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;  // a: the weight's copies
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaGraphExec_t exec = nullptr;
  TuneScratch() = default;
  TuneScratch(const TuneScratch&) = delete;
  TuneScratch& operator=(const TuneScratch&) = delete;
  ~TuneScratch() {
    if (ts) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(ts, &capture) == cudaSuccess &&
          capture != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = nullptr;
        cudaStreamEndCapture(ts, &g);
        if (g) cudaGraphDestroy(g);
      }
      for (void* p : {a, b, c, d})
        if (p) cudaFreeAsync(p, ts);
      cudaStreamSynchronize(ts);
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (ts) cudaStreamDestroy(ts);
    cudaGetLastError();  // nothing here is the caller's error
  }
};

}  // namespace

std::optional<CudaOps::Tuned> CudaOps::tune(const MatmulDesc& desc, const LtGemm& g, int align,
                                            const cublasLtMatmulAlgo_t& base) const {
  Tuned tuned;
  tuned.by_class.fill(base);
  tuned.own.fill(kCublas);
  if (g.tb != CUBLAS_OP_N) return tuned;  // B's stride is tied to n: one algorithm for every n
  // Vocabulary-sized products (a [V, C] LM head) are left alone: timing them would take seconds
  // and gigabytes.
  if (g.m * g.k > (int64_t(1) << 26)) return tuned;
  try {
    std::vector<cublasLtMatmulAlgo_t> cand{base};
    for (int64_t probe : {int64_t(1024), int64_t(64)})
      for (const cublasLtMatmulAlgo_t& a : candidates(desc, g, align, probe, 1))
        if (std::none_of(cand.begin(), cand.end(), [&](const auto& c) { return same_algo(c, a); }))
          cand.push_back(a);
    // Shapes our small-M kernel takes (cuda::small_gemm_fits, at every n <= 64).
    const bool own_eligible = g.small_m_operands() && align == 16 && g.m % 8 == 0 && g.k % 16 == 0;
    if (cand.size() == 1 && !own_eligible) return tuned;

    constexpr int64_t kVerifyN = 293;  // two full 128-column tiles and a ragged one
    constexpr std::array<int64_t, kSizeClasses> kTimeN = {16, 64, 512, 2048};
    constexpr int64_t kLargeN = 65536;  // the largest class must at least accept this n
    const int64_t nmax = kTimeN.back();
    const size_t a_count = size_t(g.lda) * size_t(g.a_cols()),
                 b_count = size_t(g.ldb) * size_t(nmax), d_count = size_t(g.ldd) * size_t(nmax),
                 c_count = size_t(g.ldd) * size_t(kVerifyN);
    const std::vector<uint8_t> ah = random_operand(g.at, a_count, 17),
                               bh = random_operand(g.bt, b_count, 29),
                               ch = random_operand(CUDA_R_32F, c_count, 41);
    // Copies of the weight for the timed calls to rotate through: twice L2 of them (5 .. 16: more
    // calls would lengthen a shape's first use), so that each call reads its weight from memory
    // as a decode step's layers do; within 256 MB.
    int l2_bytes = 0, device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess)
      return std::nullopt;
    const size_t room = (size_t(256) << 20) / ah.size();
    const int copies = std::max(
        1,
        int(std::min<size_t>(
            room, std::clamp<size_t>((2 * size_t(l2_bytes) + ah.size() - 1) / ah.size(), 5, 16))));
    const int calls = std::max(copies, 5);  // a timed graph's calls, each on the next copy
    TuneScratch m;
    // Stream-ordered memory from the pool the backend's own allocations use. A failure here
    // leaves the shape untuned for now (not remembered: its next use tries again).
    if (cudaStreamSynchronize(stream_) != cudaSuccess ||
        cudaStreamCreateWithFlags(&m.ts, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMallocAsync(&m.a, ah.size() * size_t(copies), m.ts) != cudaSuccess ||
        cudaMallocAsync(&m.b, bh.size(), m.ts) != cudaSuccess ||
        cudaMallocAsync(&m.c, ch.size(), m.ts) != cudaSuccess ||
        cudaMallocAsync(&m.d, d_count * sizeof(float), m.ts) != cudaSuccess ||
        cudaMemcpyAsync(m.a, ah.data(), ah.size(), cudaMemcpyHostToDevice, m.ts) != cudaSuccess ||
        cudaMemcpyAsync(m.b, bh.data(), bh.size(), cudaMemcpyHostToDevice, m.ts) != cudaSuccess ||
        cudaMemcpyAsync(m.c, ch.data(), ch.size(), cudaMemcpyHostToDevice, m.ts) != cudaSuccess ||
        cudaEventCreate(&m.e0) != cudaSuccess || cudaEventCreate(&m.e1) != cudaSuccess)
      return std::nullopt;
    for (int i = 1; i < copies; ++i)
      if (cudaMemcpyAsync(static_cast<char*>(m.a) + ah.size() * size_t(i), ah.data(), ah.size(),
                          cudaMemcpyHostToDevice, m.ts) != cudaSuccess)
        return std::nullopt;
    if (cudaStreamSynchronize(m.ts) != cudaSuccess) return std::nullopt;
    const Layout la(g.at, uint64_t(g.a_rows()), uint64_t(g.a_cols()), g.lda);
    auto weight = [&](int copy) {
      return static_cast<const char*>(m.a) + ah.size() * size_t(copy % copies);
    };
    auto run = [&](const cublasLtMatmulAlgo_t& algo, int64_t n, float beta, int copy) {
      const Layout lb(g.bt, uint64_t(g.k), uint64_t(n), g.ldb),
          ld(CUDA_R_32F, uint64_t(g.m), uint64_t(n), g.ldd);
      const float alpha = 1.0f;
      return cuda::cublaslt().Matmul(blas_, desc.h, &alpha, weight(copy), la.h, m.b, lb.h, &beta,
                                     m.d, ld.h, m.d, ld.h, &algo, nullptr, 0,
                                     m.ts) == CUBLAS_STATUS_SUCCESS;
    };
    // Our small-M kernel (configuration `config`) at n <= 64 columns.
    auto run_own = [&](int config, int64_t n, float beta, int copy) {
      const cuda::SmallGemmLaunch l{.x = static_cast<const uint16_t*>(m.b),
                                    .ldx = g.ldb,
                                    .w = reinterpret_cast<const uint16_t*>(weight(copy)),
                                    .y = static_cast<float*>(m.d),
                                    .ldy = g.ldd,
                                    .m = n,
                                    .n = g.m,
                                    .k = g.k,
                                    .accumulate = beta != 0.0f};
      return cuda::small_gemm_fits(l) && cuda::launch_small_gemm(l, config, m.ts) == cudaSuccess;
    };
    const Layout lb_large(g.bt, uint64_t(g.k), uint64_t(kLargeN), g.ldb),
        ld_large(CUDA_R_32F, uint64_t(g.m), uint64_t(kLargeN), g.ldd);
    auto runs_large = [&](const cublasLtMatmulAlgo_t& algo) {
      cublasLtMatmulHeuristicResult_t r{};
      return cuda::cublaslt().MatmulAlgoCheck(blas_, desc.h, la.h, lb_large.h, ld_large.h,
                                              ld_large.h, &algo, &r) == CUBLAS_STATUS_SUCCESS;
    };
    // Bits: D from C, then D (+)= A B (call(beta)) at the first `columns` columns, read back.
    auto result = [&](const std::function<bool(float)>& call, int64_t columns, float beta,
                      std::vector<uint8_t>& out) {
      const size_t bytes = size_t(g.ldd) * size_t(columns) * sizeof(float);
      out.resize(bytes);
      return cudaMemcpyAsync(m.d, m.c, bytes, cudaMemcpyDeviceToDevice, m.ts) == cudaSuccess &&
             call(beta) &&
             cudaMemcpyAsync(out.data(), m.d, bytes, cudaMemcpyDeviceToHost, m.ts) == cudaSuccess &&
             cudaStreamSynchronize(m.ts) == cudaSuccess;
    };
    auto result_of = [&](const cublasLtMatmulAlgo_t& algo, float beta, std::vector<uint8_t>& out) {
      return result([&](float b) { return run(algo, kVerifyN, b, 0); }, kVerifyN, beta, out);
    };
    // Time per call (ms): the median of three launches of a graph of `calls` calls (call(i): the
    // i-th, each on the next copy of the weight), over `calls`; < 0: failed.
    auto time_of = [&](const std::function<bool(int)>& call) {
      cudaGraph_t graph = nullptr;
      if (cudaStreamBeginCapture(m.ts, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return -1.0f;
      bool ok = true;
      for (int i = 0; i < calls && ok; ++i) ok = call(i);
      ok = cudaStreamEndCapture(m.ts, &graph) == cudaSuccess && ok;
      ok = ok && cudaGraphInstantiate(&m.exec, graph, 0) == cudaSuccess;
      if (graph) cudaGraphDestroy(graph);
      std::array<float, 3> ms{};
      ok = ok && cudaGraphLaunch(m.exec, m.ts) == cudaSuccess;  // warm-up
      for (float& t : ms) {
        ok = ok && cudaEventRecord(m.e0, m.ts) == cudaSuccess &&
             cudaGraphLaunch(m.exec, m.ts) == cudaSuccess &&
             cudaEventRecord(m.e1, m.ts) == cudaSuccess &&
             cudaEventSynchronize(m.e1) == cudaSuccess &&
             cudaEventElapsedTime(&t, m.e0, m.e1) == cudaSuccess;
      }
      if (m.exec) cudaGraphExecDestroy(m.exec);
      m.exec = nullptr;
      cudaGetLastError();
      std::sort(ms.begin(), ms.end());
      return ok ? ms[1] / float(calls) : -1.0f;
    };

    auto time_at = [&](const cublasLtMatmulAlgo_t& algo, int64_t n) {
      return time_of([&](int i) { return run(algo, n, 0.0f, i); });
    };

    std::vector<uint8_t> ref0, ref1, got;
    if (!result_of(base, 0.0f, ref0) || !result_of(base, 1.0f, ref1)) return std::nullopt;
    std::array<float, kSizeClasses> best{};
    for (size_t c = 0; c < kSizeClasses; ++c) best[c] = time_at(base, kTimeN[c]);
    int verified = 1;
    for (size_t i = 1; i < cand.size(); ++i) {
      if (!result_of(cand[i], 0.0f, got) || got != ref0 || !result_of(cand[i], 1.0f, got) ||
          got != ref1)
        continue;
      ++verified;
      const bool large = runs_large(cand[i]);
      for (size_t c = 0; c < kSizeClasses; ++c) {
        if (c + 1 == kSizeClasses && !large) continue;
        const float t = time_at(cand[i], kTimeN[c]);
        // A clear gain only: timing noise must not move the choice back and forth.
        if (t > 0 && (best[c] <= 0 || t < 0.97f * best[c])) {
          best[c] = t;
          tuned.by_class[c] = cand[i];
        }
      }
    }
    // Our small-M kernel for the classes of n <= 64: its bits against the pinned choice's first
    // 64 columns, then its time at each class's n.
    constexpr int64_t kOwnN = kTunedUpTo[kOwnClasses - 1];
    int own_verified = 0;
    for (int config = 0; own_eligible && config < cuda::kSmallGemmConfigs; ++config) {
      auto own = [&](float beta) { return run_own(config, kOwnN, beta, 0); };
      if (!result(own, kOwnN, 0.0f, got) || !std::equal(got.begin(), got.end(), ref0.begin()) ||
          !result(own, kOwnN, 1.0f, got) || !std::equal(got.begin(), got.end(), ref1.begin()))
        continue;
      ++own_verified;
      for (int c = 0; c < kOwnClasses; ++c) {
        const float t = time_of([&](int i) { return run_own(config, kTimeN[c], 0.0f, i); });
        if (t > 0 && (best[c] <= 0 || t < 0.97f * best[c])) {
          best[c] = t;
          tuned.own[c] = config;
        }
      }
    }
    auto ours = [&](int c) {
      return tuned.own[c] != kCublas ? fmt::format("; n <= {} runs ours ({})", kTunedUpTo[c],
                                                   cuda::small_gemm_config_name(tuned.own[c]))
                                     : std::string();
    };
    log::debug(
        "cuBLASLt [{}, {}] x [{}, n]: {} of {} candidates and {} of {} small-M configurations of "
        "ours give the pinned bits; {:.1f} / {:.1f} / {:.1f} / {:.1f} us at n = 16 / 64 / 512 / "
        "2048 (negative: the timing failed){}{}",
        g.m, g.k, g.k, verified, cand.size(), own_verified,
        own_eligible ? cuda::kSmallGemmConfigs : 0, best[0] * 1000, best[1] * 1000, best[2] * 1000,
        best[3] * 1000, ours(0), ours(1));
    return tuned;
  } catch (...) {  // host memory, cuBLASLt descriptors: the pinned choice serves meanwhile
    cudaGetLastError();
    return std::nullopt;
  }
}
void CudaOps::no_algorithm(const LtGemm& g, int align, const char* which) {
  throw Error(ErrorKind::unsupported,
              fmt::format("cuBLASLt has no algorithm without workspace and split-K {} for a [{}, "
                          "{}] x [{}, {}] product at {}-byte alignment",
                          which, g.m, g.k, g.k, g.n, align));
}

std::optional<cublasLtMatmulAlgo_t> CudaOps::first_running(const MatmulDesc& desc, const LtGemm& g,
                                                           int align, int64_t probe,
                                                           int64_t check) const {
  std::vector<cublasLtMatmulAlgo_t> all = candidates(desc, g, align, probe, check);
  if (all.empty()) return std::nullopt;
  return all.front();
}

std::vector<cublasLtMatmulAlgo_t> CudaOps::candidates(const MatmulDesc& desc, const LtGemm& g,
                                                      int align, int64_t probe,
                                                      int64_t check) const {
  Layout la(g.at, uint64_t(g.a_rows()), uint64_t(g.a_cols()), g.lda),
      lb(g.bt, uint64_t(g.b_rows(probe)), uint64_t(g.b_cols(probe)), g.ldb),
      lc(CUDA_R_32F, uint64_t(g.m), uint64_t(probe), g.ldd);
  const PinnedPreference pref(uint32_t(std::min<int>(align, int(element_bytes(g.at)) * 8)),
                              uint32_t(align));
  cublasLtMatmulHeuristicResult_t results[8] = {};
  int found = 0;
  const cublasStatus_t s = cuda::cublaslt().MatmulAlgoGetHeuristic(
      blas_, desc.h, la.h, lb.h, lc.h, lc.h, pref.h, 8, results, &found);
  Layout lb1(g.bt, uint64_t(g.b_rows(check)), uint64_t(g.b_cols(check)), g.ldb),
      lc1(CUDA_R_32F, uint64_t(g.m), uint64_t(check), g.ldd);
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < found && s == CUBLAS_STATUS_SUCCESS; ++i) {
    // At the probe's own n the heuristic's answer stands without AlgoCheck (which, on an H200,
    // left no candidate for [50304, 768] bf16 at n = 320 standing, or the heuristic found none:
    // the message did not say which).
    if (check == probe) {
      if (results[i].workspaceSize == 0) out.push_back(results[i].algo);
      continue;
    }
    cublasLtMatmulHeuristicResult_t r{};
    if (cuda::cublaslt().MatmulAlgoCheck(blas_, desc.h, la.h, lb1.h, lc1.h, lc1.h, &results[i].algo,
                                         &r) == CUBLAS_STATUS_SUCCESS &&
        r.workspaceSize == 0)
      out.push_back(results[i].algo);
  }
  return out;
}

void CudaOps::run_batched_gemm(const LtGemm& g, int64_t batch, int64_t stride_a, int64_t stride_b,
                               int64_t stride_d, const void* A, const void* B, float* D,
                               bool accumulate) const {
  const size_t ea = element_bytes(g.at), eb = element_bytes(g.bt);
  const int align = alignment_of(
      {uint64_t(reinterpret_cast<uintptr_t>(A)), uint64_t(g.lda) * ea, uint64_t(stride_a) * ea,
       uint64_t(reinterpret_cast<uintptr_t>(B)), uint64_t(g.ldb) * eb, uint64_t(stride_b) * eb,
       uint64_t(reinterpret_cast<uintptr_t>(D)), uint64_t(g.ldd) * 4, uint64_t(stride_d) * 4});
  const MatmulDesc& desc = this->desc(g.ta, g.tb);
  const auto n = int32_t(batch);
  const Layout la(g.at, uint64_t(g.a_rows()), uint64_t(g.a_cols()), g.lda, n, stride_a),
      lb(g.bt, uint64_t(g.b_rows(g.n)), uint64_t(g.b_cols(g.n)), g.ldb, n, stride_b),
      lc(CUDA_R_32F, uint64_t(g.m), uint64_t(g.n), g.ldd, n, stride_d);
  const auto key = std::make_tuple(g.key(g.n, align), batch, stride_a, stride_b, stride_d);
  auto it = batched_algos_.find(key);
  if (it == batched_algos_.end()) {
    const PinnedPreference pref(uint32_t(std::min<int>(align, int(ea) * 8)), uint32_t(align));
    cublasLtMatmulHeuristicResult_t results[8] = {};
    int found = 0;
    const cublasStatus_t s = cuda::cublaslt().MatmulAlgoGetHeuristic(
        blas_, desc.h, la.h, lb.h, lc.h, lc.h, pref.h, 8, results, &found);
    std::optional<cublasLtMatmulAlgo_t> algo;
    for (int i = 0; i < found && s == CUBLAS_STATUS_SUCCESS && !algo; ++i)
      if (results[i].workspaceSize == 0) algo = results[i].algo;
    it = batched_algos_.emplace(key, algo).first;
  }
  if (!it->second) {  // a launch per product
    for (int64_t i = 0; i < batch; ++i)
      run_gemm(g, static_cast<const char*>(A) + i * stride_a * int64_t(ea),
               static_cast<const char*>(B) + i * stride_b * int64_t(eb), D + i * stride_d,
               accumulate, Pin::this_n);
    return;
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_blas(cuda::cublaslt().Matmul(blas_, desc.h, &alpha, A, la.h, B, lb.h, &beta, D, lc.h, D,
                                     lc.h, &*it->second, nullptr, 0, stream_),
             "batched matmul");
}

namespace {

// How many equal k slices make a product with few output tiles fill the GPU twice over (1: no
// split): tiles counted at 128 x 128, at most 16 slices, each at least 1,024 deep and a
// multiple of 16 (so every slice's operands stay 32-byte aligned).
int64_t split_k_parts(const LtGemm& g) {
  constexpr int64_t kTile = 128, kMaxParts = 16, kMinDepth = 1024;
  const int64_t tiles = ((g.m + kTile - 1) / kTile) * ((g.n + kTile - 1) / kTile);
  const int64_t want = std::min(kMaxParts, (2 * cuda::sm_count() + tiles - 1) / tiles);
  for (int64_t p = want; p > 1; --p)
    if (g.k % p == 0 && (g.k / p) % 16 == 0 && g.k / p >= kMinDepth) return p;
  return 1;
}

}  // namespace

void CudaOps::run_split_gemm(const LtGemm& g, const void* A, const void* B, float* D,
                             bool accumulate) const {
  const int64_t parts = split_k_parts(g);
  if (parts == 1) {
    run_gemm(g, A, B, D, accumulate, Pin::this_n);
    return;
  }
  LtGemm slice = g;
  slice.k = g.k / parts;
  slice.ldd = g.m;
  // A slice's step along k: A is m x k (ta N, column j of k at j lda) or k x m (ta T: row j at
  // j); B is k x n (tb N) or n x k (tb T).
  const int64_t stride_a = g.ta == CUBLAS_OP_N ? slice.k * g.lda : slice.k;
  const int64_t stride_b = g.tb == CUBLAS_OP_N ? slice.k : slice.k * g.ldb;
  float* p = static_cast<float*>(scratch(12, size_t(parts * g.m * g.n) * sizeof(float)));
  run_batched_gemm(slice, parts, stride_a, stride_b, g.m * g.n, A, B, p, false);
  check(cuda::launch_sum_parts(p, parts, D, g.ldd, g.n, g.m, accumulate, stream_), "split-k sum");
}

}  // namespace deg::cuda_backend
