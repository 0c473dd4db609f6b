#include "tiny_model.h"

#include "io/json.h"
#include "io/safetensors.h"
#include "model/gemma4.h"
#include "model/gpt_config.h"
#include "model/lfm2.h"
#include "model/qwen35.h"
#include "test_util.h"
#include "text/bpe_train.h"
#include "text/byte_level.h"
#include "train/gpt_params.h"

namespace deg::testing {

namespace {

Json tiny_config() {
  return {{"architectures", {"Qwen3_5ForCausalLM"}},
          {"model_type", "qwen3_5_text"},
          {"vocab_size", 259},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"layer_types", {"linear_attention", "full_attention"}},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", 16},
          {"linear_num_key_heads", 2},
          {"linear_num_value_heads", 2},
          {"linear_key_head_dim", 8},
          {"linear_value_head_dim", 8},
          {"linear_conv_kernel_dim", 4},
          {"rms_norm_eps", 1e-6},
          {"rope_parameters",
           {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}}},
          {"tie_word_embeddings", true}};
}

}  // namespace

std::string tiny_tokenizer_json(const std::vector<std::string>& specials) {
  text::BpeVocabulary v;  // ids 0-255: the bytes in byte order; the special tokens after them
  for (int b = 0; b < 256; ++b) v.tokens.push_back(text::byte_level_alphabet().utf8_of_byte[b]);
  for (const std::string& t : specials) {
    v.special_ids.push_back(int32_t(v.tokens.size()));
    v.tokens.push_back(t);
  }
  return text::bpe_tokenizer_json(v);
}

void write_tiny_qwen35(const std::filesystem::path& dir, uint64_t seed) {
  write_tiny_qwen35(dir, seed, "{}", "");
}

void write_tiny_qwen35(const std::filesystem::path& dir, uint64_t seed,
                       const std::string& config_patch, const std::string& tokenizer_json) {
  std::filesystem::create_directories(dir);
  Json config = tiny_config();
  config.update(Json::parse(config_patch));
  write_text(dir / "config.json", config.dump(2));
  Qwen35Config cfg = Qwen35Config::from_json(JsonConfig(config, (dir / "config.json").string()));
  TensorMap weights = qwen35_random_weights(cfg, DType::bf16, seed);
  std::vector<NamedTensor> named;
  for (auto& [name, t] : weights) {
    named.push_back({name == "lm_head.weight" ? name : "model." + name, t});
  }
  safetensors_write(dir / "model.safetensors", named);
  write_text(dir / "tokenizer.json",
             tokenizer_json.empty() ? tiny_tokenizer_json() : tokenizer_json);
}

void write_tiny_lfm2(const std::filesystem::path& dir, uint64_t seed) {
  std::filesystem::create_directories(dir);
  const std::vector<std::string> specials = {"<|pad|>", "<|startoftext|>", "<|endoftext|>",
                                             "<|im_start|>", "<|im_end|>"};
  Json config = {{"architectures", {"Lfm2ForCausalLM"}},
                 {"model_type", "lfm2"},
                 {"vocab_size", 256 + int64_t(specials.size())},
                 {"hidden_size", 32},
                 {"intermediate_size", 72},
                 {"block_auto_adjust_ff_dim", true},
                 {"block_ffn_dim_multiplier", 1.0},
                 {"block_multiple_of", 16},
                 {"num_hidden_layers", 5},
                 {"layer_types", {"conv", "conv", "full_attention", "conv", "full_attention"}},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 2},
                 {"conv_L_cache", 3},
                 {"norm_eps", 1e-5},
                 {"rope_theta", 1e6},
                 {"tie_word_embeddings", true}};
  write_text(dir / "config.json", config.dump(2));
  Lfm2Config cfg = Lfm2Config::from_json(JsonConfig(config, (dir / "config.json").string()));
  TensorMap weights = lfm2_random_weights(cfg, DType::bf16, seed);
  std::vector<NamedTensor> named;
  for (auto& [name, t] : weights) {
    named.push_back({name == "lm_head.weight" ? name : "model." + name, t});
  }
  safetensors_write(dir / "model.safetensors", named);
  write_text(dir / "tokenizer.json", tiny_tokenizer_json(specials));
}

}  // namespace deg::testing

namespace deg::testing {

void write_tiny_gemma4(const std::filesystem::path& dir, uint64_t seed, bool multimodal) {
  std::filesystem::create_directories(dir);
  const char* S = "sliding_attention";
  const char* F = "full_attention";
  Json text = {{"model_type", "gemma4_text"},
               {"vocab_size", 263},
               {"hidden_size", 64},
               {"intermediate_size", 64},
               {"num_hidden_layers", 6},
               {"layer_types", {S, S, F, S, S, F}},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"head_dim", 16},
               {"sliding_window", 8},
               {"num_kv_shared_layers", 2},
               {"use_double_wide_mlp", true},
               {"hidden_size_per_layer_input", 8},
               {"vocab_size_per_layer_input", 263},
               {"final_logit_softcapping", 5.0},
               {"rms_norm_eps", 1e-6},
               {"hidden_activation", "gelu_pytorch_tanh"},
               {"rope_parameters",
                {{S, {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
                 {F,
                  {{"rope_type", "proportional"},
                   {"partial_rotary_factor", 0.25},
                   {"rope_theta", 1000000.0}}}}},
               {"tie_word_embeddings", true}};
  Json config;
  if (multimodal) {
    text["per_layer_config"] = {{"02", {{"head_dim", 32}}}, {"05", {{"head_dim", 32}}}};
    config = {{"architectures", {"Gemma4ForConditionalGeneration"}},
              {"model_type", "gemma4"},
              {"text_config", text},
              {"tie_word_embeddings", true}};
  } else {
    text["global_head_dim"] = 32;
    text["architectures"] = {"Gemma4ForCausalLM"};
    config = text;
  }
  write_text(dir / "config.json", config.dump(2));
  Gemma4Config cfg = Gemma4Config::from_json(JsonConfig(config, (dir / "config.json").string()));
  TensorMap weights = gemma4_random_weights(cfg, DType::bf16, seed);
  const std::string prefix = multimodal ? "model.language_model." : "model.";
  std::vector<NamedTensor> named;
  for (auto& [name, t] : weights) {
    named.push_back({name == "lm_head.weight" ? name : prefix + name, t});
  }
  safetensors_write(dir / "model.safetensors", named);
  Json tok = Json::parse(tiny_tokenizer_json());
  int id = 259;
  for (const char* t : {"<bos>", "<pad>", "<|turn>", "<turn|>"}) {
    tok["added_tokens"].push_back({{"id", id++},
                                   {"content", t},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", true}});
  }
  write_text(dir / "tokenizer.json", tok.dump());
}

void write_tiny_gpt(const std::filesystem::path& dir, uint64_t seed) {
  GptConfig c = gpt_preset("tiny");
  c.vocab_size = 320;
  c.window_short = 256;
  c.window_long = 512;
  train::GptParams p = train::GptParams::create(c);
  p.init(seed);
  train::Rng rng(seed + 1);
  for (auto& t : p.tensors())
    for (auto& x : t.data) x += float(rng.normal() * 0.05);
  std::filesystem::create_directories(dir);
  p.save(dir / "model.safetensors");
  write_text(dir / "config.json", gpt_config_to_json(c).dump());
  write_text(dir / "tokenizer.json", tiny_tokenizer_json({"<|endoftext|>"}));
}

}  // namespace deg::testing
