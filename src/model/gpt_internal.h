// Pieces of the gpt family (src/model/gpt.cc) shared with its attention sublayer
// (src/model/gpt_attention.cc): scalar helpers in the trainer's arithmetic, per-call scratch, and
// the attention sublayer's interface. Internal to the family; not part of the Family contract.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>

#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/scratch.h"
#include "model/backbone.h"

namespace deg::gpt_detail {

constexpr int64_t kQueryBlock = 16;           // attention work unit (queries of one row and head)
constexpr int kTokenSlot = kLayerSlots + 14;  // per-token temporaries (any thread)
constexpr int kScoreSlot = kLayerSlots + 15;  // attention scores of one query (any thread)

// ---- small helpers (the trainer's scalar forms) ----

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
// Double-accumulated dot product, as train/ops.h dot().
inline float dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return float(s);
}
inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
inline void for_each(int64_t n, int64_t grain, const std::function<void(int64_t)>& fn) {
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) fn(i);
      },
      grain);
}

// Per-call buffers carved from one per-thread scratch slot.
class SlotArena {
 public:
  SlotArena(int slot, size_t size) : base_(scratch_floats(slot, size)), size_(size) {}
  float* take(int64_t n) {
    DEG_CHECK(used_ + size_t(n) <= size_, "gpt arena: {} + {} floats > {}", used_, n, size_);
    float* p = base_ + used_;
    used_ += size_t(n);
    return p;
  }

 private:
  float* base_;
  size_t size_, used_ = 0;
};

// One attention layer's weights and settings.
struct AttnWeights {
  Tensor qk, v, o;  // [2 H Dq, C], [H Dv, C], [C, H Dv]
  int64_t dq = 0, dv = 0, d = 0;
  bool paired = false, key_offset = false;
  int64_t window = 0;           // in attention positions (2 per token when paired)
  const float* freq = nullptr;  // [Dq] rotary frequencies
  float scale = 1.0f;           // softmax scale
};

// What the attention sublayer reads besides its weights. Lanes are offsets into a token's
// residual stream row (-1: none).
struct AttnInputs {
  const LayerCall* call = nullptr;  // the layer call (stream, rows, lengths, positions, K/V views)
  const float* xn = nullptr;        // [N, C] normed input
  const float* aux = nullptr;   // [N, C] added to V (head h reads its leading Dv of C/H), or null
  const float* ones = nullptr;  // [>= Dq] unit RMS-norm weights
  float sa0 = 1.0f;             // scales q, k, v
  float eps = 0.0f;             // q/k RMS norm
  int64_t model_dim = 0, heads = 0, rotary_dim = 0;
  int64_t stream = 0;  // S
  int64_t xsa = -1;    // lane of head 0's raw XSA strength
  int64_t gate = -1;   // lane of head 0's output gate
};

// q, k = rotary(norm(sa0 xn W_qk^T)), v = sa0 xn W_v^T + aux; the call's real K/V into the rows'
// own buffers; causal sliding-window attention over the rows' prefix and own keys (paired heads,
// key offset); XSA and output gates -> y W_o^T [N, C] from `ar` (padded rows 0). The output
// scale is the caller's.
const float* attention(const AttnWeights& a, const AttnInputs& in, SlotArena& ar);

}  // namespace deg::gpt_detail
