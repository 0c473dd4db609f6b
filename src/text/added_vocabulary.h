// Added tokens of tokenizer.json ("added_tokens"): special and ordinary tokens matched in the
// text before the model sees it, longest match first at the leftmost position, with HF's
// single_word / lstrip / rstrip rules. Tokens with normalized=false are found in the original
// text; normalized ones in each piece after the normalizer ran.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "text/bpe.h"
#include "text/normalizers.h"
#include "text/pre_tokenizers.h"

namespace deg::text {

struct AddedToken {
  std::string content;
  bool special = false;
  bool normalized = true;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

class AddedVocabulary {
 public:
  // Adds `tokens` in order with HF's id rules: a token already in the model vocabulary keeps
  // that id, a new one gets the next free id after the vocabulary.
  void add(const std::vector<AddedToken>& tokens, const BpeModel& model,
           const Normalizer* normalizer);

  // Splits the undecided pieces at added tokens: first those matched on the original text,
  // then (after normalizing each remaining piece) the normalized ones. `special`: special
  // tokens are matched too; false leaves their text as plain text (HF's encode_special_tokens).
  void split_and_normalize(Pieces& pieces, const Normalizer* normalizer, bool special) const;

  std::optional<int32_t> token_to_id(std::string_view content) const;
  // The added token's text (its normalized form when normalization changed it).
  const std::string* id_to_token(int32_t id) const;
  bool is_special_content(std::string_view content) const;
  bool is_special_id(int32_t id) const;
  size_t size() const { return by_content_.size(); }
  int32_t max_id() const;  // the largest id of an added token; -1 when none
  // Number of added tokens whose content is not also in the model vocabulary.
  int64_t count_not_in(const BpeModel& model) const;

 private:
  // Leftmost-longest matcher over a set of strings (a byte trie).
  class Matcher {
   public:
    void build(const std::vector<std::pair<std::string, int32_t>>& patterns);
    bool empty() const { return nodes_.size() <= 1; }
    // Next match at or after `from`: {start, end, id}; false when none.
    bool next(std::string_view text, size_t from, size_t& start, size_t& end, int32_t& id) const;

   private:
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
      int32_t id = -1;
    };
    std::vector<Node> nodes_;
    bool first_byte_[256] = {};
  };

  void split_with(Pieces& pieces, const Matcher& matcher) const;
  void refresh();

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> by_content_;
  std::unordered_map<int32_t, AddedToken> by_id_;
  std::unordered_map<int32_t, std::string> normalized_form_;
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_;
  Matcher raw_;         // normalized=false tokens
  Matcher normalized_;  // normalized=true tokens (by their normalized form)
  Matcher raw_plain_;   // the same two without the special tokens
  Matcher normalized_plain_;
};

}  // namespace deg::text
