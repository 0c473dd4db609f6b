// The CUDA backend's training kernels (launch.h "backward.cu"): the backward of the forward ops
// in the CPU's formulas (kernels/cpu/backward.cc). No result depends on the launch shape and none
// needs atomics: an element summed over many terms is one thread's (terms in order) or a fixed
// group of threads' — a warp (or a fixed lane group of one) for a norm's or a combination's
// vector, a 256-thread block for a column sum — each thread taking the terms at a fixed stride
// and the partial sums meeting in a fixed tree, so the bits depend on the sizes only (the CPU's
// sums run in plain order; the f64 partial sums make the f32 results agree to rounding).
// Attention's backward is in attention_f64_backward.cu.
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/grid.cuh"

// A warp per (row, head) vector: lane l takes dims l, l + 32, ... (kPer of them held in
// registers, so each pass's loads go out together; kPer 0: any width, read from memory each
// pass), its sums in that order.
template <int kPer>
__global__ void rms_norm_backward_kernel(NormBackwardLaunch a) {
  constexpr int kHeld = kPer > 0 ? kPer : 1;
  const int64_t hx = a.hx ? a.hx : a.dim, hy = a.hy ? a.hy : a.dim, hd = a.hdx ? a.hdx : a.dim;
  const LaneGroups lg(kWarp);
  const int64_t n = a.rows * a.heads, lane = lg.lane;
  for (int64_t v = lg.first; lg.warp_has(v, n); v += lg.warps * lg.per_warp) {
    const bool on = v < n;
    const int64_t r = on ? v / a.heads : 0, h = on ? v % a.heads : 0;
    const float* x = a.x + r * a.ldx + h * hx;
    const float* dy = a.dy + r * a.ldy + h * hy;
    float xr[kHeld], dyr[kHeld];
    double xx = 0;
    if (kPer > 0) {
#pragma unroll
      for (int c = 0; c < kHeld; ++c) {
        const int64_t d = lane + kWarp * c;
        const bool in = on && d < a.dim;
        xr[c] = in ? x[d] : 0.0f;
        dyr[c] = in ? dy[d] : 0.0f;
      }
#pragma unroll
      for (int c = 0; c < kHeld; ++c)
        if (lane + kWarp * c < a.dim) xx += double(xr[c]) * double(xr[c]);
    } else if (on) {
      for (int64_t d = lane; d < a.dim; d += kWarp) xx += double(x[d]) * double(x[d]);
    }
    const float rstd = float(1.0 / sqrt(group_sum(xx, kWarp) / double(a.dim) + a.eps));
    double m = 0;
    if (kPer > 0) {
#pragma unroll
      for (int c = 0; c < kHeld; ++c)
        if (lane + kWarp * c < a.dim) m += double(dyr[c]) * double(xr[c] * rstd);
    } else if (on) {
      for (int64_t d = lane; d < a.dim; d += kWarp) m += double(dy[d]) * double(x[d] * rstd);
    }
    const float mean = float(group_sum(m, kWarp) / double(a.dim));
    if (!on) continue;
    float* dx = a.dx + r * a.lddx + h * hd;
    if (kPer > 0) {
#pragma unroll
      for (int c = 0; c < kHeld; ++c) {
        const int64_t d = lane + kWarp * c;
        if (d < a.dim) dx[d] += rstd * (dyr[c] - xr[c] * rstd * mean);
      }
    } else {
      for (int64_t d = lane; d < a.dim; d += kWarp) dx[d] += rstd * (dy[d] - x[d] * rstd * mean);
    }
  }
}

__device__ float slope(const ActivationBackwardLaunch& a, float x) {
  if (a.act == 0) return x > 0 ? 2.0f * x : 0.0f;
  if (a.act == 1)
    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
           x * 0.39894228040143268f * expf(-0.5f * x * x);
  const float u = sigmoid((x + a.b) / a.c);
  return a.a / a.c * u * (1.0f - u);
}

// kVec: four columns a thread (by_float4); dx may be dy.
template <bool kVec>
__global__ void activation_backward_kernel(ActivationBackwardLaunch a) {
  if constexpr (kVec) {
    const int64_t n4 = a.n / 4;
    DEG_GRID_LOOP(e, a.rows * n4) {
      const int64_t r = e / n4, j = e % n4;
      const float4 x = reinterpret_cast<const float4*>(a.x + r * a.ldx)[j];
      const float4 dy = reinterpret_cast<const float4*>(a.dy + r * a.ldy)[j];
      float4* dx = reinterpret_cast<float4*>(a.dx + r * a.lddx) + j;
      float4 g = make_float4(dy.x * slope(a, x.x), dy.y * slope(a, x.y), dy.z * slope(a, x.z),
                             dy.w * slope(a, x.w));
      if (a.accumulate) {
        const float4 o = *dx;
        g = make_float4(o.x + g.x, o.y + g.y, o.z + g.z, o.w + g.w);
      }
      *dx = g;
    }
  } else {
    DEG_GRID_LOOP(e, a.rows * a.n) {
      const int64_t r = e / a.n, j = e % a.n;
      const float g = a.dy[r * a.ldy + j] * slope(a, a.x[r * a.ldx + j]);
      float* dx = a.dx + r * a.lddx + j;
      *dx = a.accumulate ? *dx + g : g;
    }
  }
}

// A block per column: thread t sums rows t, t + kThreads, ..., then block_sum's tree.
__global__ void __launch_bounds__(kThreads) column_sum_kernel(ColumnSumLaunch a) {
  __shared__ double red[kThreads];
  for (int64_t j = blockIdx.x; j < a.n; j += gridDim.x) {
    double s = 0;
    for (int64_t r = threadIdx.x; r < a.rows; r += kThreads) s += a.x[r * a.ldx + j];
    const float v = a.s * float(block_sum(s, red));
    if (threadIdx.x == 0) a.out[j] = a.accumulate ? a.out[j] + v : v;
  }
}

// Many rows: a block per (chunk of kColumnSumChunk rows, column) sums the chunk as above into
// partial[j chunks + c]; then a block per column sums its partials the same way.
__global__ void __launch_bounds__(kThreads)
    column_sum_chunks_kernel(ColumnSumLaunch a, int64_t chunks) {
  __shared__ double red[kThreads];
  for (int64_t e = blockIdx.x; e < chunks * a.n; e += gridDim.x) {
    const int64_t j = e / chunks, c = e % chunks;
    const int64_t r1 = (c + 1) * kColumnSumChunk < a.rows ? (c + 1) * kColumnSumChunk : a.rows;
    double s = 0;
    for (int64_t r = c * kColumnSumChunk + threadIdx.x; r < r1; r += kThreads)
      s += a.x[r * a.ldx + j];
    const double t = block_sum(s, red);
    if (threadIdx.x == 0) a.partial[e] = t;
  }
}

__global__ void __launch_bounds__(kThreads)
    column_sum_partials_kernel(ColumnSumLaunch a, int64_t chunks) {
  __shared__ double red[kThreads];
  for (int64_t j = blockIdx.x; j < a.n; j += gridDim.x) {
    double s = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) s += a.partial[j * chunks + c];
    const float v = a.s * float(block_sum(s, red));
    if (threadIdx.x == 0) a.out[j] = a.accumulate ? a.out[j] + v : v;
  }
}

__device__ float term_coef(const CombineTermLaunch& t, int64_t r, int64_t g) {
  if (!t.lane) return t.s;
  float c = t.s * t.lane[r * t.ldl + g * t.gl];
  if (t.add) c += t.add[r * t.lda + g * t.ga];
  if (t.offset != 0.0f) c = t.offset + c;
  return c;
}

// A lane group per (row, column group), `lanes` lanes (a power of two up to a warp): lane l
// takes the group's columns l, l + lanes, ... for every term; each coefficient's gradient is
// the lanes' f64 partial sums added in group_sum's tree.
__global__ void combine_backward_kernel(CombineBackwardLaunch a, int lanes) {
  const CombineLaunch& f = a.forward;
  const int64_t groups = (f.n + f.group - 1) / f.group;
  const LaneGroups lg(lanes);
  const int64_t n = f.rows * groups, lane = lg.lane;
  for (int64_t e = lg.first; lg.warp_has(e, n); e += lg.warps * lg.per_warp) {
    const bool on = e < n;
    const int64_t r = on ? e / groups : 0, g = on ? e % groups : 0, j0 = g * f.group;
    const int64_t j1 = j0 + f.group < f.n ? j0 + f.group : f.n;
    // The terms' loops unrolled to kCombineTerms (guarded), so c and dc stay in registers.
    float c[kCombineTerms];
    double dc[kCombineTerms];
    bool self = false;
#pragma unroll
    for (int k = 0; k < kCombineTerms; ++k) {
      c[k] = on && k < f.terms ? term_coef(f.term[k], r, g) : 0.0f;
      dc[k] = 0;
      self = self || (k < f.terms && !f.term[k].x);
    }
    float* dyb = a.dy_before ? a.dy_before + r * a.lddb : nullptr;
    const bool in_place = self && dyb == a.dy + r * a.ldy;
    for (int64_t j = j0 + lane; on && j < j1; j += lanes) {
      const float dy = a.dy[r * a.ldy + j];
      float self_grad = 0.0f;
#pragma unroll
      for (int k = 0; k < kCombineTerms; ++k) {
        if (k >= f.terms) break;
        const CombineTermLaunch& t = f.term[k];
        const float x = t.x ? t.x[r * t.ldx + j] : a.y_before[r * a.ldb + j];
        if (t.x) {
          if (a.grad[k].dx) a.grad[k].dx[r * a.grad[k].lddx + j] += c[k] * dy;
        } else {
          self_grad += c[k] * dy;
        }
        dc[k] += double(dy) * x;
      }
      if (self) dyb[j] = in_place ? self_grad : dyb[j] + self_grad;
    }
#pragma unroll
    for (int k = 0; k < kCombineTerms; ++k) {
      if (k >= f.terms) break;
      const double sum = group_sum(dc[k], lanes);
      if (on && lane == 0 && a.grad[k].dcoef) a.grad[k].dcoef[r * a.grad[k].ldc + g] += float(sum);
    }
  }
}

// A thread per (sorted entry, column): the thread of a row's first entry adds the row's terms in
// entry order to its table element; rows without entries are not touched (an n-gram table's
// 4M rows against a step's ~33k entries).
__global__ void scatter_rows_kernel(ScatterRowsLaunch a) {
  DEG_GRID_LOOP(e, a.entries * a.cols) {
    const int64_t q = e / a.cols, c = e % a.cols;
    const int32_t key = a.keys[a.order[q]];
    if (key < 0 || key >= a.rows || a.starts[key] != q) continue;
    float* t = a.dtable + int64_t(key) * a.cols + c;
    float acc = *t;
    for (int64_t p = q; p < a.starts[key + 1]; ++p) {
      const int64_t entry = a.order[p], i = entry >> a.entry_shift;
      const float dy = a.dy[i * a.ldy + c];
      if (a.signs) {
        acc += dy * a.sign_pool[int64_t(a.signs[entry]) * a.cols + c];
      } else {
        acc += (a.row_scale ? a.row_scale[i * a.ld_scale] : a.scale) * dy;
      }
    }
    *t = acc;
  }
}

__global__ void row_scale_grad_kernel(RowScaleGradLaunch a) {
  DEG_GRID_LOOP(i, a.n) {
    const int32_t id = a.ids[i];
    if (id < 0) continue;
    a.drow_scale[i * a.ld_drow] += float(dot_f64(a.dy + i * a.ldy, a.table + id * a.cols, a.cols));
  }
}

__global__ void lane_ids_kernel(const float* lane, int64_t ld, int64_t n, int32_t* ids) {
  DEG_GRID_LOOP(i, n) ids[i] = int32_t(lane[i * ld]);
}

__global__ void sigmoid_gates_dz_kernel(SigmoidGatesBackwardLaunch a) {
  const SigmoidGatesLaunch& f = a.forward;
  DEG_GRID_LOOP(r, f.rows) {
    for (int64_t h = 0; h < f.heads; ++h) {
      const float* w = f.w + h * f.ldw;
      float z = float(dot_f64(w, f.x + r * f.ldx, f.n));
      if (f.x2) z += float(dot_f64(w + f.n, f.x2 + r * f.ldx2, f.n));
      const float sg = sigmoid(z);
      const float d = a.dout[r * a.lddo + h] * f.s * sg * (1.0f - sg);
      a.dz[r * f.heads + h] = d;
      if (a.dx)
        for (int64_t j = 0; j < f.n; ++j) a.dx[r * a.lddx + j] += d * w[j];
      if (a.dx2)
        for (int64_t j = 0; j < f.n; ++j) a.dx2[r * a.lddx2 + j] += d * w[f.n + j];
    }
  }
}

// dw's partial sums: a thread per (block of kGateRowsPerPartial rows, head, weight), rows in
// order in f64.
__global__ void sigmoid_gates_dw_partial_kernel(SigmoidGatesBackwardLaunch a) {
  const SigmoidGatesLaunch& f = a.forward;
  const int64_t width = f.x2 ? 2 * f.n : f.n;
  const int64_t blocks = (f.rows + kGateRowsPerPartial - 1) / kGateRowsPerPartial;
  DEG_GRID_LOOP(e, blocks * f.heads * width) {
    const int64_t b = e / (f.heads * width), h = e / width % f.heads, j = e % width;
    const float* x = j < f.n ? f.x + j : f.x2 + (j - f.n);
    const int64_t ld = j < f.n ? f.ldx : f.ldx2;
    const int64_t r1 =
        (b + 1) * kGateRowsPerPartial < f.rows ? (b + 1) * kGateRowsPerPartial : f.rows;
    double s = 0;
    for (int64_t r = b * kGateRowsPerPartial; r < r1; ++r)
      s += double(a.dz[r * f.heads + h]) * x[r * ld];
    a.partial[e] = s;
  }
}

// dw += the partial sums of each weight, blocks in order.
__global__ void sigmoid_gates_dw_kernel(SigmoidGatesBackwardLaunch a) {
  const SigmoidGatesLaunch& f = a.forward;
  const int64_t width = f.x2 ? 2 * f.n : f.n;
  const int64_t blocks = (f.rows + kGateRowsPerPartial - 1) / kGateRowsPerPartial;
  DEG_GRID_LOOP(e, f.heads * width) {
    double s = 0;
    for (int64_t b = 0; b < blocks; ++b) s += a.partial[b * f.heads * width + e];
    a.dw[e / width * f.ldw + e % width] += float(s);
  }
}

// A warp per (token, head): lane l takes dims l, l + 32, ... of the three f64 dot products
// (meeting in group_sum's tree), then writes its own dims of dv and dy (dv first: dy may be
// dy_out).
__global__ void subtract_projection_backward_kernel(ProjectionBackwardLaunch a) {
  const ProjectionLaunch& f = a.forward;
  const int i = blockIdx.y;
  const int64_t n = f.rows.length[i] * f.heads, row0 = (f.rows.first + i) * f.rows.tokens;
  const LaneGroups lg(kWarp);
  const int64_t lane = lg.lane;
  for (int64_t e = lg.first; lg.warp_has(e, n); e += lg.warps * lg.per_warp) {
    const bool on = e < n;
    const int64_t tok = row0 + (on ? e / f.heads : 0), h = on ? e % f.heads : 0;
    const float* y = f.y + tok * f.ldy + h * f.hy;
    const float* v = f.v + tok * f.ldv + h * f.hv;
    const float* go = a.dy_out + tok * a.lddo + h * f.hy;
    double vv_s = 0, yv_s = 0, gv_s = 0;
    if (on)
      for (int64_t d = lane; d < f.dim; d += kWarp) {
        vv_s += double(v[d]) * double(v[d]);
        yv_s += double(y[d]) * double(v[d]);
        gv_s += double(go[d]) * double(v[d]);
      }
    const float vv_raw = float(group_sum(vv_s, kWarp));
    const float yv = float(group_sum(yv_s, kWarp));
    const float dcoef = -float(group_sum(gv_s, kWarp));
    if (!on) continue;
    const bool clamped = vv_raw <= f.eps;
    const float vv = clamped ? f.eps : vv_raw;
    const float t = tanhf(f.strength[tok * f.lds + h]);
    const float coef = t * yv / vv;
    if (a.dv) {
      float* dv = a.dv + tok * a.lddv + h * f.hv;
      const float ky = dcoef * t / vv;
      const float kv = clamped ? 0.0f : -2.0f * dcoef * t * yv / (vv * vv);
      for (int64_t d = lane; d < f.dim; d += kWarp) dv[d] += -coef * go[d] + ky * y[d] + kv * v[d];
    }
    if (a.dstrength && lane == 0) a.dstrength[tok * a.ldds + h] += dcoef * (1.0f - t * t) * yv / vv;
    if (a.dy) {
      float* dy = a.dy + tok * a.lddy + h * f.hy;
      const bool in_place = a.dy == a.dy_out;
      const float k = dcoef * t / vv;
      for (int64_t d = lane; d < f.dim; d += kWarp)
        dy[d] = (in_place ? 0.0f : dy[d]) + go[d] + k * v[d];
    }
  }
}

}  // namespace

cudaError_t launch_rms_norm_backward(const NormBackwardLaunch& a, cudaStream_t stream) {
  if (a.rows * a.heads == 0) return cudaSuccess;
  const unsigned grid = grid_for(a.rows * a.heads * kWarp);
  const int64_t per = (a.dim + kWarp - 1) / kWarp;  // dims a lane holds
  if (per <= 2) {
    rms_norm_backward_kernel<2><<<grid, kThreads, 0, stream>>>(a);
  } else if (per <= 4) {
    rms_norm_backward_kernel<4><<<grid, kThreads, 0, stream>>>(a);
  } else if (per <= 8) {
    rms_norm_backward_kernel<8><<<grid, kThreads, 0, stream>>>(a);
  } else if (per <= 16) {
    rms_norm_backward_kernel<16><<<grid, kThreads, 0, stream>>>(a);
  } else if (per <= 32) {
    rms_norm_backward_kernel<32><<<grid, kThreads, 0, stream>>>(a);
  } else {
    rms_norm_backward_kernel<0><<<grid, kThreads, 0, stream>>>(a);
  }
  return launched();
}

cudaError_t launch_activation_backward(const ActivationBackwardLaunch& a, cudaStream_t stream) {
  if (a.rows * a.n == 0) return cudaSuccess;
  if (by_float4(a.n, {a.x, a.dy, a.dx}, {a.ldx, a.ldy, a.lddx})) {
    activation_backward_kernel<true><<<grid_for(a.rows * a.n / 4), kThreads, 0, stream>>>(a);
  } else {
    activation_backward_kernel<false><<<grid_for(a.rows * a.n), kThreads, 0, stream>>>(a);
  }
  return launched();
}

cudaError_t launch_column_sum(const ColumnSumLaunch& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  if (column_sum_partials(a.rows, a.n) == 0) {
    column_sum_kernel<<<block_per_item(a.n), kThreads, 0, stream>>>(a);
    return launched();
  }
  const int64_t chunks = (a.rows + kColumnSumChunk - 1) / kColumnSumChunk;
  column_sum_chunks_kernel<<<block_per_item(chunks * a.n), kThreads, 0, stream>>>(a, chunks);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  column_sum_partials_kernel<<<block_per_item(a.n), kThreads, 0, stream>>>(a, chunks);
  return launched();
}

cudaError_t launch_combine_backward(const CombineBackwardLaunch& a, cudaStream_t stream) {
  const CombineLaunch& f = a.forward;
  if (f.rows * f.n == 0) return cudaSuccess;
  if (f.terms < 1 || f.terms > kCombineTerms || f.group < 1) return cudaErrorInvalidValue;
  int lanes = 1;  // lanes a column group: the power of two at or above its width, up to a warp
  while (lanes < kWarp && lanes < f.group) lanes *= 2;
  const int64_t groups = f.rows * ((f.n + f.group - 1) / f.group);
  combine_backward_kernel<<<grid_for(groups * lanes), kThreads, 0, stream>>>(a, lanes);
  return launched();
}

cudaError_t launch_scatter_rows(const ScatterRowsLaunch& a, cudaStream_t stream) {
  if (a.entries == 0 || a.rows == 0 || a.cols == 0) return cudaSuccess;
  scatter_rows_kernel<<<grid_for(a.entries * a.cols), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_row_scale_grad(const RowScaleGradLaunch& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  row_scale_grad_kernel<<<grid_for(a.n), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_lane_ids(const float* lane, int64_t ld, int64_t n, int32_t* ids,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  lane_ids_kernel<<<grid_for(n), kThreads, 0, stream>>>(lane, ld, n, ids);
  return launched();
}

cudaError_t launch_sigmoid_gates_backward(const SigmoidGatesBackwardLaunch& a,
                                          cudaStream_t stream) {
  const SigmoidGatesLaunch& f = a.forward;
  if (f.rows * f.heads == 0) return cudaSuccess;
  sigmoid_gates_dz_kernel<<<grid_for(f.rows), kThreads, 0, stream>>>(a);
  if (cudaError_t e = launched(); e != cudaSuccess || !a.dw) return e;
  const int64_t weights = f.heads * (f.x2 ? 2 * f.n : f.n);
  const int64_t blocks = (f.rows + kGateRowsPerPartial - 1) / kGateRowsPerPartial;
  sigmoid_gates_dw_partial_kernel<<<grid_for(blocks * weights), kThreads, 0, stream>>>(a);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  sigmoid_gates_dw_kernel<<<grid_for(weights), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_subtract_projection_backward(const ProjectionBackwardLaunch& a,
                                                cudaStream_t stream) {
  const Rows& r = a.forward.rows;
  int64_t most = 0;
  for (int i = 0; i < r.count; ++i) most = r.length[i] > most ? r.length[i] : most;
  if (most == 0 || a.forward.heads == 0) return cudaSuccess;
  subtract_projection_backward_kernel<<<
      dim3(grid_for(most * a.forward.heads * kWarp), unsigned(r.count)), kThreads, 0, stream>>>(a);
  return launched();
}

}  // namespace deg::cuda
