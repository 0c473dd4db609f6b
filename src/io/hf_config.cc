#include "io/hf_config.h"

#include <cmath>
#include <limits>

namespace deg {

JsonConfig JsonConfig::load(const std::filesystem::path& path) {
  Json j = json_load(path);
  if (!j.is_object()) {
    throw Error(ErrorKind::format, "expected a JSON object at the top level",
                {.path = path.string()});
  }
  return JsonConfig(std::move(j), path.string());
}

JsonConfig::JsonConfig(Json json, std::string path, std::string pointer)
    : json_(std::move(json)), path_(std::move(path)), pointer_(std::move(pointer)) {}

bool JsonConfig::has(const std::string& key) const {
  auto it = json_.find(key);
  return it != json_.end() && !it->is_null();
}

const Json& JsonConfig::at(const std::string& key) const {
  auto it = json_.find(key);
  if (it == json_.end() || it->is_null()) {
    throw Error(ErrorKind::not_found, "required key missing",
                {.path = path_, .pointer = json_pointer_join(pointer_, key)});
  }
  return *it;
}

Error JsonConfig::range_error(const std::string& key, const std::string& value,
                              const std::string& lo, const std::string& hi) const {
  return Error(ErrorKind::unsupported,
               fmt::format("{} is outside [{}, {}], the range deg supports for {}; fix the config",
                           value, lo, hi, key),
               {.path = path_, .pointer = json_pointer_join(pointer_, key)});
}

Error JsonConfig::type_error(const std::string& key, const char* expected) const {
  return Error(ErrorKind::format,
               fmt::format("expected {}, found {}", expected, json_type_name(at(key))),
               {.path = path_, .pointer = json_pointer_join(pointer_, key)});
}

template <>
int64_t JsonConfig::get<int64_t>(const std::string& key) const {
  const Json& v = at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  // Some configs write integers as 1024.0.
  if (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>() &&
      std::fabs(v.get<double>()) < 9.0e15) {
    return int64_t(v.get<double>());
  }
  throw type_error(key, "an integer");
}

template <>
int JsonConfig::get<int>(const std::string& key) const {
  int64_t v = get<int64_t>(key);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    throw Error(ErrorKind::format, fmt::format("integer {} out of range", v),
                {.path = path_, .pointer = json_pointer_join(pointer_, key)});
  }
  return int(v);
}

template <>
double JsonConfig::get<double>(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_number()) throw type_error(key, "a number");
  return v.get<double>();
}

template <>
float JsonConfig::get<float>(const std::string& key) const {
  return float(get<double>(key));
}

template <>
bool JsonConfig::get<bool>(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_boolean()) throw type_error(key, "true or false");
  return v.get<bool>();
}

template <>
std::string JsonConfig::get<std::string>(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_string()) throw type_error(key, "a string");
  return v.get<std::string>();
}

template <>
std::vector<std::string> JsonConfig::get<std::vector<std::string>>(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_array()) throw type_error(key, "an array of strings");
  std::vector<std::string> out;
  for (const Json& e : v) {
    if (!e.is_string()) throw type_error(key, "an array of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

template <>
std::vector<int64_t> JsonConfig::get<std::vector<int64_t>>(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_array()) throw type_error(key, "an array of integers");
  std::vector<int64_t> out;
  for (const Json& e : v) {
    if (!e.is_number_integer()) throw type_error(key, "an array of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

JsonConfig JsonConfig::sub(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_object()) throw type_error(key, "an object");
  return JsonConfig(v, path_, json_pointer_join(pointer_, key));
}

JsonConfig JsonConfig::text() const {
  return has("text_config") ? sub("text_config") : *this;
}

}  // namespace deg
