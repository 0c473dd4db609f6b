// GEMM front end: runtime ISA dispatch, the split of work over threads (column blocks x row
// blocks, neither of which changes any element's result), bf16 rounding of the activations for
// bf16 dot products, the scalar reference, and the peak-FLOP/s measurement.
#include "kernels/gemm.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/scratch.h"

namespace deg {

namespace {

constexpr int64_t kColBlock = 16;  // output columns per work unit
constexpr int64_t kRowBlock = 64;  // rows per work unit (x block stays in L2)

GemmIsa detect_isa() {
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return GemmIsa::avx512bf16;
  if (avx512) return GemmIsa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return GemmIsa::avx2;
  return GemmIsa::scalar;
}

std::atomic<int>& forced_isa() {
  static std::atomic<int> isa{-1};
  return isa;
}

void check_args(const GemmArgs& a) {
  DEG_CHECK(a.m >= 0 && a.k > 0 && a.ldx >= a.k, "gemm: m {} k {} ldx {}", a.m, a.k, a.ldx);
  for (const GemmOutput& o : a.outputs) {
    DEG_CHECK(o.w && o.w->rank() == 2 && o.w->dim(1) == a.k && o.w->is_contiguous(),
              "gemm: weight {} does not match K {}", o.w ? o.w->describe() : "null", a.k);
    DEG_CHECK(o.w->dtype() == DType::f32 || o.w->dtype() == DType::bf16,
              "gemm: weight dtype {} unsupported", dtype_name(o.w->dtype()));
    DEG_CHECK(o.ldy >= o.w->dim(0), "gemm: ldy {} < N {}", o.ldy, o.w->dim(0));
  }
}

float weight_at(const Tensor& w, int64_t index) {
  if (w.dtype() == DType::bf16) return bf16_to_f32(w.data<bf16>()[index]);
  return w.data<float>()[index];
}

}  // namespace

GemmIsa gemm_best_isa() {
  static const GemmIsa best = detect_isa();
  return best;
}

GemmIsa gemm_isa() {
  int forced = forced_isa().load();
  return forced >= 0 ? GemmIsa(forced) : gemm_best_isa();
}

void gemm_force_isa(GemmIsa isa) {
  DEG_CHECK(int(isa) <= int(gemm_best_isa()), "gemm: this CPU cannot run {}", gemm_isa_name(isa));
  forced_isa().store(int(isa));
}

const char* gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::scalar: return "scalar";
    case GemmIsa::avx2: return "avx2+fma";
    case GemmIsa::avx512: return "avx512";
    case GemmIsa::avx512bf16: return "avx512+bf16";
  }
  return "?";
}

void gemm_reference(const GemmArgs& a) {
  check_args(a);
  for (const GemmOutput& o : a.outputs) {
    const Tensor& w = *o.w;
    const bool round = rounds_to_bf16(a.precision, w.dtype());
    for (int64_t m = 0; m < a.m; ++m) {
      const float* x = a.x + m * a.ldx;
      for (int64_t n = 0; n < w.dim(0); ++n) {
        float acc = 0;
        for (int64_t k = 0; k < a.k; ++k) {
          const float wv = weight_at(w, n * a.k + k);
          acc += (round ? bf16_to_f32(f32_to_bf16(x[k])) : x[k]) *
                 (round ? bf16_to_f32(f32_to_bf16(wv)) : wv);
        }
        float* y = o.y + m * o.ldy + n;
        *y = o.accumulate ? *y + acc : acc;
      }
    }
  }
}

void gemm(const GemmArgs& a) {
  check_args(a);
  if (a.m == 0 || a.outputs.empty()) return;
  if (a.precision == GemmPrecision::bf16_all) {  // the f32 weights rounded, then as bf16
    std::vector<Tensor> rounded;
    rounded.reserve(a.outputs.size());
    std::vector<GemmOutput> outs(a.outputs.begin(), a.outputs.end());
    for (GemmOutput& o : outs)
      if (o.w->dtype() == DType::f32) o.w = &rounded.emplace_back(o.w->to(DType::bf16));
    GemmArgs b = a;
    b.outputs = outs;
    b.precision = GemmPrecision::bf16;
    gemm(b);
    return;
  }
  const GemmIsa isa = gemm_isa();
  if (isa == GemmIsa::scalar) {
    gemm_reference(a);
    return;
  }
  bool any_bf16_weight = false;
  for (const GemmOutput& o : a.outputs) any_bf16_weight |= o.w->dtype() == DType::bf16;
  const bool round_x = a.precision == GemmPrecision::bf16 && any_bf16_weight;
  const bool any_bf16_dot = round_x && isa == GemmIsa::avx512bf16;

  // Without bf16 dot products, bf16 precision still means "x rounded to bf16": an f32 copy of
  // the rounded x feeds the f32 kernels for the bf16 weights.
  float* xr = nullptr;
  if (round_x && !any_bf16_dot) {
    xr = scratch_floats(kKernelSlots + 12, size_t(a.m * a.k));
    parallel_for(a.m, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t k = 0; k < a.k; ++k)
          xr[m * a.k + k] = bf16_to_f32(f32_to_bf16(a.x[m * a.ldx + k]));
    });
  }

  // x rounded to bf16 once, rows zero-padded to a multiple of 32 (one vdpbf16ps step).
  uint16_t* xb = nullptr;
  const int64_t ldxb = (a.k + 31) / 32 * 32;
  if (any_bf16_dot) {  // two bf16 per float of scratch
    xb = reinterpret_cast<uint16_t*>(scratch_floats(kKernelSlots + 13, size_t(a.m * ldxb + 1) / 2));
    parallel_for(a.m, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        const float* x = a.x + m * a.ldx;
        uint16_t* d = xb + m * ldxb;
        for (int64_t k = 0; k < a.k; ++k) d[k] = f32_to_bf16(x[k]).bits;
        for (int64_t k = a.k; k < ldxb; ++k) d[k] = 0;
      }
    });
  }

  // Work units: (output, column block, row block), in that order, so a thread's contiguous
  // share of units covers whole column strips.
  const int64_t row_blocks = (a.m + kRowBlock - 1) / kRowBlock;
  std::vector<int64_t> first_unit(a.outputs.size() + 1, 0);
  for (size_t o = 0; o < a.outputs.size(); ++o) {
    int64_t cols = a.outputs[o].w->dim(0);
    first_unit[o + 1] = first_unit[o] + (cols + kColBlock - 1) / kColBlock * row_blocks;
  }
  parallel_for(first_unit.back(), [&](int64_t u0, int64_t u1) {
    size_t o = 0;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= first_unit[o + 1]) ++o;
      const GemmOutput& out = a.outputs[o];
      const int64_t local = u - first_unit[o];
      const int64_t cb = local / row_blocks, rb = local % row_blocks;
      const int64_t n_total = out.w->dim(0);
      const bool rounded = xr && out.w->dtype() == DType::bf16;
      gemm_detail::TileJob job{
          .x = rounded ? xr : a.x,
          .ldx = rounded ? a.k : a.ldx,
          .xb = xb,
          .ldxb = ldxb,
          .w = out.w->raw(),
          .ldw = a.k,
          .w_bf16 = out.w->dtype() == DType::bf16,
          .k = a.k,
          .m0 = rb * kRowBlock,
          .m1 = std::min(a.m, (rb + 1) * kRowBlock),
          .n0 = cb * kColBlock,
          .n1 = std::min(n_total, (cb + 1) * kColBlock),
          .y = out.y,
          .ldy = out.ldy,
          .accumulate = out.accumulate,
      };
      const bool dot = any_bf16_dot && job.w_bf16;
      if (dot) {
        gemm_detail::tile_avx512_bf16dot(job);
      } else if (isa == GemmIsa::avx2) {
        gemm_detail::tile_avx2(job);
      } else {
        gemm_detail::tile_avx512(job);
      }
    }
  });
}

void matmul_nt_reference(const MatmulArgs& a) {
  for (int64_t i = 0; i < a.m; ++i)
    for (int64_t j = 0; j < a.n; ++j) {
      float acc = 0;
      for (int64_t k = 0; k < a.k; ++k) acc += a.a[i * a.lda + k] * a.b[j * a.ldb + k];
      float* y = a.c + i * a.ldc + j;
      *y = a.accumulate ? *y + acc : acc;
    }
}

void matmul_nn_reference(const MatmulArgs& a) {
  for (int64_t i = 0; i < a.m; ++i)
    for (int64_t j = 0; j < a.n; ++j) {
      float acc = 0;
      for (int64_t k = 0; k < a.k; ++k) acc += a.a[i * a.lda + k] * a.b[k * a.ldb + j];
      float* y = a.c + i * a.ldc + j;
      *y = a.accumulate ? *y + acc : acc;
    }
}

void matmul_nt(const MatmulArgs& a) {
  if (a.m <= 0 || a.n <= 0) return;
  const GemmIsa isa = gemm_isa();
  if (isa == GemmIsa::scalar || a.k <= 0) {
    matmul_nt_reference(a);
    return;
  }
  gemm_detail::TileJob job{.x = a.a,
                           .ldx = a.lda,
                           .w = a.b,
                           .ldw = a.ldb,
                           .w_bf16 = false,
                           .k = a.k,
                           .m0 = 0,
                           .m1 = a.m,
                           .n0 = 0,
                           .n1 = a.n,
                           .y = a.c,
                           .ldy = a.ldc,
                           .accumulate = a.accumulate};
  if (isa == GemmIsa::avx2) {
    gemm_detail::tile_avx2(job);
  } else {
    gemm_detail::tile_avx512(job);
  }
}

void matmul_nn(const MatmulArgs& a) {
  if (a.m <= 0 || a.n <= 0) return;
  const GemmIsa isa = gemm_isa();
  if (isa == GemmIsa::scalar) {
    matmul_nn_reference(a);
    return;
  }
  gemm_detail::NnJob job{.a = a.a,
                         .lda = a.lda,
                         .b = a.b,
                         .ldb = a.ldb,
                         .m = a.m,
                         .n = a.n,
                         .k = a.k,
                         .c = a.c,
                         .ldc = a.ldc,
                         .accumulate = a.accumulate};
  if (isa == GemmIsa::avx2) {
    gemm_detail::nn_avx2(job);
  } else {
    gemm_detail::nn_avx512(job);
  }
}

PeakFlops measure_peak_flops(double seconds) {
  using Clock = std::chrono::steady_clock;
  const GemmIsa isa = gemm_best_isa();
  const int threads = thread_pool().size();
  auto rate = [&](float (*loop)(int64_t), double flops_per_iter) {
    // Calibrate on one thread, then run every thread for about `seconds`.
    int64_t iters = 1 << 16;
    for (;;) {
      auto t0 = Clock::now();
      volatile float sink = loop(iters);
      (void)sink;
      double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (dt > seconds / 8 || iters > (int64_t(1) << 40)) {
        iters = int64_t(double(iters) * seconds / std::max(dt, 1e-9));
        break;
      }
      iters *= 4;
    }
    std::atomic<int64_t> done{0};
    auto t0 = Clock::now();
    parallel_for(threads, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        volatile float sink = loop(iters);
        (void)sink;
        done += iters;
      }
    });
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    return double(done.load()) * flops_per_iter / dt;
  };
  PeakFlops p;
  const double acc = gemm_detail::kPeakAccumulators;
  if (isa == GemmIsa::avx512bf16) p.bf16 = rate(gemm_detail::peak_loop_bf16_avx512, acc * 64);
  if (isa >= GemmIsa::avx512) {
    p.f32 = rate(gemm_detail::peak_loop_f32_avx512, acc * 32);
  } else if (isa == GemmIsa::avx2) {
    p.f32 = rate(gemm_detail::peak_loop_f32_avx2, acc * 16);
  }
  return p;
}

}  // namespace deg
