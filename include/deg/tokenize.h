// A model's tokenizer.json, run exactly as HF tokenizers runs it: what `deg tokenize` and
// `deg detokenize` print.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deg {

struct TokenEncoding {
  std::vector<int32_t> ids;
  std::vector<std::pair<int64_t, int64_t>> offsets;       // [start, end) code points of the text
  std::vector<std::pair<int64_t, int64_t>> byte_offsets;  // the same spans in bytes
};

class Tokenizer {
 public:
  // `path`: a tokenizer.json file, a directory holding one (an HF snapshot), or a deg checkpoint
  // whose deg.json "base" names such a directory. Throws deg::Error with the path and what to do.
  static Tokenizer load(const std::filesystem::path& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // No special tokens added; special-token strings in the text (<|im_start|>) become their ids;
  // invalid UTF-8 reads as U+FFFD.
  TokenEncoding encode(std::string_view text) const;
  // Ids to text through the decoder, as HF's decode(ids, skip_special_tokens); unknown ids are
  // skipped.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deg
