// The gpt family's trained tensors as f32 host arrays, by name (the family's tensor-name table),
// with the seed's initialisation, the n-gram sign pool and the rotary state (YaRN frequencies
// and softmax scales, which the window schedule changes). Saved to / loaded from safetensors.
//
// Names and shapes (C model dim, V vocab, H heads, F MLP hidden, M MUDD hidden, G groups):
//   embed [V, C], lm_head [V, C], value_embeds [n_ve, V, C], ngram_table [NV, Dn],
//   smear_gate [1, smear_channels], ve_gate [n_ve_gate, H, 2 ve_gate_channels],
//   scalars [2L + 2] (sa lambdas per layer, smear lambda, skip lambda), resid_lambdas [L, 2],
//   post_lambdas [L, 2], layers.{i}.attn.{qk [2 H Dq, C], v [H Dv, C], o [C, H Dv]},
//   layers.{i}.mlp.{fc, proj} [F, C] (y = relu(x fc^T)^2 proj), parallel_mlp.{fc, proj},
//   mudd_w1 [2, M, C], mudd_w2 [2, n_mu, M], mudd_b2 [2, n_mu], mudd_w2g [n_mu, G, M],
//   mudd_gate_w1 [2, Mg, C], mudd_gate_w2 [2, n_g, Mg], mudd_gate_b2 [2, n_g],
//   mudd_gate_scale [1]. Buffers: ngram_sign_pool [P, Dn], rotary.{narrow,wide}.freq [Dq],
//   rotary.{narrow,wide}.attn_scale [1].
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/gpt_config.h"

namespace deg::train {

struct ParamTensor {
  std::string name;
  Shape shape;
  std::vector<float> data;
  int64_t numel() const { return int64_t(data.size()); }
};

// A deterministic generator (splitmix64; Box-Muller normals) so inits match across platforms.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  double uniform();  // [0, 1)
  double normal();

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// Rotary state of one table: frequencies per q/k dim and the softmax scale (YaRN grows both).
struct RotaryState {
  std::vector<float> freq;  // [Dq]
  float attn_scale = 1.0f;
  // YaRN rescale when the window grows (attention.py Yarn.apply, alpha 1, beta 32).
  void apply_yarn(int64_t old_window, int64_t new_window);
};
RotaryState rotary_initial(int64_t qk_dim, int64_t rotary_dim, float attn_scale);

class GptParams {
 public:
  // All trained tensors at their shapes, zero; buffers at their initial values.
  static GptParams create(const GptConfig& config);
  // The seed's initialisation (init_attn, init_mlp, init_misc, init_mudd, init_mudd_gate).
  void init(uint64_t seed);

  const GptConfig& config() const { return config_; }
  std::vector<ParamTensor>& tensors() { return tensors_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  ParamTensor& get(const std::string& name);
  const ParamTensor& get(const std::string& name) const;
  float* data(const std::string& name) { return get(name).data.data(); }
  const float* data(const std::string& name) const { return get(name).data.data(); }
  int64_t parameter_count() const;

  std::vector<float> sign_pool;  // [P, Dn], entries +-1
  RotaryState rotary_narrow, rotary_wide;

  // Zero-valued tensors of the same names and shapes (gradients, optimizer state).
  std::vector<ParamTensor> zeros_like() const;

  // weights safetensors: every tensor and buffer, f32, each name after `prefix` (a deg
  // checkpoint's backbone.safetensors keeps them under "model.").
  void save(const std::filesystem::path& path, const std::string& prefix = "") const;
  // Loads tensors by name into a model created from its config; throws deg::Error naming a
  // missing or mis-shaped tensor.
  static GptParams load(const GptConfig& config, const std::filesystem::path& path,
                        const std::string& prefix = "");

 private:
  void add(const std::string& name, Shape shape);
  GptConfig config_;
  std::vector<ParamTensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace deg::train
