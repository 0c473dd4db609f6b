// The deg heads (seed `Heads`, `PointerHead`, `SpanHead`, `AnchorHead`, `span_rel_bias`): small
// fp32 layers on the backbone's final-norm hidden states that answer a query. `a` is the hidden
// state at the query's last token, `o_i` at the last token of option line i, `c_t` the trunk's
// hidden state at context token t.
//
//   choice, score   q(a)·k(o_i)/sqrt(d) + u·o_i over the options          (pointer heads)
//   noul            w·a + b -> logits [l, 0] = [true, false]
//   extract         qs(a)·ks(c_t)/sqrt(d) and qe(a)·ke(c_t)/sqrt(d) over context tokens, plus a
//                   null logit ns(a) / ne(a) as outcome T; inside an anchored array item a
//                   learned bias by bucket of t - anchor and by inside/outside the item
//   count           a linear head over 0..64 items
//   anchor          per token qa(a)·ka(c_t)/sqrt(d) + ua·c_t + b, masked to the region
//
// Every logit is a fixed-order dot product of its own row and token (kernels/gemm.h), so values
// do not depend on the batch, the context's length, or the other queries. A context's keys are
// made once (ContextKeys) where its hidden states are: on a GPU only the logits come back.
// Letters: n queries, O options, T context tokens, C hidden, d head dim.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deg {

class Ops;

inline constexpr int64_t kHeadDim = 256;
inline constexpr int64_t kMaxCount = 64;
inline constexpr float kAnchorInitBias = -6.0f;
inline constexpr std::array<int64_t, 14> kRelEdges = {-256, -64, -16, -4, 0,  1,   2,
                                                      4,    8,   16,  32, 64, 128, 256};

// Calibration temperatures are stored in this order (the seed's KINDS).
enum class HeadKind : uint8_t { choice, score, noul, extract, count };
inline constexpr std::array<const char*, 5> kHeadKindNames = {"choice", "score", "noul", "extract",
                                                              "count"};

// nn.Linear: y = x·Wᵀ + b, f32.
struct Linear {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out]
  int64_t in() const { return weight.dim(1); }
  int64_t out() const { return weight.dim(0); }
  // y [n, out] = x [n, in] · Wᵀ + b
  void apply(const float* x, int64_t n, float* y) const;
};

struct PointerHeadWeights {
  Linear query, key, prior;  // [d, C], [d, C], [1, C]
};

struct SpanHeadWeights {
  Linear q_start, k_start, q_end, k_end;  // [d, C]
  Linear null_start, null_end;            // [1, C]
};

struct Heads {
  int64_t hidden = 0;  // C
  PointerHeadWeights choice, score;
  Linear noul;  // [1, C]
  SpanHeadWeights span;
  Linear count;               // [65, C]
  PointerHeadWeights anchor;  // same shapes as a pointer head; prior starts at kAnchorInitBias
  Tensor span_bias;           // [2 (start, end), 2 (outside, inside), 15 buckets]
  Tensor temperature;         // [5] in HeadKind order

  // Fresh heads with PyTorch's nn.Linear default init (uniform +-1/sqrt(in) for weights and
  // biases), the anchor prior scaled as the seed does, zero span bias, unit temperatures.
  static Heads init(int64_t hidden, uint64_t seed);
  // heads.safetensors with the seed's key names (choice.query.weight, span.q_start.bias, ...).
  static Heads load(const std::filesystem::path& path);
  void save(const std::filesystem::path& path) const;

  float temp(HeadKind kind) const { return temperature.data<float>()[int(kind)]; }

  // Every tensor by its key name; `trained` leaves out the temperatures (calibration fits those,
  // not the gradient).
  std::vector<std::pair<std::string, Tensor*>> tensors(bool trained = false);
  // A writable deep copy (loaded heads view their read-only mapped file).
  Heads clone() const;
  // The same heads with every tensor in `ops`'s memory (Ops::upload: the host tensors
  // themselves on the CPU): what span_keys / anchor_keys take. Every other function here reads
  // host heads (on a GPU these tensors are device memory).
  Heads on(const Ops& ops) const;
  // Zeros of the same shapes: gradients, optimizer moments.
  Heads zeros_like() const;
};

// Pointer head over one query's options: answer [C], options [O, C] -> logits [O].
std::vector<float> pointer_logits(const PointerHeadWeights& head, const float* answer,
                                  const float* options, int64_t num_options);
// answers [n, C] -> l [n]; the 2-way logits are [l, 0].
std::vector<float> noul_logits(const Heads& heads, const float* answers, int64_t n);
// answers [n, C] -> logits [n, kMaxCount + 1]
std::vector<float> count_logits(const Heads& heads, const float* answers, int64_t n);

// Where an extract query sits: inside an anchored array item (anchor >= 0) its span logits get
// the relative bias; region_end is the item's end token (exclusive, -1 = end of context).
struct SpanQuery {
  int64_t anchor = -1;
  int64_t region_end = -1;
};

// A context's projections the span and anchor heads read (the span heads' start and end keys,
// the anchor head's keys and prior), made once per document for every query of every round, on
// the backend where the context's hidden states are: on a GPU only the logits come back, never
// [T, C] or [T, kHeadDim]. Each part is made when first asked for.
struct ContextKeys {
  const Ops* ops = nullptr;  // whose memory the keys are in
  int64_t T = 0;
  bool span = false, anchors = false;  // which parts are made
  Tensor span_start, span_end;         // [T, kHeadDim], in ops' memory
  Tensor anchor;                       // [T, kHeadDim], in ops' memory
  std::vector<float> prior;            // [T], host
};
// The span heads' part of `keys` for a context [T, C] in `ops`' memory, unless made already; the
// anchor head's. `on_ops`: the heads with their tensors in ops' memory (Heads::on). Each key is
// Linear::apply's bits (the product, then the bias added once).
void span_keys(const Ops& ops, const Heads& on_ops, const float* context, int64_t T,
               ContextKeys& keys);
void anchor_keys(const Ops& ops, const Heads& on_ops, const float* context, int64_t T,
                 ContextKeys& keys);

// Span logits for n queries over a context [T, C]: start and end [n, T + 1] (index T = null).
// The query side (answers [n, C], host) runs on the host, the products with the keys where the
// keys are.
struct SpanLogits {
  std::vector<float> start, end;
};
SpanLogits span_logits(const Heads& heads, const float* answers, int64_t n,
                       const std::vector<SpanQuery>& queries, const float* context, int64_t T);
SpanLogits span_logits(const Heads& heads, const float* answers, int64_t n,
                       const std::vector<SpanQuery>& queries, const ContextKeys& keys);

// Anchor logits [n, T] for n array queries, -inf outside each query's region [lo, hi)
// (hi = -1: end of context).
struct Region {
  int64_t lo = 0;
  int64_t hi = -1;
};
std::vector<float> anchor_logits(const Heads& heads, const float* answers, int64_t n,
                                 const std::vector<Region>& regions, const float* context,
                                 int64_t T);
std::vector<float> anchor_logits(const Heads& heads, const float* answers, int64_t n,
                                 const std::vector<Region>& regions, const ContextKeys& keys);

// Bucket of a token offset t - anchor: the number of kRelEdges <= d (0..14).
int rel_bucket(int64_t d);

}  // namespace deg
