// Tokenizer: an HF tokenizer.json run in C++ with the ids and the offsets HF `tokenizers`
// gives. encode() never adds special tokens (HF's add_special_tokens=False); offsets are in
// Unicode code points of the original text (what HF's Python API returns) and in bytes.
//
// Invalid UTF-8 is repaired, not rejected: each maximal invalid subpart reads as U+FFFD (as
// Python's errors="replace" decodes it). Code-point offsets count in that repaired text; byte
// offsets always point into the bytes given to encode().
//
// A Tokenizer is immutable after loading and cheap to copy (shared state); encode and decode
// may run concurrently from any number of threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/json.h"

namespace deg::text {

using Offsets = std::pair<int64_t, int64_t>;  // [start, end)

struct Encoding {
  std::vector<int32_t> ids;
  std::vector<Offsets> offsets;       // code points into the original text
  std::vector<Offsets> byte_offsets;  // the same spans in bytes of the original input
};

struct EncodeOptions {
  // Tokenize the pieces of long texts on the thread pool. Off when the caller already runs
  // one encode per worker; the result is the same either way.
  bool parallel = true;
  // Match special added tokens (<|im_end|>, <bos>, ...) in the text, as HF does by default.
  // false: their text is plain text like any other, so text from outside (a document, a
  // schema's description) can never become a control token of the chat template.
  bool special_tokens = true;
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file, a directory holding one (an HF snapshot), or a deg
  // checkpoint whose deg.json "base" names such a directory. Throws deg::Error (not_found,
  // format, unsupported) with the path and what to do.
  static Tokenizer load(const std::filesystem::path& path);
  // From parsed tokenizer.json content; `what` names it in errors.
  static Tokenizer from_json(const Json& json, const std::string& what);

  Encoding encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Ids to text through the decoder; unknown ids are skipped (as HF does).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // Added tokens first, then the model vocabulary.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // Model vocabulary plus added tokens not in it (HF's get_vocab_size(True)).
  int64_t vocab_size() const;
  // One past the largest id it has (vocab_size() unless the ids leave gaps): the rows of a
  // model's vocabulary its text can come from.
  int64_t id_limit() const;
  const std::string& source() const;  // the file it was loaded from, or `what`

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// The tokenizer.json that `path` stands for (see Tokenizer::load); throws when none.
std::filesystem::path find_tokenizer_json(const std::filesystem::path& path);

}  // namespace deg::text
