// GptConfig presets, validation, MUDD gate lane layout and JSON round trip.
#include "model/gpt_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <stdexcept>
#include <utility>

#include "core/error.h"

namespace deg {
namespace {

// The seed's topology (seed 003 lines "NUM_LAYERS = 11" .. "MUDD_GATE_SCALE"), shared by every
// preset: presets differ in widths only.
void set_speedrun_topology(GptConfig& c) {
  c.num_layers = 11;
  c.attn_layers = {0, 1, 2, 3, 5, 8, 10};
  c.no_mlp_layers = {7};
  c.skip_layer = 6;
  c.skip_source = 3;
  c.long_window_layers = {3, 10};
  c.wide_qk_layers = {3, 10};
  c.half_v_layers = {1, 8};
  c.paired_head_layers = {0, 2, 5};
  c.attn_gate_layers = {3, 10};
  c.xsa_layers = {1, 3};
  c.value_embed_layers = {1, 2, 8, 10};
  c.value_embed_gate_layers = {1, 2, 8};
  c.value_embed_gate_channels = 6;
  c.x0_inject_layers = {0, 1, 2, 4, 5, 7};
  c.ngram_inject_layers = {0, 1, 4, 5, 9};
  c.post_gate_layer = 4;
  c.parallel_mlp_layer = 8;
  c.late_layer = 7;
  using K = GptMixSource::Kind;
  c.post_mix_sources = {{K::cache, 0},        {K::cache, 7},       {K::cache, 9},
                        {K::value_embed, 1},  {K::cache, 3},       {K::value_embed, 2},
                        {K::value_embed, 10}, {K::value_embed, 8}, {K::last_mlp_in, 0},
                        {K::late_attn_in, 0}};
  // init_mudd: "-0.5 backout absorbed into residual h7 coef".
  c.post_mix_bias_init = {0, -0.5f, 0, 0, 0, 0, 0, 0, 0, 0};
}

const char* kind_name(GptMixSource::Kind k) {
  switch (k) {
    case GptMixSource::Kind::cache: return "cache";
    case GptMixSource::Kind::value_embed: return "value_embed";
    case GptMixSource::Kind::last_mlp_in: return "last_mlp_in";
    case GptMixSource::Kind::late_attn_in: return "late_attn_in";
  }
  return "?";
}

[[noreturn]] void bad(const std::string& pointer, const std::string& message) {
  throw Error(ErrorKind::invalid_argument, "gpt config: " + message, {.pointer = pointer});
}

}  // namespace

bool GptConfig::has(const std::vector<int>& layers, int layer) const {
  return std::find(layers.begin(), layers.end(), layer) != layers.end();
}

int GptConfig::value_embed_index(int layer) const {
  auto it = std::find(value_embed_layers.begin(), value_embed_layers.end(), layer);
  return it == value_embed_layers.end() ? -1 : int(it - value_embed_layers.begin());
}

int GptConfig::value_embed_gate_index(int layer) const {
  auto it = std::find(value_embed_gate_layers.begin(), value_embed_gate_layers.end(), layer);
  return it == value_embed_gate_layers.end() ? -1 : int(it - value_embed_gate_layers.begin());
}

int64_t GptConfig::mudd_coefs() const {
  return std::max<int64_t>(14, int64_t(post_mix_sources.size()));
}

GptConfig::GateLanes GptConfig::gate_lanes() const {
  GateLanes g;
  const int L = num_layers, H = num_heads;
  g.xsa.assign(L, -1);
  g.attn_gate.assign(L, -1);
  g.x0.assign(L, -1);
  g.ngram.assign(L, -1);
  g.gate_id.assign(L, 0);
  for (int i = 0; i < L; ++i) g.gate_id[i] = i < post_gate_layer ? 0 : 1;
  // init_mudd_gate's layouts: pre = xsa, attn gates, x0, n-gram; post = attn gates, x0, n-gram,
  // skip. Lists are read in the order given (the seed's are sorted).
  int pre = 0, post = 0;
  for (int l : xsa_layers) g.xsa[l] = (pre += H) - H;
  for (int l : attn_gate_layers)
    if (l < post_gate_layer) g.attn_gate[l] = (pre += H) - H;
  for (int l : x0_inject_layers)
    if (l < post_gate_layer) g.x0[l] = pre++;
  for (int l : ngram_inject_layers)
    if (l < post_gate_layer) g.ngram[l] = pre++;
  for (int l : attn_gate_layers)
    if (l >= post_gate_layer) g.attn_gate[l] = (post += H) - H;
  for (int l : x0_inject_layers)
    if (l >= post_gate_layer) g.x0[l] = post++;
  for (int l : ngram_inject_layers)
    if (l >= post_gate_layer) g.ngram[l] = post++;
  if (skip_layer >= 0) g.skip = post++;
  g.pre_count = pre;
  g.post_count = post;
  return g;
}

int64_t GptConfig::mudd_gate_coefs() const {
  GateLanes g = gate_lanes();
  return std::max(g.pre_count, g.post_count);
}

void GptConfig::validate() const {
  auto positive = [](const char* ptr, int64_t v) {
    if (v <= 0) bad(ptr, fmt::format("{} must be positive, got {}", ptr + 1, v));
  };
  positive("/vocab_size", vocab_size);
  positive("/model_dim", model_dim);
  positive("/num_layers", num_layers);
  positive("/num_heads", num_heads);
  positive("/head_dim", head_dim);
  positive("/narrow_head_dim", narrow_head_dim);
  positive("/rotary_dim", rotary_dim);
  positive("/mlp_hidden", mlp_hidden);
  positive("/ngram_vocab", ngram_vocab);
  positive("/ngram_dim", ngram_dim);
  positive("/ngram_sign_rows", ngram_sign_rows);
  positive("/mudd_dim", mudd_dim);
  positive("/mudd_gate_dim", mudd_gate_dim);
  if (num_heads % 2) bad("/num_heads", "num_heads must be even (paired heads, MUDD ve gate)");
  if (model_dim != num_heads * head_dim) bad("/model_dim", "model_dim must be num_heads*head_dim");
  if (narrow_head_dim > head_dim) bad("/narrow_head_dim", "narrow_head_dim exceeds head_dim");
  if (rotary_dim % 2 || rotary_dim > narrow_head_dim)
    bad("/rotary_dim", "rotary_dim must be even and at most narrow_head_dim");
  if (ngram_dim > model_dim) bad("/ngram_dim", "ngram_dim exceeds model_dim");
  if (ngram_vocab % 2 || ngram_vocab < 4) bad("/ngram_vocab", "ngram_vocab must be even, >= 4");
  if (ngram_sign_rows & (ngram_sign_rows - 1))
    bad("/ngram_sign_rows", "ngram_sign_rows must be a power of two");
  if (smear_channels <= 0 || smear_channels > model_dim)
    bad("/smear_channels", "smear_channels must be in [1, model_dim]");
  if (value_embed_gate_channels <= 0 || value_embed_gate_channels > model_dim)
    bad("/value_embed_gate_channels", "value_embed_gate_channels must be in [1, model_dim]");
  if (mudd_groups <= 0 || model_dim % mudd_groups)
    bad("/mudd_groups", "mudd_groups must divide model_dim");
  if (window_short < 0 || window_long < 0) bad("/window_short", "windows must be >= 0");
  const int L = num_layers, last = L - 1;
  auto check_list = [&](const char* ptr, const std::vector<int>& v) {
    for (size_t k = 0; k < v.size(); ++k)
      if (v[k] < 0 || v[k] >= L)
        bad(fmt::format("{}/{}", ptr, k), fmt::format("layer {} is outside [0, {})", v[k], L));
  };
  check_list("/attn_layers", attn_layers);
  check_list("/no_mlp_layers", no_mlp_layers);
  check_list("/long_window_layers", long_window_layers);
  check_list("/wide_qk_layers", wide_qk_layers);
  check_list("/half_v_layers", half_v_layers);
  check_list("/paired_head_layers", paired_head_layers);
  check_list("/attn_gate_layers", attn_gate_layers);
  check_list("/xsa_layers", xsa_layers);
  check_list("/value_embed_layers", value_embed_layers);
  check_list("/value_embed_gate_layers", value_embed_gate_layers);
  check_list("/x0_inject_layers", x0_inject_layers);
  check_list("/ngram_inject_layers", ngram_inject_layers);
  if (!has_attn(last) || !has_mlp(last) || !has(value_embed_layers, last))
    bad("/attn_layers", "the last (MUDD) layer needs attention, an MLP and a value embedding");
  if (has(x0_inject_layers, last) || has(ngram_inject_layers, last) ||
      has(value_embed_gate_layers, last) || has(paired_head_layers, last))
    bad("/x0_inject_layers", "the last (MUDD) layer takes its injections and VE gate from MUDD");
  if (skip_layer >= 0) {
    if (skip_layer >= L || skip_source < 0 || skip_source >= skip_layer)
      bad("/skip_layer", "skip_source must be a layer before skip_layer");
    if (has_attn(skip_layer) || skip_layer < post_gate_layer)
      bad("/skip_layer", "the skip layer has no attention and reads the post MUDD gate");
    if (has(x0_inject_layers, skip_layer) || has(ngram_inject_layers, skip_layer))
      bad("/skip_layer", "the skip layer injects neither x0 nor the n-gram embedding");
  }
  if (post_gate_layer <= 0 || post_gate_layer > last)
    bad("/post_gate_layer", "post_gate_layer must be in [1, num_layers - 1]");
  if (late_layer < 0 || late_layer >= last)
    bad("/late_layer", "late_layer must be a layer before the last (the MUDD layer reads it)");
  for (int l : xsa_layers)
    if (l >= post_gate_layer || paired(l) || !has_attn(l))
      bad("/xsa_layers", "XSA layers are unpaired attention layers before post_gate_layer");
  for (int l : long_window_layers)
    if (qk_dim(l) <= rotary_dim)
      bad("/long_window_layers", "the key offset needs non-rotating q/k dims (a wide layer)");
  for (int l : paired_head_layers)
    if (has(wide_qk_layers, l)) bad("/paired_head_layers", "paired heads run at narrow q/k");
  for (int l : value_embed_gate_layers)
    if (!has(value_embed_layers, l)) bad("/value_embed_gate_layers", "gate without a VE plane");
  for (int l : value_embed_layers)
    if (!has_attn(l)) bad("/value_embed_layers", "value embeddings need an attention layer");
  for (int l : attn_gate_layers)
    if (!has_attn(l)) bad("/attn_gate_layers", "attention gates need an attention layer");
  if (parallel_mlp_layer >= 0 && (parallel_mlp_layer >= last || !has_mlp(parallel_mlp_layer)))
    bad("/parallel_mlp_layer", "the parallel MLP sits beside a layer's own MLP, not the last");
  if (post_mix_sources.size() != post_mix_bias_init.size())
    bad("/post_mix_bias_init", "one initial coefficient per post-mix source");
  for (size_t k = 0; k < post_mix_sources.size(); ++k) {
    const auto& s = post_mix_sources[k];
    std::string ptr = fmt::format("/post_mix_sources/{}", k);
    if (s.kind == GptMixSource::Kind::cache && (s.layer < 0 || s.layer >= last))
      bad(ptr, "a cache source is layer 0..num_layers-2");
    if (s.kind == GptMixSource::Kind::value_embed && !has(value_embed_layers, s.layer))
      bad(ptr, "a value_embed source names a value-embedding layer");
    if (s.kind == GptMixSource::Kind::late_attn_in && late_layer < 0)
      bad(ptr, "late_attn_in needs late_layer");
  }
}

int64_t GptConfig::parameter_count() const {
  const int64_t C = model_dim, V = vocab_size, H = num_heads;
  int64_t n = 2 * V * C;                            // embed, lm_head
  n += int64_t(value_embed_layers.size()) * V * C;  // value_embeds
  n += ngram_vocab * ngram_dim;                     // n-gram table
  n += smear_channels;                              // smear gate
  n += int64_t(value_embed_gate_layers.size()) * H * 2 * value_embed_gate_channels;
  n += 2 * num_layers + 2 + 4 * num_layers;  // scalars, resid/post lambdas
  for (int l : attn_layers) n += 2 * H * qk_dim(l) * C + 2 * H * v_dim(l) * C;
  for (int l = 0; l < num_layers; ++l)
    if (has_mlp(l)) n += 2 * mlp_hidden * C;
  if (parallel_mlp_layer >= 0) n += 2 * mlp_hidden * C;
  n += 2 * mudd_dim * C + 2 * mudd_coefs() * mudd_dim + 2 * mudd_coefs();
  n += mudd_coefs() * mudd_groups * mudd_dim;
  n += 2 * mudd_gate_dim * C + 2 * mudd_gate_coefs() * mudd_gate_dim + 2 * mudd_gate_coefs() + 1;
  return n;
}

int64_t GptConfig::matmul_parameter_count() const {
  const int64_t lookups = (1 + int64_t(value_embed_layers.size())) * vocab_size * model_dim +
                          ngram_vocab * ngram_dim;  // embed, value_embeds, the n-gram table
  return parameter_count() - lookups;
}

int64_t gpt_attention_flops(const GptConfig& cfg, const std::vector<int32_t>& seg_start) {
  // Visible pairs over positions p of a stream whose token p / `per` starts its segment at
  // per seg_start: sum_p min(window, p - per seg_start) + 1.
  auto pairs = [&](int per, int64_t window) {
    int64_t n = 0;
    for (int64_t p = 0; p < per * int64_t(seg_start.size()); ++p)
      n += std::min(window, p - per * int64_t(seg_start[size_t(p / per)])) + 1;
    return n;
  };
  std::map<std::pair<int, int64_t>, int64_t> counted;
  int64_t flops = 0;
  for (int i = 0; i < cfg.num_layers; ++i) {
    if (!cfg.has_attn(i)) continue;
    const int per = cfg.paired(i) ? 2 : 1;
    const int64_t window = cfg.long_window(i) ? cfg.window_long : cfg.window_short;
    auto it = counted.find({per, window});
    if (it == counted.end()) it = counted.emplace(std::pair{per, window}, pairs(per, window)).first;
    flops += 2 * (cfg.num_heads / per) * (cfg.qk_dim(i) + cfg.v_dim(i)) * it->second;
  }
  return 3 * flops;
}

GptConfig gpt_preset(const std::string& name) {
  GptConfig c;
  set_speedrun_topology(c);
  c.name = name;
  if (name == "speedrun-124m" || name == "speedrun-124m-1gpu") {
    // GPT(vocab 50257 -> 50304, 11 layers, 6 heads of 128, d 768); MLP_HIDDEN_DIM 2816;
    // NGRAM_VOCAB_SIZE / NGRAM_DIM / NGRAM_SIGN_POOL_ROWS of ngram_table.py.
    c.vocab_size = 50304;
    c.model_dim = 768;
    c.num_heads = 6;
    c.head_dim = 128;
    c.narrow_head_dim = 64;
    c.rotary_dim = 64;
    c.mlp_hidden = 2816;
    c.max_seq_len = 65536;
    c.ngram_vocab = 84602880;
    c.ngram_dim = 768;
    c.ngram_sign_rows = 8192;
    c.window_short = 128;
    c.window_long = 384;
    // One GPU: the seed's table (65.0G parameters, ~130 GB in bf16) is sharded over 8 GPUs. 2^22
    // rows (1/20 of its rows, 3.22G parameters) keep the table, its gradient and both Adam
    // moments at 51.5 GB in f32 (the whole model 56.2 GB), leaving the rest of an H200's 141 GB
    // to activations. docs/training.md says what the smaller table is expected to cost.
    if (name == "speedrun-124m-1gpu") c.ngram_vocab = int64_t(1) << 22;
  } else if (name == "small") {
    // Our default trunk: the seed's topology at d 512, 8 heads of 64 (~24M trunk parameters).
    c.vocab_size = 32768;
    c.model_dim = 512;
    c.num_heads = 8;
    c.head_dim = 64;
    c.narrow_head_dim = 32;
    c.rotary_dim = 32;
    c.mlp_hidden = 1792;
    c.max_seq_len = 16384;
    c.mudd_dim = 32;
    c.mudd_gate_dim = 32;
    c.mudd_groups = 16;
    c.ngram_vocab = 131072;
    c.ngram_dim = 128;
    c.ngram_sign_rows = 1024;
    c.window_short = 128;
    c.window_long = 384;
  } else if (name == "compact") {
    // The shipped default model's trunk (issue #16: <= 25 MB with its heads and tokenizer, in
    // bf16): d 256, 4 heads of 64, MLP 512, an 8192 x 64 n-gram table; windows of 1024 / 2048
    // tokens, so a field's query sees the start of a long e-mail. At vocab 4096: 11.3M
    // parameters, of which 6.3M are the embedding, LM head and value-embedding tables.
    c.vocab_size = 4096;
    c.model_dim = 256;
    c.num_heads = 4;
    c.head_dim = 64;
    c.narrow_head_dim = 32;
    c.rotary_dim = 32;
    c.mlp_hidden = 512;
    c.max_seq_len = 16384;
    c.mudd_dim = 32;
    c.mudd_gate_dim = 32;
    c.mudd_groups = 8;
    c.ngram_vocab = 8192;
    c.ngram_dim = 64;
    c.ngram_sign_rows = 1024;
    c.window_short = 1024;
    c.window_long = 2048;
  } else if (name == "tiny") {
    // Tests: every component present at toy widths.
    c.vocab_size = 64;
    c.model_dim = 48;
    c.num_heads = 6;
    c.head_dim = 8;
    c.narrow_head_dim = 4;
    c.rotary_dim = 4;
    c.mlp_hidden = 64;
    c.max_seq_len = 4096;
    c.mudd_dim = 16;
    c.mudd_gate_dim = 16;
    c.mudd_groups = 12;
    c.ngram_vocab = 256;
    c.ngram_dim = 24;
    c.ngram_sign_rows = 16;
    c.window_short = 16;
    c.window_long = 48;
  } else {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("unknown gpt preset '{}'; known: speedrun-124m, speedrun-124m-1gpu, "
                            "small, compact, tiny, or a path to a config JSON file",
                            name));
  }
  c.validate();
  return c;
}

std::vector<std::string> gpt_preset_names() {
  return {"speedrun-124m", "speedrun-124m-1gpu", "small", "compact", "tiny"};
}

Json gpt_config_to_json(const GptConfig& c) {
  Json j;
  j["family"] = "gpt";
  j["name"] = c.name;
  j["vocab_size"] = c.vocab_size;
  j["model_dim"] = c.model_dim;
  j["num_layers"] = c.num_layers;
  j["num_heads"] = c.num_heads;
  j["head_dim"] = c.head_dim;
  j["narrow_head_dim"] = c.narrow_head_dim;
  j["rotary_dim"] = c.rotary_dim;
  j["mlp_hidden"] = c.mlp_hidden;
  j["max_seq_len"] = c.max_seq_len;
  j["attn_layers"] = c.attn_layers;
  j["no_mlp_layers"] = c.no_mlp_layers;
  j["skip_layer"] = c.skip_layer;
  j["skip_source"] = c.skip_source;
  j["long_window_layers"] = c.long_window_layers;
  j["wide_qk_layers"] = c.wide_qk_layers;
  j["half_v_layers"] = c.half_v_layers;
  j["paired_head_layers"] = c.paired_head_layers;
  j["attn_gate_layers"] = c.attn_gate_layers;
  j["xsa_layers"] = c.xsa_layers;
  j["value_embed_layers"] = c.value_embed_layers;
  j["value_embed_gate_layers"] = c.value_embed_gate_layers;
  j["value_embed_gate_channels"] = c.value_embed_gate_channels;
  j["x0_inject_layers"] = c.x0_inject_layers;
  j["ngram_inject_layers"] = c.ngram_inject_layers;
  j["post_gate_layer"] = c.post_gate_layer;
  j["parallel_mlp_layer"] = c.parallel_mlp_layer;
  j["late_layer"] = c.late_layer;
  j["mudd_dim"] = c.mudd_dim;
  j["mudd_scale"] = c.mudd_scale;
  j["mudd_groups"] = c.mudd_groups;
  Json sources = Json::array();
  for (const auto& s : c.post_mix_sources) {
    Json e = {{"kind", kind_name(s.kind)}};
    if (s.kind == GptMixSource::Kind::cache || s.kind == GptMixSource::Kind::value_embed)
      e["layer"] = s.layer;
    sources.push_back(e);
  }
  j["post_mix_sources"] = sources;
  j["post_mix_bias_init"] = c.post_mix_bias_init;
  j["mudd_gate_dim"] = c.mudd_gate_dim;
  j["mudd_gate_scale_init"] = c.mudd_gate_scale_init;
  j["ngram_vocab"] = c.ngram_vocab;
  j["ngram_dim"] = c.ngram_dim;
  j["ngram_sign_rows"] = c.ngram_sign_rows;
  j["ngram_sign_seed"] = c.ngram_sign_seed;
  j["bigram_row_muls"] = c.bigram_row_muls;
  j["trigram_row_muls"] = c.trigram_row_muls;
  j["bigram_sign_muls"] = c.bigram_sign_muls;
  j["trigram_sign_muls"] = c.trigram_sign_muls;
  j["smear_channels"] = c.smear_channels;
  j["narrow_attn_scale"] = c.narrow_attn_scale;
  j["wide_attn_scale"] = c.wide_attn_scale;
  j["window_short"] = c.window_short;
  j["window_long"] = c.window_long;
  j["softcap"] = {c.softcap_a, c.softcap_b, c.softcap_c};
  j["norm_eps"] = c.norm_eps;
  j["lm_head_init_std"] = c.lm_head_init_std;
  j["value_embed_init_std"] = c.value_embed_init_std;
  return j;
}

GptConfig gpt_config_from_json(const Json& j, const std::string& what) {
  if (!j.is_object()) throw Error(ErrorKind::format, "gpt config is not a JSON object", {what});
  if (j.contains("family") && j["family"] != "gpt")
    throw Error(ErrorKind::format,
                fmt::format("config family is {}, expected \"gpt\"", j["family"].dump()),
                {.path = what, .pointer = "/family"});
  GptConfig c;
  auto get = [&](const char* key, auto& out) {
    if (!j.contains(key)) return;
    try {
      j.at(key).get_to(out);
    } catch (const std::exception& e) {
      throw Error(ErrorKind::format, fmt::format("bad value: {}", e.what()),
                  {.path = what, .pointer = std::string("/") + key});
    }
  };
  auto need = [&](const char* key, auto& out) {
    if (!j.contains(key))
      throw Error(ErrorKind::format, fmt::format("missing key \"{}\"", key),
                  {.path = what, .pointer = std::string("/") + key});
    get(key, out);
  };
  get("name", c.name);
  need("vocab_size", c.vocab_size);
  need("model_dim", c.model_dim);
  need("num_layers", c.num_layers);
  need("num_heads", c.num_heads);
  need("head_dim", c.head_dim);
  need("narrow_head_dim", c.narrow_head_dim);
  need("rotary_dim", c.rotary_dim);
  need("mlp_hidden", c.mlp_hidden);
  get("max_seq_len", c.max_seq_len);
  need("attn_layers", c.attn_layers);
  get("no_mlp_layers", c.no_mlp_layers);
  get("skip_layer", c.skip_layer);
  get("skip_source", c.skip_source);
  get("long_window_layers", c.long_window_layers);
  get("wide_qk_layers", c.wide_qk_layers);
  get("half_v_layers", c.half_v_layers);
  get("paired_head_layers", c.paired_head_layers);
  get("attn_gate_layers", c.attn_gate_layers);
  get("xsa_layers", c.xsa_layers);
  get("value_embed_layers", c.value_embed_layers);
  get("value_embed_gate_layers", c.value_embed_gate_layers);
  get("value_embed_gate_channels", c.value_embed_gate_channels);
  get("x0_inject_layers", c.x0_inject_layers);
  get("ngram_inject_layers", c.ngram_inject_layers);
  get("post_gate_layer", c.post_gate_layer);
  get("parallel_mlp_layer", c.parallel_mlp_layer);
  get("late_layer", c.late_layer);
  get("mudd_dim", c.mudd_dim);
  get("mudd_scale", c.mudd_scale);
  get("mudd_groups", c.mudd_groups);
  if (j.contains("post_mix_sources")) {
    const Json& arr = j["post_mix_sources"];
    if (!arr.is_array())
      throw Error(ErrorKind::format, "expected an array of {\"kind\", \"layer\"} objects",
                  {.path = what, .pointer = "/post_mix_sources"});
    c.post_mix_sources.clear();
    for (size_t k = 0; k < arr.size(); ++k) {
      std::string ptr = fmt::format("/post_mix_sources/{}", k);
      // Typed reads: a number for "kind" or an element that is no object is a format error
      // here, not nlohmann's type_error (found by fuzz/hf_config_fuzz).
      std::string kind;
      GptMixSource s;
      try {
        if (!arr[k].is_object()) throw std::invalid_argument("not an object");
        kind = arr[k].value("kind", "");
        s.layer = arr[k].value("layer", 0);
      } catch (const std::exception& e) {
        throw Error(ErrorKind::format, fmt::format("bad value: {}", e.what()),
                    {.path = what, .pointer = ptr});
      }
      if (kind == "cache")
        s.kind = GptMixSource::Kind::cache;
      else if (kind == "value_embed")
        s.kind = GptMixSource::Kind::value_embed;
      else if (kind == "last_mlp_in")
        s.kind = GptMixSource::Kind::last_mlp_in;
      else if (kind == "late_attn_in")
        s.kind = GptMixSource::Kind::late_attn_in;
      else
        throw Error(ErrorKind::format,
                    "kind must be cache, value_embed, last_mlp_in or late_attn_in",
                    {.path = what, .pointer = ptr + "/kind"});
      c.post_mix_sources.push_back(s);
    }
  }
  get("post_mix_bias_init", c.post_mix_bias_init);
  get("mudd_gate_dim", c.mudd_gate_dim);
  get("mudd_gate_scale_init", c.mudd_gate_scale_init);
  need("ngram_vocab", c.ngram_vocab);
  need("ngram_dim", c.ngram_dim);
  need("ngram_sign_rows", c.ngram_sign_rows);
  get("ngram_sign_seed", c.ngram_sign_seed);
  get("bigram_row_muls", c.bigram_row_muls);
  get("trigram_row_muls", c.trigram_row_muls);
  get("bigram_sign_muls", c.bigram_sign_muls);
  get("trigram_sign_muls", c.trigram_sign_muls);
  get("smear_channels", c.smear_channels);
  get("narrow_attn_scale", c.narrow_attn_scale);
  get("wide_attn_scale", c.wide_attn_scale);
  get("window_short", c.window_short);
  get("window_long", c.window_long);
  if (j.contains("softcap")) {
    std::array<float, 3> s{};
    get("softcap", s);
    c.softcap_a = s[0];
    c.softcap_b = s[1];
    c.softcap_c = s[2];
  }
  get("norm_eps", c.norm_eps);
  get("lm_head_init_std", c.lm_head_init_std);
  get("value_embed_init_std", c.value_embed_init_std);
  try {
    c.validate();
  } catch (const Error& e) {
    throw e.with_path(what);
  }
  return c;
}

GptConfig gpt_config_resolve(const std::string& preset_or_path) {
  for (const auto& name : gpt_preset_names())
    if (name == preset_or_path) return gpt_preset(name);
  std::filesystem::path p(preset_or_path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  if (!std::filesystem::exists(p))
    throw Error(
        ErrorKind::not_found,
        fmt::format("'{}' is neither a gpt preset (speedrun-124m, speedrun-124m-1gpu, small, "
                    "tiny) nor a config file",
                    preset_or_path),
        {.path = p.string()});
  return gpt_config_from_json(json_load(p), p.string());
}

void gpt_config_save(const GptConfig& config, const std::filesystem::path& path) {
  std::ofstream out(path);
  out << gpt_config_to_json(config).dump(2) << "\n";
  if (!out) throw Error(ErrorKind::io, "cannot write the config", {.path = path.string()});
}

}  // namespace deg
