// What the backends share: call arenas on host or device memory, and the backend of a device.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace deg {

Arena::Block Arena::block(size_t floats) const {
  if (device_ == Device::cuda) {
    return {.data = std::shared_ptr<float>(static_cast<float*>(cuda_malloc(floats * sizeof(float))),
                                           [](float* p) { cuda_free(p); }),
            .size = floats};
  }
  return {.data = std::shared_ptr<float>(new float[floats], std::default_delete<float[]>()),
          .size = floats};
}

float* Arena::floats(int64_t n) {
  const size_t want = size_t(std::max<int64_t>(n, 1) + 63) / 64 * 64;  // 256-byte steps
  for (Block& b : blocks_) {
    if (b.size - b.used >= want) {
      float* p = b.data.get() + b.used;
      b.used += want;
      return p;
    }
  }
  size_t size = want;
  for (const Block& b : blocks_) size = std::max(size, 2 * b.size);
  blocks_.push_back(block(size));
  blocks_.back().used = want;
  return blocks_.back().data.get();
}

int32_t* Arena::ints(int64_t n) {
  static_assert(sizeof(int32_t) == sizeof(float) && alignof(int32_t) <= alignof(float));
  if (device_ == Device::cuda) return reinterpret_cast<int32_t*>(floats(n));  // device memory
  return new (floats(n)) int32_t[size_t(std::max<int64_t>(n, 1))];  // starts their lifetime
}

void Arena::reset() {
  // Several blocks mean the last use outgrew the first: keep one block of their total size, so
  // the next use of the same size takes no allocation.
  if (blocks_.size() > 1) {
    size_t total = 0;
    for (const Block& b : blocks_) total += b.size;
    blocks_.clear();
    blocks_.push_back(block(total));
  }
  for (Block& b : blocks_) b.used = 0;
}

Device pick_device(const std::string& name) {
  std::string d = name;
  if (d == "auto") {
    const std::string& env = env_config().device;
    d = !env.empty() ? env : (cuda_available() ? "cuda" : "cpu");
  }
  if (d == "cpu") return Device::cpu;
  if (d == "cuda") {
    if (!cuda_built()) {
      throw Error(ErrorKind::unsupported,
                  "device cuda: this deg was built without CUDA (nvcc was not found when it was "
                  "compiled); use --device cpu");
    }
    return Device::cuda;
  }
  throw Error(ErrorKind::invalid_argument,
              "the device must be cpu, cuda or auto (DEG_DEVICE: cpu or cuda), got \"" + d + "\"");
}

Tensor host_copy(const Tensor& t) {
  if (t.device() == Device::cpu) return t;
  DEG_CHECK(t.is_contiguous(), "host_copy: {} is not contiguous", t.describe());
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  ops_for(t.device()).to_host(h.raw_mutable(), t.raw(), t.nbytes());
  return h;
}

void Ops::no_training_op(const char* op) const {
  throw Error(ErrorKind::unsupported, fmt::format("the {} backend has no {} op", name(), op));
}

const Ops& ops_for(Device device) {
  return device == Device::cuda ? cuda_ops() : cpu_ops();
}

void logit_picks_row(const LogitPicksArgs& a, int64_t r) {
  const float* l = a.logits + r * a.ld;
  int64_t best = -1, second = -1;
  bool bad = false;
  for (int64_t i = 0; i < a.n; ++i) {
    if (!std::isfinite(l[i])) {
      bad = bad || !(l[i] < 0);  // NaN or +inf
      continue;
    }
    if (best < 0 || l[i] > l[best]) {
      second = best;
      best = i;
    } else if (second < 0 || l[i] > l[second]) {
      second = i;
    }
  }
  double mx = best < 0 ? 0.0 : double(l[best]), sum = 0;
  for (int64_t i = 0; i < a.n && best >= 0; ++i)
    if (std::isfinite(l[i])) sum += std::exp(double(l[i]) - mx);
  a.best[r] = int32_t(best);
  a.second[r] = int32_t(second);
  a.best_logit[r] = best < 0 ? 0.0f : l[best];
  a.second_logit[r] = second < 0 ? 0.0f : l[second];
  a.max[r] = mx;
  a.sum[r] = sum;
  a.bad[r] = bad ? 1 : 0;
}

int64_t softcap_cross_entropy_chunk(int64_t V) {
  const int64_t rows = (int64_t(16) << 20) / std::max<int64_t>(V, 1);  // 64 MiB of f32
  return rows >= 64 ? rows / 64 * 64 : std::max<int64_t>(rows, 1);
}

}  // namespace deg
