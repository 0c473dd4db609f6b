#include "model/checkpoint.h"

#include <fmt/ranges.h>

#include <fstream>

#include "core/buffer.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "model/gpt.h"
#include "model/heads.h"

namespace deg {

namespace fs = std::filesystem;

namespace {

// Tensors of a base snapshot that belong to the text model, under their `model.` names.
std::vector<NamedTensor> backbone_tensors(const WeightStore& store) {
  const std::string& prefix = store.text_prefix();
  std::vector<NamedTensor> out;
  for (const std::string& name : store.names()) {
    if (!name.starts_with(prefix)) continue;  // lm_head, vision / audio towers, MTP heads
    const std::string rest = name.substr(prefix.size());
    if (rest.find(".lora_") != std::string::npos ||
        rest.ends_with("embed_tokens_per_layer.weight")) {
      continue;
    }
    Tensor t = store.get(name);
    out.push_back({"model." + rest, t.dtype() == DType::bf16 ? t : t.to(DType::bf16)});
  }
  return out;
}

const char* kCopiedFiles[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                              "special_tokens_map.json", "generation_config.json"};

}  // namespace

CheckpointMeta checkpoint_meta_parse(std::string_view text, const std::string& path) {
  Json json = json_parse(text, path);
  if (!json.is_object()) {
    throw Error(ErrorKind::format, "expected a JSON object at the top level", {.path = path});
  }
  JsonConfig j(std::move(json), path);
  CheckpointMeta m;
  m.base = j.get_or<std::string>("base", "custom");
  m.backbone = j.get_or<std::string>("backbone", "");
  m.array_mode = j.get_or<std::string>("array_mode", "anchor");
  if (m.array_mode != "anchor" && m.array_mode != "index") {
    throw Error(ErrorKind::unsupported,
                "array_mode \"" + m.array_mode + "\" is neither \"anchor\" nor \"index\"",
                {.path = path, .pointer = "/array_mode"});
  }
  if (j.has("max_count") && j.get<int64_t>("max_count") != kMaxCount) {
    throw Error(ErrorKind::unsupported,
                fmt::format("max_count {} differs from the {} this deg build's count head has",
                            j.get<int64_t>("max_count"), kMaxCount),
                {.path = path, .pointer = "/max_count"});
  }
  m.raw = j.json();
  for (const char* key : {"lora", "moe"}) {
    if (j.has(key)) {
      throw Error(ErrorKind::unsupported,
                  fmt::format("this checkpoint carries {} weights, which this deg build cannot "
                              "run yet; use a checkpoint without them",
                              key),
                  {.path = path, .pointer = std::string("/") + key});
    }
  }
  return m;
}

CheckpointMeta checkpoint_meta_load(const fs::path& dir) {
  const fs::path meta = dir / "deg.json";
  CheckpointMeta m = checkpoint_meta_parse(read_file(meta), meta.string());
  for (const char* file : {"adapters.safetensors", "moe.safetensors"}) {
    if (fs::exists(dir / file)) {
      throw Error(ErrorKind::unsupported,
                  std::string(file) + " is not supported by this deg build yet",
                  {.path = dir.string()});
    }
  }
  return m;
}

void checkpoint_init(const CheckpointInitOptions& options) {
  const fs::path& base = options.base;
  if (!fs::exists(base / "config.json")) {
    throw Error(ErrorKind::not_found,
                "config.json not found; --base must be an HF snapshot directory",
                {.path = base.string()});
  }
  if (fs::exists(options.out) && !fs::is_empty(options.out)) {
    throw Error(ErrorKind::invalid_argument,
                "output directory exists and is not empty; choose a new --out",
                {.path = options.out.string()});
  }
  JsonConfig config = JsonConfig::load(base / "config.json");
  JsonConfig text = config.text();
  // A `deg pretrain` gpt checkpoint: bare tensor names, kept in f32 (bf16 would change the
  // trained trunk; the rotary frequencies in particular).
  const bool gpt = gpt_handles(config.json());
  const int64_t hidden = gpt ? text.get<int64_t>("model_dim") : text.get<int64_t>("hidden_size");
  WeightStore store = WeightStore::open_dir(base);
  std::vector<NamedTensor> backbone;
  if (gpt) {
    for (const std::string& name : store.names())
      backbone.push_back({"model." + name, store.get(name)});
  } else {
    backbone = backbone_tensors(store);
  }
  if (backbone.empty()) {
    throw Error(ErrorKind::format, "no text-model tensors (model.* or model.language_model.*)",
                {.path = base.string()});
  }

  fs::create_directories(options.out);
  safetensors_write(options.out / "backbone.safetensors", backbone);
  Heads::init(hidden, options.seed).save(options.out / "heads.safetensors");
  for (const char* f : kCopiedFiles) {
    if (fs::exists(base / f))
      fs::copy_file(base / f, options.out / f, fs::copy_options::overwrite_existing);
  }
  std::string backbone_name = gpt ? "gpt" : text.model_type();
  if (backbone_name.ends_with("_text")) backbone_name.resize(backbone_name.size() - 5);
  OrderedJson meta = {{"base", fs::absolute(base).lexically_normal().string()},
                      {"backbone", backbone_name},
                      {"seed", options.seed},
                      {"lora", nullptr},
                      {"moe", nullptr},
                      {"kinds", kHeadKindNames},
                      {"max_count", kMaxCount},
                      {"array_mode", "anchor"}};
  std::ofstream out(options.out / "deg.json");
  out << meta.dump(2) << "\n";
  if (!out.flush()) {
    throw Error(ErrorKind::io, "cannot write deg.json", {.path = options.out.string()});
  }
}

CheckpointPackResult checkpoint_pack(const CheckpointPackOptions& o) {
  if (!fs::exists(o.model / "deg.json"))
    throw Error(ErrorKind::not_found, "no deg.json here: not a deg checkpoint",
                {.path = o.model.string()});
  if (o.dtype != "bf16" && o.dtype != "f32")
    throw Error(ErrorKind::invalid_argument, "--dtype must be bf16 or f32, got " + o.dtype);
  if (o.max_file_bytes < (int64_t(1) << 16))
    throw Error(ErrorKind::invalid_argument, "the largest file must allow at least 64 KiB");
  if (fs::exists(o.out) && !fs::is_empty(o.out))
    throw Error(ErrorKind::invalid_argument,
                "output directory exists and is not empty; choose a new --out",
                {.path = o.out.string()});
  const WeightStore store = WeightStore::open_files(checkpoint_backbone_files(o.model));
  // The other files, copied as they are (checked first: nothing is written for a bad run).
  std::vector<fs::path> copies;
  for (const auto& e : fs::directory_iterator(o.model)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || is_backbone_file(name) || name == "metrics.jsonl" ||
        name.ends_with(".tmp"))
      continue;
    if (int64_t(e.file_size()) > o.max_file_bytes)
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("{} takes {} bytes, more than a file may hold ({})", name,
                              e.file_size(), o.max_file_bytes),
                  {.path = e.path().string()});
    copies.push_back(e.path());
  }
  CheckpointPackResult r;
  auto shrunk = [&](Tensor t) {  // bf16 for the tensors worth it
    if (o.dtype == "bf16" && t.dtype() == DType::f32 && t.numel() >= kPackMinValues) {
      t = t.to(DType::bf16);
      ++r.converted;
    }
    return t;
  };
  // Tensors into parts in name order; a part's header is counted generously.
  std::vector<std::vector<NamedTensor>> parts(1);
  int64_t used = 0;
  for (const std::string& name : store.names()) {
    Tensor t = shrunk(store.get(name));
    const int64_t bytes = int64_t(t.nbytes()) + 256 + int64_t(name.size());
    if (bytes + 4096 > o.max_file_bytes)
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("tensor {} takes {} bytes, more than a file may hold ({})", name,
                              t.nbytes(), o.max_file_bytes));
    if (used + bytes + 4096 > o.max_file_bytes) {
      parts.emplace_back();
      used = 0;
    }
    parts.back().push_back({name, std::move(t)});
    used += bytes;
  }
  fs::create_directories(o.out);
  const int n = int(parts.size());
  for (int k = 0; k < n; ++k) {
    const fs::path path =
        o.out / (n == 1 ? std::string("backbone.safetensors")
                        : fmt::format("backbone-{:05d}-of-{:05d}.safetensors", k + 1, n));
    safetensors_write(path, parts[size_t(k)]);
    const int64_t size = int64_t(fs::file_size(path));
    DEG_CHECK(size <= o.max_file_bytes, "{} came out at {} bytes", path.string(), size);
    r.largest_file = std::max(r.largest_file, size);
    r.bytes += size;
  }
  r.files = n;
  for (const fs::path& from : copies) {
    if (from.filename() == "heads.safetensors" && o.dtype == "bf16") {  // its matrices too
      SafetensorsFile heads = SafetensorsFile::open(from);
      std::vector<NamedTensor> ts;
      for (const TensorInfo& info : heads.tensors())
        ts.push_back({info.name, shrunk(heads.tensor(info.name))});
      safetensors_write(o.out / from.filename(), ts, heads.metadata());
    } else {
      fs::copy_file(from, o.out / from.filename());
    }
    const int64_t size = int64_t(fs::file_size(o.out / from.filename()));
    r.largest_file = std::max(r.largest_file, size);
    r.bytes += size;
  }
  return r;
}

fs::path model_config_dir(const fs::path& dir, const fs::path& base_override) {
  if (!fs::exists(dir / "deg.json") || fs::exists(dir / "config.json")) return dir;
  if (!base_override.empty()) return base_override;
  CheckpointMeta m = checkpoint_meta_load(dir);
  if (m.base != "custom" && fs::exists(fs::path(m.base) / "config.json")) return m.base;
  throw Error(ErrorKind::not_found,
              "this deg checkpoint has no config.json and its base snapshot '" + m.base +
                  "' is not here; pass --base DIR pointing at the base HF snapshot",
              {.path = dir.string()});
}

}  // namespace deg
