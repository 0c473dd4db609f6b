// The CUDA backend's training ops (cuda_ops.h): the backward ops (backward.cu; the products
// through cuBLASLt), the optimizer steps (optimizer.cu) and the fused soft-capped loss (loss.cu).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/backward.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launch.h"

namespace deg::cuda_backend {

void CudaOps::matmul(const MatmulOpArgs& a) const {
  if (a.m * a.n == 0) return;
  if (a.k == 0) {
    if (!a.accumulate)
      check(cudaMemset2DAsync(a.c, size_t(a.ldc) * 4, 0, size_t(a.n) * 4, size_t(a.m), stream_),
            "matmul");
    return;
  }
  std::lock_guard lock(mu_);
  // bf16_all: each operand rounded to bf16 as stored ([rows, cols] at its ld, a batch's
  // matrices back to back), packed.
  const bool low = a.precision == GemmPrecision::bf16_all;
  const void *pa = a.a, *pb = a.b;
  int64_t lda = a.lda, ldb = a.ldb, stride_a = a.stride_a, stride_b = a.stride_b;
  if (low) {
    const int64_t ra = a.ta ? a.k : a.m, ca = a.ta ? a.m : a.k;
    const int64_t rb = a.tb ? a.n : a.k, cb = a.tb ? a.k : a.n;
    DEG_CHECK(a.batch == 1 || (a.stride_a == ra * a.lda && a.stride_b == rb * a.ldb),
              "matmul: a bf16_all batch's matrices lie back to back");
    // Each operand rounded here unless an earlier op of this backend already did (ab / bb).
    auto rounded = [&](const float* x, int64_t ld, int64_t rows, int64_t cols, const bf16* done,
                       bf16* keep, int slot) -> const void* {
      if (done) return done;
      void* out = keep ? static_cast<void*>(keep) : scratch(slot, size_t(rows * cols) * 2);
      check(cuda::launch_to_bf16(x, ld, rows, cols, out, stream_), "to bf16");
      return out;
    };
    pa = rounded(a.a, a.lda, a.batch * ra, ca, a.ab, a.ab_out, 10);
    pb = rounded(a.b, a.ldb, a.batch * rb, cb, a.bb, nullptr, 11);
    lda = ca, ldb = cb, stride_a = ra * ca, stride_b = rb * cb;
  }
  const cudaDataType t = low ? CUDA_R_16BF : CUDA_R_32F;
  // Row-major c = op(a) op(b) is column-major cᵀ = op(b)ᵀ op(a)ᵀ: the column-major view of a
  // row-major [r, c] matrix is its transpose, so b's view (N x K, or K x N read transposed
  // when tb) multiplies a's (K x M, or M x K read transposed when ta).
  const LtGemm g{.ta = a.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                 .tb = a.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                 .at = t,
                 .bt = t,
                 .m = a.n,
                 .n = a.m,
                 .k = a.k,
                 .lda = ldb,
                 .ldb = lda,
                 .ldd = a.ldc};
  if (a.batch > 1) {
    run_batched_gemm(g, a.batch, stride_b, stride_a, a.stride_c, pb, pa, a.c, a.accumulate);
  } else {
    run_split_gemm(g, pb, pa, a.c, a.accumulate);
  }
}

void CudaOps::rms_norm_backward(const NormBackwardArgs& a) const {
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

void CudaOps::activation_backward(const ActivationBackwardArgs& a) const {
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

void CudaOps::column_sum(const ColumnSumArgs& a) const {
  DeviceTemp partial(size_t(cuda::column_sum_partials(a.rows, a.n)) * sizeof(double));
  check(cuda::launch_column_sum({.x = a.x,
                                 .ldx = a.ldx,
                                 .rows = a.rows,
                                 .n = a.n,
                                 .s = a.s,
                                 .out = a.out,
                                 .accumulate = a.accumulate,
                                 .partial = partial.as<double>()},
                                stream_),
        "column_sum");
}

void CudaOps::combine_backward(const CombineBackwardArgs& a) const {
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

void CudaOps::gather_backward(const GatherBackwardArgs& a) const {
  const GatherArgs& f = a.forward;
  const Tensor& t = *f.table;
  DEG_CHECK(t.dtype() == DType::f32 && t.device() == Device::cuda && f.mix == 1.0f && !f.soft_rows,
            "cuda gather_backward: an f32 device table without mix or soft rows");
  const int64_t n = f.n, V = t.dim(0), C = t.dim(1);
  DeviceTemp dev_ids(size_t(n) * sizeof(int32_t));
  const int32_t* ids = f.ids;
  if (f.id_lane) {
    check(cuda::launch_lane_ids(f.id_lane, f.ld_id, n, dev_ids.as<int32_t>(), stream_),
          "gather_backward");
    ids = dev_ids.as<int32_t>();
  }
  if (a.dtable) {
    scatter(ids, n, V, C,
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

void CudaOps::sigmoid_gates_backward(const SigmoidGatesBackwardArgs& a) const {
  const SigmoidGateArgs& f = a.forward;
  DeviceTemp dz(size_t(std::max<int64_t>(f.rows * f.heads, 1)) * sizeof(float));
  const int64_t blocks = (f.rows + cuda::kGateRowsPerPartial - 1) / cuda::kGateRowsPerPartial;
  DeviceTemp partial(size_t(std::max<int64_t>(blocks * f.heads * (f.x2 ? 2 : 1) * f.n, 1)) *
                     sizeof(double));
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
                                             .dz = dz.as<float>(),
                                             .partial = partial.as<double>()},
                                            stream_),
        "sigmoid_gates_backward");
}

void CudaOps::subtract_projection_backward(const ProjectionBackwardArgs& a) const {
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

void CudaOps::ngram_embed_backward(const NgramBackwardArgs& a) const {
  const NgramEmbedArgs& f = a.forward;
  DEG_CHECK(f.table->dtype() == DType::f32, "cuda ngram_embed_backward: an f32 table");
  const int64_t n = f.rows.n(), V = f.table->dim(0), Dn = f.table->dim(1);
  // The table rows and sign rows every token read, then a scatter per table row.
  DeviceTemp rows(size_t(2 * n) * sizeof(int32_t)), signs(size_t(2 * n) * sizeof(int32_t));
  for_row_chunks(f.rows, [&](const cuda::Rows& r, int64_t) {
    check(cuda::launch_ngram_entries(ngram_launch(f, r), rows.as<int32_t>(), signs.as<int32_t>(),
                                     stream_),
          "ngram_embed_backward");
  });
  scatter(rows.as<int32_t>(), 2 * n, V, Dn,
          {.dy = a.dy,
           .ldy = a.ldy,
           .entry_shift = 1,
           .signs = signs.as<int32_t>(),
           .sign_pool = f.sign_pool,
           .dtable = a.dtable});
}

void CudaOps::attention_f64_backward(const AttendF64BackwardArgs& a) const {
  const AttendF64Args& f = a.forward;
  std::optional<DeviceTemp> stats;  // the f64 kernels' (attention_bf16.cu keeps its own)
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
                                       .hdq = a.hdq};
    for (int i = 0; i < r.count; ++i) {
      l.forward.kv[i] = kv_row(f.views[first + i]);
      l.grad[i] = kv_row(a.dviews[first + i]);
    }
    if (f.bf16 && cuda::attention_bf16_fits(l.forward)) {  // tensor cores (attention_bf16.cu)
      DeviceTemp work(cuda::attention_bf16_workspace(l.forward, true));
      check(cuda::launch_attention_bf16_backward(l, work.get(), stream_),
            "attention_f64_backward (bf16)");
      return;
    }
    if (!stats)
      stats.emplace(size_t(std::max<int64_t>(f.rows.n() * f.heads * 3, 1)) * sizeof(float));
    l.stats = stats->as<float>();
    check(cuda::launch_attention_f64_backward(l, stream_), "attention_f64_backward");
  });
}

void CudaOps::adam_step(const AdamStepArgs& a) const {
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

void CudaOps::nesterov(const NesterovArgs& a) const {
  check(cuda::launch_nesterov({.g = a.g,
                               .buf = a.buf,
                               .u = a.u,
                               .n = a.n,
                               .momentum = a.momentum,
                               .count = a.gs ? a.count : 1,
                               .gs = a.gs,
                               .bufs = a.bufs},
                              stream_),
        "nesterov");
}

void CudaOps::normuon_step(const NorMuonStepArgs& a) const {
  const int64_t count = a.ps ? a.count : 1;
  DeviceTemp work(size_t(count * (2 * std::max(a.rows, a.cols) + 1)) * sizeof(float));
  check(cuda::launch_normuon_step({.u = a.u,
                                   .p = a.p,
                                   .second = a.second,
                                   .rows = a.rows,
                                   .cols = a.cols,
                                   .beta2 = a.beta2,
                                   .lr = a.lr,
                                   .wd = a.wd,
                                   .count = count,
                                   .ps = a.ps,
                                   .seconds = a.seconds,
                                   .lr_muls = a.lr_muls,
                                   .work = work.as<float>()},
                                  stream_),
        "normuon_step");
}

double CudaOps::sum_squares(const float* x, int64_t n) const {
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  DeviceTemp work(size_t(chunks + 1) * sizeof(double));
  double* out = work.as<double>() + chunks;
  check(cuda::launch_sum_squares(x, n, kSumChunk, work.as<double>(), out, stream_), "sum_squares");
  double s = 0;
  to_host(&s, out, sizeof(double));
  return s;
}

void CudaOps::frobenius_normalize(const FrobeniusNormalizeArgs& a) const {
  if (a.n * a.count == 0) return;
  const int64_t chunks = (a.n + kSumChunk - 1) / kSumChunk;
  DeviceTemp work(size_t(a.count * chunks) * sizeof(double) + size_t(a.count) * sizeof(float));
  check(cuda::launch_frobenius_normalize(
            {.x = a.x, .n = a.n, .count = a.count, .margin = a.margin, .eps = a.eps}, kSumChunk,
            work.as<double>(), reinterpret_cast<float*>(work.as<double>() + a.count * chunks),
            stream_),
        "frobenius_normalize");
}

void CudaOps::softcap_cross_entropy(const SoftcapCrossEntropyArgs& a) const {
  const Tensor& w = *a.w;
  DEG_CHECK(w.rank() == 2 && w.is_contiguous() && w.device() == Device::cuda,
            "cuda softcap_cross_entropy: weight {} is not a contiguous [V, C] device tensor",
            w.describe());
  DEG_CHECK(a.mtp >= 0 && a.mtp <= cuda::kLossMtp, "softcap_cross_entropy: {} mtp weights", a.mtp);
  if (w.dtype() != DType::f32 && w.dtype() != DType::bf16)
    throw Error(ErrorKind::unsupported,
                fmt::format("cuda softcap_cross_entropy: {} weights", dtype_name(w.dtype())));
  const int64_t T = a.rows, V = w.dim(0), C = w.dim(1);
  if (T == 0) return;
  std::lock_guard lock(mu_);
  const bool grad = a.dxn || a.dw, low = a.bf16;
  // Four times the CPU's chunk of logits (256 MiB of f32): fewer passes of the products'
  // accumulation into dw.
  const int64_t chunk = std::min(T, 4 * softcap_cross_entropy_chunk(V));
  const cudaDataType pt = low ? CUDA_R_16BF : CUDA_R_32F;  // the products' operand type
  const void* wp = w.raw();
  if (!low && w.dtype() == DType::bf16) {  // exact: W widened to f32 once per call
    float* wf = static_cast<float*>(scratch(7, size_t(V * C) * sizeof(float)));
    check(cuda::launch_widen_bf16(w.raw(), V * C, wf, stream_), "widen bf16");
    wp = wf;
  } else if (low && w.dtype() == DType::f32) {  // W rounded to bf16 once per call
    void* wb = scratch(7, size_t(V * C) * 2);
    check(cuda::launch_to_bf16(w.data<float>(), C, V, C, wb, stream_), "to bf16");
    wp = wb;
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
      run_split_gemm({.ta = CUBLAS_OP_N,
                      .tb = CUBLAS_OP_N,
                      .at = pt,
                      .bt = pt,
                      .m = C,
                      .n = R,
                      .k = V,
                      .lda = C,
                      .ldb = V,
                      .ldd = a.lddx},
                     wp, dz, a.dxn + r0 * a.lddx, true);
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

void CudaOps::scatter(const int32_t* keys, int64_t entries, int64_t rows, int64_t cols,
                      cuda::ScatterRowsLaunch l) const {
  const size_t temp_bytes = cuda::row_order_bytes(entries, rows);
  DeviceTemp o(size_t(entries) * sizeof(int64_t)), st(size_t(rows + 1) * sizeof(int64_t)),
      temp(temp_bytes);
  check(cuda::launch_row_order(keys, entries, rows, o.as<int64_t>(), st.as<int64_t>(), temp.get(),
                               temp_bytes, stream_),
        "scatter");
  l.keys = keys;
  l.entries = entries;
  l.order = o.as<int64_t>();
  l.starts = st.as<int64_t>();
  l.rows = rows;
  l.cols = cols;
  check(cuda::launch_scatter_rows(l, stream_), "scatter");
}

}  // namespace deg::cuda_backend
