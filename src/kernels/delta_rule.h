// The gated delta rule of Gated DeltaNet for one (row, value head), f32 throughout:
//   S <- S * exp(g_t);  S <- S + k_t ⊗ beta_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t
// with S [Dk, Dv]. Two forms with one contract: the recurrence (decode steps; the reference) and
// the chunked form HF/FLA use for prefill (chunks of 64 from the row's first position, a UT
// transform inside each chunk). q must already be L2-normalised and scaled by Dk^-0.5, k
// L2-normalised. Only the row's n real positions are read: padding never enters the state.
#pragma once

#include <cstdint>

namespace deg {

struct DeltaRuleArgs {
  int64_t n = 0;             // real positions
  int64_t dk = 0;            // key head dim
  int64_t dv = 0;            // value head dim
  const float* q = nullptr;  // [n, dk] at token stride ldqk
  const float* k = nullptr;  // [n, dk] at token stride ldqk
  int64_t ldqk = 0;
  const float* v = nullptr;  // [n, dv] at token stride ldv
  int64_t ldv = 0;
  const float* g = nullptr;     // [n] log decay (<= 0) at stride ldgb
  const float* beta = nullptr;  // [n] write strength at stride ldgb
  int64_t ldgb = 0;
  float* state = nullptr;  // [dk, dv] initial state in, final state out
  float* out = nullptr;    // [n, dv] at token stride ldo
  int64_t ldo = 0;
  // delta_rule_recurrent only: each token's update d_t = beta_t (v_t - Sᵀ k_t) (after the decay)
  // at token stride ldd, or null.
  float* delta = nullptr;
  int64_t ldd = 0;
};

inline constexpr int64_t kDeltaRuleChunk = 64;

void delta_rule_recurrent(const DeltaRuleArgs& a);
// The recurrence's state steps of n earlier tokens from their kept updates (DeltaRuleHistory):
// S <- S e^(g_j); S <- S + k_j ⊗ d_j, rounded as delta_rule_recurrent rounds them, so a state
// carried as history is bitwise the state the recurrence would have kept.
void delta_rule_replay(float* state, int64_t dk, int64_t dv, int64_t n, const float* k, int64_t ldk,
                       const float* d, int64_t ldd, const float* g, int64_t ldg);
void delta_rule_chunked(const DeltaRuleArgs& a, int64_t chunk = kDeltaRuleChunk);

}  // namespace deg
