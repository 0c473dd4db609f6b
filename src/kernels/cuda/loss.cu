// The CUDA backend's softcap_cross_entropy kernel (launch.h): one chunk's rows of logits in, each
// row's loss out, and dz (the gradient of the mean loss with respect to the logits) written over
// the logits or as bf16 for the backward GEMMs. cuda/ops.cc runs the GEMMs around it.
//
// Batch invariance: a row is one block of kLossThreads threads; thread i takes columns i, i +
// kLossThreads, ... in order (f64 partial sums), then the block's sums combine in a fixed order
// (warp butterflies, then warps in order), so a row's loss depends on its own logits and V only.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

constexpr int kLossThreads = 512;
constexpr int kLossWarps = kLossThreads / 32;

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// The sum of v over the block in a fixed order; every thread gets it.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kLossWarps];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  double s = warp_sums[0];
  for (int w = 1; w < kLossWarps; ++w) s += warp_sums[w];
  return s;
}

// Row r of the chunk (blockIdx.x): u = sigmoid((z + b) / c), lse = a + log sum exp(a u - a)
// (the soft cap is below a, so a is a safe fixed maximum), the row's terms as the CPU backend
// takes them, its loss in f64, then dz in the CPU's expression order.
__global__ void softcap_loss_kernel(SoftcapLossLaunch a) {
  const int64_t r = blockIdx.x, t = a.first + r, V = a.vocab;
  float* z = a.z + r * V;
  double part = 0;
  for (int64_t v = threadIdx.x; v < V; v += kLossThreads) {
    const float u = sigmoid((z[v] + a.b) / a.c);
    part += double(expf(a.a * u - a.a));
  }
  const double lse = a.a + log(block_sum(part));
  __shared__ int32_t targets[kLossTerms];
  __shared__ float weights[kLossTerms];
  __shared__ int terms;
  __shared__ float weight_sum;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int k = 0; k < a.mtp && t + k < a.total; ++k) {
      const int32_t target = a.targets[t + k];
      if (target >= 0 && target < V) {
        targets[n] = target;
        weights[n++] = a.mtp_weights[k];
      }
    }
    if (a.prefix && a.prefix_weight != 0.0f && a.prefix[t] >= 0 && a.prefix[t] < V) {
      targets[n] = a.prefix[t];
      weights[n++] = a.prefix_weight;
    }
    double loss = 0, sum = 0;
    for (int i = 0; i < n; ++i) {
      const float u = sigmoid((z[targets[i]] + a.b) / a.c);
      loss += double(weights[i]) * (lse - double(a.a * u));
      sum += weights[i];
    }
    a.loss[t] = float(loss);
    terms = n;
    weight_sum = float(sum);
  }
  __syncthreads();  // the targets' logits are read before dz overwrites them
  if (!a.grad) return;
  const float inv_t = 1.0f / float(a.total);
  __nv_bfloat16* dz = a.dz_bf16 ? static_cast<__nv_bfloat16*>(a.dz_bf16) + r * V : nullptr;
  for (int64_t v = threadIdx.x; v < V; v += kLossThreads) {
    const float u = sigmoid((z[v] + a.b) / a.c);
    float g = weight_sum * expf(float(double(a.a * u) - lse));
    for (int i = 0; i < terms; ++i)
      if (targets[i] == v) g -= weights[i];
    g *= inv_t * a.a / a.c * u * (1.0f - u);
    if (dz) {
      dz[v] = __float2bfloat16_rn(g);
    } else {
      z[v] = g;
    }
  }
}

}  // namespace

cudaError_t launch_softcap_loss(const SoftcapLossLaunch& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  softcap_loss_kernel<<<unsigned(a.rows), kLossThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace deg::cuda
