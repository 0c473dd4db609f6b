// The CUDA backend's class (kernels/ops.h), shared by its three files: ops.cc (memory, GEMMs
// through cuBLASLt, the forward ops, the profile decorator), gemm_algos.cc (which cuBLASLt
// algorithm each GEMM runs) and ops_train.cc (the training ops: backward, optimizer steps, the
// fused loss). Internal to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/stream.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace deg::cuda_backend {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorKind::internal, fmt::format("CUDA {}: {}", what, cudaGetErrorString(e)));
  }
}

inline void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorKind::internal, fmt::format("cuBLASLt {}: status {}", what, int(s)));
  }
}

[[noreturn]] inline void not_on_cuda(const char* op) {
  throw Error(
      ErrorKind::unsupported,
      fmt::format("the CUDA backend has no {} op yet; run this model with --device cpu", op));
}

// The largest power of two (up to 16) dividing every address and byte stride: what vector
// widths a GEMM kernel may assume.
inline int alignment_of(std::initializer_list<uint64_t> values) {
  int a = 16;
  for (uint64_t v : values)
    while (a > 1 && v % uint64_t(a)) a /= 2;
  return a;
}

// One cuBLASLt matrix layout, released with the object.
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
    check_blas(cuda::cublaslt().MatrixLayoutCreate(&h, t, rows, cols, ld), "layout");
  }
  // `batch` matrices `stride` elements apart.
  Layout(cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld, int32_t batch, int64_t stride)
      : Layout(t, rows, cols, ld) {
    check_blas(cuda::cublaslt().MatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &batch, sizeof(batch)),
               "layout batch");
    check_blas(cuda::cublaslt().MatrixLayoutSetAttribute(
                   h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
               "layout stride");
  }
  ~Layout() { cuda::cublaslt().MatrixLayoutDestroy(h); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

// The search preference of pinned algorithms: no workspace, no split-K / stream-K reduction,
// operands aligned to a_align (A) and c_align (B, C, D) bytes. Released with the object.
struct PinnedPreference {
  cublasLtMatmulPreference_t h = nullptr;
  PinnedPreference(uint32_t a_align, uint32_t c_align) {
    check_blas(cuda::cublaslt().MatmulPreferenceCreate(&h), "preference");
    const uint64_t no_workspace = 0;
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    cuda::cublaslt().MatmulPreferenceSetAttribute(h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &no_workspace, sizeof(no_workspace));
    cuda::cublaslt().MatmulPreferenceSetAttribute(h, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &no_reduction, sizeof(no_reduction));
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      const uint32_t v = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES ? a_align : c_align;
      cuda::cublaslt().MatmulPreferenceSetAttribute(h, attr, &v, sizeof(v));
    }
  }
  ~PinnedPreference() { cuda::cublaslt().MatmulPreferenceDestroy(h); }
  PinnedPreference(const PinnedPreference&) = delete;
  PinnedPreference& operator=(const PinnedPreference&) = delete;
};

// f32 compute (no TF32) with op(A), op(B) as given.
struct MatmulDesc {
  cublasLtMatmulDesc_t h = nullptr;
  MatmulDesc(cublasOperation_t ta, cublasOperation_t tb) {
    check_blas(cuda::cublaslt().MatmulDescCreate(&h, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "matmul desc");
    check_blas(
        cuda::cublaslt().MatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        "transa");
    check_blas(
        cuda::cublaslt().MatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        "transb");
  }
  ~MatmulDesc() { cuda::cublaslt().MatmulDescDestroy(h); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
};

// How a GEMM's algorithm is pinned (CudaOps::pinned_algo): one for every n (a row's output never
// depends on the rows beside it: the projections), that where cuBLASLt has one and else one for
// this n, or one for this very n. Pinned algorithms take no workspace and no split-K.
enum class Pin : uint8_t { every_n, every_n_or_this_n, this_n };

// What the pinned and heuristic algorithm caches are keyed by (LtGemm::key).
using GemmKey = std::array<int64_t, 11>;

// One GEMM in cuBLASLt's column-major terms: D [m, n] (+)= op(A) · op(B) with f32 output, A
// stored m x k (ta N) or k x m (ta T) at lda, B k x n (tb N) or n x k (tb T) at ldb. The
// defaults are the forward projection's: A = W [N, K] read transposed, B = Xᵀ.
struct LtGemm {
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cudaDataType at = CUDA_R_32F, bt = CUDA_R_32F;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;

  int64_t a_rows() const { return ta == CUBLAS_OP_N ? m : k; }
  int64_t a_cols() const { return ta == CUBLAS_OP_N ? k : m; }
  int64_t b_rows(int64_t cols_of_d) const { return tb == CUBLAS_OP_N ? k : cols_of_d; }
  int64_t b_cols(int64_t cols_of_d) const { return tb == CUBLAS_OP_N ? cols_of_d : k; }
  // bf16 products of a contiguous weight: the operands our small-M kernel reads (gemm_small.cu).
  bool small_m_operands() const {
    return at == CUDA_R_16BF && bt == CUDA_R_16BF && ta == CUBLAS_OP_T && lda == k;
  }
  GemmKey key(int64_t n_key, int align) const {
    return {int64_t(ta), int64_t(tb), int64_t(at), int64_t(bt), m, n_key, k, lda, ldb, ldd, align};
  }
};

// Row tables by value, one launch per chunk of cuda::kRows rows.
template <class F>
inline void for_row_chunks(const RowTable& t, F&& launch) {
  for (int64_t first = 0; first < t.rows; first += cuda::kRows) {
    cuda::Rows r;
    r.count = int(std::min<int64_t>(cuda::kRows, t.rows - first));
    r.tokens = t.tokens;
    r.first = first;
    for (int i = 0; i < r.count; ++i) {
      r.length[i] = t.lengths[first + i];
      r.position[i] = t.positions[first + i];
    }
    launch(r, first);
  }
}

// ngram_embed's launch for one chunk of rows.
inline cuda::NgramLaunch ngram_launch(const NgramEmbedArgs& a, const cuda::Rows& r) {
  const Tensor& t = *a.table;
  cuda::NgramLaunch l{.rows = r,
                      .ids = a.ids,
                      .prev1 = a.prev1,
                      .prev2 = a.prev2,
                      .table = t.raw(),
                      .bf16 = t.dtype() == DType::bf16,
                      .table_rows = t.dim(0),
                      .dim = t.dim(1),
                      .sign_pool = a.sign_pool,
                      .sign_rows = a.sign_rows,
                      .y = a.y,
                      .ldy = a.ldy};
  std::copy(a.bigram_rows.begin(), a.bigram_rows.end(), l.bigram_rows);
  std::copy(a.trigram_rows.begin(), a.trigram_rows.end(), l.trigram_rows);
  std::copy(a.bigram_signs.begin(), a.bigram_signs.end(), l.bigram_signs);
  std::copy(a.trigram_signs.begin(), a.trigram_signs.end(), l.trigram_signs);
  return l;
}

inline cuda::KvRow kv_row(const RowView& v) {
  return {v.prefix_k, v.prefix_v, v.prefix_len, v.prefix_stride,
          v.own_k,    v.own_v,    v.own_before, v.own_stride};
}

inline cuda::StateRow state_row(const RowView& v) {
  return {v.rec_in, v.rec_out, v.tail_in, v.tail_out};
}

class CudaOps final : public Ops {
 public:
  CudaOps() {
    const std::vector<CudaDeviceInfo> devices = cuda_devices();
    if (devices.empty()) {
      throw Error(ErrorKind::unsupported,
                  "no CUDA GPU is visible (no driver, or CUDA_VISIBLE_DEVICES hides them); use "
                  "--device cpu");
    }
    if (devices[0].compute_capability != 90) {
      throw Error(ErrorKind::unsupported,
                  fmt::format("deg's CUDA kernels are built for Hopper (sm_90a); GPU 0 is {} "
                              "(compute capability {}.{}); use --device cpu",
                              devices[0].name, devices[0].compute_capability / 10,
                              devices[0].compute_capability % 10));
    }
    name_ = "cuda (" + devices[0].name + ")";
    stream_ = cuda::stream();
    check_blas(cuda::cublaslt().Create(&blas_), "create");
  }

  Device device() const override { return Device::cuda; }
  const char* name() const override { return name_.c_str(); }

  Tensor alloc(const Shape& shape, DType dtype) const override;
  Tensor upload(const Tensor& host) const override;
  void to_device(void* dst, const void* src, size_t bytes) const override;
  void to_host(void* dst, const void* src, size_t bytes) const override;
  void synchronize() const override { check(cudaStreamSynchronize(stream_), "synchronize"); }
  cudaStream_t stream() const { return stream_; }

  // ---- GEMM ----

  void gemm(const GemmArgs& a) const override;

  // y [M, N] at o (y, ldy, accumulate) from the weight rows at w ([N, K] of dtype dt).
  void gemm_one(const GemmArgs& a, const std::byte* w, DType dt, int64_t N, const void* xb,
                int64_t ldxb, const GemmOutput& o) const;

  // ---- row-wise ops ----

  void rms_norm(const NormArgs& a) const override;
  void l2_norm(const L2NormArgs& a) const override;
  void rope(const RopeArgs& a) const override;
  void kv_write(const KvWriteArgs& a) const override;
  void attention(const AttendArgs& a) const override;
  void causal_conv(const ConvArgs& a) const override;
  void delta_gates(const DeltaGatesArgs& a) const override;
  void delta_rule(const DeltaRuleOpArgs& a) const override;
  // A decode step's recurrence reads and writes each row's 1 MB state a layer (docs/cuda.md).
  bool prefers_delta_history() const override { return true; }

  // ---- elementwise ----

  void glu(const GluArgs& a) const override;
  void binary(const BinaryArgs& a) const override;
  void scale(const ScaleArgs& a) const override;
  void gather(const GatherArgs& a) const override;
  void softcap(const SoftcapArgs& a) const override;
  void logit_picks(const LogitPicksArgs& a) const override;
  void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t n) const override;
  void gather_rows(const float* x, int64_t ldx, const int32_t* index, float* y, int64_t ldy,
                   int64_t rows, int64_t n) const override;
  void transpose(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t cols) const override;

  // ---- the f32 row ops with f64 dot products, hashes and combinations (mixing.cu) ----

  void activation(const ActivationArgs& a) const override;
  void bias_scale(const BiasScaleArgs& a) const override;
  void combine(const CombineArgs& a) const override;
  void shift_ids(const ShiftIdsArgs& a) const override;
  void ngram_embed(const NgramEmbedArgs& a) const override;
  void sigmoid_gates(const SigmoidGateArgs& a) const override;
  void rope_pairs(const RopePairsArgs& a) const override;
  void attention_f64(const AttendF64Args& a) const override;
  void subtract_projection(const ProjectionArgs& a) const override;

  // ---- training (backward.cu; the product through cuBLASLt) ----

  void matmul(const MatmulOpArgs& a) const override;
  void rms_norm_backward(const NormBackwardArgs& a) const override;
  void activation_backward(const ActivationBackwardArgs& a) const override;
  void column_sum(const ColumnSumArgs& a) const override;
  void combine_backward(const CombineBackwardArgs& a) const override;
  void gather_backward(const GatherBackwardArgs& a) const override;
  void sigmoid_gates_backward(const SigmoidGatesBackwardArgs& a) const override;
  void subtract_projection_backward(const ProjectionBackwardArgs& a) const override;
  void ngram_embed_backward(const NgramBackwardArgs& a) const override;
  void attention_f64_backward(const AttendF64BackwardArgs& a) const override;

  // ---- optimizer steps (optimizer.cu) ----

  void adam_step(const AdamStepArgs& a) const override;
  void nesterov(const NesterovArgs& a) const override;
  void normuon_step(const NorMuonStepArgs& a) const override;
  double sum_squares(const float* x, int64_t n) const override;
  void frobenius_normalize(const FrobeniusNormalizeArgs& a) const override;

  // ---- softcap_cross_entropy: per chunk of rows, the logits GEMM (the projection's pinned
  // algorithm), the loss kernel (dz over the logits, or as bf16), then dxn += dz W and dw += dzᵀ
  // xn as pinned GEMMs without split-K: dw adds the chunks' products in chunk order. ----
  void softcap_cross_entropy(const SoftcapCrossEntropyArgs& a) const override;

 private:
  static cuda::CombineLaunch combine_launch(const CombineArgs& a);

  // Device memory for one op's work, freed once the stream has finished with it.
  class DeviceTemp {
   public:
    explicit DeviceTemp(size_t bytes) : data_(cuda_malloc(std::max<size_t>(bytes, 1))) {}
    ~DeviceTemp() { cuda_free(data_); }  // stream-ordered: after the work queued before
    DeviceTemp(const DeviceTemp&) = delete;
    DeviceTemp& operator=(const DeviceTemp&) = delete;
    void* get() const { return data_; }
    template <class T>
    T* as() const {
      return static_cast<T*>(data_);
    }

   private:
    void* data_;
  };

  // dtable rows [0, rows) += the terms of the entries whose keys (device, [entries]) are theirs,
  // each row's in entry order (grouped on the device: launch_row_order).
  void scatter(const int32_t* keys, int64_t entries, int64_t rows, int64_t cols,
               cuda::ScatterRowsLaunch l) const;

  // Device scratch `slot` of at least `bytes` (kept and grown; stream order makes reuse safe).
  // Callers hold mu_.
  void* scratch(int slot, size_t bytes) const;

  // y[M, N] (+)= x[M, K] · W[N, K]ᵀ in cuBLASLt's column-major terms: Yᵀ = W · Xᵀ, with W read
  // as a K x N matrix transposed and Xᵀ as K x M (n = M).
  void matmul(const void* w, cudaDataType wt, int64_t N, const void* x, cudaDataType xt,
              int64_t ldx, int64_t M, int64_t K, const GemmOutput& o, Pin pin = Pin::every_n) const;

  // D (+)= op(A) · op(B) for g (LtGemm) with a pinned algorithm (pinned_algo).
  void run_gemm(const LtGemm& g, const void* A, const void* B, float* D, bool accumulate,
                Pin pin) const;

  // The same for `batch` products, A, B and D stride_a, stride_b, stride_d elements apart: one
  // strided-batch launch by an algorithm of the same preference (no workspace, no split-K),
  // kept per shape; a product per launch (run_gemm) where cuBLASLt offers none.
  void run_batched_gemm(const LtGemm& g, int64_t batch, int64_t stride_a, int64_t stride_b,
                        int64_t stride_d, const void* A, const void* B, float* D,
                        bool accumulate) const;

  // A training product whose output has few tiles for its long k (a weight's gradient summed
  // over the tokens, the loss's d(xn) over the vocabulary): one pinned block per output tile
  // would keep a few multiprocessors busy, so k is cut into equal slices (split_k_parts), each
  // slice's product written as f32 partials by one strided-batch launch, and the partials added
  // to D in slice order. The same bits every run for a shape; not batch-invariant in n (the
  // slicing follows the tile count), so never on an inference path.
  void run_split_gemm(const LtGemm& g, const void* A, const void* B, float* D,
                      bool accumulate) const;

  static size_t element_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

  // The descriptor of (op(A), op(B)), made once per pair.
  const MatmulDesc& desc(cublasOperation_t ta, cublasOperation_t tb) const;

  // The cuBLASLt layout of a [cols, rows] column-major matrix (kept: creating one per call
  // costs host time on every GEMM of a decode step). Callers hold mu_; the cache only grows
  // here (run_gemm empties it between GEMMs when it is full, never while references are held).
  static constexpr size_t kMaxLayouts = 4096;
  const Layout& layout(cudaDataType t, int64_t rows, int64_t cols, int64_t ld) const;

  struct Heuristic {
    cublasLtMatmulAlgo_t algo;
    size_t workspace = 0;
  };

  // cuBLASLt's first choice for exactly this problem, M included, with up to 64 MiB of workspace
  // and any reduction (split-K, stream-K): what a batch-variant engine would run.
  const Heuristic& heuristic_algo(const MatmulDesc& desc, const Layout& la, const Layout& lb,
                                  const Layout& lc, const LtGemm& g) const;

 public:
  // The benchmark's switch between pinned (batch-invariant) and heuristic algorithms.
  void set_heuristic(bool on) const;
  // The tests' switch: our small-M configuration `config` wherever it fits, or -1: the tuning's.
  void set_small_config(int config) const;

 private:
  // The algorithm of a GEMM of this shape, dtypes, strides and alignment, without workspace
  // and without split-K reduction (neither stream-K fix-ups nor split-K sums, whose order would
  // depend on n). Pin::every_n: the pinned rule's choice — the heuristic's first for n = 1024
  // that also runs n = 1, else its first for n = 1 that also runs n = 1024 — or, per class of
  // n, a faster algorithm that gives the same bits (tune). Pin::this_n: one for this very n.
  // Pin::every_n_or_this_n: the pinned rule's choice where cuBLASLt has one, else this_n.
  // `own`, when given, is set to the configuration of our own small-M kernel (cuda::
  // launch_small_gemm) that tune chose for the class n falls in (Pin::every_n only), or kCublas.
  const cublasLtMatmulAlgo_t& pinned_algo(const MatmulDesc& desc, const LtGemm& g, int align,
                                          Pin pin, int* own = nullptr) const;

  [[noreturn]] static void no_algorithm(const LtGemm& g, int align, const char* which);

  // The heuristic's candidates for g at n = probe (no workspace, no reduction) that also run
  // n = check without workspace, in its order; first_running: the first of them, if any.
  std::vector<cublasLtMatmulAlgo_t> candidates(const MatmulDesc& desc, const LtGemm& g, int align,
                                               int64_t probe, int64_t check) const;
  std::optional<cublasLtMatmulAlgo_t> first_running(const MatmulDesc& desc, const LtGemm& g,
                                                    int align, int64_t probe, int64_t check) const;

  // Pin::every_n's algorithm for each class of n (kTunedUpTo: n <= 16, n <= 64, n <= 512,
  // larger): of the heuristic's candidates at n = 1024 and n = 64, those whose results on random
  // operands are bitwise the pinned choice's (at n = 293, with and without accumulation; for the
  // largest class also accepted by cuBLASLt at n = 65536), the fastest at the class's n (16, 64,
  // 512, 2048; timed as CUDA graphs on a private stream). Every candidate sums each output over k
  // in the same order, or it is left out: the class an n falls in never changes a row's bits.
  // Which one is fastest may differ from run to run; the results may not. `base` (the pinned
  // rule's choice) stays where nothing else qualifies, for operands of other strides than B's
  // plain column-major, and for products with more than 2^26 weight elements (a vocabulary-sized
  // LM head: seconds and gigabytes to time). For the bf16 products of a contiguous weight that
  // cuda::small_gemm_fits takes, the classes of n <= 64 also weigh our own small-M kernel's
  // configurations (gemm_small.cu: the same order of sums by construction, checked here like any
  // candidate, at n = 64). The timed calls rotate over copies of the weight, twice L2 of them
  // (5 to 16, within 256 MB), so that a weight is timed coming from memory, as the layers of a
  // decode step read theirs.
  static constexpr int kSizeClasses = 4;
  static constexpr std::array<int64_t, kSizeClasses> kTunedUpTo = {16, 64, 512, INT64_MAX};
  static constexpr int kOwnClasses = 2;  // the classes our small-M kernel may take
  static_assert(kTunedUpTo[kOwnClasses - 1] <= cuda::kSmallGemmRows);
  static constexpr int kCublas = -1;  // Tuned::own: the class's cuBLASLt algorithm runs
  struct Tuned {
    std::array<cublasLtMatmulAlgo_t, kSizeClasses> by_class;
    std::array<int, kOwnClasses> own;  // our small-M kernel's configuration per class, or kCublas
  };
  // nullopt: the tuning could not run (memory, a failed copy); the caller keeps `base` for now.
  std::optional<Tuned> tune(const MatmulDesc& desc, const LtGemm& g, int align,
                            const cublasLtMatmulAlgo_t& base) const;

  struct Scratch {
    std::shared_ptr<void> data;
    size_t size = 0;
  };

  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t blas_ = nullptr;
  mutable std::array<std::unique_ptr<MatmulDesc>, 4> descs_;  // by (op(A), op(B))
  mutable std::map<std::tuple<int, int64_t, int64_t, int64_t>, std::unique_ptr<Layout>> layouts_;
  mutable std::recursive_mutex mu_;
  mutable std::map<GemmKey, std::optional<cublasLtMatmulAlgo_t>> algos_;  // none: no such one
  mutable std::map<GemmKey, Tuned> tuned_;                                // Pin::every_n
  // x in bf16, widened W, GEMM and attention work; then softcap_cross_entropy's logits, xn in
  // bf16, dz in bf16 and widened W; logit_picks' parts; the delta rule's chunk work; matmul's
  // operands in bf16.
  mutable std::array<Scratch, 13> scratch_;
  mutable bool heuristic_ = false;
  mutable int small_config_ = -1;
  mutable std::map<GemmKey, Heuristic> heuristics_;
  // run_batched_gemm's choices by (shape, batch, strides); none: a launch per product.
  mutable std::map<std::tuple<GemmKey, int64_t, int64_t, int64_t, int64_t>,
                   std::optional<cublasLtMatmulAlgo_t>>
      batched_algos_;
};

}  // namespace deg::cuda_backend
