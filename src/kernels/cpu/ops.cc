// The CPU backend of the op interface (kernels/ops.h): each op spreads a call's rows, tokens or
// heads over the process thread pool and runs the per-row kernels of kernels/cpu on them. Work is
// split by index into fixed pieces, and every kernel's reduction order depends on its own
// inputs' sizes only, so how the pool splits a call never changes a bit. The thread pool is used
// here and in the kernels, nowhere above.
#include "kernels/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <new>
#include <utility>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/conv.h"
#include "kernels/cpu/attention_f64.h"
#include "kernels/cpu/backward.h"
#include "kernels/cpu/scalar_ops.h"
#include "kernels/delta_rule.h"
#include "kernels/scratch.h"

namespace deg {

namespace {

constexpr int64_t kQueryBlock = 16;         // attention work unit (queries)
constexpr int64_t kConvChannelBlock = 512;  // conv work unit (channels)
constexpr int64_t kRowGrain = 16;           // token rows per piece of a row-wise op

void for_each_index(int64_t n, int64_t grain, const std::function<void(int64_t)>& fn) {
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) fn(i);
      },
      grain);
}

bool is_real(const RowTable& r, int64_t i) {
  return i % r.tokens < r.lengths[i / r.tokens];
}

// PyTorch's gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

// ---- softcap_cross_entropy's row (train/loss.h's arithmetic) ----

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// Row t of softcap_cross_entropy: z [V] (its logits) becomes dz when `grad`; u [V] is scratch.
// Soft-capped logits are in (0, a), so a is a safe fixed maximum for the lse (as the seed's
// kernel); the sum runs over v in order, in f64.
void softcap_row(const SoftcapCrossEntropyArgs& a, int64_t T, int64_t V, int64_t t, float* z,
                 float* u, bool grad) {
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) {
    u[v] = sigmoid((z[v] + a.b) / a.c);
    sum += std::exp(double(a.a * u[v] - a.a));
  }
  const double lse = a.a + std::log(sum);
  std::array<std::pair<int32_t, float>, kMaxMtpWeights + 1> terms;  // (target, weight)
  int n = 0;
  for (int64_t k = 0; k < a.mtp && t + k < T; ++k) {
    const int32_t target = a.targets[t + k];
    if (target >= 0 && target < V) terms[size_t(n++)] = {target, a.mtp_weights[size_t(k)]};
  }
  if (a.prefix && a.prefix_weight != 0.0f && a.prefix[t] >= 0 && a.prefix[t] < V)
    terms[size_t(n++)] = {a.prefix[t], a.prefix_weight};
  double loss = 0, weights = 0;
  for (int i = 0; i < n; ++i) {
    const auto [target, weight] = terms[size_t(i)];
    loss += double(weight) * (lse - double(a.a * u[target]));
    weights += weight;
  }
  a.loss[t] = float(loss);
  if (!grad) return;
  // d(loss)/d(s_v) = weights p_v - the weights on v; then through the soft cap.
  const float inv_t = 1.0f / float(T);
  for (int64_t v = 0; v < V; ++v) z[v] = float(weights) * float(std::exp(double(a.a * u[v]) - lse));
  for (int i = 0; i < n; ++i) z[terms[size_t(i)].first] -= terms[size_t(i)].second;
  for (int64_t v = 0; v < V; ++v) z[v] *= inv_t * a.a / a.c * u[v] * (1.0f - u[v]);
}

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::cpu; }
  const char* name() const override { return "cpu"; }
  Tensor alloc(const Shape& shape, DType dtype) const override {
    return Tensor::zeros(shape, dtype);
  }

  void gemm(const GemmArgs& a) const override {
    if (a.xb) return gemm_via_f32(a, [](const GemmArgs& f) { deg::gemm(f); });
    deg::gemm(a);
  }

  void rms_norm(const NormArgs& a) const override {
    if (a.yb) return rms_norm_via_f32(a, [&](const NormArgs& f) { rms_norm(f); });
    std::vector<float> unit;  // a missing weight scales by 1: w = 1, or 1 + w with w = 0
    const float* w = a.w;
    if (!w) {
      unit.assign(size_t(a.dim), a.scale == NormScale::w ? 1.0f : 0.0f);
      w = unit.data();
    }
    const int64_t hx = a.hx ? a.hx : a.dim, hy = a.hy ? a.hy : a.dim, hg = a.hg ? a.hg : a.dim;
    parallel_for(
        a.rows,
        [&](int64_t b, int64_t e) {
          if (a.heads == 1) {  // one kernel call over the piece's rows
            RmsNormArgs k{.x = a.x + b * a.ldx,
                          .ldx = a.ldx,
                          .y = a.y + b * a.ldy,
                          .ldy = a.ldy,
                          .rows = e - b,
                          .dim = a.dim,
                          .w = w,
                          .eps = a.eps,
                          .scale = a.scale};
            if (a.gate) {
              gated_rms_norm(k, a.gate + b * a.ldg, a.ldg);
            } else {
              deg::rms_norm(k);
            }
            return;
          }
          for (int64_t r = b; r < e; ++r) {
            RmsNormArgs k{.x = a.x + r * a.ldx,
                          .ldx = hx,
                          .y = a.y + r * a.ldy,
                          .ldy = hy,
                          .rows = a.heads,
                          .dim = a.dim,
                          .w = w,
                          .eps = a.eps,
                          .scale = a.scale};
            if (a.gate) {
              gated_rms_norm(k, a.gate + r * a.ldg, hg);
            } else {
              deg::rms_norm(k);
            }
          }
        },
        kRowGrain);
  }

  void l2_norm(const L2NormArgs& a) const override {
    const int64_t scaled = scaled_heads(a);
    for_each_index(a.rows, kRowGrain, [&](int64_t i) {
      float* x = a.x + i * a.ldx;
      deg::l2_norm(x, a.dim, scaled, a.dim, a.eps, a.post_scale);
      deg::l2_norm(x + scaled * a.dim, a.dim, a.heads - scaled, a.dim, a.eps, 1.0f);
    });
  }

  void rope(const RopeArgs& a) const override {
    const RowTable& r = a.rows;
    for_each_index(r.n(), kRowGrain, [&](int64_t i) {
      if (!is_real(r, i)) return;
      rope_apply(*a.table, r.positions[i / r.tokens] + i % r.tokens, a.x + i * a.ldx, a.heads,
                 a.hs);
    });
  }

  void kv_write(const KvWriteArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t D = a.dim, dk = a.k_dim ? a.k_dim : D, dv = a.v_dim ? a.v_dim : D;
    const int64_t hk = a.hk ? a.hk : dk, hv = a.hv ? a.hv : dv;
    for_each_index(r.n(), kRowGrain, [&](int64_t i) {
      if (!is_real(r, i)) return;
      const RowView& rv = a.views[i / r.tokens];
      const int64_t t = i % r.tokens;
      for (int64_t h = 0; h < a.kv_heads; ++h) {
        const int64_t at = h * rv.own_stride + (rv.own_before + t) * D;
        std::memcpy(rv.own_k + at, a.k + i * a.ldk + h * hk, size_t(dk) * sizeof(float));
        std::memcpy(rv.own_v + at, a.v + i * a.ldv + h * hv, size_t(dv) * sizeof(float));
      }
    });
  }

  // Work units are (row, KV head, block of queries); when there are fewer than threads (a decode
  // step over few KV heads) each unit's query heads are split among more units. A query head's
  // output is computed the same way in any split, so results do not depend on it.
  void attention(const AttendArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t B = r.rows, L = r.tokens, G = a.group, D = a.head_dim;
    const int64_t width = a.kv_heads * G * D;
    for (int64_t b = 0; b < B; ++b)  // padded positions
      for (int64_t t = r.lengths[b]; t < L; ++t)
        std::memset(a.out + (b * L + t) * a.ldo, 0, size_t(width) * sizeof(float));
    struct Task {
      int64_t b, h, t0, t1, g0, g1;  // row, KV head, queries [t0, t1), query heads [g0, g1)
    };
    std::vector<Task> tasks;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < a.kv_heads; ++h)
        for (int64_t i = 0, nb = (r.lengths[b] + kQueryBlock - 1) / kQueryBlock; i < nb; ++i) {
          // Cheap and costly blocks alternate (0, last, 1, last - 1, ...), so the pool's
          // contiguous shares carry similar work.
          const int64_t t = (i % 2 ? nb - 1 - i / 2 : i / 2) * kQueryBlock;
          tasks.push_back({b, h, t, std::min(r.lengths[b], t + kQueryBlock), 0, G});
        }
    const auto threads = int64_t(thread_pool().size());
    if (!tasks.empty() && int64_t(tasks.size()) < threads && G > 1) {
      const int64_t pieces =
          std::min(G, (threads + int64_t(tasks.size()) - 1) / int64_t(tasks.size()));
      std::vector<Task> split;
      for (const Task& tk : tasks)
        for (int64_t p = 0; p < pieces; ++p)
          split.push_back({tk.b, tk.h, tk.t0, tk.t1, G * p / pieces, G * (p + 1) / pieces});
      tasks = std::move(split);
    }
    for_each_index(int64_t(tasks.size()), 1, [&](int64_t i) {
      const Task& tk = tasks[size_t(i)];
      const RowView& rv = a.views[tk.b];
      const int64_t head = tk.h * G + tk.g0;  // first query head of the task
      deg::attention({.t0 = tk.t0,
                      .t1 = tk.t1,
                      .group = tk.g1 - tk.g0,
                      .d = D,
                      .q = a.q + tk.b * L * a.ldq + head * D,
                      .ldq = a.ldq,
                      .prefix_k = rv.prefix_k ? rv.prefix_k + tk.h * rv.prefix_stride : nullptr,
                      .prefix_v = rv.prefix_v ? rv.prefix_v + tk.h * rv.prefix_stride : nullptr,
                      .prefix_len = rv.prefix_len,
                      .own_k = rv.own_k + tk.h * rv.own_stride,
                      .own_v = rv.own_v + tk.h * rv.own_stride,
                      .own_before = rv.own_before,
                      .scale = a.scale,
                      .window = a.window,
                      .out = a.out + tk.b * L * a.ldo + head * D,
                      .ldo = a.ldo});
    });
  }

  // Per (row, block of channels) over the row's real positions, carrying the tail.
  void causal_conv(const ConvArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t L = r.tokens, Cc = a.channels, K = a.kernel;
    const int64_t ldt = a.ldt ? a.ldt : Cc;
    const int64_t blocks = (Cc + kConvChannelBlock - 1) / kConvChannelBlock;
    for_each_index(r.rows * blocks, 1, [&](int64_t task) {
      const int64_t b = task / blocks, c0 = task % blocks * kConvChannelBlock;
      const int64_t n = r.lengths[b], width = std::min(kConvChannelBlock, Cc - c0);
      const RowView& v = a.views[b];
      const CausalConvArgs k{.n = n,
                             .channels = width,
                             .kernel = K,
                             .x = a.x + b * L * a.ldx + c0,
                             .ldx = a.ldx,
                             .tail_in = v.tail_in ? v.tail_in + c0 : nullptr,
                             .ldt = ldt,
                             .w = a.w + c0 * K,
                             .y = a.y + b * L * a.ldy + c0,
                             .ldy = a.ldy,
                             .tail_out = v.tail_out ? v.tail_out + c0 : nullptr};
      if (a.silu) {
        causal_conv_silu(k);
      } else {
        deg::causal_conv(k);
      }
      for (int64_t t = n; t < L; ++t)
        std::memset(a.y + (b * L + t) * a.ldy + c0, 0, size_t(width) * sizeof(float));
    });
  }

  void delta_gates(const DeltaGatesArgs& a) const override {
    const RowTable& r = a.rows;
    for_each_index(r.n(), kRowGrain, [&](int64_t i) {
      const bool real = is_real(r, i);
      float* bt = a.beta + i * a.ld;
      float* gt = a.g + i * a.ld;
      for (int64_t h = 0; h < a.heads; ++h) {
        bt[h] = real ? 1.0f / (1.0f + std::exp(-bt[h])) : 0.0f;
        const float x = gt[h] + a.dt_bias[h];
        gt[h] = real ? a.neg_decay[h] * (x > 20.0f ? x : std::log1p(std::exp(x))) : 0.0f;
      }
    });
  }

  void delta_rule(const DeltaRuleOpArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t L = r.tokens, Hk = a.k_heads, Hv = a.v_heads, Dk = a.dk, Dv = a.dv;
    for (int64_t b = 0; b < r.rows; ++b)  // padded positions
      for (int64_t t = r.lengths[b]; t < L; ++t)
        std::memset(a.out + (b * L + t) * a.ldo, 0, size_t(Hv * Dv) * sizeof(float));
    const int64_t per_head = Dk * Dv;
    for_each_index(r.rows * Hv, 1, [&](int64_t task) {
      const int64_t b = task / Hv, h = task % Hv, kh = h / (Hv / Hk);
      const RowView& v = a.views[b];
      float* state = v.rec_out + h * per_head;
      if (v.rec_in != v.rec_out) {
        std::memcpy(state, v.rec_in + h * per_head, size_t(per_head) * sizeof(float));
      }
      const int64_t row = b * L;
      DeltaRuleArgs k{.n = r.lengths[b],
                      .dk = Dk,
                      .dv = Dv,
                      .q = a.q + row * a.ld + kh * Dk,
                      .k = a.k + row * a.ld + kh * Dk,
                      .ldqk = a.ld,
                      .v = a.v + row * a.ld + h * Dv,
                      .ldv = a.ld,
                      .g = a.g + row * a.ldg + h,
                      .beta = a.beta + row * a.ldg + h,
                      .ldgb = a.ldg,
                      .state = state,
                      .out = a.out + row * a.ldo + h * Dv,
                      .ldo = a.ldo};
      const DeltaRuleHistory& hs = v.hist;
      DEG_CHECK(!hs.append || hs.len + k.n <= hs.cap, "delta_rule: {} + {} history entries of {}",
                hs.len, k.n, hs.cap);
      if (hs.len > 0) {
        delta_rule_replay(state, Dk, Dv, hs.len, hs.k + kh * hs.cap * Dk, Dk,
                          hs.d + h * hs.cap * Dv, Dv, hs.g + h * hs.cap, 1);
      }
      if (hs.append) {  // token by token, keeping each update
        k.delta = hs.d + (h * hs.cap + hs.len) * Dv;
        k.ldd = Dv;
        delta_rule_recurrent(k);
        for (int64_t t = 0; t < k.n; ++t) {
          if (h % (Hv / Hk) == 0)
            std::copy_n(k.k + t * a.ld, Dk, hs.k + (kh * hs.cap + hs.len + t) * Dk);
          hs.g[h * hs.cap + hs.len + t] = k.g[t * a.ldg];
        }
      } else if (k.n == 1) {
        delta_rule_recurrent(k);
      } else {
        delta_rule_chunked(k);
      }
    });
  }

  void glu(const GluArgs& a) const override {
    if (a.outb) return glu_via_f32(a, [&](const GluArgs& f) { glu(f); });
    if (a.act == Activation::sigmoid && !a.up) {  // a gate applied in place
      parallel_for(
          a.rows,
          [&](int64_t b, int64_t e) {
            sigmoid_gate(a.out + b * a.ldo, a.ldo, a.gate + b * a.ldg, a.ldg, e - b, a.n);
          },
          kRowGrain);
      return;
    }
    DEG_CHECK(a.up != nullptr, "glu: {} needs an up input", int(a.act));
    const bool packed = a.ldg == a.n && a.ldu == a.n && a.ldo == a.n;
    if (a.act == Activation::silu) {
      parallel_for(
          a.rows,
          [&](int64_t b, int64_t e) {
            if (packed) {
              swiglu(a.gate + b * a.n, a.up + b * a.n, a.out + b * a.n, (e - b) * a.n);
              return;
            }
            for (int64_t r = b; r < e; ++r)
              swiglu(a.gate + r * a.ldg, a.up + r * a.ldu, a.out + r * a.ldo, a.n);
          },
          kRowGrain);
      return;
    }
    DEG_CHECK(a.act == Activation::gelu_tanh, "glu: activation {}", int(a.act));
    if (packed) {  // one flat range: elementwise, so any split gives the same bits
      parallel_for(
          a.rows * a.n,
          [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) a.out[i] = gelu_tanh(a.gate[i]) * a.up[i];
          },
          4096);
      return;
    }
    for_each_index(a.rows, kRowGrain, [&](int64_t r) {
      for (int64_t j = 0; j < a.n; ++j)
        a.out[r * a.ldo + j] = gelu_tanh(a.gate[r * a.ldg + j]) * a.up[r * a.ldu + j];
    });
  }

  void binary(const BinaryArgs& a) const override {
    for_each_index(a.rows, kRowGrain, [&](int64_t r) {
      float* y = a.y + r * a.ldy;
      const float* x = a.a + r * a.lda;
      if (a.mul) {
        for (int64_t j = 0; j < a.n; ++j) y[j] *= x[j];
      } else {
        for (int64_t j = 0; j < a.n; ++j) y[j] += x[j];
      }
    });
  }

  void scale(const ScaleArgs& a) const override {
    for_each_index(a.rows, kRowGrain, [&](int64_t r) {
      for (int64_t j = 0; j < a.n; ++j) a.y[r * a.ldy + j] *= a.s;
    });
  }

  void gather(const GatherArgs& a) const override {
    const Tensor& t = *a.table;
    const int64_t C = t.dim(1);
    for_each_index(a.n, kRowGrain, [&](int64_t i) {
      float* y = a.y + i * a.ldy;
      if (a.soft_rows && a.soft_rows[i] >= 0) {
        std::memcpy(y, a.soft + int64_t(a.soft_rows[i]) * C, size_t(C) * sizeof(float));
        return;
      }
      const int64_t id = a.id_lane ? int64_t(a.id_lane[i * a.ld_id]) : a.ids[i];
      if (id < 0) return;
      const float scale = a.row_scale ? a.row_scale[i * a.ld_scale] : a.scale;
      if (!a.keep && scale == 1.0f && a.mix == 1.0f) {  // a plain copy (widened from bf16)
        if (t.dtype() == DType::bf16) {
          const bf16* row = t.data<bf16>() + id * C;
          for (int64_t c = 0; c < C; ++c) y[c] = bf16_to_f32(row[c]);
        } else {
          std::memcpy(y, t.data<float>() + id * C, size_t(C) * sizeof(float));
        }
        return;
      }
      const float keep = a.keep ? 1.0f : 0.0f;
      if (!a.keep) std::fill(y, y + C, 0.0f);
      if (t.dtype() == DType::bf16) {
        const bf16* row = t.data<bf16>() + id * C;
        for (int64_t c = 0; c < C; ++c) y[c] = (y[c] * keep + bf16_to_f32(row[c]) * scale) * a.mix;
      } else {
        const float* row = t.data<float>() + id * C;
        for (int64_t c = 0; c < C; ++c) y[c] = (y[c] * keep + row[c] * scale) * a.mix;
      }
    });
  }

  void logit_picks(const LogitPicksArgs& a) const override {
    parallel_for(a.rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) logit_picks_row(a, r);
    });
  }

  void softcap(const SoftcapArgs& a) const override {
    const float cap = a.cap;
    parallel_for(
        a.n,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) a.y[i] = std::tanh(a.y[i] / cap) * cap;
        },
        4096);
  }

  void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t n) const override {
    if (y == x && ldx == ldy) return;
    if (y <= x && ldy <= ldx) {  // packing toward the front of the same buffer: in order
      for (int64_t r = 0; r < rows; ++r)
        std::memmove(y + r * ldy, x + r * ldx, size_t(n) * sizeof(float));
      return;
    }
    for_each_index(rows, kRowGrain, [&](int64_t r) {
      std::memcpy(y + r * ldy, x + r * ldx, size_t(n) * sizeof(float));
    });
  }

  void gather_rows(const float* x, int64_t ldx, const int32_t* index, float* y, int64_t ldy,
                   int64_t rows, int64_t n) const override {
    for_each_index(rows, kRowGrain, [&](int64_t r) {
      std::memcpy(y + r * ldy, x + int64_t(index[r]) * ldx, size_t(n) * sizeof(float));
    });
  }

  // In 32 x 32 tiles (a tile's reads and writes stay in cache), a band of output rows per task.
  void transpose(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t cols) const override {
    constexpr int64_t kTile = 32;
    for_each_index((cols + kTile - 1) / kTile, 1, [&](int64_t tj) {
      const int64_t j0 = tj * kTile, j1 = std::min(cols, j0 + kTile);
      for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
        const int64_t i1 = std::min(rows, i0 + kTile);
        for (int64_t j = j0; j < j1; ++j)
          for (int64_t i = i0; i < i1; ++i) y[j * ldy + i] = x[i * ldx + j];
      }
    });
  }

  void activation(const ActivationArgs& a) const override {
    if (a.ldx == a.n && a.ldy == a.n) {  // one flat range: elementwise, any split gives the same
      parallel_for(
          a.rows * a.n,
          [&](int64_t b, int64_t e) {
            ActivationArgs k = a;
            k.x = a.x + b;
            k.y = a.y + b;
            k.ldx = k.ldy = k.n = e - b;
            activation_range(k, 0, 1);
          },
          4096);
      return;
    }
    parallel_for(
        a.rows, [&](int64_t b, int64_t e) { activation_range(a, b, e); }, kRowGrain);
  }

  void bias_scale(const BiasScaleArgs& a) const override {
    parallel_for(
        a.rows, [&](int64_t b, int64_t e) { bias_scale_range(a, b, e); }, kRowGrain);
  }

  void combine(const CombineArgs& a) const override {
    parallel_for(
        a.rows, [&](int64_t b, int64_t e) { combine_range(a, b, e); }, kRowGrain);
  }

  void shift_ids(const ShiftIdsArgs& a) const override { shift_ids_range(a, 0, a.rows.n()); }

  void ngram_embed(const NgramEmbedArgs& a) const override {
    parallel_for(
        a.rows.n(), [&](int64_t b, int64_t e) { ngram_embed_range(a, b, e); }, kRowGrain);
  }

  void sigmoid_gates(const SigmoidGateArgs& a) const override {
    parallel_for(
        a.rows, [&](int64_t b, int64_t e) { sigmoid_gates_range(a, b, e); }, kRowGrain);
  }

  void rope_pairs(const RopePairsArgs& a) const override {
    parallel_for(
        a.rows.n(), [&](int64_t b, int64_t e) { rope_pairs_range(a, b, e); }, kRowGrain);
  }

  // Per (row, head, block of queries); each query's result depends on its keys only.
  void attention_f64(const AttendF64Args& a) const override {
    const RowTable& r = a.rows;
    attention_f64_zero_padded(a);
    struct Task {
      int64_t b, h, t0, t1;
    };
    std::vector<Task> tasks;
    for (int64_t b = 0; b < r.rows; ++b)
      for (int64_t h = 0; h < a.heads; ++h)
        for (int64_t t = 0; t < r.lengths[b]; t += kQueryBlock)
          tasks.push_back({b, h, t, std::min(r.lengths[b], t + kQueryBlock)});
    for_each_index(int64_t(tasks.size()), 1, [&](int64_t i) {
      const Task& tk = tasks[size_t(i)];
      attention_f64_range(a, tk.b, tk.h, tk.t0, tk.t1);
    });
  }

  void subtract_projection(const ProjectionArgs& a) const override {
    parallel_for(
        a.rows.n(), [&](int64_t b, int64_t e) { subtract_projection_range(a, b, e); }, kRowGrain);
  }

  // ---- training (kernels/cpu/backward.cc) ----

  void matmul(const MatmulOpArgs& a) const override {
    for (int64_t i = 0; i < a.batch; ++i) {  // a batch: each product as alone
      MatmulOpArgs one = a;
      one.a += i * a.stride_a, one.b += i * a.stride_b, one.c += i * a.stride_c;
      one.batch = 1;
      std::vector<float> ra, rb;
      const MatmulOpArgs f = rounded_operands(one, ra, rb);
      parallel_for(
          a.m, [&](int64_t b, int64_t e) { matmul_range(f, b, e); }, 1);
    }
  }

  void rms_norm_backward(const NormBackwardArgs& a) const override {
    parallel_for(
        a.rows * a.heads, [&](int64_t b, int64_t e) { rms_norm_backward_range(a, b, e); },
        kRowGrain);
  }

  void activation_backward(const ActivationBackwardArgs& a) const override {
    parallel_for(
        a.rows, [&](int64_t b, int64_t e) { activation_backward_range(a, b, e); }, kRowGrain);
  }

  void column_sum(const ColumnSumArgs& a) const override {
    parallel_for(
        a.n, [&](int64_t b, int64_t e) { column_sum_range(a, b, e); }, kRowGrain);
  }

  void combine_backward(const CombineBackwardArgs& a) const override {
    parallel_for(
        a.forward.rows, [&](int64_t b, int64_t e) { combine_backward_range(a, b, e); }, kRowGrain);
  }

  void gather_backward(const GatherBackwardArgs& a) const override {
    const GatherArgs& f = a.forward;
    DEG_CHECK(f.table->dtype() == DType::f32 && f.mix == 1.0f && !f.soft_rows,
              "gather_backward: an f32 table without mix or soft rows");
    std::vector<int32_t> lane_ids;
    const int32_t* ids = f.ids;
    if (f.id_lane) {
      lane_ids.resize(size_t(f.n));
      for (int64_t i = 0; i < f.n; ++i) lane_ids[size_t(i)] = int32_t(f.id_lane[i * f.ld_id]);
      ids = lane_ids.data();
    }
    if (a.dtable) {
      std::vector<int64_t> starts;
      const std::vector<int64_t> order = gather_order(ids, f.n, f.table->dim(0), starts);
      parallel_for(
          f.table->dim(0),
          [&](int64_t b, int64_t e) { gather_backward_rows(a, order, starts, b, e); }, kRowGrain);
    }
    if (a.drow_scale) {
      parallel_for(
          f.n, [&](int64_t b, int64_t e) { gather_row_scale_range(a, ids, b, e); }, kRowGrain);
    }
  }

  void sigmoid_gates_backward(const SigmoidGatesBackwardArgs& a) const override {
    const SigmoidGateArgs& f = a.forward;
    std::vector<float> dz(size_t(f.rows * f.heads));
    parallel_for(
        f.rows, [&](int64_t b, int64_t e) { sigmoid_gates_dz_range(a, dz.data(), b, e); },
        kRowGrain);
    if (a.dw) {
      parallel_for(
          f.heads * (f.x2 ? 2 * f.n : f.n),
          [&](int64_t b, int64_t e) { sigmoid_gates_dw_range(a, dz.data(), b, e); }, 1);
    }
  }

  void subtract_projection_backward(const ProjectionBackwardArgs& a) const override {
    parallel_for(
        a.forward.rows.n(),
        [&](int64_t b, int64_t e) { subtract_projection_backward_range(a, b, e); }, kRowGrain);
  }

  void ngram_embed_backward(const NgramBackwardArgs& a) const override {
    DEG_CHECK(a.forward.table->dtype() == DType::f32, "ngram_embed_backward: an f32 table");
    std::vector<int64_t> starts;
    std::vector<int32_t> signs;
    const std::vector<int64_t> order = ngram_order(a.forward, a.forward.rows.n(), starts, signs);
    parallel_for(
        a.forward.table->dim(0),
        [&](int64_t b, int64_t e) { ngram_backward_rows(a, order, starts, signs, b, e); },
        kRowGrain);
  }

  void attention_f64_backward(const AttendF64BackwardArgs& a) const override {
    const int64_t slots = a.forward.paired_heads ? a.forward.heads / 2 : a.forward.heads;
    for_each_index(slots, 1, [&](int64_t s) { attention_f64_backward_task(a, s); });
  }

  void adam_step(const AdamStepArgs& a) const override {
    parallel_for(
        a.n, [&](int64_t b, int64_t e) { adam_step_range(a, b, e); }, 4096);
  }

  // A batch goes vector by vector (block by block), each as it is alone.
  void nesterov(const NesterovArgs& a) const override {
    for (int64_t v = 0; v < (a.gs ? a.count : 1); ++v) {
      NesterovArgs one = a;
      if (a.gs) one.g = a.gs[v], one.buf = a.bufs[v], one.u = a.u + v * a.n;
      parallel_for(
          a.n, [&](int64_t b, int64_t e) { nesterov_range(one, b, e); }, 4096);
    }
  }

  void normuon_step(const NorMuonStepArgs& a) const override {
    for (int64_t v = 0; v < (a.ps ? a.count : 1); ++v) {
      NorMuonStepArgs one = a;
      if (a.ps)
        one.u = a.u + v * a.rows * a.cols, one.p = a.ps[v], one.second = a.seconds[v],
        one.lr = a.lr * a.lr_muls[v];
      deg::normuon_step(one);
    }
  }

  double sum_squares(const float* x, int64_t n) const override {
    const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
    std::vector<double> part(static_cast<size_t>(chunks));
    for_each_index(chunks, 1, [&](int64_t c) { part[size_t(c)] = sum_squares_chunk(x, n, c); });
    double s = 0;
    for (double p : part) s += p;
    return s;
  }

  void frobenius_normalize(const FrobeniusNormalizeArgs& a) const override {
    for (int64_t i = 0; i < a.count; ++i) {
      float* x = a.x + i * a.n;
      const float f = float(1.0 / (std::sqrt(sum_squares(x, a.n)) * (1 + a.margin) + a.eps));
      parallel_for(
          a.n,
          [&](int64_t b, int64_t e) {
            for (int64_t j = b; j < e; ++j) x[j] *= f;
          },
          4096);
    }
  }

  // ---- softcap_cross_entropy (kernels/ops.h): per chunk of rows, the logits through gemm(),
  // each row's soft cap, lse, loss and dz in place over the pool, then dxn += dz W (rows over
  // the pool) and dw += dz^T xn (vocabulary rows over the pool, from dz transposed). ----
  void softcap_cross_entropy(const SoftcapCrossEntropyArgs& a) const override {
    const Tensor& w = *a.w;
    const int64_t T = a.rows, V = w.dim(0), C = w.dim(1);
    DEG_CHECK(a.mtp >= 0 && a.mtp <= kMaxMtpWeights, "softcap_cross_entropy: {} mtp weights",
              a.mtp);
    if (T == 0) return;
    const bool grad = a.dxn || a.dw;
    const Tensor wf = a.dxn && w.dtype() == DType::bf16 ? w.to(DType::f32) : w;  // for dz W
    const int64_t chunk = std::min(T, softcap_cross_entropy_chunk(V));
    std::vector<float> z(size_t(chunk * V)), u(size_t(chunk * V));
    std::vector<float> zt(a.dw ? size_t(chunk * V) : 0);
    const GemmOutput logits{.w = &w, .y = z.data(), .ldy = V};
    for (int64_t r0 = 0; r0 < T; r0 += chunk) {
      const int64_t R = std::min(chunk, T - r0);
      deg::gemm({.x = a.xn + r0 * a.ldx, .m = R, .k = C, .ldx = a.ldx, .outputs = {&logits, 1}});
      parallel_for(
          R,
          [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r)
              softcap_row(a, T, V, r0 + r, z.data() + r * V, u.data() + r * V, grad);
          },
          1);
      if (a.dxn) {
        parallel_for(
            R,
            [&](int64_t begin, int64_t end) {
              matmul_nn({.a = z.data() + begin * V,
                         .lda = V,
                         .b = wf.data<float>(),
                         .ldb = C,
                         .m = end - begin,
                         .n = C,
                         .k = V,
                         .c = a.dxn + (r0 + begin) * a.lddx,
                         .ldc = a.lddx,
                         .accumulate = true});
            },
            kRowGrain);
      }
      if (a.dw) {
        for_each_index(V, 256, [&](int64_t v) {
          for (int64_t r = 0; r < R; ++r) zt[size_t(v * R + r)] = z[size_t(r * V + v)];
        });
        parallel_for(
            V,
            [&](int64_t begin, int64_t end) {
              matmul_nn({.a = zt.data() + begin * R,
                         .lda = R,
                         .b = a.xn + r0 * a.ldx,
                         .ldb = a.ldx,
                         .m = end - begin,
                         .n = C,
                         .k = R,
                         .c = a.dw + begin * C,
                         .ldc = C,
                         .accumulate = true});
            },
            kRowGrain);
      }
    }
  }
};

}  // namespace

const Ops& cpu_ops() {
  static const CpuOps ops;
  return ops;
}

}  // namespace deg
