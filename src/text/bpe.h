// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocabulary, merge ranks, byte
// fallback (<0xNN> tokens), unknown-token fusing, ignore_merges and subword prefix/suffix, as
// HF's BPE applies them. Words seen before come from a bounded, thread-safe cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/json.h"

namespace deg::text {

// Hash for string-keyed maps that are looked up with string_views.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// One model token: its id and the byte range it covers in the word.
struct WordToken {
  int32_t id;
  uint32_t start;
  uint32_t end;
};

// Token ids a tokenizer.json may use: [0, kMaxTokenIds) (the id -> token table is dense).
inline constexpr int64_t kMaxTokenIds = int64_t(1) << 24;  // 16,777,216

class BpeModel {
 public:
  // Throws deg::Error (format) naming `pointer` for a malformed model.
  BpeModel(const Json& model, const std::string& pointer);
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the tokens of `word` (one pre-tokenized piece) to `out`; thread-safe.
  void tokenize(std::string_view word, std::vector<WordToken>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when unknown
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  int32_t max_id() const;  // the largest id of the vocabulary; -1 when empty

 private:
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len;  // bytes of the word; 0 once merged into its left neighbour
  };
  class MergeMap;
  class WordCache;

  void merge_word(std::string_view word, std::vector<Symbol>& symbols) const;
  void merge_all(std::vector<Symbol>& symbols) const;
  std::optional<int32_t> char_id(std::string_view ch, bool first, bool last) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<const std::string*> vocab_r_;  // id -> token (nullptr for gaps)
  std::unique_ptr<MergeMap> merges_;
  std::unique_ptr<WordCache> cache_;
  std::optional<std::string> unk_token_;
  std::string prefix_;  // continuing_subword_prefix ("" when none)
  std::string suffix_;  // end_of_word_suffix ("" when none)
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> byte_ids_;    // <0xNN> token ids, -1 when absent (byte_fallback)
  std::vector<int32_t> small_char_;  // id of a lone char below U+0800 when no affix, -2 unset
};

}  // namespace deg::text
