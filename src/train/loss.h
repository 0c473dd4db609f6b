// The gpt training loss (seed 003 GPT._loss, perf/kernels/cross_entropy.py): logits
// z = xn W^T, soft-capped to a * sigmoid((z + b) / c); a row's loss is the multi-token term
// sum_k w_k CE(row t, target t+k) over the targets that exist, plus prefix_weight CE(row t,
// prefix target) where one is given. Reported and differentiated as the mean over rows.
//
// Letters: T rows, C model dim, V vocab.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace deg::train {

struct SoftcapLoss {
  float a = 23.0f, b = 5.0f, c = 7.5f;
  std::vector<float> mtp_weights{1.0f};  // weight of target t + k
  float prefix_weight = 0.0f;
};

struct LossInputs {
  const float* xn = nullptr;         // [T, C] final normed hidden state
  const float* w = nullptr;          // [V, C] lm_head
  const int32_t* targets = nullptr;  // [T] next tokens (-1: none)
  const int32_t* prefix = nullptr;   // [T] prefix targets (-1: none) or null
  int64_t T = 0, C = 0, V = 0;
};

// softcap_cross_entropy's arguments for `loss` over T rows of xn [T, C] (contiguous, where the
// backend reads them) with lm_head w; the caller sets loss, dxn and dw. Throws when there are
// more multi-token weights than the op takes.
SoftcapCrossEntropyArgs softcap_op_args(const SoftcapLoss& loss, const float* xn, const Tensor* w,
                                        const int32_t* targets, const int32_t* prefix, int64_t T,
                                        int64_t C);

// Returns the mean loss; when dxn / dw are given, adds the mean loss's gradients to them.
// per_row (optional) receives each row's loss.
double softcap_loss(const SoftcapLoss& loss, const LossInputs& in, float* dxn, float* dw,
                    std::vector<float>* per_row = nullptr);

// Soft-capped logits [T, V] (no loss): what `deg forward` returns for a gpt checkpoint.
void softcap_logits(const SoftcapLoss& loss, const float* xn, const float* w, int64_t T, int64_t C,
                    int64_t V, float* logits);

}  // namespace deg::train
