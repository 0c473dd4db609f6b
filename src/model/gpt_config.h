// The `gpt` family's configuration as plain data: the modded-nanogpt "track 1 short" GPT of seed
// 003 with its layer topology as lists (which layers attend, which run only an MLP, where the
// long windows, paired heads, value embeddings, gates and injections are) instead of constants.
// Presets: `speedrun-124m` (the seed's 11 layers, d 768, 6 heads of 128), `speedrun-124m-1gpu`
// (the same with a hashed n-gram table that fits one GPU), `small` (our default trunk), `tiny`
// (tests). Read/written as JSON (config.json of a `gpt` checkpoint, family "gpt").
// docs/training.md lists every component and where its formula comes from.
//
// Layer index conventions follow the seed: cache:i is the residual stream after layer i for
// i >= 1 and the stream entering layer 0 for i = 0; the last layer is the MUDD layer.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/json.h"

namespace deg {

// One source of the post-loop MUDD mix.
struct GptMixSource {
  enum class Kind : uint8_t { cache, value_embed, last_mlp_in, late_attn_in };
  Kind kind = Kind::cache;
  int layer = 0;  // cache: the cache index; value_embed: the layer whose plane it is
};

struct GptConfig {
  std::string name = "custom";

  // ---- sizes (C model dim, V vocab, H heads, F MLP hidden) ----
  int64_t vocab_size = 0;       // V
  int64_t model_dim = 0;        // C = num_heads * head_dim
  int num_layers = 0;           // L
  int num_heads = 0;            // H (even: paired heads pair head h with h + H/2)
  int64_t head_dim = 0;         // wide q/k and full v width
  int64_t narrow_head_dim = 0;  // narrow q/k width and the halved v width
  int64_t rotary_dim = 0;       // leading rotating dims of every q/k head; the rest are fixed
  int64_t mlp_hidden = 0;       // F
  int64_t max_seq_len = 0;      // rotary table length (tokens)

  // ---- topology ----
  std::vector<int> attn_layers;         // layers with an attention sublayer
  std::vector<int> no_mlp_layers;       // layers without an MLP (they keep the residual scaling)
  int skip_layer = -1;                  // this layer adds a gated cache[skip_source] instead of
  int skip_source = -1;                 //   attention (-1: none)
  std::vector<int> long_window_layers;  // long window + partial key offset
  std::vector<int> wide_qk_layers;      // q/k at head_dim; others at narrow_head_dim
  std::vector<int> half_v_layers;       // v/o at narrow_head_dim; others at head_dim
  std::vector<int> paired_head_layers;  // paired-head attention
  std::vector<int> attn_gate_layers;    // per-head output gates from the MUDD gates
  std::vector<int> xsa_layers;          // gated XSA, strength from the pre MUDD gate
  std::vector<int> value_embed_layers;  // one value-embedding plane each, added to V
  std::vector<int> value_embed_gate_layers;  // ... gated by a learned per-head gate
  int value_embed_gate_channels = 6;         // leading channels the gate reads
  std::vector<int> x0_inject_layers;         // x0 added back, gated per token
  std::vector<int> ngram_inject_layers;      // the n-gram embedding added back (0: before the loop)
  int post_gate_layer = 4;                   // the post MUDD gate is computed entering this layer
  int parallel_mlp_layer = -1;               // a second MLP in parallel on this layer (-1: none)
  int late_layer = -1;  // attention after this layer reads norm(cache[late_layer]) (-1: never)

  // ---- MUDD dense connections and gates ----
  int64_t mudd_dim = 64;
  float mudd_scale = 0.1f;  // constant output scale (biases are stored divided by it)
  int mudd_groups = 12;     // channel groups of the post-loop mix
  std::vector<GptMixSource> post_mix_sources;
  std::vector<float> post_mix_bias_init;  // effective initial coefficient per source
  int64_t mudd_gate_dim = 64;
  float mudd_gate_scale_init = 0.1f;  // a learned scalar

  // ---- hashed n-gram embedding ----
  int64_t ngram_vocab = 0;       // table rows: [0, n/2) bigram channel, [n/2, n) trigram
  int64_t ngram_dim = 0;         // added to the leading ngram_dim channels
  int64_t ngram_sign_rows = 0;   // +-1 sign pool rows (a power of two)
  uint64_t ngram_sign_seed = 0;  // the pool is drawn from this seed and saved with the weights
  std::array<int32_t, 2> bigram_row_muls{36313, 27191};           // x[t], x[t-1]
  std::array<int32_t, 3> trigram_row_muls{17351, 60961, 45259};   // x[t], x[t-1], x[t-2]
  std::array<int32_t, 2> bigram_sign_muls{48271, 30011};          // x[t], x[t-1]
  std::array<int32_t, 3> trigram_sign_muls{58699, 39779, 26801};  // x[t], x[t-1], x[t-2]

  // ---- embeddings, attention, head ----
  int smear_channels = 12;
  float narrow_attn_scale = 0.13f;  // softmax scale of narrow-q/k layers at the start
  float wide_attn_scale = 0.085f;   // ... of wide-q/k layers
  int64_t window_short = 128;       // sliding windows (tokens) the trainer starts with
  int64_t window_long = 384;
  float softcap_a = 23.0f;  // logits = a * sigmoid((z + b) / c)
  float softcap_b = 5.0f;
  float softcap_c = 7.5f;
  float norm_eps = 1.1920928955078125e-7f;  // F.rms_norm's fp32 eps
  float lm_head_init_std = 0.005f;
  float value_embed_init_std = 0.01f;

  // ---- derived helpers ----
  bool has(const std::vector<int>& layers, int layer) const;
  bool has_attn(int layer) const { return has(attn_layers, layer); }
  bool has_mlp(int layer) const { return !has(no_mlp_layers, layer); }
  int mudd_layer() const { return num_layers - 1; }
  int64_t qk_dim(int layer) const {
    return has(wide_qk_layers, layer) ? head_dim : narrow_head_dim;
  }
  int64_t v_dim(int layer) const { return has(half_v_layers, layer) ? narrow_head_dim : head_dim; }
  bool paired(int layer) const { return has(paired_head_layers, layer); }
  bool long_window(int layer) const { return has(long_window_layers, layer); }
  int value_embed_index(int layer) const;       // plane of `layer`, -1 when none
  int value_embed_gate_index(int layer) const;  // gate row of `layer`, -1 when none
  int64_t mudd_coefs() const;                   // rows of mudd_w2 / mudd_b2 (>= 14)

  // MUDD gate lanes: where each layer's lanes sit in the pre (id 0) or post (id 1) gate output.
  struct GateLanes {
    int pre_count = 0, post_count = 0;
    std::vector<int> xsa, attn_gate, x0, ngram;  // per layer: lane start, -1 when none
    std::vector<int> gate_id;                    // per layer: 0 pre, 1 post
    int skip = -1;                               // post-gate lane of the skip gate
  };
  GateLanes gate_lanes() const;
  int64_t mudd_gate_coefs() const;  // rows of mudd_gate_w2 / mudd_gate_b2

  // Throws deg::Error (invalid_argument, with the JSON pointer of the field) when inconsistent.
  void validate() const;
  int64_t parameter_count() const;  // every trained parameter, embeddings included
  // The parameters that multiply activations: every trained one but the lookup tables (embed,
  // value_embeds, ngram_table); lm_head counts. The N of a step's model FLOPs, 6 N a token.
  int64_t matmul_parameter_count() const;
};

// Model FLOPs of a step's attention: 3 x the forward's 2 (dq + dv) multiply-adds per visible
// (query head, key) pair of each attention layer, counted over the batch's real mask (a key of
// the query's window inside its segment, itself included; `seg_start` [T] each token's segment
// start; a paired-head layer runs half the heads over 2 T positions, segment starts doubled).
// With 6 N a token, the count an MFU divides by (docs/training.md; the reference's the same).
int64_t gpt_attention_flops(const GptConfig& cfg, const std::vector<int32_t>& seg_start);

// "speedrun-124m", "speedrun-124m-1gpu", "small", "compact", "tiny"; throws deg::Error naming the
// known presets otherwise.
GptConfig gpt_preset(const std::string& name);
std::vector<std::string> gpt_preset_names();

Json gpt_config_to_json(const GptConfig& config);  // includes "family": "gpt"
GptConfig gpt_config_from_json(const Json& json, const std::string& what);
// A preset name, or a path to a JSON file (a config.json or a bare config).
GptConfig gpt_config_resolve(const std::string& preset_or_path);
void gpt_config_save(const GptConfig& config, const std::filesystem::path& path);

}  // namespace deg
