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

namespace {

// Rounds y[r ld + h hs + i] (r < rows, h < heads, i < dim) into yb at the same offsets.
void round_into(const float* y, bf16* yb, int64_t rows, int64_t ld, int64_t heads, int64_t hs,
                int64_t dim) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < dim; ++i) {
        const int64_t o = r * ld + h * hs + i;
        yb[o] = f32_to_bf16(y[o]);
      }
}

// Elements from the first to one past the last of rows x heads vectors of dim at (ld, hs).
size_t extent(int64_t rows, int64_t ld, int64_t heads, int64_t hs, int64_t dim) {
  return rows == 0 ? 0 : size_t((rows - 1) * ld + (heads - 1) * hs + dim);
}

}  // namespace

void rms_norm_via_f32(const NormArgs& a, const std::function<void(const NormArgs&)>& run) {
  const int64_t hy = a.hy ? a.hy : a.dim;
  std::vector<float> y(extent(a.rows, a.ldy, a.heads, hy, a.dim));
  NormArgs f = a;
  f.y = y.data();
  f.yb = nullptr;
  run(f);
  round_into(y.data(), a.yb, a.rows, a.ldy, a.heads, hy, a.dim);
}

void glu_via_f32(const GluArgs& a, const std::function<void(const GluArgs&)>& run) {
  std::vector<float> out(extent(a.rows, a.ldo, 1, 0, a.n));
  if (!a.up) {  // the gate scales out: start from out's values
    for (int64_t r = 0; r < a.rows; ++r)
      std::copy_n(a.out + r * a.ldo, a.n, out.data() + r * a.ldo);
  }
  GluArgs f = a;
  f.out = out.data();
  f.outb = nullptr;
  run(f);
  round_into(out.data(), a.outb, a.rows, a.ldo, 1, 0, a.n);
}

void check_bf16_rows(const GemmArgs& a) {
  DEG_CHECK(a.precision == GemmPrecision::bf16, "gemm: bf16 rows (xb) need bf16 dot products");
  for (const GemmOutput& o : a.outputs)
    DEG_CHECK(o.w->dtype() == DType::bf16, "gemm: bf16 rows (xb) need bf16 weights, not {}",
              dtype_name(o.w->dtype()));
}

int64_t scaled_heads(const L2NormArgs& a) {
  DEG_CHECK(a.unscaled_heads >= 0 && a.unscaled_heads <= a.heads,
            "l2_norm: {} unscaled of {} heads", a.unscaled_heads, a.heads);
  return a.heads - a.unscaled_heads;
}

void gemm_via_f32(const GemmArgs& a, const std::function<void(const GemmArgs&)>& run) {
  check_bf16_rows(a);
  std::vector<float> x(size_t(a.m * a.k));
  for (int64_t m = 0; m < a.m; ++m)
    for (int64_t k = 0; k < a.k; ++k) x[size_t(m * a.k + k)] = bf16_to_f32(a.xb[m * a.ldx + k]);
  GemmArgs f = a;
  f.x = x.data();
  f.xb = nullptr;
  f.ldx = a.k;
  run(f);
}

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

double cuda_bf16_peak_flops() {
  const std::vector<CudaDeviceInfo> d = cuda_devices();
  if (d.empty()) return 0;
  const std::string& n = d.front().name;
  return n.find("H100") != std::string::npos || n.find("H200") != std::string::npos ? 989.5e12 : 0;
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
