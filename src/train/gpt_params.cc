// GptParams: the tensor-name table, the seed's initialisation, save and load.
#include "train/gpt_params.h"

#include <cmath>

#include "core/error.h"
#include "io/safetensors.h"

namespace deg::train {

uint64_t Rng::next_u64() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::uniform() {
  return double(next_u64() >> 11) * 0x1.0p-53;
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  const double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
  spare_ = r * std::sin(th);
  has_spare_ = true;
  return r * std::cos(th);
}

RotaryState rotary_initial(int64_t qk_dim, int64_t rotary_dim, float attn_scale) {
  // (1/1024) ** linspace(0, 1, rotary_dim / 2), each repeated for its pair; zeros after.
  RotaryState r;
  r.freq.assign(size_t(qk_dim), 0.0f);
  const int64_t n = rotary_dim / 2;
  for (int64_t i = 0; i < n; ++i) {
    const double e = n > 1 ? double(i) / double(n - 1) : 0.0;
    const float f = float(std::pow(1.0 / 1024.0, e));
    r.freq[size_t(2 * i)] = r.freq[size_t(2 * i + 1)] = f;
  }
  r.attn_scale = attn_scale;
  return r;
}

void RotaryState::apply_yarn(int64_t old_window, int64_t new_window) {
  if (old_window == new_window || old_window <= 0 || new_window <= 0) return;
  const double scaling = double(old_window) / double(new_window);
  for (float& f : freq) {
    const double rotations = double(old_window) * f / (2.0 * M_PI);
    const double w = std::clamp((rotations - 1.0) / (32.0 - 1.0), 0.0, 1.0);
    f = float(f * (scaling + w * (1.0 - scaling)));
  }
  attn_scale = float(attn_scale * (0.2 * std::log(double(new_window) / double(old_window)) + 1.0));
}

void GptParams::add(const std::string& name, Shape shape) {
  DEG_CHECK(!index_.count(name), "duplicate tensor {}", name);
  index_[name] = tensors_.size();
  tensors_.push_back({name, shape, std::vector<float>(size_t(shape_numel(shape)), 0.0f)});
}

GptParams GptParams::create(const GptConfig& c) {
  c.validate();
  GptParams p;
  p.config_ = c;
  const int64_t C = c.model_dim, V = c.vocab_size, H = c.num_heads, L = c.num_layers;
  p.add("embed", {V, C});
  p.add("lm_head", {V, C});
  p.add("value_embeds", {int64_t(c.value_embed_layers.size()), V, C});
  p.add("ngram_table", {c.ngram_vocab, c.ngram_dim});
  p.add("smear_gate", {1, c.smear_channels});
  p.add("ve_gate", {int64_t(c.value_embed_gate_layers.size()), H, 2 * c.value_embed_gate_channels});
  p.add("scalars", {2 * L + 2});
  p.add("resid_lambdas", {L, 2});
  p.add("post_lambdas", {L, 2});
  for (int i = 0; i < L; ++i) {
    const std::string pre = "layers." + std::to_string(i);
    if (c.has_attn(i)) {
      p.add(pre + ".attn.qk", {2 * H * c.qk_dim(i), C});
      p.add(pre + ".attn.v", {H * c.v_dim(i), C});
      p.add(pre + ".attn.o", {C, H * c.v_dim(i)});
    }
    if (c.has_mlp(i)) {
      p.add(pre + ".mlp.fc", {c.mlp_hidden, C});
      p.add(pre + ".mlp.proj", {c.mlp_hidden, C});
    }
  }
  if (c.parallel_mlp_layer >= 0) {
    p.add("parallel_mlp.fc", {c.mlp_hidden, C});
    p.add("parallel_mlp.proj", {c.mlp_hidden, C});
  }
  const int64_t nmu = c.mudd_coefs(), ng = c.mudd_gate_coefs();
  p.add("mudd_w1", {2, c.mudd_dim, C});
  p.add("mudd_w2", {2, nmu, c.mudd_dim});
  p.add("mudd_b2", {2, nmu});
  p.add("mudd_w2g", {nmu, c.mudd_groups, c.mudd_dim});
  p.add("mudd_gate_w1", {2, c.mudd_gate_dim, C});
  p.add("mudd_gate_w2", {2, ng, c.mudd_gate_dim});
  p.add("mudd_gate_b2", {2, ng});
  p.add("mudd_gate_scale", {1});
  p.sign_pool.assign(size_t(c.ngram_sign_rows * c.ngram_dim), 1.0f);
  p.rotary_narrow = rotary_initial(c.narrow_head_dim, c.rotary_dim, c.narrow_attn_scale);
  p.rotary_wide = rotary_initial(c.head_dim, c.rotary_dim, c.wide_attn_scale);
  return p;
}

ParamTensor& GptParams::get(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(ErrorKind::not_found, "no such gpt tensor", {.tensor = name});
  return tensors_[it->second];
}

const ParamTensor& GptParams::get(const std::string& name) const {
  return const_cast<GptParams*>(this)->get(name);
}

int64_t GptParams::parameter_count() const {
  int64_t n = 0;
  for (const auto& t : tensors_) n += t.numel();
  return n;
}

std::vector<ParamTensor> GptParams::zeros_like() const {
  std::vector<ParamTensor> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_)
    out.push_back({t.name, t.shape, std::vector<float>(t.data.size())});
  return out;
}

void GptParams::init(uint64_t seed) {
  const GptConfig& c = config_;
  Rng rng(seed);
  const int64_t C = c.model_dim, L = c.num_layers;
  auto fill_uniform = [&](std::vector<float>& v, double bound) {
    for (float& x : v) x = float((2.0 * rng.uniform() - 1.0) * bound);
  };
  auto fill_normal = [&](std::vector<float>& v, double std) {
    for (float& x : v) x = float(rng.normal() * std);
  };
  for (auto& t : tensors_) std::fill(t.data.begin(), t.data.end(), 0.0f);
  // lm_head ~ N(0, 0.005), embed tied to it at init.
  fill_normal(get("lm_head").data, c.lm_head_init_std);
  get("embed").data = get("lm_head").data;
  fill_normal(get("value_embeds").data, c.value_embed_init_std);
  // "improved init scale": uniform with std 0.5 / sqrt(C); c_proj zero.
  const double bound = std::sqrt(3.0) * 0.5 / std::sqrt(double(C));
  for (int i = 0; i < L; ++i) {
    const std::string pre = "layers." + std::to_string(i);
    if (c.has_attn(i)) {
      fill_uniform(get(pre + ".attn.qk").data, bound);
      fill_uniform(get(pre + ".attn.v").data, bound);
      fill_uniform(get(pre + ".attn.o").data, bound);
    }
    if (c.has_mlp(i)) fill_uniform(get(pre + ".mlp.fc").data, bound);
  }
  if (c.parallel_mlp_layer >= 0) fill_uniform(get("parallel_mlp.fc").data, bound);
  // init_misc.
  for (auto& x : get("post_lambdas").data) x = 1.0f;
  for (auto& x : get("resid_lambdas").data) x = float(std::sqrt(1.1));
  auto& sc = get("scalars").data;
  for (int i = 0; i < L; ++i) {
    sc[size_t(2 * i)] = 0.5f;
    sc[size_t(2 * i + 1)] = 1.0f;
  }
  sc[size_t(2 * L)] = 0.0f;       // smear lambda
  sc[size_t(2 * L + 1)] = -1.5f;  // skip lambda: sigmoid(-1.5) ~ 0.18
  // MUDD (kaiming_uniform a=sqrt(5) -> bound 1/sqrt(fan_in)), biases in the pre-scaled domain.
  fill_uniform(get("mudd_w1").data, 1.0 / std::sqrt(double(C)));
  fill_uniform(get("mudd_gate_w1").data, 1.0 / std::sqrt(double(C)));
  const int64_t nmu = c.mudd_coefs();
  auto& b = get("mudd_b2").data;
  const float s = c.mudd_scale;
  b[6] = b[7] = 2.0f / s;             // VE gate lanes
  b[8] = float(std::sqrt(1.1)) / s;   // resid_attn
  b[9] = 1.0f / s;                    // post_attn
  b[11] = 0.05f / s;                  // n-gram lambda
  b[12] = float(std::sqrt(1.1)) / s;  // resid_mlp
  b[13] = 1.0f / s;                   // post_mlp
  for (size_t k = 0; k < c.post_mix_bias_init.size(); ++k)
    b[size_t(nmu) + k] = c.post_mix_bias_init[k] / s;
  const auto lanes = c.gate_lanes();
  const int64_t ng = c.mudd_gate_coefs();
  const float gs = c.mudd_gate_scale_init;
  auto& gb = get("mudd_gate_b2").data;
  for (int l = 0; l < L; ++l) {
    const int64_t row = lanes.gate_id[size_t(l)] * ng;
    if (lanes.attn_gate[size_t(l)] >= 0)
      for (int h = 0; h < c.num_heads; ++h)
        gb[size_t(row + lanes.attn_gate[size_t(l)] + h)] = 0.25f / gs;
    if (lanes.ngram[size_t(l)] >= 0) gb[size_t(row + lanes.ngram[size_t(l)])] = 0.05f / gs;
  }
  if (lanes.skip >= 0) gb[size_t(ng + lanes.skip)] = 0.5f / gs;
  get("mudd_gate_scale").data[0] = gs;
  // The +-1 sign pool: randn().sign().
  for (float& x : sign_pool) x = rng.normal() < 0 ? -1.0f : 1.0f;
  rotary_narrow = rotary_initial(c.narrow_head_dim, c.rotary_dim, c.narrow_attn_scale);
  rotary_wide = rotary_initial(c.head_dim, c.rotary_dim, c.wide_attn_scale);
}

void GptParams::save(const std::filesystem::path& path, const std::string& prefix) const {
  std::vector<NamedTensor> out;
  for (const auto& t : tensors_) out.push_back({t.name, Tensor::from_vector(t.data, t.shape)});
  out.push_back({"ngram_sign_pool",
                 Tensor::from_vector(sign_pool, {config_.ngram_sign_rows, config_.ngram_dim})});
  for (auto [name, r] : {std::pair{"narrow", &rotary_narrow}, std::pair{"wide", &rotary_wide}}) {
    out.push_back({std::string("rotary.") + name + ".freq",
                   Tensor::from_vector(r->freq, {int64_t(r->freq.size())})});
    out.push_back({std::string("rotary.") + name + ".attn_scale",
                   Tensor::from_vector(std::vector<float>{r->attn_scale}, {1})});
  }
  for (auto& t : out) t.name = prefix + t.name;
  safetensors_write(path, out, {{"format", "pt"}, {"family", "gpt"}});
}

GptParams GptParams::load(const GptConfig& config, const std::filesystem::path& path,
                          const std::string& prefix) {
  GptParams p = create(config);
  SafetensorsFile file = SafetensorsFile::open(path);
  auto read = [&](const std::string& name, std::vector<float>& dst, const Shape& shape) {
    Tensor t = file.tensor(prefix + name);
    if (t.shape() != shape)
      throw Error(ErrorKind::format,
                  fmt::format("tensor has shape {}, the config expects {}", shape_str(t.shape()),
                              shape_str(shape)),
                  {.path = path.string(), .tensor = prefix + name});
    dst = t.to(DType::f32).to_f32_vector();
  };
  for (auto& t : p.tensors_) read(t.name, t.data, t.shape);
  read("ngram_sign_pool", p.sign_pool, {config.ngram_sign_rows, config.ngram_dim});
  for (auto [name, r] :
       {std::pair{"narrow", &p.rotary_narrow}, std::pair{"wide", &p.rotary_wide}}) {
    read(std::string("rotary.") + name + ".freq", r->freq, {int64_t(r->freq.size())});
    std::vector<float> s;
    read(std::string("rotary.") + name + ".attn_scale", s, {1});
    r->attn_scale = s[0];
  }
  return p;
}

}  // namespace deg::train
