// The CUDA delta rule's recurrence (delta_rule.cu's top comment): decode steps, short rows and a
// row's short last chunk, the state in registers, one warp per 16 value columns.
//
// A row with a history (DeltaRuleHistory) loads rec_in, the state its prefix's fork rows share
// (so most of it comes from L2 at a decode step of many rows), replays its history's updates over
// it in registers with the very operations the token loop below makes (S <- fmaf(k, d, S e^g)),
// then runs its tokens; when it appends, it keeps each token's update d = u4 and stores no state.
// So a state carried as history is bitwise the state this kernel would have stored, and a decode
// step reads the shared state and ~1 KB a history token a (row, head) instead of reading and
// writing a 64 KB state of its own.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/delta_rule_common.cuh"

namespace deg::cuda::dr {

// ---- the recurrence: decode, short rows, short last chunks ----

struct RecurPlan {
  int col_blocks;  // ceil(Dv / kRecCols): CTAs per (row, head)
  int tmax;        // most tokens a row of the launch runs here (<= kRecurTokens)
  int hmax;        // longest history a row of the launch replays
  int fold;        // rows run no tokens: their history replayed over rec_in, stored to rec_out
  int vec_hist;    // every history 16-byte aligned with Dk, Dv % 4 == 0
  int dkr;         // 8 R: row stride of the staged q, k
  int vec_qk;      // q, k rows 16-byte aligned: 16-byte cp.async
  int vec_state;   // every row's rec_in / rec_out 16-byte aligned and Dv % 4 == 0
  int vec_v;
  int vec_out;
};

__host__ __device__ inline int recur_smem_floats(const RecurPlan& p) {
  return (2 * p.tmax + p.hmax) * p.dkr + round_up(p.hmax + p.tmax, 4) + round_up(p.tmax, 4) +
         p.hmax * kRecCols;
}

// R: rows of S per lane (Dk <= 8 R). Lane (rg = lane / 4, cg = lane % 4) of warp w holds rows
// rg R .. rg R + R - 1 and columns 16 w + 4 cg .. + 3 of the CTA's block.
template <int R>
__global__ void __launch_bounds__(kRecThreads)
    recur_kernel(const DeltaRuleLaunch a, const RowList list, const RecurPlan p) {
  extern __shared__ float4 smem4[];
  // History entries first, then the call's tokens: ks, gs [hist + tokens], ds [hist].
  float* qs = reinterpret_cast<float*>(smem4);    // [tmax][dkr]
  float* ks = qs + p.tmax * p.dkr;                // [hmax + tmax][dkr]
  float* gs = ks + (p.hmax + p.tmax) * p.dkr;     // [hmax + tmax]
  float* bs = gs + round_up(p.hmax + p.tmax, 4);  // [tmax]
  float* ds = bs + round_up(p.tmax, 4);           // [hmax][kRecCols]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cg = lane & 3, rg = lane >> 2;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int hv = static_cast<int>(a.v_heads);
  const int cb = static_cast<int>(blockIdx.x % p.col_blocks);
  const int rest = static_cast<int>(blockIdx.x / p.col_blocks);
  const int h = rest % hv, row = list.index[rest / hv];
  const int kh = h / (hv / static_cast<int>(a.k_heads));
  const int64_t n = p.fold ? 0 : a.rows.length[row], len = a.rows.tokens;
  const int64_t tok0 = (a.rows.first + row) * len;
  const int64_t t0 = chunked_tokens(n);  // tokens the chunked form ran (state now in rec_out)
  const int cnt = static_cast<int>(n - t0);
  const int c0 = cb * kRecCols, col = c0 + 16 * warp + 4 * cg;
  const HistRow hr = a.hist[row];
  const int hl = hr.len;  // 0 where the chunked form ran first (the launcher folded the row)
  const bool keep_hist = hr.append != 0 && !p.fold;

  if (t0 == 0 && !p.fold) {  // no chunked form for this row: zero the padded outputs here
    const int width = min(kRecCols, dv - c0);
    for (int64_t w = tid; w < (len - n) * kRecCols; w += kRecThreads) {
      const int64_t t = n + w / kRecCols;
      const int j = static_cast<int>(w % kRecCols);
      if (j < width) a.out[(tok0 + t) * a.ldo + h * dv + c0 + j] = 0.0f;
    }
  }

  // Stage q, k (rows past Dk zero-filled), g, beta of the cnt tokens, after the history's k, g
  // and the CTA's columns of its d.
  const int64_t first = tok0 + t0;
  float* kt = ks + hl * p.dkr;  // the tokens' k
  if (p.vec_qk) {
    const int w4 = p.dkr / 4;
    for (int w = tid; w < cnt * w4; w += kRecThreads) {
      const int t = w / w4, x = 4 * (w - t * w4);
      const bool ok = x < dk;
      const int64_t off = (first + t) * a.ld + kh * dk + x;
      cp_async16(qs + t * p.dkr + x, ok ? a.q + off : a.q, ok);
      cp_async16(kt + t * p.dkr + x, ok ? a.k + off : a.k, ok);
    }
  } else {
    for (int w = tid; w < cnt * p.dkr; w += kRecThreads) {
      const int t = w / p.dkr, x = w - t * p.dkr;
      const bool ok = x < dk;
      const int64_t off = (first + t) * a.ld + kh * dk + x;
      cp_async4(qs + w, ok ? a.q + off : a.q, ok);
      cp_async4(kt + w, ok ? a.k + off : a.k, ok);
    }
  }
  for (int t = tid; t < cnt; t += kRecThreads) {
    cp_async4(gs + hl + t, a.g + (first + t) * a.ldg + h, true);
    cp_async4(bs + t, a.beta + (first + t) * a.ldg + h, true);
  }
  if (hl > 0) {
    const float* hk = hr.k + static_cast<int64_t>(kh) * hr.cap * dk;
    const float* hd = hr.d + static_cast<int64_t>(h) * hr.cap * dv;
    if (p.vec_hist) {
      const int w4 = p.dkr / 4;
      for (int w = tid; w < hl * w4; w += kRecThreads) {
        const int j = w / w4, x = 4 * (w - j * w4);
        const bool ok = x < dk;
        cp_async16(ks + j * p.dkr + x, ok ? hk + j * dk + x : hk, ok);
      }
      for (int w = tid; w < hl * (kRecCols / 4); w += kRecThreads) {
        const int j = w / (kRecCols / 4), x = 4 * (w - j * (kRecCols / 4));
        const bool ok = c0 + x < dv;
        cp_async16(ds + j * kRecCols + x, ok ? hd + j * dv + c0 + x : hd, ok);
      }
    } else {
      for (int w = tid; w < hl * p.dkr; w += kRecThreads) {
        const int j = w / p.dkr, x = w - j * p.dkr;
        const bool ok = x < dk;
        cp_async4(ks + w, ok ? hk + j * dk + x : hk, ok);
      }
      for (int w = tid; w < hl * kRecCols; w += kRecThreads) {
        const int j = w / kRecCols, x = w - j * kRecCols;
        const bool ok = c0 + x < dv;
        cp_async4(ds + w, ok ? hd + j * dv + c0 + x : hd, ok);
      }
    }
    for (int j = tid; j < hl; j += kRecThreads)
      cp_async4(gs + j, hr.g + static_cast<int64_t>(h) * hr.cap + j, true);
  }

  // This lane's part of S, loaded once: rec_out may alias rec_in, and every element is read and
  // written by the same thread.
  const int64_t head = static_cast<int64_t>(h) * dk * dv;
  const float* s_in = (t0 > 0 ? a.state[row].rec_out : a.state[row].rec_in) + head;
  float* s_out = a.state[row].rec_out + head;
  const bool vs = p.vec_state != 0;
  float s[R][4];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int x = rg * R + i;
    const float4 v =
        x < dk ? load_cols(s_in + x * dv + col, col, dv, vs) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    s[i][0] = v.x;
    s[i][1] = v.y;
    s[i][2] = v.z;
    s[i][3] = v.w;
  }
  cp_async_wait_all();
  __syncthreads();

  // The history's updates, as the token loop below made them.
  for (int j = 0; j < hl; ++j) {
    const float decay = expf(gs[j]);
    const float* kr = ks + j * p.dkr + rg * R;
    const float4 d4 = ld4(ds + j * kRecCols + 16 * warp + 4 * cg);
    const float dd[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
    for (int i = 0; i < R; i += 4) {
      const float4 k4 = ld4(kr + i);
      const float kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[i + u][e] = fmaf(kk[u], dd[e], s[i + u][e] * decay);
    }
  }

  const float* vp = a.v + first * a.ld + h * dv + col;
  float* op = a.out + first * a.ldo + h * dv + col;
  float4 vnext = cnt > 0 ? load_cols(vp, col, dv, p.vec_v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int t = 0; t < cnt; ++t) {
    const float vt[4] = {vnext.x, vnext.y, vnext.z, vnext.w};
    if (t + 1 < cnt) vnext = load_cols(vp + (t + 1) * a.ld, col, dv, p.vec_v);
    const float decay = expf(gs[hl + t]), beta = bs[t];
    const float* kr = kt + t * p.dkr + rg * R;
    const float* qr = qs + t * p.dkr + rg * R;
    // mem = Sᵀ k (before the decay)
    float mem[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < R; i += 4) {
      const float4 k4 = ld4(kr + i);
      const float kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) mem[e] = fmaf(kk[u], s[i + u][e], mem[e]);
    }
#pragma unroll
    for (int off = 4; off < 32; off <<= 1)
#pragma unroll
      for (int e = 0; e < 4; ++e) mem[e] += __shfl_xor_sync(0xffffffffu, mem[e], off);
    float u4[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) u4[e] = (vt[e] - decay * mem[e]) * beta;
    if (keep_hist && rg == 0) {
      float* dp = hr.d + (static_cast<int64_t>(h) * hr.cap + hl + t) * dv + col;
      store_cols(dp, col, dv, p.vec_hist, make_float4(u4[0], u4[1], u4[2], u4[3]));
    }
    // S <- e^g S + k ⊗ u; o = Sᵀ q
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < R; i += 4) {
      const float4 k4 = ld4(kr + i), q4 = ld4(qr + i);
      const float kk[4] = {k4.x, k4.y, k4.z, k4.w}, qq[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[i + u][e] = fmaf(kk[u], u4[e], s[i + u][e] * decay);
          o[e] = fmaf(qq[u], s[i + u][e], o[e]);
        }
    }
#pragma unroll
    for (int off = 4; off < 32; off <<= 1)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] += __shfl_xor_sync(0xffffffffu, o[e], off);
    if (rg == 0)
      store_cols(op + t * a.ldo, col, dv, p.vec_out, make_float4(o[0], o[1], o[2], o[3]));
  }

  if (keep_hist) {  // the tokens' k (once per key head) and g
    if (cb == 0 && h % (hv / static_cast<int>(a.k_heads)) == 0) {
      float* hk = hr.k + (static_cast<int64_t>(kh) * hr.cap + hl) * dk;
      for (int w = tid; w < cnt * dk; w += kRecThreads) {
        const int t = w / dk, x = w - t * dk;
        hk[t * dk + x] = kt[t * p.dkr + x];
      }
    }
    if (cb == 0)
      for (int t = tid; t < cnt; t += kRecThreads)
        hr.g[static_cast<int64_t>(h) * hr.cap + hl + t] = gs[hl + t];
    return;  // the row's state is its history
  }
  if (a.rec_scratch && !p.fold) return;  // nothing reads the final state (fork rows not kept)
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int x = rg * R + i;
    if (x < dk)
      store_cols(s_out + x * dv + col, col, dv, vs,
                 make_float4(s[i][0], s[i][1], s[i][2], s[i][3]));
  }
}

template <int R>
cudaError_t launch_recur_r(const DeltaRuleLaunch& a, const RowList& rows, const RecurPlan& p,
                           cudaStream_t stream) {
  const int bytes = recur_smem_floats(p) * int(sizeof(float));
  if (bytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(recur_kernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
  }
  const unsigned grid = static_cast<unsigned>(p.col_blocks * a.v_heads * rows.count);
  recur_kernel<R><<<grid, kRecThreads, bytes, stream>>>(a, rows, p);
  return cudaGetLastError();
}

cudaError_t launch_recurrent(const DeltaRuleLaunch& a, const RowList& rows, int tmax, bool fold,
                             cudaStream_t stream) {
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int r = dk <= 32 ? 4 : dk <= 128 ? 16 : 32;
  RecurPlan p{};
  p.col_blocks = (dv + kRecCols - 1) / kRecCols;
  p.tmax = fold ? 0 : tmax;
  p.fold = fold ? 1 : 0;
  p.vec_hist = dk % 4 == 0 && dv % 4 == 0;
  for (int i = 0; i < rows.count; ++i) {
    const HistRow& h = a.hist[rows.index[i]];
    p.hmax = h.len > p.hmax ? h.len : p.hmax;
    p.vec_hist = p.vec_hist && ((h.len == 0 && !h.append) || (aligned16(h.k) && aligned16(h.d)));
  }
  p.dkr = 8 * r;
  p.vec_qk = aligned16(a.q) && aligned16(a.k) && a.ld % 4 == 0 && dk % 4 == 0;
  p.vec_v = aligned16(a.v) && a.ld % 4 == 0 && dv % 4 == 0;
  p.vec_out = aligned16(a.out) && a.ldo % 4 == 0 && dv % 4 == 0;
  p.vec_state = dv % 4 == 0;
  for (int i = 0; i < rows.count; ++i) {
    const StateRow& s = a.state[rows.index[i]];
    p.vec_state = p.vec_state && aligned16(s.rec_in) && aligned16(s.rec_out);
  }
  if (r == 4) return launch_recur_r<4>(a, rows, p, stream);
  if (r == 16) return launch_recur_r<16>(a, rows, p, stream);
  return launch_recur_r<32>(a, rows, p, stream);
}

}  // namespace deg::cuda::dr
