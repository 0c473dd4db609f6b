// Typed, error-reporting access to HF config.json (and other JSON configs such as deg.json).
// Multimodal snapshots nest the text model's settings under "text_config"; text() gives that
// object when present and the root otherwise, so family code reads one layout.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/json.h"

namespace deg {

class JsonConfig {
 public:
  static JsonConfig load(const std::filesystem::path& path);
  JsonConfig(Json json, std::string path, std::string pointer = "");

  bool has(const std::string& key) const;  // present and not null
  // The value at `key` as T; throws deg::Error naming the file and JSON pointer when it is
  // missing or of the wrong type.
  template <class T>
  T get(const std::string& key) const;
  template <class T>
  T get_or(const std::string& key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }
  // The value at `key` (or `fallback` when absent) within [lo, hi], the range the code
  // supports; throws deg::Error naming the file, the JSON pointer and the range otherwise (NaN
  // and infinities are outside every range).
  template <class T>
  T get_in(const std::string& key, T lo, T hi) const {
    return in_range(key, get<T>(key), lo, hi);
  }
  template <class T>
  T get_or_in(const std::string& key, T fallback, T lo, T hi) const {
    return has(key) ? get_in<T>(key, lo, hi) : fallback;
  }
  JsonConfig sub(const std::string& key) const;  // an object member

  JsonConfig text() const;  // "text_config" when present, else *this
  std::string model_type() const { return get_or<std::string>("model_type", ""); }

  const Json& json() const { return json_; }
  const std::string& path() const { return path_; }
  const std::string& pointer() const { return pointer_; }

 private:
  template <class T>
  T in_range(const std::string& key, T v, T lo, T hi) const {
    if (!(v >= lo && v <= hi))
      throw range_error(key, fmt::format("{}", v), fmt::format("{}", lo), fmt::format("{}", hi));
    return v;
  }
  Error range_error(const std::string& key, const std::string& value, const std::string& lo,
                    const std::string& hi) const;
  Error type_error(const std::string& key, const char* expected) const;
  const Json& at(const std::string& key) const;

  Json json_;
  std::string path_;
  std::string pointer_;
};

template <>
int64_t JsonConfig::get<int64_t>(const std::string& key) const;
template <>
int JsonConfig::get<int>(const std::string& key) const;
template <>
double JsonConfig::get<double>(const std::string& key) const;
template <>
float JsonConfig::get<float>(const std::string& key) const;
template <>
bool JsonConfig::get<bool>(const std::string& key) const;
template <>
std::string JsonConfig::get<std::string>(const std::string& key) const;
template <>
std::vector<std::string> JsonConfig::get<std::vector<std::string>>(const std::string& key) const;
template <>
std::vector<int64_t> JsonConfig::get<std::vector<int64_t>>(const std::string& key) const;

}  // namespace deg
