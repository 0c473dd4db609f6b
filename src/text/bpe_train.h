// Training a GPT-2 style byte-level BPE tokenizer from text (`deg tokenizer train`): words are
// counted once with the encoder's own pre-tokenization (special tokens cut out, then GPT-2's split
// regex), then merges are learned greedily, the most frequent adjacent pair of the counted words
// first, with pair counts updated incrementally after each merge. The result is written as an HF
// tokenizer.json that deg's Tokenizer and HF `tokenizers` both load and encode alike.
//
// This is not HF's BpeTrainer: no dropout, no limit on the alphabet, no continuing-subword
// prefix; the alphabet is always the 256 byte tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deg::text {

struct BpeTrainOptions {
  // Tokens of the trained tokenizer: the special tokens, the 256 byte tokens and one per merge.
  int64_t vocab_size = 0;
  // A pair seen fewer times than this (summed over the counted words) is never merged, so the
  // vocabulary may come out smaller than vocab_size on little text.
  int64_t min_frequency = 2;
  // Added as special tokens (ids 0, 1, ...); their text is cut out of the training text, so no
  // merge reaches across one.
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
};

// A byte-level BPE vocabulary. From the trainer, ids are: the special tokens, then the 256 byte
// tokens in the order of their alphabet characters (GPT-2's order), then one token per new
// merged string.
struct BpeVocabulary {
  std::vector<std::string> tokens;   // by id; byte tokens in the byte-level alphabet (Ġ for ' ')
  std::vector<int32_t> special_ids;  // written as added tokens; the trainer's are 0, 1, ...
  std::vector<std::pair<int32_t, int32_t>> merges;  // by rank: the ids merged
};

struct BpeTrainProgress {
  int64_t merges = 0;      // learned so far
  int64_t max_merges = 0;  // what vocab_size allows
};

// Counts words of texts, then learns the merges. Not thread-safe; add_text may be called any
// number of times before train().
class BpeTrainer {
 public:
  // Throws deg::Error (invalid_argument) when the options cannot make a tokenizer: vocab_size
  // below 256 + special tokens, min_frequency below 1, an empty or repeated special token.
  explicit BpeTrainer(BpeTrainOptions options);
  ~BpeTrainer();
  BpeTrainer(const BpeTrainer&) = delete;
  BpeTrainer& operator=(const BpeTrainer&) = delete;

  // Counts the words of `text` (any bytes: invalid UTF-8 reads as U+FFFD, as encode() sees it).
  void add_text(std::string_view text);
  int64_t word_count() const;    // words counted so far
  int64_t unique_words() const;  // distinct ones
  // Every distinct word (raw bytes, before the byte-level mapping) with its count; for tests.
  std::map<std::string, int64_t> word_counts() const;

  // Throws deg::Error (invalid_argument) when no word was counted. `on_progress` is called
  // after every merge.
  BpeVocabulary train(const std::function<void(const BpeTrainProgress&)>& on_progress = {}) const;

 private:
  struct Counts;
  BpeTrainOptions options_;
  std::unique_ptr<Counts> counts_;
};

// The tokenizer.json of a trained vocabulary: model BPE (vocab + merges), ByteLevel
// pre-tokenizer (add_prefix_space false, use_regex true), ByteLevel post-processor (no offset
// trimming) and decoder, the special tokens as added tokens. Deterministic: the same vocabulary
// gives the same bytes.
std::string bpe_tokenizer_json(const BpeVocabulary& vocabulary);

}  // namespace deg::text
