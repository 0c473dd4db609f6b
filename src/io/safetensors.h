// safetensors: the weight format of HF snapshots and deg checkpoints. Files are mapped read-only
// and tensors are views into the map (never copied). Every header is validated before use: known
// dtype, non-negative shape, byte length = numel x dtype size, offsets inside the data section,
// no two tensors overlapping; each violation is a deg::Error naming the file and the tensor.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace deg {

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data section (after the header)
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in file order (by begin offset)
  std::map<std::string, std::string> metadata;
};

// Validates a header's JSON against a data section of `data_size` bytes. `path` is only for
// messages. Safe on any input (this is the fuzz target's entry point).
SafetensorsHeader safetensors_parse_header(std::string_view header_json, uint64_t data_size,
                                           const std::string& path);

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  // Parses an in-memory file image (tests, fuzzing).
  static SafetensorsFile from_buffer(std::shared_ptr<Buffer> bytes, const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  // A read-only view into the mapped file; throws deg::Error (not_found) when absent.
  Tensor tensor(std::string_view name) const;

 private:
  std::string path_;
  std::shared_ptr<Buffer> bytes_;
  uint64_t data_start_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Writes tensors (any layout; written contiguous, in the given order) and string metadata.
void safetensors_write(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace deg
