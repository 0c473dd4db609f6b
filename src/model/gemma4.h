// Gemma 4 text backbone (HF `Gemma4ForCausalLM`, model types `gemma4_text` and the multimodal
// `gemma4` with text_config): its hyper-parameters as plain data, its tensor-name table, and
// the Family that runs it. Vision / audio towers are not here (they are read as soft tokens).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"
#include "model/backbone.h"

namespace deg {

// One decoder layer's shape.
struct Gemma4Layer {
  bool sliding = true;       // sliding-window layer (else global, full attention)
  int64_t heads = 0;         // Hq
  int64_t kv_heads = 0;      // Hkv
  int64_t head_dim = 0;      // D (global layers: global_head_dim)
  int64_t intermediate = 0;  // MLP width (twice the base on shared layers with the double-wide MLP)
  int kv_source = -1;        // K/V-sharing layers: the earlier layer whose K/V they read
};

// Rotary embedding of one layer kind. `proportional` (global layers): the whole head dim pairs
// i with i + D/2, and only the first floor(partial * D / 2) frequencies 1/theta^(2i/D) turn (the
// rest are 0: those dims pass through); otherwise HF's default: every dim of the head turns.
struct Gemma4Rope {
  bool proportional = false;
  double theta = 10000.0;
  double partial = 1.0;  // proportional only
  double factor = 1.0;   // frequencies divided by it (proportional only)
};

struct Gemma4Config {
  int64_t vocab = 0;         // V
  int64_t hidden = 0;        // C
  int64_t intermediate = 0;  // base MLP width
  std::vector<Gemma4Layer> layers;
  int64_t window = 0;  // W: a sliding layer's query sees its last W positions (itself included)
  Gemma4Rope sliding_rope;
  Gemma4Rope global_rope{.proportional = true, .theta = 1e6, .partial = 0.25};
  int64_t ple_dim = 0;    // P: per-layer embedding width (0: no per-layer embeddings)
  int64_t ple_vocab = 0;  // Vp: rows of the per-layer embedding table
  float softcap = 0;      // final logit soft-cap (0: none)
  float eps = 1e-6f;
  bool tied = true;  // LM head = embedding
  // Media read as soft tokens (HF Gemma4Config): the text pad id stands at their positions (the
  // per-layer embedding reads it there); image and audio spans are wrapped in begin/end ids and
  // marked by a placeholder id. A kind is listed only when the snapshot configures its encoder
  // and its ids lie in the vocabulary (images not with use_bidirectional_attention "vision").
  int32_t pad_id = 0;
  std::vector<BackboneSpec::Media> media;

  // From config.json: the root (`gemma4_text`) or its text_config (`gemma4`). Global layers'
  // head dim comes from per_layer_config (transformers >= 5.15) or global_head_dim. Throws
  // deg::Error naming the file and JSON pointer of a missing or unsupported setting.
  static Gemma4Config from_json(const JsonConfig& root);
  // A real model's dimensions, for benchmarks with random weights: "e2b" (Gemma 4 E2B's text
  // decoder). Throws deg::Error (invalid_argument) for another size.
  static Gemma4Config preset(const std::string& size);
};

// The config.json (text decoder, `gemma4_text`) of a preset size, as Gemma4Config::preset reads
// it: for benchmarks that write a checkpoint. Throws deg::Error (invalid_argument) for another
// size.
Json gemma4_preset_json(const std::string& size);

bool gemma4_handles(const std::string& model_type);

// Tensor names (relative to the text prefix, plus "lm_head.weight" when untied) with shapes: the
// table the loader checks, the random initialiser fills, and error messages quote.
std::vector<std::pair<std::string, Shape>> gemma4_tensor_table(const Gemma4Config& cfg);

// Weights by table name. Big matrices (the per-layer embedding table included) stay views
// (mmap'd, f32 or bf16); small vectors are read into f32 copies. Throws deg::Error naming a
// missing tensor or a wrong shape.
using TensorMap = std::map<std::string, Tensor>;
// The family on `ops`' device (its weights are copied there when that is a GPU).
std::unique_ptr<Family> gemma4_family(const Gemma4Config& cfg, const TensorMap& weights,
                                      const Ops& ops = cpu_ops());

// Random weights for tests and benchmarks (every matrix `dtype`, std 0.02; norm weights and
// layer scalars around 1).
TensorMap gemma4_random_weights(const Gemma4Config& cfg, DType dtype, uint64_t seed);

}  // namespace deg
