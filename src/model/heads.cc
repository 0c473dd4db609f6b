// Head weights (init, load, save) and head math. See heads.h for the formulas.
#include "model/heads.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "io/safetensors.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"

namespace deg {

namespace {

// Uniform floats in [-bound, bound) from a 64-bit engine: the same bits on every platform.
class Uniform {
 public:
  explicit Uniform(uint64_t seed) : rng_(seed) {}
  float operator()(float bound) {
    float u = float(rng_() >> 40) * 0x1.0p-24f;  // [0, 1)
    return (2.0f * u - 1.0f) * bound;
  }

 private:
  std::mt19937_64 rng_;
};

Linear linear_init(int64_t in, int64_t out, Uniform& u) {
  Linear l{Tensor::empty({out, in}, DType::f32), Tensor::empty({out}, DType::f32)};
  const float bound = 1.0f / std::sqrt(float(in));  // kaiming_uniform(a=sqrt(5)) == this
  float* w = l.weight.mutable_data<float>();
  for (int64_t i = 0; i < out * in; ++i) w[i] = u(bound);
  float* b = l.bias.mutable_data<float>();
  for (int64_t i = 0; i < out; ++i) b[i] = u(bound);
  return l;
}

PointerHeadWeights pointer_init(int64_t hidden, Uniform& u) {
  PointerHeadWeights h;
  h.query = linear_init(hidden, kHeadDim, u);
  h.key = linear_init(hidden, kHeadDim, u);
  h.prior = linear_init(hidden, 1, u);
  return h;
}

// Every Linear of the heads with its key prefix, for load and save.
template <class H, class F>
void for_each_linear(H& heads, F&& f) {
  for (auto [name, p] : {std::pair{"choice", &heads.choice}, std::pair{"score", &heads.score},
                         std::pair{"anchor", &heads.anchor}}) {
    f(std::string(name) + ".query", p->query);
    f(std::string(name) + ".key", p->key);
    f(std::string(name) + ".prior", p->prior);
  }
  f("noul", heads.noul);
  f("count", heads.count);
  f("span.q_start", heads.span.q_start);
  f("span.k_start", heads.span.k_start);
  f("span.q_end", heads.span.q_end);
  f("span.k_end", heads.span.k_end);
  f("span.null_start", heads.span.null_start);
  f("span.null_end", heads.span.null_end);
}

// The f32 view of `t`, copied only when it is not f32 already (a checkpoint may store bf16).
Tensor as_f32(const Tensor& t) {
  return t.dtype() == DType::f32 ? t.contiguous() : t.to(DType::f32);
}

// y[i, j] (row stride ldy) = x[i, :] · w[j, :] for x [n, K] and w [m, K] (both f32).
void dots(const float* x, int64_t n, const Tensor& w, float* y, int64_t ldy) {
  GemmOutput out{.w = &w, .y = y, .ldy = ldy};
  gemm({.x = x, .m = n, .k = w.dim(1), .ldx = w.dim(1), .outputs = {&out, 1}});
}

}  // namespace

// The bias rows are written first and the product added to them in the kernel's store (one
// addition, as before: the same bits), so y is not walked a second time.
void Linear::apply(const float* x, int64_t n, float* y) const {
  const int64_t m = out();
  const float* b = bias.data<float>();
  for (int64_t i = 0; i < n; ++i) std::copy(b, b + m, y + i * m);
  GemmOutput o{.w = &weight, .y = y, .ldy = m, .accumulate = true};
  gemm({.x = x, .m = n, .k = in(), .ldx = in(), .outputs = {&o, 1}});
}

Heads Heads::init(int64_t hidden, uint64_t seed) {
  Uniform u(seed);
  Heads h;
  h.hidden = hidden;
  h.choice = pointer_init(hidden, u);
  h.score = pointer_init(hidden, u);
  h.noul = linear_init(hidden, 1, u);
  h.span.q_start = linear_init(hidden, kHeadDim, u);
  h.span.k_start = linear_init(hidden, kHeadDim, u);
  h.span.q_end = linear_init(hidden, kHeadDim, u);
  h.span.k_end = linear_init(hidden, kHeadDim, u);
  h.span.null_start = linear_init(hidden, 1, u);
  h.span.null_end = linear_init(hidden, 1, u);
  h.count = linear_init(hidden, kMaxCount + 1, u);
  h.anchor = pointer_init(hidden, u);
  float* pw = h.anchor.prior.weight.mutable_data<float>();
  for (int64_t i = 0; i < hidden; ++i) pw[i] *= 0.1f;
  h.anchor.prior.bias.mutable_data<float>()[0] = kAnchorInitBias;
  h.span_bias = Tensor::zeros({2, 2, int64_t(kRelEdges.size()) + 1}, DType::f32);
  h.temperature = Tensor::empty({int64_t(kHeadKindNames.size())}, DType::f32);
  for (int64_t i = 0; i < h.temperature.numel(); ++i) h.temperature.mutable_data<float>()[i] = 1;
  return h;
}

Heads Heads::load(const std::filesystem::path& path) {
  SafetensorsFile file = SafetensorsFile::open(path);
  Heads h;
  auto get = [&](const std::string& name, const Shape& shape) {
    Tensor t = as_f32(file.tensor(name));
    if (t.shape() != shape) {
      throw Error(
          ErrorKind::format,
          fmt::format("shape {} where {} was expected", shape_str(t.shape()), shape_str(shape)),
          {.path = path.string(), .tensor = name});
    }
    const float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!std::isfinite(v[i])) {
        throw Error(
            ErrorKind::format,
            fmt::format("holds a NaN or an infinity (element {}); the heads are corrupt", i),
            {.path = path.string(), .tensor = name});
      }
    }
    return t;
  };
  const TensorInfo* noul = file.find("noul.weight");
  if (!noul || noul->shape.size() != 2) {
    throw Error(ErrorKind::format, "missing or malformed tensor; not a deg heads file?",
                {.path = path.string(), .tensor = "noul.weight"});
  }
  h.hidden = noul->shape[1];
  for_each_linear(h, [&](const std::string& name, Linear& l) {
    int64_t out = 1;
    if (name.ends_with("query") || name.ends_with("key") || name.starts_with("span.q") ||
        name.starts_with("span.k")) {
      out = kHeadDim;
    } else if (name == "count") {
      out = kMaxCount + 1;
    }
    l.weight = get(name + ".weight", {out, h.hidden});
    l.bias = get(name + ".bias", {out});
  });
  h.span_bias = get("span_bias", {2, 2, int64_t(kRelEdges.size()) + 1});
  h.temperature = get("temperature", {int64_t(kHeadKindNames.size())});
  for (size_t k = 0; k < kHeadKindNames.size(); ++k) {
    const float temp = h.temperature.data<float>()[k];
    if (!(temp >= 1e-3f && temp <= 1e3f)) {
      throw Error(ErrorKind::format,
                  fmt::format("the {} temperature {} is outside [0.001, 1000]; refit calibration",
                              kHeadKindNames[k], temp),
                  {.path = path.string(), .tensor = "temperature"});
    }
  }
  return h;
}

void Heads::save(const std::filesystem::path& path) const {
  std::vector<NamedTensor> tensors;
  for_each_linear(*this, [&](const std::string& name, const Linear& l) {
    tensors.push_back({name + ".weight", l.weight});
    tensors.push_back({name + ".bias", l.bias});
  });
  tensors.push_back({"span_bias", span_bias});
  tensors.push_back({"temperature", temperature});
  safetensors_write(path, tensors);
}

std::vector<std::pair<std::string, Tensor*>> Heads::tensors(bool trained) {
  std::vector<std::pair<std::string, Tensor*>> out;
  for_each_linear(*this, [&](const std::string& name, Linear& l) {
    out.emplace_back(name + ".weight", &l.weight);
    out.emplace_back(name + ".bias", &l.bias);
  });
  out.emplace_back("span_bias", &span_bias);
  if (!trained) out.emplace_back("temperature", &temperature);
  return out;
}

Heads Heads::clone() const {
  Heads h = *this;
  for (auto& [name, t] : h.tensors()) *t = t->clone();
  return h;
}

Heads Heads::on(const Ops& ops) const {
  Heads h = *this;
  for (auto& [name, t] : h.tensors()) *t = ops.upload(*t);
  return h;
}

Heads Heads::zeros_like() const {
  Heads h = *this;
  for (auto& [name, t] : h.tensors()) *t = Tensor::zeros(t->shape(), DType::f32);
  return h;
}

std::vector<float> pointer_logits(const PointerHeadWeights& head, const float* answer,
                                  const float* options, int64_t num_options) {
  std::vector<float> q(static_cast<size_t>(kHeadDim)),
      k(static_cast<size_t>(num_options * kHeadDim));
  std::vector<float> prior(static_cast<size_t>(num_options)), out(static_cast<size_t>(num_options));
  head.query.apply(answer, 1, q.data());
  head.key.apply(options, num_options, k.data());
  head.prior.apply(options, num_options, prior.data());
  Tensor qw = Tensor::from_vector(q, {1, kHeadDim});
  dots(k.data(), num_options, qw, out.data(), 1);
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  for (int64_t i = 0; i < num_options; ++i)
    out[size_t(i)] = out[size_t(i)] * scale + prior[size_t(i)];
  return out;
}

std::vector<float> noul_logits(const Heads& heads, const float* answers, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  heads.noul.apply(answers, n, out.data());
  return out;
}

std::vector<float> count_logits(const Heads& heads, const float* answers, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * (kMaxCount + 1)));
  heads.count.apply(answers, n, out.data());
  return out;
}

int rel_bucket(int64_t d) {
  int b = 0;
  for (int64_t e : kRelEdges) b += e <= d;
  return b;
}

namespace {

// y [n, out] = x [n, in] · Wᵀ + b, every operand in ops' memory: the product, then the bias added
// once — Linear::apply's bits.
void apply_on(const Ops& ops, const Linear& l, const float* x, int64_t n, float* y) {
  GemmOutput o{.w = &l.weight, .y = y, .ldy = l.out()};
  ops.gemm({.x = x, .m = n, .k = l.in(), .ldx = l.in(), .outputs = {&o, 1}});
  ops.bias_scale({.x = y,
                  .ldx = l.out(),
                  .y = y,
                  .ldy = l.out(),
                  .rows = n,
                  .n = l.out(),
                  .bias = l.bias.data<float>()});
}

Tensor project_on(const Ops& ops, const Linear& proj, const float* context, int64_t T) {
  Tensor y = ops.alloc({T, proj.out()}, DType::f32);
  apply_on(ops, proj, context, T, y.mutable_data<float>());
  return y;
}

// Queries per product. On a GPU the product's weight is always [kQueryBlock, kHeadDim] (zero
// rows pad the last block), so its one pinned GEMM algorithm — and a query's bits — do not
// depend on how many queries share the round; the CPU's products are column-invariant anyway,
// so fewer queries go in one unpadded product there.
constexpr int64_t kQueryBlock = 64;

// Every query's dot product with every key: y[t, i] = keys[t] · q[i] for q [n, kHeadDim] on the
// host and keys where ContextKeys keeps them; returns y [T, ld] in host memory (columns >= n
// unused). Only the products cross to the host.
std::vector<float> key_products(const Ops& ops, const Tensor& keys, const std::vector<float>& q,
                                int64_t n, int64_t* ld) {
  const int64_t T = keys.dim(0);
  if (n <= 0) {
    *ld = 0;
    return {};
  }
  const int64_t block = ops.device() == Device::cpu && n < kQueryBlock ? n : kQueryBlock;
  *ld = (n + block - 1) / block * block;
  std::vector<float> out(size_t(T * *ld)), qb(size_t(block * kHeadDim)), part(size_t(T * block));
  Tensor qd = ops.alloc({block, kHeadDim}, DType::f32);
  Tensor y = ops.alloc({T, block}, DType::f32);
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t m = std::min(block, n - b0);
    std::fill(qb.begin(), qb.end(), 0.0f);
    std::copy(q.begin() + b0 * kHeadDim, q.begin() + (b0 + m) * kHeadDim, qb.begin());
    ops.to_device(qd.mutable_data<float>(), qb.data(), qb.size() * sizeof(float));
    GemmOutput o{.w = &qd, .y = y.mutable_data<float>(), .ldy = block};
    ops.gemm({.x = keys.data<float>(), .m = T, .k = kHeadDim, .ldx = kHeadDim, .outputs = {&o, 1}});
    ops.to_host(part.data(), y.data<float>(), part.size() * sizeof(float));
    for (int64_t t = 0; t < T; ++t)
      std::copy(part.begin() + t * block, part.begin() + t * block + m, out.begin() + t * *ld + b0);
  }
  return out;
}

}  // namespace

void span_keys(const Ops& ops, const Heads& on_ops, const float* context, int64_t T,
               ContextKeys& keys) {
  if (keys.span) return;
  keys.ops = &ops;
  keys.T = T;
  keys.span = true;
  keys.span_start = project_on(ops, on_ops.span.k_start, context, T);
  keys.span_end = project_on(ops, on_ops.span.k_end, context, T);
}

void anchor_keys(const Ops& ops, const Heads& on_ops, const float* context, int64_t T,
                 ContextKeys& keys) {
  if (keys.anchors) return;
  keys.ops = &ops;
  keys.T = T;
  keys.anchors = true;
  keys.anchor = project_on(ops, on_ops.anchor.key, context, T);
  const Tensor prior = project_on(ops, on_ops.anchor.prior, context, T);
  keys.prior.assign(size_t(T), 0.0f);
  ops.to_host(keys.prior.data(), prior.data<float>(), size_t(T) * sizeof(float));
}

SpanLogits span_logits(const Heads& heads, const float* answers, int64_t n,
                       const std::vector<SpanQuery>& queries, const float* context, int64_t T) {
  ContextKeys keys;
  span_keys(cpu_ops(), heads, context, T, keys);
  return span_logits(heads, answers, n, queries, keys);
}

SpanLogits span_logits(const Heads& heads, const float* answers, int64_t n,
                       const std::vector<SpanQuery>& queries, const ContextKeys& keys) {
  DEG_CHECK(int64_t(queries.size()) == n, "{} span queries for {} answers", queries.size(), n);
  DEG_CHECK(keys.span, "span_logits without the span keys");
  const int64_t T = keys.T, W = T + 1;
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  const SpanHeadWeights& sp = heads.span;
  SpanLogits out{std::vector<float>(size_t(n * W)), std::vector<float>(size_t(n * W))};
  std::vector<float> qs(static_cast<size_t>(n * kHeadDim)), qe(static_cast<size_t>(n * kHeadDim));
  std::vector<float> ns(static_cast<size_t>(n)), ne(static_cast<size_t>(n));
  sp.q_start.apply(answers, n, qs.data());
  sp.q_end.apply(answers, n, qe.data());
  sp.null_start.apply(answers, n, ns.data());
  sp.null_end.apply(answers, n, ne.data());
  int64_t ld = 0;
  const std::vector<float> ks = key_products(*keys.ops, keys.span_start, qs, n, &ld);
  const std::vector<float> ke = key_products(*keys.ops, keys.span_end, qe, n, &ld);
  const float* bias = heads.span_bias.data<float>();
  const int64_t nb = int64_t(kRelEdges.size()) + 1;
  for (int64_t i = 0; i < n; ++i) {
    float* st = out.start.data() + i * W;
    float* en = out.end.data() + i * W;
    const SpanQuery& sq = queries[size_t(i)];
    const int64_t hi = sq.region_end < 0 ? T : std::min(sq.region_end, T);
    for (int64_t t = 0; t < T; ++t) {
      st[t] = ks[size_t(t * ld + i)] * scale;
      en[t] = ke[size_t(t * ld + i)] * scale;
      if (sq.anchor >= 0) {
        const int64_t inside = t >= sq.anchor && t < hi;
        const int b = rel_bucket(t - sq.anchor);
        st[t] += bias[(0 * 2 + inside) * nb + b];
        en[t] += bias[(1 * 2 + inside) * nb + b];
      }
    }
    st[T] = ns[size_t(i)];
    en[T] = ne[size_t(i)];
  }
  return out;
}

std::vector<float> anchor_logits(const Heads& heads, const float* answers, int64_t n,
                                 const std::vector<Region>& regions, const float* context,
                                 int64_t T) {
  ContextKeys keys;
  anchor_keys(cpu_ops(), heads, context, T, keys);
  return anchor_logits(heads, answers, n, regions, keys);
}

std::vector<float> anchor_logits(const Heads& heads, const float* answers, int64_t n,
                                 const std::vector<Region>& regions, const ContextKeys& keys) {
  DEG_CHECK(int64_t(regions.size()) == n, "{} regions for {} answers", regions.size(), n);
  DEG_CHECK(keys.anchors, "anchor_logits without the anchor keys");
  const int64_t T = keys.T;
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  std::vector<float> out(static_cast<size_t>(n * T)), q(static_cast<size_t>(n * kHeadDim));
  heads.anchor.query.apply(answers, n, q.data());
  int64_t ld = 0;
  const std::vector<float> dots = key_products(*keys.ops, keys.anchor, q, n, &ld);
  const std::vector<float>& prior = keys.prior;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = std::max<int64_t>(0, regions[size_t(i)].lo);
    const int64_t hi = regions[size_t(i)].hi < 0 ? T : std::min(regions[size_t(i)].hi, T);
    float* row = out.data() + i * T;
    for (int64_t t = 0; t < T; ++t) {
      row[t] = (t >= lo && t < hi) ? dots[size_t(t * ld + i)] * scale + prior[size_t(t)] : neg_inf;
    }
  }
  return out;
}

}  // namespace deg
