// Scalar kernels of the ops that have no vector kernel (kernels/ops.h: activation, bias_scale,
// combine, shift_ids, ngram_embed, sigmoid_gates, rope_pairs, subtract_projection; attention_f64
// has its own file, kernels/cpu/attention_f64.h). Each `*_range` runs its op over a range of the
// op's independent work items (token rows) in plain f32 / f64 C++ with a fixed
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

}  // namespace deg
