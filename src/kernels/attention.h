// Causal softmax attention of one row and one KV head (its `group` query heads, GQA), the same
// kernel for trunk prefill and for fork rows: query t (at own position own_before + t) attends
// the row's prefix keys [0, prefix_len) — read by reference from a shared trunk state — then its
// own keys [0, own_before + t]. Scores exist for one block of queries at a time ([block x keys],
// never L×L); every score is one dot product in a fixed order, the softmax is two-pass (max, then
// exp-sum in key order) and each output element sums over keys in index order, so a query's
// output depends on its keys only: batch invariant, and the same whether the input was read in
// one piece or in chunks (keys past a query's own position add exact zeros).
//
// Sliding attention (window > 0): the query at key index i (prefix then own keys, one sequence)
// sees keys (i - window, i] only. Keys before a block's reach are skipped, so a long read costs
// O(block * (window + block)); masked keys inside the reach add exact zeros, so the result does
// not depend on how many earlier keys the buffers hold (a kept tail or the whole input).
#pragma once

#include <cstdint>

namespace deg {

struct AttentionArgs {
  int64_t t0 = 0, t1 = 0;    // the queries to compute, of this call's n_q (t1 <= n_q)
  int64_t group = 1;         // query heads sharing this KV head
  int64_t d = 0;             // head dim
  const float* q = nullptr;  // query t, head g at q[t * ldq + g * d]
  int64_t ldq = 0;
  const float* prefix_k = nullptr;  // [prefix_len, d] contiguous (may be null when 0)
  const float* prefix_v = nullptr;
  int64_t prefix_len = 0;
  const float* own_k =
      nullptr;  // [own_before + n_q, d] contiguous: earlier own keys, then this call's
  const float* own_v = nullptr;
  int64_t own_before = 0;
  float scale = 1;
  int64_t window = 0;    // > 0: sliding attention over the last `window` keys (itself included)
  float* out = nullptr;  // query t, head g at out[t * ldo + g * d]
  int64_t ldo = 0;
};

void attention(const AttentionArgs& a);
// Straightforward double-precision version for tests.
void attention_reference(const AttentionArgs& a);

}  // namespace deg
