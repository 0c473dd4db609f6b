// The losses of the deg heads (model/heads.h) for `deg train`, with their explicit backward.
// The logits are the inference functions' own (pointer_logits, span_logits, ...), so a head is
// trained on exactly what `deg fill` reads; the backward recomputes the projections it needs.
//
//   choice, score  cross-entropy over the options' pointer logits
//   noul           cross-entropy over [l, 0] (true, false)
//   count          cross-entropy over the counts the field allows
//   extract        cross-entropy of the start and of the end over the context tokens and the
//                  null outcome (index T); inside an anchored item the relative bias takes part
//   anchor         sum over the region's tokens of BCE(logit, "an item starts here"), the item
//                  starts' terms weighted by pos_weight (they are a few tokens among many)
//
// Every function returns the summed loss of its queries and adds `weight` times its gradients
// into the ones it is given:
// the head tensors (a Heads of Heads::zeros_like) and the hidden states (answers, options,
// context), which the trunk's backward takes from there. Temperatures stay 1 while training
// (calibration fits them afterwards).
//
// Letters: n queries, O options, T context tokens, C hidden.
#pragma once

#include <cstdint>
#include <vector>

#include "model/heads.h"

namespace deg::train {

// answer [C], options [O, C]; target in [0, O). Adds into da [C], doptions [O, C].
double pointer_loss(const PointerHeadWeights& head, PointerHeadWeights& grad, const float* answer,
                    const float* options, int64_t O, int64_t target, float* da, float* doptions,
                    float weight = 1.0f);

// answer [C]; target true or false.
double noul_loss(const Heads& heads, Heads& grad, const float* answer, bool target, float* da,
                 float weight = 1.0f);

// answer [C]; target in [lo, hi], the counts the field allows (the others are masked).
double count_loss(const Heads& heads, Heads& grad, const float* answer, int64_t lo, int64_t hi,
                  int64_t target, float* da, float weight = 1.0f);

// Inclusive context-token span; start = -1: the null outcome.
struct SpanTarget {
  int64_t start = -1, end = -1;
};
// answers [n, C] over one context [T, C]; adds into da [n, C] and dcontext [T, C].
double span_loss(const Heads& heads, Heads& grad, const float* answers, int64_t n,
                 const std::vector<SpanQuery>& queries, const std::vector<SpanTarget>& targets,
                 const float* context, int64_t T, float* da, float* dcontext, float weight = 1.0f);

// answers [n, C]; starts[i]: the item-start tokens of query i, inside its region.
double anchor_loss(const Heads& heads, Heads& grad, const float* answers, int64_t n,
                   const std::vector<Region>& regions,
                   const std::vector<std::vector<int64_t>>& starts, const float* context, int64_t T,
                   float* da, float* dcontext, float weight = 1.0f, float pos_weight = 1.0f);

}  // namespace deg::train
