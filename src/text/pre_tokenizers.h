// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Split, ByteLevel, Metaspace, Digits,
// Punctuation, Whitespace, WhitespaceSplit and Sequence. They cut the text into pieces (the
// model then tokenizes each piece on its own) and may rewrite them (ByteLevel, Metaspace).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/json.h"
#include "text/normalized.h"

namespace deg::text {

// A piece of the input on its way through the pipeline; token_id >= 0 once an added token
// has claimed it (later stages leave such pieces alone).
struct Piece {
  NormalizedText text;
  int32_t token_id = -1;
};
using Pieces = std::vector<Piece>;

// Replaces every undecided piece by the non-empty pieces fn(NormalizedText&&) returns
// (HF's PreTokenizedString::split).
template <class Fn>
void split_pieces(Pieces& pieces, Fn&& fn) {
  Pieces out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    if (p.token_id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    for (NormalizedText& t : fn(std::move(p.text))) {
      if (!t.empty()) out.push_back({std::move(t), -1});
    }
  }
  pieces = std::move(out);
}

// GPT-2's split, applied by the ByteLevel pre-tokenizer when it has use_regex (and by the BPE
// trainer, so that it counts the words encode will see).
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(Pieces& pieces) const = 0;
};

// Builds the pre-tokenizer described by `j`; null JSON gives nullptr. Throws deg::Error
// (unsupported / format) naming `pointer`.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& pointer);

SplitBehavior parse_split_behavior(const Json& j, const std::string& pointer);

}  // namespace deg::text
