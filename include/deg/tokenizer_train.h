// Training a byte-level BPE tokenizer (GPT-2 style) from text, part of the public API: what
// `deg tokenizer train` runs. The words of the text are counted once, cut as the tokenizer will
// cut them; then, until the vocabulary is full, the most frequent adjacent pair of tokens becomes
// a new token. The result is an HF tokenizer.json that deg's Tokenizer (deg/tokenize.h) and HF
// `tokenizers` load and encode alike.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace deg {

struct TokenizerTrainOptions {
  // Tokens of the tokenizer: the special tokens, the 256 byte tokens and one per merge.
  int64_t vocab_size = 0;
  // A pair seen fewer times than this is never merged, so the vocabulary may come out smaller
  // than vocab_size on little text.
  int64_t min_frequency = 2;
  // Special tokens (ids 0, 1, ...); their text is cut out of the training text, so no merge
  // reaches across one.
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
};

struct TokenizerTrainProgress {
  int64_t merges = 0;      // learned so far
  int64_t max_merges = 0;  // what vocab_size allows
};

struct TrainedTokenizer {
  std::string json;        // the tokenizer.json; the same text and options give the same bytes
  int64_t vocab_size = 0;  // below the options' when no pair is left of min_frequency
  int64_t merges = 0, special_tokens = 0;
};

// Counts the words of texts, then learns the merges. Not thread-safe; texts may be added any
// number of times before train().
class TokenizerTrainer {
 public:
  // Throws deg::Error (invalid_argument) when the options cannot make a tokenizer: vocab_size
  // below 256 + special tokens, min_frequency below 1, an empty or repeated special token.
  explicit TokenizerTrainer(const TokenizerTrainOptions& options);
  ~TokenizerTrainer();
  TokenizerTrainer(TokenizerTrainer&&) noexcept;
  TokenizerTrainer& operator=(TokenizerTrainer&&) noexcept;

  // Counts the words of `text` (any bytes: invalid UTF-8 reads as U+FFFD, as encode() sees it).
  void add_text(std::string_view text);
  // The same for a file's text (at most 1 GiB); returns its size in bytes. Throws deg::Error
  // naming the file when it cannot be read.
  int64_t add_file(const std::filesystem::path& path);
  int64_t word_count() const;    // words counted so far
  int64_t unique_words() const;  // distinct ones

  // Throws deg::Error (invalid_argument) when no word was counted. `on_progress` is called after
  // every merge.
  TrainedTokenizer train(
      const std::function<void(const TokenizerTrainProgress&)>& on_progress = {}) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Writes DIR/tokenizer.json (DIR made if needed) through a temporary file, so that a failed write
// never leaves a half-written tokenizer.json; returns its path. Throws deg::Error (io) naming the
// path.
std::filesystem::path tokenizer_json_write(const std::filesystem::path& dir,
                                           const std::string& json);

}  // namespace deg
