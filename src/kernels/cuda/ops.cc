// The CUDA backend (kernels/ops.h): every op enqueued in order on one stream of the first GPU.
// GEMMs go through cuBLASLt with one pinned algorithm per (weight shape, dtype, alignment) and no
// split-K (gemm_algos.cc), so a row's output never depends on how many rows share the call; the
// other ops are own kernels (launch.h), whose row tables travel by value in the launch.
//
// Every op of the table runs here.
#include <cublasLt.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"
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
  // bf16 dot products: x rounded to bf16 once for every output (or by the op that wrote it).
  const void* xb = a.xb;
  if (a.xb) check_bf16_rows(a);
  bool round_x = false;
  for (const GemmOutput& o : a.outputs) round_x |= rounds_to_bf16(a.precision, o.w->dtype());
  const int64_t ldxb = a.xb ? a.ldx : a.k;
  if (!a.xb && round_x) {
    void* buf = a.xb_out ? static_cast<void*>(a.xb_out) : scratch(0, size_t(a.m * a.k) * 2);
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
    gemm_one(a, o.w->raw(), dt, N, xb, ldxb, o);
    i = j;
  }
}

void CudaOps::gemm_one(const GemmArgs& a, const std::byte* w, DType dt, int64_t N, const void* xb,
                       int64_t ldxb, const GemmOutput& o) const {
  if (dt == DType::f32 && a.precision == GemmPrecision::bf16_all) {  // W rounded, then bf16
    void* wb = scratch(1, size_t(N * a.k) * 2);
    check(cuda::launch_to_bf16(reinterpret_cast<const float*>(w), a.k, N, a.k, wb, stream_),
          "to bf16");
    matmul(wb, CUDA_R_16BF, N, xb, CUDA_R_16BF, ldxb, a.m, a.k, o);
  } else if (dt == DType::f32) {
    matmul(w, CUDA_R_32F, N, a.x, CUDA_R_32F, a.ldx, a.m, a.k, o);
  } else if (xb) {
    matmul(w, CUDA_R_16BF, N, xb, CUDA_R_16BF, ldxb, a.m, a.k, o);
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
                               .hg = a.hg ? a.hg : a.dim,
                               .yb = reinterpret_cast<uint16_t*>(a.yb)},
                              stream_),
        "rms_norm");
}

void CudaOps::l2_norm(const L2NormArgs& a) const {
  scaled_heads(a);  // checks unscaled_heads
  check(cuda::launch_l2_norm({.x = a.x,
                              .ldx = a.ldx,
                              .rows = a.rows,
                              .heads = a.heads,
                              .dim = a.dim,
                              .eps = a.eps,
                              .post_scale = a.post_scale,
                              .unscaled_heads = a.unscaled_heads},
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
    for (int i = 0; i < r.count; ++i) {
      cuda::KvRow& kv = l.kv[i];
      kv = kv_row(a.views[first + i]);
      // A sliding window's kept keys start past key 0 (backbone.cc keeps them from a multiple
      // of kSkippedAlign, the kernels' key block): the kernels see them at their absolute key
      // indices, as if every earlier key were there (a prefix as long as the keys not kept, whose
      // blocks no query reaches), so a query's key blocks and splits are those of one read of the
      // whole input.
      const int64_t skipped = a.views[first + i].skipped;
      if (skipped != 0) {
        DEG_CHECK(skipped > 0 && skipped % kSkippedAlign == 0 && a.window > 0,
                  "attention: row {} holds its keys from key {}: not a sliding window kept from "
                  "a multiple of {}",
                  first + i, skipped, kSkippedAlign);
        const int64_t shift = skipped * a.head_dim;
        if (kv.prefix_len == 0) {  // a trunk row: its own keys are the window
          kv.prefix_k = kv.own_k - shift;
          kv.prefix_v = kv.own_v - shift;
          kv.prefix_stride = kv.own_stride;
        } else {
          kv.prefix_k -= shift;
          kv.prefix_v -= shift;
        }
        kv.prefix_len += skipped;
      }
    }
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
    l.rec_scratch = true;
    for (int i = 0; i < r.count; ++i) {
      const RowView& v = a.views[first + i];
      l.state[i] = state_row(v);
      l.hist[i] = {.k = v.hist.k,
                   .d = v.hist.d,
                   .g = v.hist.g,
                   .len = int32_t(v.hist.len),
                   .cap = int32_t(v.hist.cap),
                   .append = v.hist.append ? 1 : 0};
      l.rec_scratch = l.rec_scratch && v.rec_scratch;
    }
    // DEG_CUDA_DELTA_RULE_WORKSPACE (floats) shrinks the chunked form's segments: tests hold
    // that segments change no bit.
    const char* cap = std::getenv("DEG_CUDA_DELTA_RULE_WORKSPACE");
    const int64_t ws = cuda::delta_rule_workspace_floats(
        l, cap ? std::max<int64_t>(1, std::atoll(cap)) : cuda::kDeltaRuleWorkspaceCap);
    std::lock_guard lock(mu_);
    l.workspace = ws > 0 ? static_cast<float*>(scratch(9, size_t(ws) * sizeof(float))) : nullptr;
    l.workspace_floats = ws;
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
                          .act = act,
                          .outb = reinterpret_cast<uint16_t*>(a.outb)},
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

void CudaOps::logit_picks(const LogitPicksArgs& a) const {
  std::lock_guard lock(mu_);  // the scratch slot
  check(cuda::launch_logit_picks({.logits = a.logits,
                                  .ld = a.ld,
                                  .rows = a.rows,
                                  .n = a.n,
                                  .best = a.best,
                                  .second = a.second,
                                  .best_logit = a.best_logit,
                                  .second_logit = a.second_logit,
                                  .max = a.max,
                                  .sum = a.sum,
                                  .bad = a.bad},
                                 scratch(8, cuda::logit_picks_workspace(a.rows, a.n)), stream_),
        "logit_picks");
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

void CudaOps::gather_rows(const float* x, int64_t ldx, const int32_t* index, float* y, int64_t ldy,
                          int64_t rows, int64_t n) const {
  check(cuda::launch_gather_rows(x, ldx, index, y, ldy, rows, n, stream_), "gather_rows");
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
    if (a.bf16 && cuda::attention_bf16_fits(l)) {  // tensor cores (attention_bf16.cu)
      DeviceTemp work(cuda::attention_bf16_workspace(l, false));
      check(cuda::launch_attention_bf16(l, work.get(), stream_), "attention_f64 (bf16)");
      return;
    }
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
    check_blas(cuda::cublaslt().Matmul(
                   blas_, desc.h, &alpha, A, la.h, B, lb.h, &beta, D, lc.h, D, lc.h, &h.algo,
                   h.workspace ? scratch(2, h.workspace) : nullptr, h.workspace, stream_),
               "matmul");
    return;
  }
  int own = kCublas;
  const cublasLtMatmulAlgo_t& algo = pinned_algo(desc, g, align, pin, &own);
  if (small_config_ >= 0 && g.small_m_operands()) own = small_config_;
  if (own != kCublas) {  // tune found ours faster with the same bits, or a test asks for it
    const cuda::SmallGemmLaunch l{.x = static_cast<const uint16_t*>(B),
                                  .ldx = g.ldb,
                                  .w = static_cast<const uint16_t*>(A),
                                  .y = D,
                                  .ldy = g.ldd,
                                  .m = g.n,
                                  .n = g.m,
                                  .k = g.k,
                                  .accumulate = accumulate};
    if (cuda::small_gemm_fits(l)) {
      check(cuda::launch_small_gemm(l, own, stream_), "small-M gemm");
      return;
    }
  }
  check_blas(cuda::cublaslt().Matmul(blas_, desc.h, &alpha, A, la.h, B, lb.h, &beta, D, lc.h, D,
                                     lc.h, &algo, nullptr, 0, stream_),
             "matmul");
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
    std::map<std::pair<std::string, const void*>, OpSite> sites;
    for (const Mark& m : marks_) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[m.start], events_[m.start + 1]), "event time");
      OpTime& t = sums[m.op];
      t.op = m.op;
      t.ms += ms;
      ++t.calls;
      OpSite& s = sites[{m.op, m.site}];
      s.ms += ms;
      ++s.calls;
    }
    for (auto& [key, s] : sites) {
      s.where = site_name(key.second);
      sums[key.first].sites.push_back(s);
    }
    std::vector<OpTime> out;
    for (auto& [op, t] : sums) {
      std::sort(t.sites.begin(), t.sites.end(),
                [](const OpSite& a, const OpSite& b) { return a.ms > b.ms; });
      out.push_back(t);
    }
    std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
    return out;
  }

 protected:
  void run(const char* op, const void* site, const std::function<void()>& call) const override {
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
    marks_.push_back({op, site, at});
  }

 private:
  struct Mark {
    const char* op;
    const void* site;
    size_t start;  // events_[start], events_[start + 1]
  };

  // "MODULE+0xOFFSET" of a code address (its offset from the module's load address, which is
  // what addr2line reads), or the bare address when the loader cannot say.
  static std::string site_name(const void* site) {
    Dl_info info{};
    if (dladdr(site, &info) != 0 && info.dli_fname && info.dli_fbase)
      return fmt::format(
          "{}+0x{:x}", info.dli_fname,
          reinterpret_cast<uintptr_t>(site) - reinterpret_cast<uintptr_t>(info.dli_fbase));
    return fmt::format("{}", site);
  }
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

void cuda_gemm_small_config(int config) {
  static_cast<const CudaOps&>(profiled().inner()).set_small_config(config);
}

}  // namespace deg
