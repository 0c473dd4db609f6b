// The hidden states the heads read for a training example, two ways: from the inference engine
// (prefill of the trunk, then every query as a fork row over it: a frozen trunk, computed once)
// or from the gpt trainer's forward over documents and their queries packed in the fork layout
// (a trunk that trains: the gradients go back the same way). Both must agree — the fork layout
// is the inference fork — which tests/train_finetune_test.cc checks.
//
// Letters: T context tokens, C hidden, n queries, O options.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model.h"
#include "train/gpt_params.h"
#include "train/gpt_step.h"
#include "train/tasks.h"

namespace deg::train {

struct Feats {
  Buf ctx;                         // [T, C] final-norm hidden of the context tokens
  Buf answers;                     // [n, C] each query's last token
  Buf options;                     // [sum O, C] each option line's last token
  std::vector<int64_t> option_at;  // [n] first options row of each query
};
// Zeros shaped like `f` (gradients).
Feats zeros_like(const Feats& f);

// Per head kind (QueryHead order): summed loss and number of queries.
struct LossStats {
  double sum[6] = {0, 0, 0, 0, 0, 0};
  int64_t queries[6] = {0, 0, 0, 0, 0, 0};
  void add(const LossStats& o);
  double total() const;
  // The sum over kinds of each kind's mean loss: every kind weighs the same, however many
  // queries it has (a schema of forty optional arrays has forty anchor queries per choice).
  double balanced() const;
};

// The summed head loss of one example; adds the head gradients into `grad` and the hidden
// states' into `dfeats` (zeros_like(feats)), each query's scaled by its kind's weight
// (QueryHead order; null: 1).
double example_loss(const Heads& heads, Heads& grad, const TaskExample& ex, const Feats& feats,
                    Feats& dfeats, LossStats* stats = nullptr, const float* kind_weight = nullptr,
                    float anchor_pos_weight = 1.0f);

// The engine's hidden states of one example (any backbone; nothing is trained through them).
Feats engine_features(const engine::DegModel& model, const TaskExample& ex);

// Examples packed into one stream in the fork layout: each trunk is its own segment from
// position 0, each query follows its trunk's last token, continues its positions and reads its
// keys.
struct Packed {
  GptBatch batch;
  std::vector<int64_t> trunk_at;               // [examples] stream index of each trunk
  std::vector<std::vector<int64_t>> query_at;  // [examples][queries] stream index of each query
};
Packed pack_examples(const std::vector<const TaskExample*>& examples);
// The features of example k of a packed batch from the trainer's final hidden [T, C].
Feats packed_features(const Packed& p, const std::vector<const TaskExample*>& examples, size_t k,
                      const float* hidden, int64_t C);
// Adds an example's feature gradients into the packed stream's dhidden [T, C].
void scatter_features(const Packed& p, const std::vector<const TaskExample*>& examples, size_t k,
                      const Feats& dfeats, float* dhidden, int64_t C);

}  // namespace deg::train
