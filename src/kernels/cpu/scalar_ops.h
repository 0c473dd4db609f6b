// Scalar kernels of the ops that have no vector kernel (kernels/ops.h: activation, bias_scale,
// combine, shift_ids, ngram_embed, sigmoid_gates, rope_pairs, attention_f64,
// subtract_projection). Each `*_range` runs its op over a range of the op's independent work
// items (token rows, or (row, head, queries) for attention) in plain f32 / f64 C++ with a fixed
// order per output, so the CPU backend (ops.cc) can split a call anywhere without changing a bit.
// The op table (tests/ops_test.cc) scores them against the reference backend. Not compiled with
// target clones: the f32 sums here must not be contracted into FMAs (the gpt family is checked
// bitwise against a trainer that does not).
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace deg {

// A combination term's coefficient for row r, column group g (CombineTerm's rule).
float term_coef(const CombineTerm& t, int64_t r, int64_t g);

void activation_range(const ActivationArgs& a, int64_t r0, int64_t r1);
void bias_scale_range(const BiasScaleArgs& a, int64_t r0, int64_t r1);
void combine_range(const CombineArgs& a, int64_t r0, int64_t r1);
void shift_ids_range(const ShiftIdsArgs& a, int64_t i0, int64_t i1);
void ngram_embed_range(const NgramEmbedArgs& a, int64_t i0, int64_t i1);
void sigmoid_gates_range(const SigmoidGateArgs& a, int64_t r0, int64_t r1);
void rope_pairs_range(const RopePairsArgs& a, int64_t i0, int64_t i1);
void subtract_projection_range(const ProjectionArgs& a, int64_t i0, int64_t i1);

// attention_f64: zero the padded outputs, then queries [t0, t1) of row b, head h; `scores` holds
// attention_f64_scores(a) floats.
// The first attention position a token of segment start `start` (a token position) may see.
inline int64_t segment_start(int32_t start, bool paired_heads) {
  return paired_heads ? 2 * int64_t(start) : int64_t(start);
}
// out[j] = scale * float(sum_d q[d] k_j[d]) for n keys, the sum in f64 in index order, dims
// [0, split) from lo[j] and [split, dq) from hi[j] (the key offset's previous key; hi[j] = lo[j]
// without it). Eight keys' sums run side by side (each still its own, in order: the same bits as
// one key at a time, but not one dependent chain of additions per key).
void f64_scores(const float* q, int64_t dq, int64_t split, const float* const* lo,
                const float* const* hi, int64_t n, float scale, float* out);
void attention_f64_zero_padded(const AttendF64Args& a);
int64_t attention_f64_scores(const AttendF64Args& a);
void attention_f64_range(const AttendF64Args& a, int64_t b, int64_t h, int64_t t0, int64_t t1,
                         float* scores);

}  // namespace deg
