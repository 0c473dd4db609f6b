// Soft-capped multi-token cross entropy, forward and gradient, over row chunks so the [T, V]
// logits never exist whole.
#include "train/loss.h"

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "train/ops.h"

namespace deg::train {

void softcap_logits(const SoftcapLoss& loss, const float* xn, const float* w, int64_t T, int64_t C,
                    int64_t V, float* logits) {
  matmul_nt(xn, w, logits, T, C, V);
  for (int64_t i = 0; i < T * V; ++i) logits[i] = loss.a * sigmoid((logits[i] + loss.b) / loss.c);
}

double softcap_loss(const SoftcapLoss& loss, const LossInputs& in, float* dxn, float* dw,
                    std::vector<float>* per_row) {
  const int64_t T = in.T, C = in.C, V = in.V, K = int64_t(loss.mtp_weights.size());
  const int64_t chunk =
      std::max<int64_t>(1, std::min<int64_t>(T, (1 << 20) / std::max<int64_t>(V, 1)));
  std::vector<float> rows(size_t(T), 0.0f);
  const bool grad = dxn || dw;
  Buf z = zeros(chunk * V), u = zeros(chunk * V);
  for (int64_t r0 = 0; r0 < T; r0 += chunk) {
    const int64_t R = std::min(chunk, T - r0);
    matmul_nt(in.xn + r0 * C, in.w, z.data(), R, C, V);
    parallel_for(R, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t t = r0 + r;
        float* zr = z.data() + r * V;
        float* ur = u.data() + r * V;
        // Soft-capped logits are in (0, a): a is a safe fixed maximum (as the seed's kernel).
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) {
          ur[v] = sigmoid((zr[v] + loss.b) / loss.c);
          sum += std::exp(double(loss.a * ur[v] - loss.a));
        }
        const double lse = loss.a + std::log(sum);
        // Active terms: (target, weight).
        double row = 0, wsum = 0;
        std::vector<std::pair<int32_t, float>> terms;
        for (int64_t k = 0; k < K; ++k) {
          if (t + k >= T) break;
          const int32_t tg = in.targets[t + k];
          if (tg < 0 || tg >= V) continue;
          terms.emplace_back(tg, loss.mtp_weights[size_t(k)]);
        }
        if (in.prefix && loss.prefix_weight != 0.0f && in.prefix[t] >= 0 && in.prefix[t] < V)
          terms.emplace_back(in.prefix[t], loss.prefix_weight);
        for (auto [tg, wt] : terms) {
          row += double(wt) * (lse - double(loss.a * ur[tg]));
          wsum += wt;
        }
        rows[size_t(t)] = float(row);
        if (!grad) continue;
        // d(row)/d(sc_v) = wsum p_v - sum of weights on v; then through the softcap.
        const float inv_t = 1.0f / float(T);
        for (int64_t v = 0; v < V; ++v) {
          const float p = float(std::exp(double(loss.a * ur[v]) - lse));
          zr[v] = float(wsum) * p;
        }
        for (auto [tg, wt] : terms) zr[tg] -= wt;
        for (int64_t v = 0; v < V; ++v) zr[v] *= inv_t * loss.a / loss.c * ur[v] * (1.0f - ur[v]);
      }
    });
    if (grad) {
      if (dxn) matmul_nn(z.data(), in.w, dxn + r0 * C, R, V, C, true);
      if (dw) matmul_tn(z.data(), in.xn + r0 * C, dw, R, V, C, true);
    }
  }
  double total = 0;
  for (float r : rows) total += r;
  if (per_row) *per_row = rows;
  return T > 0 ? total / double(T) : 0.0;
}

}  // namespace deg::train
