// Shared family pieces (family_common.h): weight lookup, row loops, norms, embedding, SwiGLU MLP,
// the attention pass over a call's rows and benchmark weights.
#include "model/family_common.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/scratch.h"

namespace deg {

namespace {

constexpr int64_t kQueryBlock = 16;  // attention work unit (queries)

}  // namespace

std::string layer_name(int64_t i, const std::string& rest) {
  return "layers." + std::to_string(i) + "." + rest;
}

const Tensor& weight_need(const TensorMap& w, const std::string& name, const Shape& shape) {
  auto it = w.find(name);
  if (it == w.end()) {
    throw Error(ErrorKind::not_found, "missing tensor (expected " + shape_str(shape) + ")",
                {.tensor = name});
  }
  const Tensor& t = it->second;
  if (t.shape() != shape) {
    throw Error(ErrorKind::format,
                "tensor has shape " + shape_str(t.shape()) + ", expected " + shape_str(shape),
                {.tensor = name});
  }
  if (t.dtype() != DType::f32 && t.dtype() != DType::bf16) {
    throw Error(ErrorKind::unsupported,
                fmt::format("tensor dtype {} (supported: f32, bf16)", dtype_name(t.dtype())),
                {.tensor = name});
  }
  if (!t.is_contiguous()) {
    throw Error(ErrorKind::format, "tensor is not contiguous", {.tensor = name});
  }
  return t;
}

std::vector<float> weight_f32(const TensorMap& w, const std::string& name, const Shape& shape) {
  return weight_need(w, name, shape).to_f32_vector();
}

void for_each_index(int64_t n, int64_t grain, const std::function<void(int64_t)>& fn) {
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) fn(i);
      },
      grain);
}

void rms_norm_parallel(const RmsNormArgs& a) {
  parallel_for(
      a.rows,
      [&](int64_t b, int64_t e) {
        RmsNormArgs part = a;
        part.x = a.x + b * a.ldx;
        part.y = a.y + b * a.ldy;
        part.rows = e - b;
        rms_norm(part);
      },
      16);
}

void rms_norm_rows(const float* x, float* y, int64_t n, int64_t dim, const std::vector<float>& w,
                   float eps, NormScale scale) {
  DEG_CHECK(int64_t(w.size()) == dim, "norm weight of {} for rows of {}", w.size(), dim);
  rms_norm_parallel({.x = x,
                     .ldx = dim,
                     .y = y,
                     .ldy = dim,
                     .rows = n,
                     .dim = dim,
                     .w = w.data(),
                     .eps = eps,
                     .scale = scale});
}

void gather_embeddings(const Tensor& table, const int32_t* ids, int64_t n, float* h, int64_t ldh) {
  const int64_t C = table.dim(1);
  for_each_index(n, 16, [&](int64_t i) {
    if (table.dtype() == DType::bf16) {
      const bf16* row = table.data<bf16>() + int64_t(ids[i]) * C;
      for (int64_t c = 0; c < C; ++c) h[i * ldh + c] = bf16_to_f32(row[c]);
    } else {
      std::memcpy(h + i * ldh, table.data<float>() + int64_t(ids[i]) * C, size_t(C) * 4);
    }
  });
}

void swiglu_mlp(const SwigluMlpArgs& a) {
  const int64_t N = a.n, C = a.hidden, I = a.width;
  float* gate = scratch_floats(kLayerSlots + 1, size_t(N * I));
  float* up = scratch_floats(kLayerSlots + 2, size_t(N * I));
  GemmOutput outs[] = {{.w = a.gate, .y = gate, .ldy = I}, {.w = a.up, .y = up, .ldy = I}};
  gemm({.x = a.xn, .m = N, .k = C, .ldx = C, .outputs = outs, .precision = a.precision});
  parallel_for(
      N, [&](int64_t b, int64_t e) { swiglu(gate + b * I, up + b * I, gate + b * I, (e - b) * I); },
      16);
  GemmOutput down{.w = a.down, .y = a.h, .ldy = C, .accumulate = true};
  gemm({.x = gate, .m = N, .k = I, .ldx = I, .outputs = {&down, 1}, .precision = a.precision});
}

void norm_heads(float* x, int64_t heads, int64_t d, const float* w, float eps, NormScale scale) {
  rms_norm({.x = x,
            .ldx = d,
            .y = x,
            .ldy = d,
            .rows = heads,
            .dim = d,
            .w = w,
            .eps = eps,
            .scale = scale});
}

void store_kv(const RowView& rv, int64_t t, const float* k, const float* v, int64_t kv_heads,
              int64_t d) {
  for (int64_t h = 0; h < kv_heads; ++h) {
    const int64_t at = h * rv.own_stride + (rv.own_before + t) * d;
    std::memcpy(rv.own_k + at, k + h * d, size_t(d) * sizeof(float));
    std::memcpy(rv.own_v + at, v + h * d, size_t(d) * sizeof(float));
  }
}

void attend_rows(const AttendRowsArgs& a) {
  const LayerCall& c = *a.call;
  const int64_t B = c.rows, L = c.tokens, G = a.group, D = a.head_dim;
  const int64_t width = a.kv_heads * G * D;
  for (int64_t b = 0; b < B; ++b)  // padded positions
    for (int64_t t = c.lengths[b]; t < L; ++t)
      std::memset(a.out + (b * L + t) * a.ldo, 0, size_t(width) * sizeof(float));
  struct Task {
    int64_t b, h, t0, t1, g0, g1;  // row, KV head, queries [t0, t1), query heads [g0, g1)
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < a.kv_heads; ++h)
      for (int64_t i = 0, nb = (c.lengths[b] + kQueryBlock - 1) / kQueryBlock; i < nb; ++i) {
        // Cheap and costly blocks alternate (0, last, 1, last - 1, ...), so the pool's
        // contiguous shares carry similar work.
        const int64_t t = (i % 2 ? nb - 1 - i / 2 : i / 2) * kQueryBlock;
        tasks.push_back({b, h, t, std::min(c.lengths[b], t + kQueryBlock), 0, G});
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
    const RowView& rv = c.views[tk.b];
    const int64_t head = tk.h * G + tk.g0;  // first query head of the task
    attention({.t0 = tk.t0,
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

TensorMap random_weights(const RandomWeightsArgs& a) {
  DEG_CHECK(a.table != nullptr, "random_weights without a table");
  TensorMap out;
  uint64_t index = 0;
  for (const auto& [name, shape] : *a.table) {
    Tensor t = Tensor::empty(shape, a.f32 && a.f32(name, shape) ? DType::f32 : a.dtype);
    const uint64_t tensor_seed = a.seed * 1000003u + index++;
    parallel_for(
        t.numel(),
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            uint64_t z = tensor_seed * 0x9e3779b97f4a7c15ull + uint64_t(i) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            const float unit = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
            float x = (unit - 0.5f) * 0.0693f;                         // std 0.02
            if (a.adjust) x = a.adjust(name, unit, x);
            if (t.dtype() == DType::bf16) {
              t.mutable_data<bf16>()[i] = f32_to_bf16(x);
            } else {
              t.mutable_data<float>()[i] = x;
            }
          }
        },
        65536);
    out.emplace(name, std::move(t));
  }
  return out;
}

}  // namespace deg
