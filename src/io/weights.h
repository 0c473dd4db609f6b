// The tensors of a model directory, across shards: `model.safetensors.index.json` (HF sharded),
// a single `model.safetensors`, or given files. Also hides the two HF layouts of a text model:
// plain (`model.layers.0...`) and multimodal (`model.language_model.layers.0...`).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"

namespace deg {

// The shards a `model.safetensors.index.json` text names, each with the tensors it must hold.
// Throws deg::Error (format) naming `path` for anything but an object with a "weight_map" of
// tensor name -> plain file name inside the snapshot directory.
std::map<std::string, std::vector<std::string>> safetensors_index_parse(std::string_view text,
                                                                        const std::string& path);

// A deg checkpoint's backbone files: backbone.safetensors, or the parts
// backbone-00001-of-0000N.safetensors ... that `deg pack` splits it into (every part present).
// Throws deg::Error (not_found) when there are none or a part is missing.
std::vector<std::filesystem::path> checkpoint_backbone_files(const std::filesystem::path& dir);
// A file name of the backbone or one of its parts (backbone*.safetensors).
inline bool is_backbone_file(const std::string& name) {
  return name.starts_with("backbone") && name.ends_with(".safetensors");
}

class WeightStore {
 public:
  // A directory: uses model.safetensors.index.json when present, else model.safetensors, else
  // every *.safetensors in it (sorted). Throws deg::Error when none is found.
  static WeightStore open_dir(const std::filesystem::path& dir);
  static WeightStore open_files(const std::vector<std::filesystem::path>& files);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws not_found
  Tensor get(const std::string& name) const;              // throws not_found
  const std::string& file_of(const std::string& name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

  // The prefix of the text model's own tensors: "model.language_model." in multimodal
  // snapshots, "model." otherwise (the embedding tells which).
  const std::string& text_prefix() const { return text_prefix_; }
  // get(text_prefix() + name): "layers.0.self_attn.q_proj.weight" in either layout.
  Tensor text(const std::string& name) const { return get(text_prefix_ + name); }
  bool has_text(const std::string& name) const { return contains(text_prefix_ + name); }

 private:
  void add_file(SafetensorsFile file);
  void detect_layout();

  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
  std::string text_prefix_ = "model.";
  std::string dir_;
};

}  // namespace deg
