#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "io/json.h"

namespace deg {

namespace {

// Headers above this are refused outright (the reference implementation's limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

Error header_error(const std::string& path, const std::string& tensor, const std::string& msg) {
  return Error(ErrorKind::format, msg, {.path = path, .tensor = tensor});
}

TensorInfo parse_entry(const std::string& name, const Json& entry, uint64_t data_size,
                       const std::string& path) {
  if (!entry.is_object()) throw header_error(path, name, "header entry is not an object");
  TensorInfo info;
  info.name = name;
  auto dt = entry.find("dtype");
  if (dt == entry.end() || !dt->is_string()) throw header_error(path, name, "missing \"dtype\"");
  if (!dtype_from_safetensors_name(dt->get_ref<const std::string&>(), &info.dtype)) {
    throw header_error(path, name,
                       fmt::format("unsupported dtype \"{}\"", dt->get_ref<const std::string&>()));
  }
  auto sh = entry.find("shape");
  if (sh == entry.end() || !sh->is_array())
    throw header_error(path, name, "missing \"shape\" array");
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : *sh) {
    if (!d.is_number_unsigned()) {
      throw header_error(path, name, "shape must hold non-negative integers");
    }
    uint64_t v = d.get<uint64_t>();
    if (v > uint64_t(std::numeric_limits<int64_t>::max())) overflow = true;
    info.shape.push_back(int64_t(v));
    if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v) overflow = true;
    numel *= v;
  }
  uint64_t esize = dtype_size(info.dtype);
  if (overflow || (numel != 0 && numel > std::numeric_limits<uint64_t>::max() / esize)) {
    throw header_error(path, name, "shape " + shape_str(info.shape) + " overflows");
  }
  auto off = entry.find("data_offsets");
  if (off == entry.end() || !off->is_array() || off->size() != 2 ||
      !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
    throw header_error(path, name, "\"data_offsets\" must be [begin, end] with integers >= 0");
  }
  info.begin = (*off)[0].get<uint64_t>();
  info.end = (*off)[1].get<uint64_t>();
  if (info.begin > info.end) {
    throw header_error(
        path, name,
        fmt::format("data_offsets [{}, {}] end before they begin", info.begin, info.end));
  }
  if (info.end > data_size) {
    throw header_error(path, name,
                       fmt::format("data_offsets [{}, {}] run past the data section ({} bytes; "
                                   "the file is truncated or the header is wrong)",
                                   info.begin, info.end, data_size));
  }
  if (info.end - info.begin != numel * esize) {
    throw header_error(path, name,
                       fmt::format("{} {} needs {} bytes but data_offsets [{}, {}] hold {}",
                                   dtype_safetensors_name(info.dtype), shape_str(info.shape),
                                   numel * esize, info.begin, info.end, info.end - info.begin));
  }
  return info;
}

}  // namespace

SafetensorsHeader safetensors_parse_header(std::string_view header_json, uint64_t data_size,
                                           const std::string& path) {
  Json j;
  json_check_depth(header_json, path);
  try {
    j = Json::parse(header_json.begin(), header_json.end());
  } catch (const Json::exception& e) {
    throw Error(ErrorKind::format, fmt::format("header is not valid JSON: {}", e.what()),
                {.path = path});
  }
  if (!j.is_object()) throw Error(ErrorKind::format, "header is not a JSON object", {.path = path});
  SafetensorsHeader h;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) {
        throw Error(ErrorKind::format, "__metadata__ is not an object", {.path = path});
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          throw Error(ErrorKind::format,
                      fmt::format("__metadata__ value of \"{}\" is not a string", m.key()),
                      {.path = path});
        }
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(it.key(), *it, data_size, path));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const TensorInfo& prev = h.tensors[i - 1];
    const TensorInfo& cur = h.tensors[i];
    // Zero-sized tensors occupy no bytes and overlap nothing.
    if (cur.begin < prev.end && cur.begin != cur.end) {
      throw header_error(path, cur.name,
                         fmt::format("data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]",
                                     cur.begin, cur.end, prev.name, prev.begin, prev.end));
    }
  }
  return h;
}

SafetensorsFile SafetensorsFile::from_buffer(std::shared_ptr<Buffer> bytes,
                                             const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const uint64_t size = bytes->size();
  if (size < 8) {
    throw Error(ErrorKind::format,
                fmt::format("{} bytes is too short for a safetensors file (8-byte header length "
                            "missing; truncated?)",
                            size),
                {.path = path});
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | uint8_t(bytes->data()[i]);
  if (header_len > kMaxHeaderBytes) {
    throw Error(ErrorKind::format,
                fmt::format("header length {} is implausible (limit {}); not a safetensors file?",
                            header_len, kMaxHeaderBytes),
                {.path = path});
  }
  if (header_len > size - 8) {
    throw Error(ErrorKind::format,
                fmt::format("header length {} runs past the end of the file ({} bytes; truncated?)",
                            header_len, size),
                {.path = path});
  }
  std::string_view header(reinterpret_cast<const char*>(bytes->data()) + 8, header_len);
  f.data_start_ = 8 + header_len;
  f.header_ = safetensors_parse_header(header, size - f.data_start_, path);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_[f.header_.tensors[i].name] = i;
  f.bytes_ = std::move(bytes);
  return f;
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  return from_buffer(MappedFile::open(path), path.string());
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (!info) {
    throw Error(ErrorKind::not_found, "no such tensor in the file",
                {.path = path_, .tensor = std::string(name)});
  }
  Tensor t(bytes_, size_t(data_start_ + info->begin), info->dtype, info->shape);
  // Writers pad the header so data is aligned; a file that is not gets a copy rather than
  // unaligned loads.
  if (reinterpret_cast<uintptr_t>(t.raw()) % dtype_size(info->dtype) != 0) return t.clone();
  return t;
}

void safetensors_write(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || header.contains(name)) {
      throw Error(ErrorKind::invalid_argument, "duplicate or reserved tensor name",
                  {.path = path.string(), .tensor = name});
    }
    header[name] = {{"dtype", dtype_safetensors_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h += ' ';  // keeps the data section 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorKind::io, "cannot create file", {.path = path.string()});
  uint64_t n = h.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const auto& [name, t] : tensors) {
    Tensor c = t.contiguous();
    out.write(reinterpret_cast<const char*>(c.raw()), std::streamsize(c.nbytes()));
  }
  if (!out.flush())
    throw Error(ErrorKind::io, "write failed (disk full?)", {.path = path.string()});
}

}  // namespace deg
