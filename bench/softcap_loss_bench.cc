// softcap_cross_entropy's speed on a backend against its GEMMs: the op forward (loss only) and
// forward + backward (dxn, dW) over T rows of an lm_head [V, C] in bf16 with bf16 products,
// beside the op's own logits GEMM (ops.gemm over the same chunks of rows). The three GEMMs of
// forward + backward do the same FLOPs each, so 3x the logits GEMM is the GEMM time the fused
// op is measured against. Random inputs; each figure the median of `--repeats` runs after a
// warm-up. docs/ops.md has the figures. Not a test.
//
// usage: softcap_loss_bench [--device cuda|cpu] [--rows T] [--dim C] [--vocab V] [--repeats N]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace {

using deg::DType;
using deg::Tensor;

double median_ms(const deg::Ops& ops, int repeats, const std::function<void()>& run) {
  run();  // warm-up: algorithms chosen, scratch grown
  ops.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    ops.synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Uniform values in [-scale, scale) from a fixed xorshift stream.
std::vector<float> uniform(int64_t n, float scale, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = (float(s >> 40) / float(1 << 24) * 2.0f - 1.0f) * scale;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cuda";
  int64_t T = 65536, C = 768, V = 50304;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device") {
      device = v;
    } else if (k == "--rows") {
      T = std::stoll(v);
    } else if (k == "--dim") {
      C = std::stoll(v);
    } else if (k == "--vocab") {
      V = std::stoll(v);
    } else if (k == "--repeats") {
      repeats = std::max(1, std::stoi(v));
    } else {
      fmt::print(stderr, "unknown option {}; see the usage line in bench/softcap_loss_bench.cc\n",
                 k);
      return 2;
    }
  }
  if (device != "cuda" && device != "cpu") {
    fmt::print(stderr, "--device must be cuda or cpu, not {}\n", device);
    return 2;
  }
  const deg::Ops& ops = deg::ops_for(device == "cuda" ? deg::Device::cuda : deg::Device::cpu);
  const Tensor xn = ops.upload(Tensor::from_vector(uniform(T * C, 1.7f, 1), {T, C}));
  const Tensor w = ops.upload(Tensor::from_vector(uniform(V * C, 0.1f, 2), {V, C}).to(DType::bf16));
  std::vector<int32_t> host_targets(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) host_targets[size_t(t)] = int32_t((t * 7919) % V);
  const Tensor targets = ops.upload(Tensor::from_vector(host_targets, {T}));
  const Tensor loss = ops.alloc({T}, DType::f32), dxn = ops.alloc({T, C}, DType::f32),
               dw = ops.alloc({V, C}, DType::f32);
  const int64_t R = std::min(T, deg::softcap_cross_entropy_chunk(V));
  const Tensor logits = ops.alloc({R, V}, DType::f32);

  deg::SoftcapCrossEntropyArgs a{.xn = xn.data<float>(),
                                 .ldx = C,
                                 .w = &w,
                                 .targets = targets.data<int32_t>(),
                                 .rows = T,
                                 .mtp = 3,
                                 .loss = loss.mutable_data<float>(),
                                 .lddx = C,
                                 .bf16 = true};
  a.mtp_weights = {1.0f, 0.5f, 0.25f};
  const double flop = 2.0 * double(T) * double(C) * double(V);
  fmt::print(
      "softcap_cross_entropy on {}: T={} C={} V={} (bf16 W, bf16 set, {} rows a chunk, "
      "median of {})\n",
      ops.name(), T, C, V, R, repeats);
  deg::SoftcapCrossEntropyArgs g = a;
  g.dxn = dxn.mutable_data<float>();
  g.dw = dw.mutable_data<float>();
  auto logits_gemm = [&] {
    for (int64_t r0 = 0; r0 < T; r0 += R) {
      const deg::GemmOutput o{.w = &w, .y = logits.mutable_data<float>(), .ldy = V};
      ops.gemm({.x = xn.data<float>() + r0 * C,
                .m = std::min(R, T - r0),
                .k = C,
                .ldx = C,
                .outputs = {&o, 1},
                .precision = deg::GemmPrecision::bf16});
    }
  };
  // Pinned algorithms (what the op runs), then cuBLASLt's own choice per shape (workspace,
  // split-K): the GEMMs at their best.
  for (bool heuristic : {false, true}) {
    if (device != "cuda" && heuristic) break;
    if (device == "cuda") deg::cuda_gemm_heuristic(heuristic);
    const char* how = heuristic ? "cuBLASLt's choice" : "pinned";
    try {
      const double forward = median_ms(ops, repeats, [&] { ops.softcap_cross_entropy(a); });
      const double both = median_ms(ops, repeats, [&] { ops.softcap_cross_entropy(g); });
      fmt::print("  {:18} forward (loss)        {:9.2f} ms\n", how, forward);
      fmt::print("  {:18} forward + backward    {:9.2f} ms  ({:.1f} TFLOP/s over its 3 GEMMs)\n",
                 how, both, 3 * flop / both * 1e-9);
      const double gemm = median_ms(ops, repeats, logits_gemm);
      fmt::print("  {:18} logits GEMM (ops.gemm) {:8.2f} ms  ({:.1f} TFLOP/s)\n", how, gemm,
                 flop / gemm * 1e-9);
      fmt::print("  {:18} ratio forward / GEMM {:.2f}, forward + backward / 3 GEMMs {:.2f}\n", how,
                 forward / gemm, both / (3 * gemm));
    } catch (const deg::Error& e) {
      fmt::print("  {:18} failed: {}\n", how, e.what());
    }
  }
  return 0;
}
