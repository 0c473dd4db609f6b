// The launch shape the elementwise-style kernels share (mixing.cu, backward.cu, optimizer.cu):
// 256-thread blocks, a capped grid, and a grid-stride loop over the rest; a fixed-tree block
// sum (backward.cu, optimizer.cu, attention_f64_backward.cu); lane groups with their butterfly
// sums (backward.cu, mixing.cu). Internal to those .cu files: each
// includes it inside its own anonymous namespace, after kernels/cuda/launch.h (which brings
// <cstdint> and the CUDA runtime).
#pragma once

constexpr int kThreads = 256;

// Blocks for n threads' worth of work, capped (the kernels loop over the rest).
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// A loop over [0, n) spread over the whole grid.
#define DEG_GRID_LOOP(i, n)                                                 \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__device__ inline float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// f64-accumulated dot product.
__device__ inline double dot_f64(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// The sum of x over the block by a fixed tree (blockDim.x a power of two, `red` a shared array of
// blockDim.x): every thread gets the same bits, and `red` may be reused at once.
__device__ inline double block_sum(double x, double* red) {
  const int tid = int(threadIdx.x);
  red[tid] = x;
  __syncthreads();
  for (int s = int(blockDim.x) / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    __syncthreads();
  }
  const double r = red[0];
  __syncthreads();
  return r;
}

// Blocks for one block per item, capped (the kernels loop over the rest).
inline unsigned block_per_item(int64_t n) {
  return unsigned(n < 65535 ? n : 65535);
}

constexpr int kWarp = 32;

// The sum of a lane group's values (groups of `lanes` consecutive lanes, a power of two up to
// 32): a fixed butterfly, so every lane of the group gets the same bits.
__device__ double group_sum(double v, int lanes) {
  for (int o = lanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Lane groups over a grid-stride loop of n items, `lanes` lanes (a power of two up to a warp)
// an item: whole warps go round the loop together, so every lane runs group_sum's shuffles; a
// lane whose item is past n (`on` false) takes part with zeros.
struct LaneGroups {
  int64_t per_warp, warps, first;
  int lanes, lane;
  __device__ explicit LaneGroups(int lanes_)
      : per_warp(kWarp / lanes_),
        warps(int64_t(gridDim.x) * blockDim.x / kWarp),
        first((int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp * per_warp +
              int64_t(threadIdx.x % kWarp) / lanes_),
        lanes(lanes_),
        lane(int(threadIdx.x) % lanes_) {}
  // Whether this round's items of the warp (`item` the lane's) start before n: the loop's
  // condition, the same in every lane of the warp.
  __device__ bool warp_has(int64_t item, int64_t n) const {
    return item - int64_t(threadIdx.x % kWarp) / lanes < n;
  }
};

// Whether rows of n floats at strides ld... starting at the pointers can be read as float4s.
inline bool by_float4(int64_t n, std::initializer_list<const void*> ptrs,
                      std::initializer_list<int64_t> lds) {
  bool ok = n % 4 == 0;
  for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  for (int64_t ld : lds) ok = ok && ld % 4 == 0;
  return ok;
}

inline cudaError_t launched() {
  return cudaGetLastError();
}
