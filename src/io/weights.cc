#include "io/weights.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/buffer.h"
#include "core/error.h"
#include "io/json.h"

namespace deg {

namespace fs = std::filesystem;

void WeightStore::add_file(SafetensorsFile file) {
  size_t index = files_.size();
  for (const TensorInfo& t : file.tensors()) {
    auto [it, inserted] = where_.emplace(t.name, index);
    if (!inserted) {
      throw Error(ErrorKind::format,
                  fmt::format("tensor appears in two files: {} and {}", files_[it->second].path(),
                              file.path()),
                  {.path = dir_, .tensor = t.name});
    }
  }
  files_.push_back(std::move(file));
}

void WeightStore::detect_layout() {
  bool multimodal = std::any_of(where_.begin(), where_.end(), [](const auto& kv) {
    return kv.first.rfind("model.language_model.", 0) == 0;
  });
  text_prefix_ = multimodal ? "model.language_model." : "model.";
}

WeightStore WeightStore::open_files(const std::vector<fs::path>& files) {
  WeightStore s;
  for (const auto& f : files) s.add_file(SafetensorsFile::open(f));
  s.detect_layout();
  return s;
}

std::map<std::string, std::vector<std::string>> safetensors_index_parse(std::string_view text,
                                                                        const std::string& path) {
  Json j = json_parse(text, path);
  auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object()) {
    throw Error(ErrorKind::format, "no \"weight_map\" object", {.path = path});
  }
  std::map<std::string, std::vector<std::string>> by_file;  // shard -> tensors it must hold
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) {
      throw Error(ErrorKind::format, "weight_map value is not a file name",
                  {.path = path, .tensor = it.key()});
    }
    std::string shard = it->get<std::string>();
    if (shard.find('/') != std::string::npos || shard == ".." || shard.empty()) {
      throw Error(ErrorKind::format, "weight_map names a file outside the directory: " + shard,
                  {.path = path, .tensor = it.key()});
    }
    by_file[shard].push_back(it.key());
  }
  return by_file;
}

std::vector<fs::path> checkpoint_backbone_files(const fs::path& dir) {
  if (fs::exists(dir / "backbone.safetensors")) return {dir / "backbone.safetensors"};
  std::map<int, fs::path> parts;
  int of = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    int k = 0, total = 0;
    char tail[32] = {};
    if (n.size() == 35 &&
        std::sscanf(n.c_str(), "backbone-%5d-of-%5d.%12s", &k, &total, tail) == 3 &&
        std::string(tail) == "safetensors") {
      if (of != 0 && total != of)
        throw Error(ErrorKind::format, "backbone parts of different counts",
                    {.path = dir.string()});
      of = total;
      parts[k] = e.path();
    }
  }
  if (parts.empty())
    throw Error(ErrorKind::not_found,
                "backbone.safetensors (or its parts backbone-00001-of-N.safetensors) is missing "
                "from this deg checkpoint",
                {.path = dir.string()});
  std::vector<fs::path> files;
  for (int k = 1; k <= of; ++k) {
    auto it = parts.find(k);
    if (it == parts.end())
      throw Error(ErrorKind::not_found, fmt::format("backbone part {} of {} is missing", k, of),
                  {.path = dir.string()});
    files.push_back(it->second);
  }
  if (int(parts.size()) != of)
    throw Error(ErrorKind::format, "backbone parts beyond their count", {.path = dir.string()});
  return files;
}

WeightStore WeightStore::open_dir(const fs::path& dir) {
  WeightStore s;
  s.dir_ = dir.string();
  fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const auto by_file = safetensors_index_parse(read_file(index), index.string());
    for (const auto& [shard, names] : by_file) {
      SafetensorsFile f = SafetensorsFile::open(dir / shard);
      for (const auto& name : names) {
        if (!f.find(name)) {
          throw Error(ErrorKind::format,
                      "listed in model.safetensors.index.json but missing from " + shard,
                      {.path = index.string(), .tensor = name});
        }
      }
      s.add_file(std::move(f));
    }
  } else if (fs::exists(dir / "model.safetensors")) {
    s.add_file(SafetensorsFile::open(dir / "model.safetensors"));
  } else {
    std::vector<fs::path> found;
    if (fs::is_directory(dir)) {
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".safetensors") found.push_back(e.path());
      }
    }
    if (found.empty()) {
      throw Error(ErrorKind::not_found,
                  "no *.safetensors weights found; pass a directory holding an HF snapshot "
                  "(config.json + model.safetensors) or a deg checkpoint",
                  {.path = dir.string()});
    }
    std::sort(found.begin(), found.end());
    for (const auto& f : found) s.add_file(SafetensorsFile::open(f));
  }
  s.detect_layout();
  return s;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

const TensorInfo& WeightStore::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    throw Error(ErrorKind::not_found, "missing tensor", {.path = dir_, .tensor = name});
  }
  return *files_[it->second].find(name);
}

Tensor WeightStore::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    throw Error(ErrorKind::not_found, "missing tensor", {.path = dir_, .tensor = name});
  }
  return files_[it->second].tensor(name);
}

const std::string& WeightStore::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    throw Error(ErrorKind::not_found, "missing tensor", {.path = dir_, .tensor = name});
  }
  return files_[it->second].path();
}

}  // namespace deg
