// The CUDA backend (kernels/ops.h): every op enqueued in order on one stream of the first GPU.
// GEMMs go through cuBLASLt with one pinned algorithm per (weight shape, dtype, alignment) and no
// split-K, so a row's output never depends on how many rows share the call; the other ops are
// own kernels (launch.h), whose row tables travel by value in the launch.
//
// Every op of the table runs here.
#include "kernels/ops.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/backward.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/stream.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops_decorator.h"

namespace deg {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorKind::internal, fmt::format("CUDA {}: {}", what, cudaGetErrorString(e)));
  }
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorKind::internal, fmt::format("cuBLASLt {}: status {}", what, int(s)));
  }
}

[[noreturn]] void not_on_cuda(const char* op) {
  throw Error(
      ErrorKind::unsupported,
      fmt::format("the CUDA backend has no {} op yet; run this model with --device cpu", op));
}

// The largest power of two (up to 16) dividing every address and byte stride: what vector
// widths a GEMM kernel may assume.
int alignment_of(std::initializer_list<uint64_t> values) {
  int a = 16;
  for (uint64_t v : values)
    while (a > 1 && v % uint64_t(a)) a /= 2;
  return a;
}

// One cuBLASLt matrix layout, released with the object.
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
    check_blas(cublasLtMatrixLayoutCreate(&h, t, rows, cols, ld), "layout");
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(h); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

// f32 compute (no TF32) with op(A), op(B) as given.
struct MatmulDesc {
  cublasLtMatmulDesc_t h = nullptr;
  MatmulDesc(cublasOperation_t ta, cublasOperation_t tb) {
    check_blas(cublasLtMatmulDescCreate(&h, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
    check_blas(cublasLtMatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
               "transa");
    check_blas(cublasLtMatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
               "transb");
  }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(h); }
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
  GemmKey key(int64_t n_key, int align) const {
    return {int64_t(ta), int64_t(tb), int64_t(at), int64_t(bt), m, n_key, k, lda, ldb, ldd, align};
  }
};

// Row tables by value, one launch per chunk of cuda::kRows rows.
template <class F>
void for_row_chunks(const RowTable& t, F&& launch) {
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

cuda::KvRow kv_row(const RowView& v) {
  return {v.prefix_k, v.prefix_v, v.prefix_len, v.prefix_stride,
          v.own_k,    v.own_v,    v.own_before, v.own_stride};
}

cuda::StateRow state_row(const RowView& v) {
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
    check_blas(cublasLtCreate(&blas_), "create");
  }

  Device device() const override { return Device::cuda; }
  const char* name() const override { return name_.c_str(); }

  Tensor alloc(const Shape& shape, DType dtype) const override {
    const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
    return Tensor(cuda_buffer(std::max<size_t>(bytes, 1)), 0, dtype, shape);
  }

  Tensor upload(const Tensor& host) const override {
    if (host.device() == Device::cuda) return host;
    const Tensor c = host.contiguous();
    Tensor d(cuda_buffer(std::max<size_t>(c.nbytes(), 1)), 0, c.dtype(), c.shape());
    to_device(d.raw_mutable(), c.raw(), c.nbytes());
    return d;
  }

  void to_device(void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return;
    // From pageable memory the copy has taken the source when this returns.
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
  }

  void to_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
    synchronize();
  }

  void synchronize() const override { check(cudaStreamSynchronize(stream_), "synchronize"); }
  cudaStream_t stream() const { return stream_; }

  // ---- GEMM ----

  void gemm(const GemmArgs& a) const override {
    if (a.m == 0) return;
    DEG_CHECK(a.k > 0, "cuda gemm: K = 0");
    std::lock_guard lock(mu_);
    // bf16 dot products: x rounded to bf16 once for every output.
    const void* xb = nullptr;
    bool any_bf16 = false;
    for (const GemmOutput& o : a.outputs) any_bf16 |= o.w->dtype() == DType::bf16;
    if (any_bf16 && a.precision == GemmPrecision::bf16) {
      void* buf = scratch(0, size_t(a.m * a.k) * 2);
      check(cuda::launch_to_bf16(a.x, a.ldx, a.m, a.k, buf, stream_), "to bf16");
      xb = buf;
    }
    for (const GemmOutput& o : a.outputs) {
      const Tensor& w = *o.w;
      DEG_CHECK(w.rank() == 2 && w.dim(1) == a.k && w.is_contiguous() && w.device() == Device::cuda,
                "cuda gemm: weight {} is not a contiguous [N, {}] device tensor", w.describe(),
                a.k);
      if (w.dtype() != DType::f32 && w.dtype() != DType::bf16)
        throw Error(ErrorKind::unsupported,
                    fmt::format("cuda gemm: {} weights", dtype_name(w.dtype())));
    }
    // Outputs whose weights are adjacent row blocks of one tensor (weights_stacked_on) and whose
    // outputs are adjacent columns of one row stride (their joint N within it) run as one GEMM.
    const size_t count = a.outputs.size();
    for (size_t i = 0; i < count;) {
      const GemmOutput& o = a.outputs[i];
      const DType dt = o.w->dtype();
      int64_t N = o.w->dim(0);
      size_t j = i + 1;
      for (; j < count; ++j) {
        const GemmOutput& n = a.outputs[j];
        if (n.w->dtype() != dt || n.w->raw() != o.w->raw() + size_t(N * a.k) * dtype_size(dt) ||
            n.y != o.y + N || n.ldy != o.ldy || N + n.w->dim(0) > o.ldy ||
            n.accumulate != o.accumulate)
          break;
        N += n.w->dim(0);
      }
      gemm_one(a, o.w->raw(), dt, N, xb, o);
      i = j;
    }
  }

  // y [M, N] at o (y, ldy, accumulate) from the weight rows at w ([N, K] of dtype dt).
  void gemm_one(const GemmArgs& a, const std::byte* w, DType dt, int64_t N, const void* xb,
                const GemmOutput& o) const {
    if (dt == DType::f32) {
      matmul(w, CUDA_R_32F, N, a.x, CUDA_R_32F, a.ldx, a.m, a.k, o);
    } else if (xb) {
      matmul(w, CUDA_R_16BF, N, xb, CUDA_R_16BF, a.k, a.m, a.k, o);
    } else {
      // Exact: the weight widened to f32 (exactly), a block of its rows at a time.
      const int64_t block = std::max<int64_t>(1, (int64_t(1) << 25) / a.k);
      for (int64_t n0 = 0; n0 < N; n0 += block) {
        const int64_t nb = std::min(block, N - n0);
        float* wf = static_cast<float*>(scratch(1, size_t(nb * a.k) * sizeof(float)));
        check(cuda::launch_widen_bf16(w + size_t(n0 * a.k) * 2, nb * a.k, wf, stream_),
              "widen bf16");
        GemmOutput part = o;
        part.y = o.y + n0;
        matmul(wf, CUDA_R_32F, nb, a.x, CUDA_R_32F, a.ldx, a.m, a.k, part);
      }
    }
  }

  // ---- row-wise ops ----

  void rms_norm(const NormArgs& a) const override {
    check(cuda::launch_rms_norm({.x = a.x,
                                 .ldx = a.ldx,
                                 .hx = a.hx ? a.hx : a.dim,
                                 .y = a.y,
                                 .ldy = a.ldy,
                                 .hy = a.hy ? a.hy : a.dim,
                                 .rows = a.rows,
                                 .heads = a.heads,
                                 .dim = a.dim,
                                 .w = a.w,
                                 .eps = a.eps,
                                 .one_plus_w = a.scale == NormScale::one_plus_w,
                                 .gate = a.gate,
                                 .ldg = a.ldg,
                                 .hg = a.hg ? a.hg : a.dim},
                                stream_),
          "rms_norm");
  }

  void l2_norm(const L2NormArgs& a) const override {
    check(cuda::launch_l2_norm({.x = a.x,
                                .ldx = a.ldx,
                                .rows = a.rows,
                                .heads = a.heads,
                                .dim = a.dim,
                                .eps = a.eps,
                                .post_scale = a.post_scale},
                               stream_),
          "l2_norm");
  }

  void rope(const RopeArgs& a) const override {
    const int64_t half = a.table->rot / 2;
    DEG_CHECK(half <= cuda::kRopeFreqs, "cuda rope: {} rotary dims", a.table->rot);
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t) {
      cuda::RopeLaunch l{.rows = r, .x = a.x, .ldx = a.ldx, .heads = a.heads, .hs = a.hs};
      l.half = int(half);
      std::copy(a.table->inv_freq.begin(), a.table->inv_freq.begin() + half, l.inv_freq);
      check(cuda::launch_rope(l, stream_), "rope");
    });
  }

  void kv_write(const KvWriteArgs& a) const override {
    const int64_t kd = a.k_dim ? a.k_dim : a.dim, vd = a.v_dim ? a.v_dim : a.dim;
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t first) {
      cuda::KvWriteLaunch l{.rows = r,
                            .k = a.k,
                            .ldk = a.ldk,
                            .v = a.v,
                            .ldv = a.ldv,
                            .kv_heads = a.kv_heads,
                            .dim = a.dim,
                            .k_dim = kd,
                            .v_dim = vd,
                            .hk = a.hk ? a.hk : kd,
                            .hv = a.hv ? a.hv : vd};
      for (int i = 0; i < r.count; ++i) l.kv[i] = kv_row(a.views[first + i]);
      check(cuda::launch_kv_write(l, stream_), "kv_write");
    });
  }

  void attention(const AttendArgs& a) const override {
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t first) {
      cuda::AttentionLaunch l{.rows = r,
                              .q = a.q,
                              .ldq = a.ldq,
                              .out = a.out,
                              .ldo = a.ldo,
                              .kv_heads = a.kv_heads,
                              .group = a.group,
                              .head_dim = a.head_dim,
                              .scale = a.scale,
                              .window = a.window,
                              .bf16 = a.bf16};
      for (int i = 0; i < r.count; ++i) l.kv[i] = kv_row(a.views[first + i]);
      // Key-split partials: backend scratch (stream order makes reuse across calls safe).
      const int64_t ws = cuda::attention_workspace_floats(l);
      std::lock_guard lock(mu_);
      l.workspace = ws > 0 ? static_cast<float*>(scratch(3, size_t(ws) * sizeof(float))) : nullptr;
      l.workspace_floats = ws;
      check(cuda::launch_attention(l, stream_), "attention");
    });
  }

  void causal_conv(const ConvArgs& a) const override {
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t first) {
      cuda::ConvLaunch l{.rows = r,
                         .x = a.x,
                         .ldx = a.ldx,
                         .y = a.y,
                         .ldy = a.ldy,
                         .channels = a.channels,
                         .kernel = a.kernel,
                         .w = a.w,
                         .ldt = a.ldt ? a.ldt : a.channels,
                         .silu = a.silu};
      for (int i = 0; i < r.count; ++i) l.state[i] = state_row(a.views[first + i]);
      check(cuda::launch_causal_conv(l, stream_), "causal_conv");
    });
  }

  void delta_gates(const DeltaGatesArgs& a) const override {
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t) {
      check(cuda::launch_delta_gates({.rows = r,
                                      .beta = a.beta,
                                      .g = a.g,
                                      .ld = a.ld,
                                      .heads = a.heads,
                                      .neg_decay = a.neg_decay,
                                      .dt_bias = a.dt_bias},
                                     stream_),
            "delta_gates");
    });
  }

  void delta_rule(const DeltaRuleOpArgs& a) const override {
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t first) {
      cuda::DeltaRuleLaunch l{.rows = r,
                              .q = a.q,
                              .k = a.k,
                              .v = a.v,
                              .ld = a.ld,
                              .g = a.g,
                              .beta = a.beta,
                              .ldg = a.ldg,
                              .out = a.out,
                              .ldo = a.ldo,
                              .k_heads = a.k_heads,
                              .v_heads = a.v_heads,
                              .dk = a.dk,
                              .dv = a.dv};
      for (int i = 0; i < r.count; ++i) l.state[i] = state_row(a.views[first + i]);
      check(cuda::launch_delta_rule(l, stream_), "delta_rule");
    });
  }

  // ---- elementwise ----

  void glu(const GluArgs& a) const override {
    int act = 0;
    if (a.act == Activation::gelu_tanh) {
      act = 1;
    } else if (a.act == Activation::sigmoid) {
      act = 2;
    } else if (a.act != Activation::silu) {
      not_on_cuda("glu with this activation");
    }
    check(cuda::launch_glu({.gate = a.gate,
                            .ldg = a.ldg,
                            .up = a.up,
                            .ldu = a.ldu,
                            .out = a.out,
                            .ldo = a.ldo,
                            .rows = a.rows,
                            .n = a.n,
                            .act = act},
                           stream_),
          "glu");
  }

  void binary(const BinaryArgs& a) const override {
    check(cuda::launch_binary({.a = a.a,
                               .lda = a.lda,
                               .y = a.y,
                               .ldy = a.ldy,
                               .rows = a.rows,
                               .n = a.n,
                               .mul = a.mul,
                               .s = 1.0f},
                              stream_),
          "binary");
  }

  void scale(const ScaleArgs& a) const override {
    check(cuda::launch_binary(
              {.a = nullptr, .y = a.y, .ldy = a.ldy, .rows = a.rows, .n = a.n, .s = a.s}, stream_),
          "scale");
  }

  void gather(const GatherArgs& a) const override {
    const Tensor& t = *a.table;
    DEG_CHECK(t.rank() == 2 && t.is_contiguous() && t.device() == Device::cuda &&
                  (t.dtype() == DType::f32 || t.dtype() == DType::bf16),
              "cuda gather: table {} is not an f32 / bf16 device matrix", t.describe());
    check(cuda::launch_gather({.table = t.raw(),
                               .bf16 = t.dtype() == DType::bf16,
                               .cols = t.dim(1),
                               .ids = a.ids,
                               .n = a.n,
                               .y = a.y,
                               .ldy = a.ldy,
                               .scale = a.scale,
                               .keep = a.keep,
                               .mix = a.mix,
                               .soft_rows = a.soft_rows,
                               .soft = a.soft,
                               .id_lane = a.id_lane,
                               .ld_id = a.ld_id,
                               .row_scale = a.row_scale,
                               .ld_scale = a.ld_scale},
                              stream_),
          "gather");
  }

  void softcap(const SoftcapArgs& a) const override {
    check(cuda::launch_softcap(a.y, a.n, a.cap, stream_), "softcap");
  }

  void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t n) const override {
    if (rows * n == 0) return;
    // Overlapping rows (packing a buffer in place) go through scratch: threads of one launch
    // run in no particular order.
    const float* x_end = x + (rows - 1) * ldx + n;
    const float* y_end = y + (rows - 1) * ldy + n;
    if (x < y_end && y < x_end && x != y) {
      std::lock_guard lock(mu_);
      float* tmp = static_cast<float*>(scratch(0, size_t(rows * n) * sizeof(float)));
      check(cuda::launch_copy_rows(x, ldx, tmp, n, rows, n, stream_), "copy_rows");
      check(cuda::launch_copy_rows(tmp, n, y, ldy, rows, n, stream_), "copy_rows");
      return;
    }
    if (x == y && ldx == ldy) return;
    check(cuda::launch_copy_rows(x, ldx, y, ldy, rows, n, stream_), "copy_rows");
  }

  // ---- the f32 row ops with f64 dot products, hashes and combinations (mixing.cu) ----

  void activation(const ActivationArgs& a) const override {
    int act = 0;
    switch (a.act) {
      case Activation::relu_squared: act = 0; break;
      case Activation::gelu_erf: act = 1; break;
      case Activation::scaled_sigmoid: act = 2; break;
      case Activation::sigmoid: act = 3; break;
      case Activation::silu: act = 4; break;
      case Activation::gelu_tanh: act = 5; break;
    }
    check(cuda::launch_activation({.x = a.x,
                                   .ldx = a.ldx,
                                   .y = a.y,
                                   .ldy = a.ldy,
                                   .rows = a.rows,
                                   .n = a.n,
                                   .act = act,
                                   .a = a.a,
                                   .b = a.b,
                                   .c = a.c},
                                  stream_),
          "activation");
  }

  void bias_scale(const BiasScaleArgs& a) const override {
    check(cuda::launch_bias_scale({.x = a.x,
                                   .ldx = a.ldx,
                                   .y = a.y,
                                   .ldy = a.ldy,
                                   .rows = a.rows,
                                   .n = a.n,
                                   .bias = a.bias,
                                   .s = a.s},
                                  stream_),
          "bias_scale");
  }

  void combine(const CombineArgs& a) const override {
    DEG_CHECK(!a.terms.empty() && a.terms.size() <= size_t(cuda::kCombineTerms),
              "combine: {} terms (1 to {})", a.terms.size(), cuda::kCombineTerms);
    check(cuda::launch_combine(combine_launch(a), stream_), "combine");
  }

  void shift_ids(const ShiftIdsArgs& a) const override {
    DEG_CHECK(a.back == 0 || (a.back > 0 && a.back <= a.history_len),
              "shift_ids: {} back with {} history", a.back, a.history_len);
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t) {
      check(cuda::launch_shift_ids({.rows = r,
                                    .ids = a.ids,
                                    .history = a.history,
                                    .history_len = a.history_len,
                                    .back = a.back,
                                    .out = a.out,
                                    .lane = a.lane,
                                    .ld_lane = a.ld_lane},
                                   stream_),
            "shift_ids");
    });
  }

  void ngram_embed(const NgramEmbedArgs& a) const override {
    const Tensor& t = *a.table;
    DEG_CHECK(t.rank() == 2 && t.is_contiguous() && t.device() == Device::cuda &&
                  (t.dtype() == DType::f32 || t.dtype() == DType::bf16),
              "cuda ngram_embed: table {} is not an f32 / bf16 device matrix", t.describe());
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t) {
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
      check(cuda::launch_ngram_embed(l, stream_), "ngram_embed");
    });
  }

  void sigmoid_gates(const SigmoidGateArgs& a) const override {
    check(cuda::launch_sigmoid_gates({.x = a.x,
                                      .ldx = a.ldx,
                                      .x2 = a.x2,
                                      .ldx2 = a.ldx2,
                                      .w = a.w,
                                      .ldw = a.ldw,
                                      .rows = a.rows,
                                      .heads = a.heads,
                                      .n = a.n,
                                      .s = a.s,
                                      .out = a.out,
                                      .ldo = a.ldo},
                                     stream_),
          "sigmoid_gates");
  }

  void rope_pairs(const RopePairsArgs& a) const override {
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t) {
      check(cuda::launch_rope_pairs({.rows = r,
                                     .freq = a.freq,
                                     .x = a.x,
                                     .ldx = a.ldx,
                                     .heads = a.heads,
                                     .hs = a.hs,
                                     .dims = a.dims,
                                     .paired_heads = a.paired_heads,
                                     .inverse = a.inverse},
                                    stream_),
            "rope_pairs");
    });
  }

  void attention_f64(const AttendF64Args& a) const override {
    DEG_CHECK(!a.paired_heads || a.heads % 2 == 0, "attention_f64: paired heads need even {}",
              a.heads);
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t first) {
      cuda::AttentionF64Launch l{.rows = r,
                                 .q = a.q,
                                 .ldq = a.ldq,
                                 .hq = a.hq,
                                 .out = a.out,
                                 .ldo = a.ldo,
                                 .ho = a.ho,
                                 .heads = a.heads,
                                 .qk_dim = a.qk_dim,
                                 .v_dim = a.v_dim,
                                 .kv_dim = a.kv_dim,
                                 .scale = a.scale,
                                 .window = a.window,
                                 .paired_heads = a.paired_heads,
                                 .key_offset = a.key_offset,
                                 .offset_from = a.offset_from,
                                 .segment = a.segment};
      for (int i = 0; i < r.count; ++i) l.kv[i] = kv_row(a.views[first + i]);
      check(cuda::launch_attention_f64(l, stream_), "attention_f64");
    });
  }

  void subtract_projection(const ProjectionArgs& a) const override {
    for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t) {
      check(cuda::launch_subtract_projection({.rows = r,
                                              .y = a.y,
                                              .ldy = a.ldy,
                                              .hy = a.hy,
                                              .v = a.v,
                                              .ldv = a.ldv,
                                              .hv = a.hv,
                                              .strength = a.strength,
                                              .lds = a.lds,
                                              .heads = a.heads,
                                              .dim = a.dim,
                                              .eps = a.eps},
                                             stream_),
            "subtract_projection");
    });
  }

  // ---- training (backward.cu; the product through cuBLASLt) ----

  void matmul(const MatmulOpArgs& a) const override {
    if (a.m * a.n == 0) return;
    if (a.k == 0) {
      if (!a.accumulate)
        check(cudaMemset2DAsync(a.c, size_t(a.ldc) * 4, 0, size_t(a.n) * 4, size_t(a.m), stream_),
              "matmul");
      return;
    }
    std::lock_guard lock(mu_);
    // Row-major c = op(a) op(b) is column-major cᵀ = op(b)ᵀ op(a)ᵀ: the column-major view of a
    // row-major [r, c] matrix is its transpose, so b's view (N x K, or K x N read transposed
    // when tb) multiplies a's (K x M, or M x K read transposed when ta).
    run_gemm({.ta = a.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
              .tb = a.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
              .m = a.n,
              .n = a.m,
              .k = a.k,
              .lda = a.ldb,
              .ldb = a.lda,
              .ldd = a.ldc},
             a.b, a.a, a.c, a.accumulate, Pin::this_n);
  }

  void rms_norm_backward(const NormBackwardArgs& a) const override {
    check(cuda::launch_rms_norm_backward({.x = a.x,
                                          .ldx = a.ldx,
                                          .hx = a.hx,
                                          .dy = a.dy,
                                          .ldy = a.ldy,
                                          .hy = a.hy,
                                          .dx = a.dx,
                                          .lddx = a.lddx,
                                          .hdx = a.hdx,
                                          .rows = a.rows,
                                          .heads = a.heads,
                                          .dim = a.dim,
                                          .eps = a.eps},
                                         stream_),
          "rms_norm_backward");
  }

  void activation_backward(const ActivationBackwardArgs& a) const override {
    int act = 0;
    switch (a.act) {
      case Activation::relu_squared: act = 0; break;
      case Activation::gelu_erf: act = 1; break;
      case Activation::scaled_sigmoid: act = 2; break;
      default: not_on_cuda("activation_backward of this activation");
    }
    check(cuda::launch_activation_backward({.x = a.x,
                                            .ldx = a.ldx,
                                            .dy = a.dy,
                                            .ldy = a.ldy,
                                            .dx = a.dx,
                                            .lddx = a.lddx,
                                            .rows = a.rows,
                                            .n = a.n,
                                            .act = act,
                                            .a = a.a,
                                            .b = a.b,
                                            .c = a.c,
                                            .accumulate = a.accumulate},
                                           stream_),
          "activation_backward");
  }

  void column_sum(const ColumnSumArgs& a) const override {
    check(cuda::launch_column_sum({.x = a.x,
                                   .ldx = a.ldx,
                                   .rows = a.rows,
                                   .n = a.n,
                                   .s = a.s,
                                   .out = a.out,
                                   .accumulate = a.accumulate},
                                  stream_),
          "column_sum");
  }

  void combine_backward(const CombineBackwardArgs& a) const override {
    const CombineArgs& f = a.forward;
    DEG_CHECK(!f.terms.empty() && f.terms.size() <= size_t(cuda::kCombineTerms) &&
                  a.grads.size() == f.terms.size(),
              "combine_backward: {} terms, {} gradients", f.terms.size(), a.grads.size());
    cuda::CombineBackwardLaunch l{.forward = combine_launch(f),
                                  .dy = a.dy,
                                  .ldy = a.ldy,
                                  .y_before = a.y_before,
                                  .ldb = a.ldb,
                                  .dy_before = a.dy_before,
                                  .lddb = a.lddb};
    for (size_t k = 0; k < a.grads.size(); ++k)
      l.grad[k] = {a.grads[k].dx, a.grads[k].lddx, a.grads[k].dcoef, a.grads[k].ldc};
    check(cuda::launch_combine_backward(l, stream_), "combine_backward");
  }

  void gather_backward(const GatherBackwardArgs& a) const override {
    const GatherArgs& f = a.forward;
    const Tensor& t = *f.table;
    DEG_CHECK(
        t.dtype() == DType::f32 && t.device() == Device::cuda && f.mix == 1.0f && !f.soft_rows,
        "cuda gather_backward: an f32 device table without mix or soft rows");
    const int64_t n = f.n, V = t.dim(0), C = t.dim(1);
    DeviceTemp dev_ids(*this, size_t(n) * sizeof(int32_t));
    const int32_t* ids = f.ids;
    if (f.id_lane) {
      check(cuda::launch_lane_ids(f.id_lane, f.ld_id, n, dev_ids.as<int32_t>(), stream_),
            "gather_backward");
      ids = dev_ids.as<int32_t>();
    }
    if (a.dtable) {
      std::vector<int32_t> host(static_cast<size_t>(n));
      to_host(host.data(), ids, size_t(n) * sizeof(int32_t));
      std::vector<int64_t> starts;
      const std::vector<int64_t> order = gather_order(host.data(), n, V, starts);
      scatter(order, starts, V, C,
              {.dy = a.dy,
               .ldy = a.ldy,
               .row_scale = f.row_scale,
               .ld_scale = f.ld_scale,
               .scale = f.scale,
               .dtable = a.dtable});
    }
    if (a.drow_scale) {
      check(cuda::launch_row_scale_grad({.table = t.data<float>(),
                                         .cols = C,
                                         .ids = ids,
                                         .n = n,
                                         .dy = a.dy,
                                         .ldy = a.ldy,
                                         .drow_scale = a.drow_scale,
                                         .ld_drow = a.ld_drow},
                                        stream_),
            "gather_backward");
    }
  }

  void sigmoid_gates_backward(const SigmoidGatesBackwardArgs& a) const override {
    const SigmoidGateArgs& f = a.forward;
    DeviceTemp dz(*this, size_t(std::max<int64_t>(f.rows * f.heads, 1)) * sizeof(float));
    check(cuda::launch_sigmoid_gates_backward({.forward = {.x = f.x,
                                                           .ldx = f.ldx,
                                                           .x2 = f.x2,
                                                           .ldx2 = f.ldx2,
                                                           .w = f.w,
                                                           .ldw = f.ldw,
                                                           .rows = f.rows,
                                                           .heads = f.heads,
                                                           .n = f.n,
                                                           .s = f.s},
                                               .dout = a.dout,
                                               .lddo = a.lddo,
                                               .dx = a.dx,
                                               .lddx = a.lddx,
                                               .dx2 = a.dx2,
                                               .lddx2 = a.lddx2,
                                               .dw = a.dw,
                                               .dz = dz.as<float>()},
                                              stream_),
          "sigmoid_gates_backward");
  }

  void subtract_projection_backward(const ProjectionBackwardArgs& a) const override {
    const ProjectionArgs& f = a.forward;
    for_row_chunks(f.rows, [&](const cuda::Rows& r, int64_t) {
      check(cuda::launch_subtract_projection_backward({.forward = {.rows = r,
                                                                   .y = f.y,
                                                                   .ldy = f.ldy,
                                                                   .hy = f.hy,
                                                                   .v = f.v,
                                                                   .ldv = f.ldv,
                                                                   .hv = f.hv,
                                                                   .strength = f.strength,
                                                                   .lds = f.lds,
                                                                   .heads = f.heads,
                                                                   .dim = f.dim,
                                                                   .eps = f.eps},
                                                       .dy_out = a.dy_out,
                                                       .lddo = a.lddo,
                                                       .dy = a.dy,
                                                       .lddy = a.lddy,
                                                       .dv = a.dv,
                                                       .lddv = a.lddv,
                                                       .dstrength = a.dstrength,
                                                       .ldds = a.ldds},
                                                      stream_),
            "subtract_projection_backward");
    });
  }

  void ngram_embed_backward(const NgramBackwardArgs& a) const override {
    const NgramEmbedArgs& f = a.forward;
    DEG_CHECK(f.table->dtype() == DType::f32, "cuda ngram_embed_backward: an f32 table");
    const int64_t n = f.rows.n(), V = f.table->dim(0), Dn = f.table->dim(1);
    // The hashes on the host (from the ids, which are few bytes), then a scatter per table row.
    std::vector<int32_t> ids(static_cast<size_t>(n)), p1(ids.size()), p2(ids.size());
    to_host(ids.data(), f.ids, ids.size() * sizeof(int32_t));
    to_host(p1.data(), f.prev1, p1.size() * sizeof(int32_t));
    to_host(p2.data(), f.prev2, p2.size() * sizeof(int32_t));
    NgramEmbedArgs host = f;
    host.ids = ids.data();
    host.prev1 = p1.data();
    host.prev2 = p2.data();
    std::vector<int32_t> rows(size_t(2 * n)), signs(size_t(2 * n));
    for (int64_t i = 0; i < n; ++i)
      ngram_rows_of(host, i, &rows[size_t(2 * i)], &signs[size_t(2 * i)]);
    std::vector<int64_t> starts;
    const std::vector<int64_t> order = gather_order(rows.data(), 2 * n, V, starts);
    DeviceTemp dev_signs(*this, signs.size() * sizeof(int32_t));
    to_device(dev_signs.get(), signs.data(), signs.size() * sizeof(int32_t));
    scatter(order, starts, V, Dn,
            {.dy = a.dy,
             .ldy = a.ldy,
             .entry_shift = 1,
             .signs = dev_signs.as<int32_t>(),
             .sign_pool = f.sign_pool,
             .dtable = a.dtable});
  }

  void attention_f64_backward(const AttendF64BackwardArgs& a) const override {
    const AttendF64Args& f = a.forward;
    int64_t last = 0;
    for (int64_t b = 0; b < f.rows.rows; ++b)
      last = std::max(last, f.rows.positions[b] + f.rows.lengths[b]);
    if (f.paired_heads) last = 2 * last + 1;
    const int64_t max_keys = std::min(f.window, last) + 2;
    const int64_t slots = f.paired_heads ? f.heads / 2 : f.heads;
    DeviceTemp work(*this, size_t(std::max<int64_t>(slots * 2 * max_keys, 1)) * sizeof(float));
    for_row_chunks(f.rows, [&](const cuda::Rows& r, int64_t first) {
      cuda::AttentionF64BackwardLaunch l{.forward = {.rows = r,
                                                     .q = f.q,
                                                     .ldq = f.ldq,
                                                     .hq = f.hq,
                                                     .heads = f.heads,
                                                     .qk_dim = f.qk_dim,
                                                     .v_dim = f.v_dim,
                                                     .kv_dim = f.kv_dim,
                                                     .scale = f.scale,
                                                     .window = f.window,
                                                     .paired_heads = f.paired_heads,
                                                     .key_offset = f.key_offset,
                                                     .offset_from = f.offset_from,
                                                     .segment = f.segment},
                                         .dout = a.dout,
                                         .lddo = a.lddo,
                                         .hdo = a.hdo,
                                         .dq = a.dq,
                                         .lddq = a.lddq,
                                         .hdq = a.hdq,
                                         .scratch = work.as<float>(),
                                         .max_keys = max_keys};
      for (int i = 0; i < r.count; ++i) {
        l.forward.kv[i] = kv_row(f.views[first + i]);
        l.grad[i] = kv_row(a.dviews[first + i]);
      }
      check(cuda::launch_attention_f64_backward(l, stream_), "attention_f64_backward");
    });
  }

  // ---- optimizer steps (optimizer.cu) ----

  void adam_step(const AdamStepArgs& a) const override {
    check(cuda::launch_adam_step({.p = a.p,
                                  .g = a.g,
                                  .m = a.m,
                                  .v = a.v,
                                  .n = a.n,
                                  .beta1 = a.beta1,
                                  .beta2 = a.beta2,
                                  .eps = a.eps,
                                  .step_size = a.step_size,
                                  .wd = a.wd},
                                 stream_),
          "adam_step");
  }

  void nesterov(const NesterovArgs& a) const override {
    check(cuda::launch_nesterov(
              {.g = a.g, .buf = a.buf, .u = a.u, .n = a.n, .momentum = a.momentum}, stream_),
          "nesterov");
  }

  void normuon_step(const NorMuonStepArgs& a) const override {
    DeviceTemp work(*this, size_t(2 * std::max(a.rows, a.cols) + 1) * sizeof(float));
    check(cuda::launch_normuon_step({.u = a.u,
                                     .p = a.p,
                                     .second = a.second,
                                     .rows = a.rows,
                                     .cols = a.cols,
                                     .beta2 = a.beta2,
                                     .lr = a.lr,
                                     .wd = a.wd,
                                     .work = work.as<float>()},
                                    stream_),
          "normuon_step");
  }

  double sum_squares(const float* x, int64_t n) const override {
    const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
    DeviceTemp work(*this, size_t(chunks + 1) * sizeof(double));
    double* out = work.as<double>() + chunks;
    check(cuda::launch_sum_squares(x, n, kSumChunk, work.as<double>(), out, stream_),
          "sum_squares");
    double s = 0;
    to_host(&s, out, sizeof(double));
    return s;
  }

  // ---- softcap_cross_entropy: per chunk of rows, the logits GEMM (the projection's pinned
  // algorithm), the loss kernel (dz over the logits, or as bf16), then dxn += dz W and dw += dzᵀ
  // xn as pinned GEMMs without split-K: dw adds the chunks' products in chunk order. ----
  void softcap_cross_entropy(const SoftcapCrossEntropyArgs& a) const override {
    const Tensor& w = *a.w;
    DEG_CHECK(w.rank() == 2 && w.is_contiguous() && w.device() == Device::cuda,
              "cuda softcap_cross_entropy: weight {} is not a contiguous [V, C] device tensor",
              w.describe());
    DEG_CHECK(a.mtp >= 0 && a.mtp <= cuda::kLossMtp, "softcap_cross_entropy: {} mtp weights",
              a.mtp);
    if (w.dtype() != DType::f32 && w.dtype() != DType::bf16)
      throw Error(ErrorKind::unsupported,
                  fmt::format("cuda softcap_cross_entropy: {} weights", dtype_name(w.dtype())));
    const int64_t T = a.rows, V = w.dim(0), C = w.dim(1);
    if (T == 0) return;
    std::lock_guard lock(mu_);
    const bool grad = a.dxn || a.dw, low = a.bf16 && w.dtype() == DType::bf16;
    const int64_t chunk = std::min(T, softcap_cross_entropy_chunk(V));
    const cudaDataType pt = low ? CUDA_R_16BF : CUDA_R_32F;  // the products' operand type
    const void* wp = w.raw();
    if (!low && w.dtype() == DType::bf16) {  // exact: W widened to f32 once per call
      float* wf = static_cast<float*>(scratch(7, size_t(V * C) * sizeof(float)));
      check(cuda::launch_widen_bf16(w.raw(), V * C, wf, stream_), "widen bf16");
      wp = wf;
    }
    float* z = static_cast<float*>(scratch(4, size_t(chunk * V) * sizeof(float)));
    void* xb = low ? scratch(5, size_t(chunk * C) * 2) : nullptr;
    void* dzb = low && grad ? scratch(6, size_t(chunk * V) * 2) : nullptr;
    cuda::SoftcapLossLaunch l{.z = z,
                              .dz_bf16 = dzb,
                              .vocab = V,
                              .total = T,
                              .targets = a.targets,
                              .prefix = a.prefix,
                              .a = a.a,
                              .b = a.b,
                              .c = a.c,
                              .mtp = int(a.mtp),
                              .prefix_weight = a.prefix_weight,
                              .loss = a.loss,
                              .grad = grad};
    std::copy(a.mtp_weights.begin(), a.mtp_weights.begin() + a.mtp, l.mtp_weights);
    for (int64_t r0 = 0; r0 < T; r0 += chunk) {
      const int64_t R = std::min(chunk, T - r0);
      const float* x = a.xn + r0 * a.ldx;
      if (low) check(cuda::launch_to_bf16(x, a.ldx, R, C, xb, stream_), "to bf16");
      const void* xp = low ? xb : x;
      const int64_t ldx = low ? C : a.ldx;
      matmul(wp, pt, V, xp, pt, ldx, R, C, {.y = z, .ldy = V}, Pin::every_n_or_this_n);
      l.rows = R;
      l.first = r0;
      check(cuda::launch_softcap_loss(l, stream_), "softcap_cross_entropy");
      const void* dz = low ? dzb : z;
      if (a.dxn) {  // dxnᵀ [C, R] += W [V, C] read as C x V, times dzᵀ (V x R)
        run_gemm({.ta = CUBLAS_OP_N,
                  .tb = CUBLAS_OP_N,
                  .at = pt,
                  .bt = pt,
                  .m = C,
                  .n = R,
                  .k = V,
                  .lda = C,
                  .ldb = V,
                  .ldd = a.lddx},
                 wp, dz, a.dxn + r0 * a.lddx, true, Pin::every_n_or_this_n);
      }
      if (a.dw) {  // dwᵀ [C, V] += xnᵀ (C x R) times dz (dzᵀ stored V x R, transposed)
        run_gemm({.ta = CUBLAS_OP_N,
                  .tb = CUBLAS_OP_T,
                  .at = pt,
                  .bt = pt,
                  .m = C,
                  .n = V,
                  .k = R,
                  .lda = ldx,
                  .ldb = V,
                  .ldd = C},
                 xp, dz, a.dw, true, Pin::this_n);
      }
    }
  }

 private:
  static cuda::CombineLaunch combine_launch(const CombineArgs& a) {
    cuda::CombineLaunch l{.y = a.y,
                          .ldy = a.ldy,
                          .rows = a.rows,
                          .n = a.n,
                          .group = a.group > 0 ? a.group : std::max<int64_t>(a.n, 1),
                          .terms = int(a.terms.size())};
    for (size_t k = 0; k < a.terms.size() && k < size_t(cuda::kCombineTerms); ++k) {
      const CombineTerm& t = a.terms[k];
      l.term[k] = {.x = t.x,
                   .ldx = t.ldx,
                   .s = t.s,
                   .lane = t.lane,
                   .ldl = t.ldl,
                   .gl = t.gl,
                   .add = t.add,
                   .lda = t.lda,
                   .ga = t.ga,
                   .offset = t.offset};
    }
    return l;
  }

  // Device memory for one op's work, freed once the stream has finished with it.
  class DeviceTemp {
   public:
    DeviceTemp(const CudaOps& ops, size_t bytes)
        : ops_(ops), data_(cuda_malloc(std::max<size_t>(bytes, 1))) {}
    ~DeviceTemp() {
      cudaStreamSynchronize(ops_.stream_);
      cuda_free(data_);
    }
    DeviceTemp(const DeviceTemp&) = delete;
    DeviceTemp& operator=(const DeviceTemp&) = delete;
    void* get() const { return data_; }
    template <class T>
    T* as() const {
      return static_cast<T*>(data_);
    }

   private:
    const CudaOps& ops_;
    void* data_;
  };

  // dtable rows [0, rows) += their positions' terms (order / starts of gather_order).
  void scatter(const std::vector<int64_t>& order, const std::vector<int64_t>& starts, int64_t rows,
               int64_t cols, cuda::ScatterRowsLaunch l) const {
    DeviceTemp o(*this, order.size() * sizeof(int64_t)), st(*this, starts.size() * sizeof(int64_t));
    to_device(o.get(), order.data(), order.size() * sizeof(int64_t));
    to_device(st.get(), starts.data(), starts.size() * sizeof(int64_t));
    l.order = o.as<int64_t>();
    l.starts = st.as<int64_t>();
    l.rows = rows;
    l.cols = cols;
    check(cuda::launch_scatter_rows(l, stream_), "scatter");
  }

  // Device scratch `slot` of at least `bytes` (kept and grown; stream order makes reuse safe).
  // Callers hold mu_.
  void* scratch(int slot, size_t bytes) const {
    auto& s = scratch_[size_t(slot)];
    if (s.size < bytes) {
      s.data.reset();  // freed once the work queued before is done (stream order)
      s.data = std::shared_ptr<void>(cuda_malloc(bytes), [](void* p) { cuda_free(p); });
      s.size = bytes;
    }
    return s.data.get();
  }

  // y[M, N] (+)= x[M, K] · W[N, K]ᵀ in cuBLASLt's column-major terms: Yᵀ = W · Xᵀ, with W read
  // as a K x N matrix transposed and Xᵀ as K x M (n = M).
  void matmul(const void* w, cudaDataType wt, int64_t N, const void* x, cudaDataType xt,
              int64_t ldx, int64_t M, int64_t K, const GemmOutput& o,
              Pin pin = Pin::every_n) const {
    run_gemm({.at = wt, .bt = xt, .m = N, .n = M, .k = K, .lda = K, .ldb = ldx, .ldd = o.ldy}, w, x,
             o.y, o.accumulate, pin);
  }

  // D (+)= op(A) · op(B) for g (LtGemm) with a pinned algorithm (pinned_algo).
  void run_gemm(const LtGemm& g, const void* A, const void* B, float* D, bool accumulate,
                Pin pin) const {
    const int align = alignment_of(
        {uint64_t(reinterpret_cast<uintptr_t>(A)), uint64_t(g.lda) * element_bytes(g.at),
         uint64_t(reinterpret_cast<uintptr_t>(B)), uint64_t(g.ldb) * element_bytes(g.bt),
         uint64_t(reinterpret_cast<uintptr_t>(D)), uint64_t(g.ldd) * 4});
    const MatmulDesc& desc = this->desc(g.ta, g.tb);
    if (layouts_.size() + 3 > kMaxLayouts) layouts_.clear();  // bounded: shapes vary with M
    const Layout &la = layout(g.at, g.a_rows(), g.a_cols(), g.lda),
                 &lb = layout(g.bt, g.b_rows(g.n), g.b_cols(g.n), g.ldb),
                 &lc = layout(CUDA_R_32F, g.m, g.n, g.ldd);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (heuristic_) {  // the benchmark's yardstick: cuBLASLt's own choice for this very M
      const Heuristic& h = heuristic_algo(desc, la, lb, lc, g);
      check_blas(
          cublasLtMatmul(blas_, desc.h, &alpha, A, la.h, B, lb.h, &beta, D, lc.h, D, lc.h, &h.algo,
                         h.workspace ? scratch(2, h.workspace) : nullptr, h.workspace, stream_),
          "matmul");
      return;
    }
    const cublasLtMatmulAlgo_t& algo = pinned_algo(desc, g, align, pin);
    check_blas(cublasLtMatmul(blas_, desc.h, &alpha, A, la.h, B, lb.h, &beta, D, lc.h, D, lc.h,
                              &algo, nullptr, 0, stream_),
               "matmul");
  }

  static size_t element_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

  // The descriptor of (op(A), op(B)), made once per pair.
  const MatmulDesc& desc(cublasOperation_t ta, cublasOperation_t tb) const {
    auto& d = descs_[size_t(ta == CUBLAS_OP_T) * 2 + size_t(tb == CUBLAS_OP_T)];
    if (!d) d = std::make_unique<MatmulDesc>(ta, tb);
    return *d;
  }

  // The cuBLASLt layout of a [cols, rows] column-major matrix (kept: creating one per call
  // costs host time on every GEMM of a decode step). Callers hold mu_; the cache only grows
  // here (run_gemm empties it between GEMMs when it is full, never while references are held).
  static constexpr size_t kMaxLayouts = 4096;
  const Layout& layout(cudaDataType t, int64_t rows, int64_t cols, int64_t ld) const {
    const auto key = std::make_tuple(int(t), rows, cols, ld);
    auto it = layouts_.find(key);
    if (it != layouts_.end()) return *it->second;
    return *layouts_.emplace(key, std::make_unique<Layout>(t, uint64_t(rows), uint64_t(cols), ld))
                .first->second;
  }

  struct Heuristic {
    cublasLtMatmulAlgo_t algo;
    size_t workspace = 0;
  };

  // cuBLASLt's first choice for exactly this problem, M included, with up to 64 MiB of workspace
  // and any reduction (split-K, stream-K): what a batch-variant engine would run.
  const Heuristic& heuristic_algo(const MatmulDesc& desc, const Layout& la, const Layout& lb,
                                  const Layout& lc, const LtGemm& g) const {
    const GemmKey key = g.key(g.n, 0);
    if (auto it = heuristics_.find(key); it != heuristics_.end()) return it->second;
    cublasLtMatmulPreference_t pref = nullptr;
    check_blas(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t workspace = uint64_t(64) << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof(workspace));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(blas_, desc.h, la.h, lb.h, lc.h, lc.h,
                                                             pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      check_blas(CUBLAS_STATUS_NOT_SUPPORTED, "heuristic");
    return heuristics_.emplace(key, Heuristic{result.algo, result.workspaceSize}).first->second;
  }

 public:
  // The benchmark's switch between pinned (batch-invariant) and heuristic algorithms.
  void set_heuristic(bool on) const {
    std::lock_guard lock(mu_);
    heuristic_ = on;
  }

 private:
  // The algorithm of a GEMM of this shape, dtypes, strides and alignment, without workspace
  // and without split-K reduction (neither stream-K fix-ups nor split-K sums, whose order would
  // depend on n). Pin::every_n: one for every n — the heuristic's first choice for n = 1024 that
  // also runs n = 1, else its first choice for n = 1 that also runs n = 1024. Pin::this_n: one
  // for this very n. Pin::every_n_or_this_n: every_n where cuBLASLt has one, else this_n.
  const cublasLtMatmulAlgo_t& pinned_algo(const MatmulDesc& desc, const LtGemm& g, int align,
                                          Pin pin) const {
    const GemmKey every = g.key(-1, align), exact = g.key(g.n, align);
    if (pin != Pin::this_n) {
      auto it = algos_.find(every);
      if (it == algos_.end()) {
        constexpr int64_t kProbeN = 1024;
        std::optional<cublasLtMatmulAlgo_t> a = first_running(desc, g, align, kProbeN, 1);
        if (!a) a = first_running(desc, g, align, 1, kProbeN);
        it = algos_.emplace(every, a).first;
      }
      if (it->second) return *it->second;
      if (pin == Pin::every_n) no_algorithm(g, align, "for every n");
    }
    auto it = algos_.find(exact);
    if (it == algos_.end())
      it = algos_.emplace(exact, first_running(desc, g, align, g.n, g.n)).first;
    if (!it->second) no_algorithm(g, align, "for this n");
    return *it->second;
  }

  [[noreturn]] static void no_algorithm(const LtGemm& g, int align, const char* which) {
    throw Error(ErrorKind::unsupported,
                fmt::format("cuBLASLt has no algorithm without workspace and split-K {} for a [{}, "
                            "{}] x [{}, {}] product at {}-byte alignment",
                            which, g.m, g.k, g.k, g.n, align));
  }

  // The first of the heuristic's candidates for g at n = probe (no workspace, no reduction) that
  // also runs n = check without workspace; none when there is no such candidate.
  std::optional<cublasLtMatmulAlgo_t> first_running(const MatmulDesc& desc, const LtGemm& g,
                                                    int align, int64_t probe, int64_t check) const {
    Layout la(g.at, uint64_t(g.a_rows()), uint64_t(g.a_cols()), g.lda),
        lb(g.bt, uint64_t(g.b_rows(probe)), uint64_t(g.b_cols(probe)), g.ldb),
        lc(CUDA_R_32F, uint64_t(g.m), uint64_t(probe), g.ldd);
    cublasLtMatmulPreference_t pref = nullptr;
    check_blas(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t no_workspace = 0;
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    const uint32_t a_align = uint32_t(std::min<int>(align, int(element_bytes(g.at)) * 8)),
                   c_align = uint32_t(align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &no_workspace, sizeof(no_workspace));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                         &no_reduction, sizeof(no_reduction));
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      const uint32_t v = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES ? a_align : c_align;
      cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v));
    }
    cublasLtMatmulHeuristicResult_t results[8] = {};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(blas_, desc.h, la.h, lb.h, lc.h, lc.h,
                                                            pref, 8, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    Layout lb1(g.bt, uint64_t(g.b_rows(check)), uint64_t(g.b_cols(check)), g.ldb),
        lc1(CUDA_R_32F, uint64_t(g.m), uint64_t(check), g.ldd);
    for (int i = 0; i < found && s == CUBLAS_STATUS_SUCCESS; ++i) {
      // At the probe's own n the heuristic's answer stands without AlgoCheck (which, on an H200,
      // left no candidate for [50304, 768] bf16 at n = 320 standing, or the heuristic found none:
      // the message did not say which).
      if (check == probe) {
        if (results[i].workspaceSize == 0) return results[i].algo;
        continue;
      }
      cublasLtMatmulHeuristicResult_t r{};
      if (cublasLtMatmulAlgoCheck(blas_, desc.h, la.h, lb1.h, lc1.h, lc1.h, &results[i].algo, &r) ==
              CUBLAS_STATUS_SUCCESS &&
          r.workspaceSize == 0)
        return results[i].algo;
    }
    return std::nullopt;
  }

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
  // x in bf16, widened W, GEMM and attention work; then softcap_cross_entropy's logits, xn in
  // bf16, dz in bf16 and widened W.
  mutable std::array<Scratch, 8> scratch_;
  mutable bool heuristic_ = false;
  mutable std::map<GemmKey, Heuristic> heuristics_;
};

// The backend as cuda_ops() hands it out: while a profile is on, each op is bracketed by CUDA
// events recorded on the stream (nothing waits: the ops run as they would), and stop() waits
// once and sums each op's device time. Gaps between ops (host time, launch latency) show as the
// difference between the ops' sum and the wall time.
class ProfiledOps final : public OpsDecorator {
 public:
  using OpsDecorator::OpsDecorator;
  ~ProfiledOps() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  void start() const {
    std::lock_guard lock(mu_);
    synchronize();
    marks_.clear();
    on_ = true;
  }

  std::vector<OpTime> stop() const {
    std::lock_guard lock(mu_);
    on_ = false;
    synchronize();
    std::map<std::string, OpTime> sums;
    for (const Mark& m : marks_) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[m.start], events_[m.start + 1]), "event time");
      OpTime& t = sums[m.op];
      t.op = m.op;
      t.ms += ms;
      ++t.calls;
    }
    std::vector<OpTime> out;
    for (const auto& [op, t] : sums) out.push_back(t);
    std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
    return out;
  }

 protected:
  void run(const char* op, const std::function<void()>& call) const override {
    if (!on_) {
      call();
      return;
    }
    std::lock_guard lock(mu_);
    const size_t at = marks_.size() * 2;
    while (events_.size() < at + 2) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "event");
      events_.push_back(e);
    }
    const cudaStream_t stream = static_cast<const CudaOps&>(inner()).stream();
    check(cudaEventRecord(events_[at], stream), "event");
    call();
    check(cudaEventRecord(events_[at + 1], stream), "event");
    marks_.push_back({op, at});
  }

 private:
  struct Mark {
    const char* op;
    size_t start;  // events_[start], events_[start + 1]
  };
  mutable std::recursive_mutex mu_;
  mutable bool on_ = false;
  mutable std::vector<cudaEvent_t> events_;  // kept for the next profile
  mutable std::vector<Mark> marks_;
};

const ProfiledOps& profiled() {  // the backend, made on first use
  static const CudaOps ops;
  static const ProfiledOps profiled(ops);
  return profiled;
}

}  // namespace

const Ops& cuda_ops() {
  return profiled();
}

void cuda_profile_start() {
  profiled().start();
}

std::vector<OpTime> cuda_profile_stop() {
  return profiled().stop();
}

void cuda_gemm_heuristic(bool on) {
  static_cast<const CudaOps&>(profiled().inner()).set_heuristic(on);
}

}  // namespace deg
