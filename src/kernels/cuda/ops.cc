// The CUDA backend (kernels/ops.h): every op enqueued in order on one stream of the first GPU.
// GEMMs go through cuBLASLt with one pinned algorithm per (weight shape, dtype, alignment) and no
// split-K, so a row's output never depends on how many rows share the call; the other ops are
// own kernels (launch.h), whose row tables travel by value in the launch.
//
// Every op of the table runs here.
#include <cublasLt.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops_decorator.h"

namespace deg {
namespace cuda_backend {

Tensor CudaOps::alloc(const Shape& shape, DType dtype) const {
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(cuda_buffer(std::max<size_t>(bytes, 1)), 0, dtype, shape);
}

Tensor CudaOps::upload(const Tensor& host) const {
  if (host.device() == Device::cuda) return host;
  const Tensor c = host.contiguous();
  Tensor d(cuda_buffer(std::max<size_t>(c.nbytes(), 1)), 0, c.dtype(), c.shape());
  to_device(d.raw_mutable(), c.raw(), c.nbytes());
  return d;
}

void CudaOps::to_device(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return;
  // From pageable memory the copy has taken the source when this returns.
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
}

void CudaOps::to_host(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  synchronize();
}

void CudaOps::gemm(const GemmArgs& a) const {
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
              "cuda gemm: weight {} is not a contiguous [N, {}] device tensor", w.describe(), a.k);
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

void CudaOps::gemm_one(const GemmArgs& a, const std::byte* w, DType dt, int64_t N, const void* xb,
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
      check(cuda::launch_widen_bf16(w + size_t(n0 * a.k) * 2, nb * a.k, wf, stream_), "widen bf16");
      GemmOutput part = o;
      part.y = o.y + n0;
      matmul(wf, CUDA_R_32F, nb, a.x, CUDA_R_32F, a.ldx, a.m, a.k, part);
    }
  }
}

void CudaOps::rms_norm(const NormArgs& a) const {
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

void CudaOps::l2_norm(const L2NormArgs& a) const {
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

void CudaOps::rope(const RopeArgs& a) const {
  const int64_t half = a.table->rot / 2;
  DEG_CHECK(half <= cuda::kRopeFreqs, "cuda rope: {} rotary dims", a.table->rot);
  for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t) {
    cuda::RopeLaunch l{.rows = r, .x = a.x, .ldx = a.ldx, .heads = a.heads, .hs = a.hs};
    l.half = int(half);
    std::copy(a.table->inv_freq.begin(), a.table->inv_freq.begin() + half, l.inv_freq);
    check(cuda::launch_rope(l, stream_), "rope");
  });
}

void CudaOps::kv_write(const KvWriteArgs& a) const {
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

void CudaOps::attention(const AttendArgs& a) const {
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

void CudaOps::causal_conv(const ConvArgs& a) const {
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

void CudaOps::delta_gates(const DeltaGatesArgs& a) const {
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

void CudaOps::delta_rule(const DeltaRuleOpArgs& a) const {
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

void CudaOps::glu(const GluArgs& a) const {
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

void CudaOps::binary(const BinaryArgs& a) const {
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

void CudaOps::scale(const ScaleArgs& a) const {
  check(cuda::launch_binary(
            {.a = nullptr, .y = a.y, .ldy = a.ldy, .rows = a.rows, .n = a.n, .s = a.s}, stream_),
        "scale");
}

void CudaOps::gather(const GatherArgs& a) const {
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

void CudaOps::softcap(const SoftcapArgs& a) const {
  check(cuda::launch_softcap(a.y, a.n, a.cap, stream_), "softcap");
}

void CudaOps::copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                        int64_t n) const {
  if (rows * n == 0) return;
  // Overlapping rows (packing a buffer in place) go through scratch: threads of one launch
  // run in no particular order.
  const float* x_end = x + (rows - 1) * ldx + n;
  const float* y_end = y + (rows - 1) * ldy + n;
  if (x == y && ldx == ldy) return;
  if (x < y_end && y < x_end) {
    std::lock_guard lock(mu_);
    float* tmp = static_cast<float*>(scratch(0, size_t(rows * n) * sizeof(float)));
    check(cuda::launch_copy_rows(x, ldx, tmp, n, rows, n, stream_), "copy_rows");
    check(cuda::launch_copy_rows(tmp, n, y, ldy, rows, n, stream_), "copy_rows");
    return;
  }
  check(cuda::launch_copy_rows(x, ldx, y, ldy, rows, n, stream_), "copy_rows");
}

void CudaOps::transpose(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                        int64_t cols) const {
  DEG_CHECK((rows + 31) / 32 <= 65535, "cuda transpose: {} rows", rows);
  check(cuda::launch_transpose(x, ldx, y, ldy, rows, cols, stream_), "transpose");
}

void CudaOps::activation(const ActivationArgs& a) const {
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

void CudaOps::bias_scale(const BiasScaleArgs& a) const {
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

void CudaOps::combine(const CombineArgs& a) const {
  DEG_CHECK(!a.terms.empty() && a.terms.size() <= size_t(cuda::kCombineTerms),
            "combine: {} terms (1 to {})", a.terms.size(), cuda::kCombineTerms);
  check(cuda::launch_combine(combine_launch(a), stream_), "combine");
}

void CudaOps::shift_ids(const ShiftIdsArgs& a) const {
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

void CudaOps::ngram_embed(const NgramEmbedArgs& a) const {
  const Tensor& t = *a.table;
  DEG_CHECK(t.rank() == 2 && t.is_contiguous() && t.device() == Device::cuda &&
                (t.dtype() == DType::f32 || t.dtype() == DType::bf16),
            "cuda ngram_embed: table {} is not an f32 / bf16 device matrix", t.describe());
  for_row_chunks(a.rows, [&](const cuda::Rows& r, int64_t) {
    check(cuda::launch_ngram_embed(ngram_launch(a, r), stream_), "ngram_embed");
  });
}

void CudaOps::sigmoid_gates(const SigmoidGateArgs& a) const {
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

void CudaOps::rope_pairs(const RopePairsArgs& a) const {
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

void CudaOps::attention_f64(const AttendF64Args& a) const {
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

void CudaOps::subtract_projection(const ProjectionArgs& a) const {
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

cuda::CombineLaunch CudaOps::combine_launch(const CombineArgs& a) {
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

void* CudaOps::scratch(int slot, size_t bytes) const {
  auto& s = scratch_[size_t(slot)];
  if (s.size < bytes) {
    s.data.reset();  // freed once the work queued before is done (stream order)
    s.data = std::shared_ptr<void>(cuda_malloc(bytes), [](void* p) { cuda_free(p); });
    s.size = bytes;
  }
  return s.data.get();
}

void CudaOps::matmul(const void* w, cudaDataType wt, int64_t N, const void* x, cudaDataType xt,
                     int64_t ldx, int64_t M, int64_t K, const GemmOutput& o, Pin pin) const {
  run_gemm({.at = wt, .bt = xt, .m = N, .n = M, .k = K, .lda = K, .ldb = ldx, .ldd = o.ldy}, w, x,
           o.y, o.accumulate, pin);
}

void CudaOps::run_gemm(const LtGemm& g, const void* A, const void* B, float* D, bool accumulate,
                       Pin pin) const {
  const int align =
      alignment_of({uint64_t(reinterpret_cast<uintptr_t>(A)), uint64_t(g.lda) * element_bytes(g.at),
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
  check_blas(cublasLtMatmul(blas_, desc.h, &alpha, A, la.h, B, lb.h, &beta, D, lc.h, D, lc.h, &algo,
                            nullptr, 0, stream_),
             "matmul");
}

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

void CudaOps::set_heuristic(bool on) const {
  std::lock_guard lock(mu_);
  heuristic_ = on;
}

const cublasLtMatmulAlgo_t& CudaOps::pinned_algo(const MatmulDesc& desc, const LtGemm& g, int align,
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

}  // namespace

namespace {

// What tune allocates on the device, released whatever way it returns (a capture still open is
// closed first).
struct TuneScratch {
  cudaStream_t ts = nullptr;
  void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
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
    if (cand.size() == 1) return tuned;

    constexpr int64_t kVerifyN = 293;  // two full 128-column tiles and a ragged one
    constexpr std::array<int64_t, kSizeClasses> kTimeN = {64, 512, 2048};
    constexpr int64_t kLargeN = 65536;  // the largest class must at least accept this n
    const int64_t nmax = kTimeN.back();
    const size_t a_count = size_t(g.lda) * size_t(g.a_cols()),
                 b_count = size_t(g.ldb) * size_t(nmax), d_count = size_t(g.ldd) * size_t(nmax),
                 c_count = size_t(g.ldd) * size_t(kVerifyN);
    const std::vector<uint8_t> ah = random_operand(g.at, a_count, 17),
                               bh = random_operand(g.bt, b_count, 29),
                               ch = random_operand(CUDA_R_32F, c_count, 41);
    TuneScratch m;
    // Stream-ordered memory from the pool the backend's own allocations use. A failure here
    // leaves the shape untuned for now (not remembered: its next use tries again).
    if (cudaStreamSynchronize(stream_) != cudaSuccess ||
        cudaStreamCreateWithFlags(&m.ts, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMallocAsync(&m.a, ah.size(), m.ts) != cudaSuccess ||
        cudaMallocAsync(&m.b, bh.size(), m.ts) != cudaSuccess ||
        cudaMallocAsync(&m.c, ch.size(), m.ts) != cudaSuccess ||
        cudaMallocAsync(&m.d, d_count * sizeof(float), m.ts) != cudaSuccess ||
        cudaMemcpyAsync(m.a, ah.data(), ah.size(), cudaMemcpyHostToDevice, m.ts) != cudaSuccess ||
        cudaMemcpyAsync(m.b, bh.data(), bh.size(), cudaMemcpyHostToDevice, m.ts) != cudaSuccess ||
        cudaMemcpyAsync(m.c, ch.data(), ch.size(), cudaMemcpyHostToDevice, m.ts) != cudaSuccess ||
        cudaEventCreate(&m.e0) != cudaSuccess || cudaEventCreate(&m.e1) != cudaSuccess ||
        cudaStreamSynchronize(m.ts) != cudaSuccess)
      return std::nullopt;
    const Layout la(g.at, uint64_t(g.a_rows()), uint64_t(g.a_cols()), g.lda);
    auto run = [&](const cublasLtMatmulAlgo_t& algo, int64_t n, float beta) {
      const Layout lb(g.bt, uint64_t(g.k), uint64_t(n), g.ldb),
          ld(CUDA_R_32F, uint64_t(g.m), uint64_t(n), g.ldd);
      const float alpha = 1.0f;
      return cublasLtMatmul(blas_, desc.h, &alpha, m.a, la.h, m.b, lb.h, &beta, m.d, ld.h, m.d,
                            ld.h, &algo, nullptr, 0, m.ts) == CUBLAS_STATUS_SUCCESS;
    };
    const Layout lb_large(g.bt, uint64_t(g.k), uint64_t(kLargeN), g.ldb),
        ld_large(CUDA_R_32F, uint64_t(g.m), uint64_t(kLargeN), g.ldd);
    auto runs_large = [&](const cublasLtMatmulAlgo_t& algo) {
      cublasLtMatmulHeuristicResult_t r{};
      return cublasLtMatmulAlgoCheck(blas_, desc.h, la.h, lb_large.h, ld_large.h, ld_large.h, &algo,
                                     &r) == CUBLAS_STATUS_SUCCESS;
    };
    // Bits: D from C, then D (+)= A B at kVerifyN columns, read back.
    const size_t verify_bytes = size_t(g.ldd) * size_t(kVerifyN) * sizeof(float);
    auto result = [&](const cublasLtMatmulAlgo_t& algo, float beta, std::vector<uint8_t>& out) {
      out.resize(verify_bytes);
      return cudaMemcpyAsync(m.d, m.c, verify_bytes, cudaMemcpyDeviceToDevice, m.ts) ==
                 cudaSuccess &&
             run(algo, kVerifyN, beta) &&
             cudaMemcpyAsync(out.data(), m.d, verify_bytes, cudaMemcpyDeviceToHost, m.ts) ==
                 cudaSuccess &&
             cudaStreamSynchronize(m.ts) == cudaSuccess;
    };
    // Time: the median of three launches of a graph of five calls at n columns; < 0: failed.
    auto time_at = [&](const cublasLtMatmulAlgo_t& algo, int64_t n) {
      cudaGraph_t graph = nullptr;
      if (cudaStreamBeginCapture(m.ts, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return -1.0f;
      bool ok = true;
      for (int i = 0; i < 5 && ok; ++i) ok = run(algo, n, 0.0f);
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
      return ok ? ms[1] : -1.0f;
    };

    std::vector<uint8_t> ref0, ref1, got;
    if (!result(base, 0.0f, ref0) || !result(base, 1.0f, ref1)) return std::nullopt;
    std::array<float, kSizeClasses> best{};
    for (size_t c = 0; c < kSizeClasses; ++c) best[c] = time_at(base, kTimeN[c]);
    int verified = 1;
    for (size_t i = 1; i < cand.size(); ++i) {
      if (!result(cand[i], 0.0f, got) || got != ref0 || !result(cand[i], 1.0f, got) || got != ref1)
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
    log::debug(
        "cuBLASLt [{}, {}] x [{}, n]: {} of {} candidates give the pinned bits; {:.1f} / "
        "{:.1f} / {:.1f} us at n = 64 / 512 / 2048 (negative: the timing failed)",
        g.m, g.k, g.k, verified, cand.size(), best[0] * 200, best[1] * 200, best[2] * 200);
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
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(blas_, desc.h, la.h, lb.h, lc.h, lc.h,
                                                          pref.h, 8, results, &found);
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
    if (cublasLtMatmulAlgoCheck(blas_, desc.h, la.h, lb1.h, lc1.h, lc1.h, &results[i].algo, &r) ==
            CUBLAS_STATUS_SUCCESS &&
        r.workspaceSize == 0)
      out.push_back(results[i].algo);
  }
  return out;
}

}  // namespace cuda_backend

namespace {

using cuda_backend::check;
using cuda_backend::CudaOps;

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
  cudaProfilerStart();  // Nsight Compute with --profile-from-start off sees exactly this range
}

std::vector<OpTime> cuda_profile_stop() {
  cudaProfilerStop();
  return profiled().stop();
}

void cuda_gemm_heuristic(bool on) {
  static_cast<const CudaOps&>(profiled().inner()).set_heuristic(on);
}

}  // namespace deg
