// Qwen3.5 text backbone (HF `Qwen3_5ForCausalLM`, model types `qwen3_5_text` and `qwen3_5`): its
// hyper-parameters as plain data, its tensor-name table, and the Family that runs it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"
#include "model/backbone.h"
#include "model/family_common.h"

namespace deg {

struct Qwen35Config {
  int64_t vocab = 0;         // V
  int64_t hidden = 0;        // C
  int64_t intermediate = 0;  // MLP width
  std::vector<LayerKind> layers;
  // gated full attention
  int64_t heads = 0;     // Hq
  int64_t kv_heads = 0;  // Hkv
  int64_t head_dim = 0;  // D
  double rope_theta = 10000.0;
  double partial_rotary = 0.25;
  // Gated DeltaNet
  int64_t lin_k_heads = 0;  // Hk
  int64_t lin_v_heads = 0;  // Hv (a multiple of Hk)
  int64_t lin_k_dim = 0;    // Dk
  int64_t lin_v_dim = 0;    // Dv
  int64_t conv_kernel = 4;  // K
  float eps = 1e-6f;
  bool tied = false;  // LM head = embedding

  int64_t conv_channels() const { return 2 * lin_k_heads * lin_k_dim + lin_v_heads * lin_v_dim; }

  // From config.json: the root (`qwen3_5_text`) or its text_config (`qwen3_5`). Throws deg::Error
  // naming the file and JSON pointer of a missing or unsupported setting.
  static Qwen35Config from_json(const JsonConfig& root);
  // Known sizes: "0.8b" (Qwen3.5-0.8B).
  static Qwen35Config preset(const std::string& size);
};

bool qwen35_handles(const std::string& model_type);

// Tensor names (relative to the text prefix, plus "lm_head.weight" when untied) with shapes: the
// table the loader checks, the random initialiser fills, and error messages quote.
std::vector<std::pair<std::string, Shape>> qwen35_tensor_table(const Qwen35Config& cfg);

// Weights by table name. Big matrices stay views (mmap'd, f32 or bf16); small vectors are read
// into f32 copies. Throws deg::Error naming a missing tensor or a wrong shape.
// The family on `ops`' device (its weights are copied there when that is a GPU).
std::unique_ptr<Family> qwen35_family(const Qwen35Config& cfg, const TensorMap& weights,
                                      const Ops& ops = cpu_ops());

// Random weights for benchmarks (every matrix `dtype`, N(0, 0.02); norms around their identity).
TensorMap qwen35_random_weights(const Qwen35Config& cfg, DType dtype, uint64_t seed);

}  // namespace deg
