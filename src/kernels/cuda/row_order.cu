// Positions grouped by table row on the device (launch.h "row_order.cu"): what gather_order
// (kernels/cpu/backward.cc) builds on the host for a table's backward, without copying the ids
// to the host. A stable radix sort of (row, position) pairs by row (cub's, which keeps equal
// keys in input order) lists each row's positions in increasing order, as the host does, so the
// scatter sums every table row's terms in the same order whatever the launch.
#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/grid.cuh"

constexpr size_t kAlign = 256;

size_t aligned(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// Bits that hold every key in [0, rows] (rows: the key of positions left out).
int key_bits(int64_t rows) {
  int bits = 1;
  while ((int64_t(1) << bits) <= rows) ++bits;
  return bits;
}

size_t sort_bytes(int64_t n, int64_t rows) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n, 0, key_bits(rows));
  return bytes;
}

// Keys outside [0, rows) become rows (sorted last, past starts[rows]); values are positions.
__global__ void row_keys_kernel(const int32_t* keys, int64_t n, int64_t rows, int32_t* out,
                                int64_t* positions) {
  DEG_GRID_LOOP(i, n) {
    const int32_t k = keys[i];
    out[i] = k >= 0 && k < rows ? k : int32_t(rows);
    positions[i] = i;
  }
}

// starts[v] = the first sorted entry whose key is >= v, for v in [0, rows].
__global__ void row_starts_kernel(const int32_t* sorted, int64_t n, int64_t rows, int64_t* starts) {
  DEG_GRID_LOOP(v, rows + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted[mid] < v)
        lo = mid + 1;
      else
        hi = mid;
    }
    starts[v] = lo;
  }
}

}  // namespace

size_t row_order_bytes(int64_t n, int64_t rows) {
  return 2 * aligned(size_t(n) * sizeof(int32_t)) + aligned(size_t(n) * sizeof(int64_t)) +
         sort_bytes(n, rows);
}

cudaError_t launch_row_order(const int32_t* keys, int64_t n, int64_t rows, int64_t* order,
                             int64_t* starts, void* temp, size_t temp_bytes, cudaStream_t stream) {
  if (n < 0 || rows < 0 || rows >= INT32_MAX || n > INT32_MAX) return cudaErrorInvalidValue;
  auto* at = static_cast<unsigned char*>(temp);
  auto* clamped = reinterpret_cast<int32_t*>(at);
  at += aligned(size_t(n) * sizeof(int32_t));
  auto* sorted = reinterpret_cast<int32_t*>(at);
  at += aligned(size_t(n) * sizeof(int32_t));
  auto* positions = reinterpret_cast<int64_t*>(at);
  at += aligned(size_t(n) * sizeof(int64_t));
  if (temp_bytes < row_order_bytes(n, rows)) return cudaErrorInvalidValue;
  size_t sort_temp = temp_bytes - size_t(at - static_cast<unsigned char*>(temp));
  if (n > 0) {
    row_keys_kernel<<<grid_for(n), kThreads, 0, stream>>>(keys, n, rows, clamped, positions);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
    if (cudaError_t e = cub::DeviceRadixSort::SortPairs(at, sort_temp, clamped, sorted, positions,
                                                        order, n, 0, key_bits(rows), stream);
        e != cudaSuccess)
      return e;
  }
  row_starts_kernel<<<grid_for(rows + 1), kThreads, 0, stream>>>(sorted, n, rows, starts);
  return launched();
}

}  // namespace deg::cuda
