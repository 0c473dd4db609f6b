// Soft-capped multi-token cross entropy: the logits for `deg forward`, and the loss and its
// gradient through the op interface's softcap_cross_entropy on the CPU backend (one
// implementation; kernels/ops.h has the semantics and the chunking).
#include "train/loss.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"
#include "train/ops.h"

namespace deg::train {

void softcap_logits(const SoftcapLoss& loss, const float* xn, const float* w, int64_t T, int64_t C,
                    int64_t V, float* logits) {
  matmul_nt(xn, w, logits, T, C, V);
  for (int64_t i = 0; i < T * V; ++i) logits[i] = loss.a * sigmoid((logits[i] + loss.b) / loss.c);
}

SoftcapCrossEntropyArgs softcap_op_args(const SoftcapLoss& loss, const float* xn, const Tensor* w,
                                        const int32_t* targets, const int32_t* prefix, int64_t T,
                                        int64_t C) {
  DEG_CHECK(loss.mtp_weights.size() <= size_t(kMaxMtpWeights),
            "softcap loss: {} multi-token weights (at most {})", loss.mtp_weights.size(),
            kMaxMtpWeights);
  SoftcapCrossEntropyArgs args{.xn = xn,
                               .ldx = C,
                               .w = w,
                               .targets = targets,
                               .prefix = prefix,
                               .rows = T,
                               .a = loss.a,
                               .b = loss.b,
                               .c = loss.c,
                               .mtp = int64_t(loss.mtp_weights.size()),
                               .prefix_weight = loss.prefix_weight,
                               .lddx = C};
  std::copy(loss.mtp_weights.begin(), loss.mtp_weights.end(), args.mtp_weights.begin());
  return args;
}

double softcap_loss(const SoftcapLoss& loss, const LossInputs& in, float* dxn, float* dw,
                    std::vector<float>* per_row) {
  // lm_head as a tensor over the caller's memory (a view: the op only reads it).
  const Tensor w(buffer_view(reinterpret_cast<std::byte*>(const_cast<float*>(in.w)),
                             size_t(in.V * in.C) * sizeof(float)),
                 0, DType::f32, {in.V, in.C});
  SoftcapCrossEntropyArgs args =
      softcap_op_args(loss, in.xn, &w, in.targets, in.prefix, in.T, in.C);
  args.dxn = dxn;
  args.dw = dw;
  std::vector<float> rows(size_t(in.T));
  args.loss = rows.data();
  cpu_ops().softcap_cross_entropy(args);
  double total = 0;
  for (float r : rows) total += r;
  if (per_row) *per_row = std::move(rows);
  return in.T > 0 ? total / double(in.T) : 0.0;
}

}  // namespace deg::train
