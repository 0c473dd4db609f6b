// The CUDA backend's f64-accumulated attention (AttendF64Args of kernels/ops.h): the scalar
// trainer's arithmetic per (token, head) in query tiles (attention_f64_queries.cuh: a warp per
// query, kQueries tokens of a row and one head per block, the keys staged in shared memory).
// Three passes over the keys: the maximum score, the f64 normaliser, then the output, each dim
// one lane's sum over the keys in index order, y += p_j v_j with p_j = exp(s_j - max) (1 / sum)
// (the weights of a staged tile written to shared memory first). Any window fits: scores are
// recomputed in each pass beyond the score cache.
//
// Batch invariance: a (token, head)'s result depends on its query, its keys and the fixed block
// shape only (attention_f64_queries.cuh's sum orders).
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/attention_f64_queries.cuh"

template <int kDim>
__global__ void __launch_bounds__(kTileThreads) attention_f64_kernel(AttentionF64Launch a) {
  extern __shared__ double tile_memory[];
  auto& sm = *reinterpret_cast<QueryTileShared<kDim, false>*>(tile_memory);
  const TileQuery c = tile_query(a, sm);
  float* y = a.out + c.n * a.ldo + c.h * a.ho;
  if (c.in_call && !c.active)  // padding: zeroed
    for (int64_t d = c.lane; d < a.v_dim; d += 32) y[d] = 0.0f;
  float mx, inv;
  softmax_stats(c, sm, &mx, &inv);
  float acc[kDim / 32] = {};
  for_key_tiles(c, sm, !c.cached, true, [&](int64_t base, int count) {
    for_lane_keys(c, base, count,
                  [&](int r) { sm.w[c.warp][r] = expf(score_at(c, sm, base, r) - mx) * inv; });
    accumulate_rows(c, sm, sm.v, base, count, a.v_dim, acc);
  });
  if (!c.active) return;
#pragma unroll
  for (int k = 0; k < kDim / 32; ++k) {
    const int d = c.lane + 32 * k;
    if (d < a.v_dim) y[d] = acc[k];
  }
}

template <int kDim>
cudaError_t launch_tiles(const AttentionF64Launch& a, cudaStream_t stream) {
  return launch_query_tiles(attention_f64_kernel<kDim>, a, a,
                            int(sizeof(QueryTileShared<kDim, false>)), stream);
}

}  // namespace

cudaError_t launch_attention_f64(const AttentionF64Launch& a, cudaStream_t stream) {
  if (a.rows.count == 0 || a.rows.tokens == 0 || a.heads == 0) return cudaSuccess;
  if (a.paired_heads && a.heads % 2) return cudaErrorInvalidValue;
  const int64_t dims = a.qk_dim > a.v_dim ? a.qk_dim : a.v_dim;
  if (dims <= 64) return launch_tiles<64>(a, stream);
  if (dims <= 128) return launch_tiles<128>(a, stream);
  if (dims <= 512) return launch_tiles<512>(a, stream);
  return cudaErrorInvalidValue;
}

}  // namespace deg::cuda
