// LFM2 / LFM2.5 text backbone (HF `Lfm2ForCausalLM`, model type `lfm2`; also the text model of an
// `lfm2_vl` snapshot): its hyper-parameters as plain data, its tensor-name table, and the Family
// that runs it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"
#include "model/backbone.h"
#include "model/family_common.h"

namespace deg {

struct Lfm2Config {
  int64_t vocab = 0;              // V
  int64_t hidden = 0;             // C
  int64_t ffn = 0;                // I: the SwiGLU width HF builds (after block_auto_adjust_ff_dim)
  std::vector<LayerKind> layers;  // recurrent = gated short conv, attention = full attention
  int64_t heads = 0;              // Hq
  int64_t kv_heads = 0;           // Hkv
  int64_t head_dim = 0;           // D
  double rope_theta = 1e6;
  int64_t conv_kernel = 3;  // K (conv_L_cache)
  float eps = 1e-5f;
  bool tied = true;  // LM head = embedding

  // From config.json: the root (`lfm2`) or its text_config (`lfm2_vl`). Accepts the original
  // LFM2 keys too (block_ff_dim, theta, tie_embedding, full_attn_idxs). Throws deg::Error naming
  // the file and JSON pointer of a missing or unsupported setting.
  static Lfm2Config from_json(const JsonConfig& root);
  // Known sizes: "1.2b" (LFM2.5-1.2B).
  static Lfm2Config preset(const std::string& size);
};

// HF Lfm2MLP's width: intermediate_size, or when auto-adjusted int(2 I / 3), then (with a
// multiplier) int(multiplier * that) rounded up to a multiple of `multiple_of`.
int64_t lfm2_ffn_width(int64_t intermediate, bool auto_adjust, std::optional<double> multiplier,
                       int64_t multiple_of);

bool lfm2_handles(const std::string& model_type);

// Tensor names (relative to the text prefix, plus "lm_head.weight" when untied) with shapes: the
// table the loader checks, the random initialiser fills, and error messages quote.
std::vector<std::pair<std::string, Shape>> lfm2_tensor_table(const Lfm2Config& cfg);

// Weights by table name. Matrices stay views (mmap'd, f32 or bf16); norm weights and conv
// kernels are read into f32 copies. Throws deg::Error naming a missing tensor or a wrong shape.
// The family on `ops`' device (its weights are copied there when that is a GPU).
std::unique_ptr<Family> lfm2_family(const Lfm2Config& cfg, const TensorMap& weights,
                                    const Ops& ops = cpu_ops());

// Random weights for benchmarks and tests (matrices `dtype`, std 0.02; norm weights around 1).
TensorMap lfm2_random_weights(const Lfm2Config& cfg, DType dtype, uint64_t seed);

}  // namespace deg
