// Shared family pieces (family_common.h): weight lookup, the SwiGLU MLP, self-attention over a
// call's rows and benchmark weights.
#include "model/family_common.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace deg {

std::string layer_name(int64_t i, const std::string& rest) {
  return "layers." + std::to_string(i) + "." + rest;
}

namespace {

// The index of the first NaN or infinity of a contiguous f32 / bf16 tensor, or -1: an exponent
// of all ones. Long tensors are scanned on the thread pool (the weights are read once anyway).
int64_t first_non_finite(const Tensor& t) {
  const int64_t n = t.numel();
  const bool bf16 = t.dtype() == DType::bf16;
  const auto* f32 = bf16 ? nullptr : reinterpret_cast<const uint32_t*>(t.raw());
  const auto* b16 = bf16 ? reinterpret_cast<const uint16_t*>(t.raw()) : nullptr;
  auto scan = [&](int64_t begin, int64_t end) -> int64_t {
    for (int64_t i = begin; i < end; ++i) {
      const bool bad = bf16 ? (b16[i] & 0x7f80u) == 0x7f80u : (f32[i] & 0x7f800000u) == 0x7f800000u;
      if (bad) return i;
    }
    return -1;
  };
  constexpr int64_t kChunk = int64_t(1) << 20;
  if (n <= kChunk) return scan(0, n);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int64_t> found(size_t(chunks), -1);
  parallel_for(chunks, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      found[size_t(c)] = scan(c * kChunk, std::min(n, (c + 1) * kChunk));
  });
  for (int64_t f : found)
    if (f >= 0) return f;
  return -1;
}

}  // namespace

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
  // Weights already on a device (a trainer's resident parameters) are not scanned from the host.
  if (const int64_t at = t.device() == Device::cpu ? first_non_finite(t) : -1; at >= 0) {
    throw Error(ErrorKind::format,
                fmt::format("tensor holds a NaN or an infinity (element {}); the weights are "
                            "corrupt: re-download or re-export them",
                            at),
                {.tensor = name});
  }
  return t;
}

std::vector<float> weight_f32(const TensorMap& w, const std::string& name, const Shape& shape) {
  return host_copy(weight_need(w, name, shape)).to_f32_vector();
}

Tensor weight_on(const Ops& ops, const TensorMap& w, const std::string& name, const Shape& shape) {
  return ops.upload(weight_need(w, name, shape));
}

Tensor vector_on(const Ops& ops, const std::vector<float>& v) {
  return ops.upload(Tensor::from_vector(v, {int64_t(v.size())}));
}

std::vector<Tensor> weights_stacked_on(const Ops& ops, const TensorMap& w,
                                       const std::vector<std::pair<std::string, Shape>>& parts) {
  std::vector<const Tensor*> host;
  int64_t rows = 0;
  for (const auto& [name, shape] : parts) {
    host.push_back(&weight_need(w, name, shape));
    DEG_CHECK(shape.size() == 2 && shape[1] == parts[0].second[1],
              "stacked weights must be [N, K] of one K");
    rows += shape[0];
  }
  bool stack = ops.device() != Device::cpu;
  for (const Tensor* t : host) stack = stack && t->dtype() == host[0]->dtype();
  std::vector<Tensor> out;
  if (!stack) {
    for (const Tensor* t : host) out.push_back(ops.upload(*t));
    return out;
  }
  Tensor all = Tensor::empty({rows, parts[0].second[1]}, host[0]->dtype());
  int64_t at = 0;
  for (const Tensor* t : host) {
    const Tensor c = t->contiguous();
    std::memcpy(all.raw_mutable() + size_t(at) * size_t(c.dim(1)) * dtype_size(c.dtype()), c.raw(),
                c.nbytes());
    at += c.dim(0);
  }
  const Tensor on = ops.upload(all);
  at = 0;
  for (const Tensor* t : host) {
    out.push_back(on.slice(0, at, at + t->dim(0)));
    at += t->dim(0);
  }
  return out;
}

ProjectionInput projection_input(const Exec& x, int64_t n, int64_t k, bool rounded,
                                 float* in_place) {
  if (rounded) return {.b16 = reinterpret_cast<bf16*>(x.arena.floats((n * k + 1) / 2))};
  return {.f32 = in_place ? in_place : x.arena.floats(n * k)};
}

void project(const Exec& x, ProjectionInput in, int64_t n, int64_t k,
             std::span<const GemmOutput> outs, GemmPrecision precision, int64_t ld) {
  x.ops.gemm({.x = in.f32,
              .xb = in.b16,
              .m = n,
              .k = k,
              .ldx = ld ? ld : k,
              .outputs = outs,
              .precision = precision});
}

void swiglu_mlp(const Exec& x, const SwigluMlpArgs& a) {
  const int64_t N = a.n, C = a.hidden, I = a.width;
  // gate and up side by side in one [N, 2I] buffer: with stacked weights (weights_stacked_on)
  // the backend runs both as one GEMM.
  float* gate = x.arena.floats(N * 2 * I);
  float* up = gate + I;
  GemmOutput outs[] = {{.w = a.gate, .y = gate, .ldy = 2 * I}, {.w = a.up, .y = up, .ldy = 2 * I}};
  project(x, a.xn, N, C, outs, a.precision);
  // f32: in place over gate (row stride 2I); rounded: its own [N, I] bf16 rows.
  const ProjectionInput act = projection_input(x, N, I, bf16_products(a.precision, *a.down), gate);
  const int64_t ld = act.b16 ? I : 2 * I;
  x.ops.glu({.gate = gate,
             .ldg = 2 * I,
             .up = up,
             .ldu = 2 * I,
             .out = act.f32,
             .ldo = ld,
             .rows = N,
             .n = I,
             .outb = act.b16});
  GemmOutput down{.w = a.down, .y = a.h, .ldy = C, .accumulate = true};
  project(x, act, N, I, {&down, 1}, a.precision, ld);
}

float* self_attention(const Exec& x, const SelfAttentionArgs& a) {
  const LayerCall& c = *a.call;
  const int64_t QW = a.heads * a.head_dim, KW = a.kv_heads * a.head_dim;
  if (a.k) {
    x.ops.kv_write({.rows = c.rows,
                    .views = c.views,
                    .k = a.k,
                    .ldk = KW,
                    .v = a.v,
                    .ldv = KW,
                    .kv_heads = a.kv_heads,
                    .dim = a.head_dim});
  }
  float* o = x.arena.floats(c.rows.n() * QW);
  x.ops.attention({.rows = c.rows,
                   .views = c.views,
                   .q = a.q,
                   .ldq = QW,
                   .out = o,
                   .ldo = QW,
                   .kv_heads = a.kv_heads,
                   .group = a.heads / a.kv_heads,
                   .head_dim = a.head_dim,
                   .scale = a.scale,
                   .window = a.window,
                   .bf16 = a.bf16});
  return o;
}

TensorMap random_weights(const RandomWeightsArgs& a) {
  DEG_CHECK(a.table != nullptr, "random_weights without a table");
  TensorMap out;
  uint64_t index = 0;
  for (const auto& entry : *a.table) {
    const std::string& name = entry.first;  // not a structured binding: clang 14 cannot capture one
    const Shape& shape = entry.second;
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
