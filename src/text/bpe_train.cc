// BPE training; see bpe_train.h. Words are stored once each, with their count, as runs of token
// ids in one array; a pair's count is the sum of the counts of the words holding it, times the
// times it occurs there. A merge rewrites only the words that hold its pair (found through a
// pair -> words index) and adjusts the counts of the pairs next to each occurrence. The best pair
// comes from a max-heap whose entries may be stale: an entry is trusted only when its count
// equals the pair's current count, and re-queued with that count otherwise.
#include "text/bpe_train.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/json.h"
#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/pre_tokenizers.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace deg::text {

using WordCounts = std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>>;

struct BpeTrainer::Counts {
  Counts() : split(kGpt2SplitPattern, "GPT-2 split pattern") {}
  Regex split;
  WordCounts words;
  int64_t total = 0;
};

namespace {

using PairKey = uint64_t;  // left id << 32 | right id: ordered as the pair (left, right)

PairKey pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}
int32_t pair_left(PairKey k) {
  return int32_t(k >> 32);
}
int32_t pair_right(PairKey k) {
  return int32_t(k & 0xffffffffu);
}

// The next special token in `text` at or after `from`: the leftmost, the longest of those
// starting there (as added tokens are matched at encode time). {npos, 0} when none.
std::pair<size_t, size_t> next_special(std::string_view text, size_t from,
                                       const std::vector<std::string>& specials) {
  size_t best = std::string_view::npos, best_len = 0;
  for (const std::string& s : specials) {
    const size_t at = text.find(s, from);
    if (at < best || (at == best && at != std::string_view::npos && s.size() > best_len)) {
      best = at;
      best_len = s.size();
    }
  }
  return {best, best_len};
}

// Chunks of text counted on one thread at a time.
constexpr size_t kChunkBytes = size_t(1) << 20;

bool ascii_graphic(char c) {
  return c > ' ' && c < 0x7f;
}

// Cuts `segment` into pieces of about kChunkBytes, each cut just after a newline that has an
// ASCII graphic character on either side. No GPT-2 split crosses such a point: the newline is a
// word of its own there (\s+(?!\S) cannot end before the graphic character, \s+ takes the
// newline alone), and the pattern looks neither behind nor, past the newline, ahead of it.
void cut_chunks(std::string_view segment, std::vector<std::string_view>& chunks) {
  while (segment.size() > kChunkBytes) {
    size_t cut = segment.find('\n', kChunkBytes);
    while (cut != std::string_view::npos && cut + 1 < segment.size() &&
           !(ascii_graphic(segment[cut - 1]) && ascii_graphic(segment[cut + 1])))
      cut = segment.find('\n', cut + 1);
    if (cut == std::string_view::npos || cut + 1 >= segment.size()) break;
    chunks.push_back(segment.substr(0, cut + 1));
    segment.remove_prefix(cut + 1);
  }
  if (!segment.empty()) chunks.push_back(segment);
}

// Adds the words of `text` (valid UTF-8) to `counts`; returns how many it found. The split's
// matches cover the text, but gaps are counted too, as the ByteLevel split keeps them.
int64_t count_words(const Regex& split, std::string_view text,
                    std::vector<std::pair<uint32_t, uint32_t>>& spans, WordCounts& counts) {
  spans.clear();
  split.find_all(text, spans);
  int64_t n = 0;
  auto count = [&](size_t begin, size_t end) {
    if (end <= begin) return;
    const std::string_view w = text.substr(begin, end - begin);
    auto it = counts.find(w);
    if (it == counts.end()) it = counts.emplace(std::string(w), 0).first;
    ++it->second;
    ++n;
  };
  size_t last = 0;
  for (const auto& [s, e] : spans) {
    count(last, s);
    count(s, e);
    last = e;
  }
  count(last, text.size());
  return n;
}

// The training state: words as id runs, pair counts, the pair -> words index and the heap.
class Merger {
 public:
  Merger(const WordCounts& words, const std::vector<int32_t>& id_of_byte) {
    // Sorted words, so that word indices (and so the work done) never depend on hashing.
    std::vector<const std::pair<const std::string, int64_t>*> sorted;
    sorted.reserve(words.size());
    for (const auto& w : words)
      if (w.first.size() > 1) sorted.push_back(&w);  // one byte: no pair, nothing to merge
    std::sort(sorted.begin(), sorted.end(), [](auto* x, auto* y) { return x->first < y->first; });
    for (const auto* w : sorted) {
      const auto word = int32_t(count_.size());
      start_.push_back(int64_t(ids_.size()));
      len_.push_back(uint32_t(w->first.size()));
      count_.push_back(w->second);
      for (unsigned char c : w->first) ids_.push_back(id_of_byte[c]);
      for (size_t i = 0; i + 1 < w->first.size(); ++i) {
        const int64_t at = start_.back() + int64_t(i);
        add(pair_key(ids_[size_t(at)], ids_[size_t(at + 1)]), w->second, word);
      }
    }
    for (const auto& [key, count] : pair_count_) heap_.push({count, key});
  }

  // The pair to merge next: the highest count, then the smallest (left, right); count 0 when
  // no pair is left.
  std::pair<PairKey, int64_t> best() {
    while (!heap_.empty()) {
      const Entry e = heap_.top();
      const auto it = pair_count_.find(e.key);
      const int64_t now = it == pair_count_.end() ? 0 : it->second;
      if (now == e.count) return {e.key, e.count};
      heap_.pop();
      // Counts only fall until a merge creates the pair anew, and then it is queued again with
      // its new count; so a lower stale entry has a current one above it.
      if (now > 0 && now < e.count) heap_.push({now, e.key});
    }
    return {0, 0};
  }

  // Replaces every occurrence of `key` (left to right, not overlapping) by `merged`.
  void merge(PairKey key, int32_t merged) {
    const int32_t a = pair_left(key), b = pair_right(key);
    std::vector<int32_t> words = std::move(words_of_[key]);
    words_of_.erase(key);
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    touched_.clear();
    for (const int32_t w : words) {
      int32_t* s = ids_.data() + start_[size_t(w)];
      const uint32_t n = len_[size_t(w)];
      const int64_t c = count_[size_t(w)];
      uint32_t out = 0;
      for (uint32_t r = 0; r < n;) {
        if (r + 1 < n && s[r] == a && s[r + 1] == b) {
          if (out > 0) {
            add(pair_key(s[out - 1], a), -c, w);
            add(pair_key(s[out - 1], merged), c, w);
          }
          if (r + 2 < n) {
            add(pair_key(b, s[r + 2]), -c, w);
            add(pair_key(merged, s[r + 2]), c, w);
          }
          s[out++] = merged;
          r += 2;
        } else {
          s[out++] = s[r++];
        }
      }
      len_[size_t(w)] = out;
    }
    pair_count_.erase(key);
    std::sort(touched_.begin(), touched_.end());
    touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
    for (const PairKey k : touched_) {
      const auto it = pair_count_.find(k);
      if (it != pair_count_.end() && it->second > 0) heap_.push({it->second, k});
    }
  }

 private:
  struct Entry {
    int64_t count;
    PairKey key;
    // Max-heap order: the higher count first, then the smaller pair.
    bool operator<(const Entry& o) const {
      return count != o.count ? count < o.count : key > o.key;
    }
  };

  // Adds `delta` to the pair's count; a pair that grows lists `word` and is queued again.
  void add(PairKey key, int64_t delta, int32_t word) {
    int64_t& n = pair_count_[key];
    n += delta;
    if (delta <= 0) return;
    std::vector<int32_t>& ws = words_of_[key];
    if (ws.empty() || ws.back() != word) ws.push_back(word);
    touched_.push_back(key);
  }

  std::vector<int32_t> ids_;    // every word's token ids, back to back
  std::vector<int64_t> start_;  // per word: where its ids start
  std::vector<uint32_t> len_;   // per word: ids left (shrinks as merges apply)
  std::vector<int64_t> count_;  // per word: times it was counted
  std::unordered_map<PairKey, int64_t> pair_count_;
  // Words that held the pair at some point (a superset: merging skips words without it).
  std::unordered_map<PairKey, std::vector<int32_t>> words_of_;
  std::priority_queue<Entry> heap_;
  std::vector<PairKey> touched_;  // pairs that grew during the current merge
};

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainOptions options)
    : options_(std::move(options)), counts_(std::make_unique<Counts>()) {
  const auto specials = int64_t(options_.special_tokens.size());
  if (options_.vocab_size < 256 + specials)
    throw Error(
        ErrorKind::invalid_argument,
        fmt::format("a vocabulary of {} tokens cannot hold the 256 byte tokens and {} "
                    "special token{}; ask for at least {} (a few thousand or more to "
                    "learn useful merges)",
                    options_.vocab_size, specials, specials == 1 ? "" : "s", 256 + specials));
  if (options_.vocab_size > kMaxTokenIds)
    throw Error(ErrorKind::invalid_argument,
                fmt::format("a vocabulary of {} tokens is more than deg supports ({})",
                            options_.vocab_size, kMaxTokenIds));
  if (options_.min_frequency < 1)
    throw Error(ErrorKind::invalid_argument,
                fmt::format("the minimum pair frequency must be at least 1 (got {})",
                            options_.min_frequency));
  const auto& alphabet = byte_level_alphabet();
  std::unordered_set<std::string> seen;
  for (const std::string& s : options_.special_tokens) {
    if (s.empty()) throw Error(ErrorKind::invalid_argument, "a special token cannot be empty");
    if (!seen.insert(s).second)
      throw Error(ErrorKind::invalid_argument, fmt::format("special token {:?} is given twice", s));
    if (std::find(alphabet.utf8_of_byte.begin(), alphabet.utf8_of_byte.end(), s) !=
        alphabet.utf8_of_byte.end())
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("special token {:?} is already one of the 256 byte tokens; "
                              "pick a longer string such as \"<|{}|>\"",
                              s, s));
  }
}

BpeTrainer::~BpeTrainer() = default;

void BpeTrainer::add_text(std::string_view text) {
  std::string repaired;
  if (utf8_valid_prefix(text) != text.size()) {
    repaired = utf8_repair(text, nullptr);
    text = repaired;
  }
  // Segments between special tokens are encoded apart, so they are counted apart; each is cut
  // further into chunks of about kChunkBytes where no GPT-2 split crosses, counted in parallel.
  std::vector<std::string_view> chunks;
  for (size_t from = 0; from <= text.size();) {
    const auto [at, len] = next_special(text, from, options_.special_tokens);
    const size_t end = std::min(at, text.size());
    cut_chunks(text.substr(from, end - from), chunks);
    if (at == std::string_view::npos) break;
    from = at + len;
  }
  std::mutex mutex;
  parallel_for(int64_t(chunks.size()), [&](int64_t begin, int64_t end) {
    WordCounts local;
    std::vector<std::pair<uint32_t, uint32_t>> spans;
    int64_t total = 0;
    for (int64_t i = begin; i < end; ++i)
      total += count_words(counts_->split, chunks[size_t(i)], spans, local);
    std::lock_guard lock(mutex);
    counts_->total += total;
    if (counts_->words.empty()) {
      counts_->words = std::move(local);
      return;
    }
    for (auto& [w, n] : local) counts_->words[w] += n;
  });
}

int64_t BpeTrainer::word_count() const {
  return counts_->total;
}
int64_t BpeTrainer::unique_words() const {
  return int64_t(counts_->words.size());
}
std::map<std::string, int64_t> BpeTrainer::word_counts() const {
  return {counts_->words.begin(), counts_->words.end()};
}

BpeVocabulary BpeTrainer::train(
    const std::function<void(const BpeTrainProgress&)>& on_progress) const {
  if (counts_->total == 0)
    throw Error(ErrorKind::invalid_argument,
                "there is no text to train on (the input is empty or holds only special "
                "tokens); pass files with text");
  BpeVocabulary v;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> id_of;
  auto add_token = [&](std::string s) {
    const auto id = int32_t(v.tokens.size());
    id_of.emplace(s, id);
    v.tokens.push_back(std::move(s));
    return id;
  };
  for (const std::string& s : options_.special_tokens) v.special_ids.push_back(add_token(s));
  const auto& alphabet = byte_level_alphabet();
  std::vector<int32_t> id_of_byte(256);
  for (char32_t c = 0; c < alphabet.byte_of_char.size(); ++c) {  // GPT-2's order: by character
    const int b = alphabet.byte_of_char[c];
    if (b >= 0) id_of_byte[size_t(b)] = add_token(alphabet.utf8_of_byte[size_t(b)]);
  }

  Merger merger(counts_->words, id_of_byte);
  BpeTrainProgress progress{.max_merges = options_.vocab_size - int64_t(v.tokens.size())};
  while (int64_t(v.tokens.size()) < options_.vocab_size) {
    const auto [key, count] = merger.best();
    if (count < options_.min_frequency) break;
    const int32_t a = pair_left(key), b = pair_right(key);
    std::string merged = v.tokens[size_t(a)] + v.tokens[size_t(b)];
    // Two merge paths can spell the same string ("ab" + "c", "a" + "bc"): one token for both.
    const auto it = id_of.find(merged);
    const int32_t id = it != id_of.end() ? it->second : add_token(std::move(merged));
    v.merges.emplace_back(a, b);
    merger.merge(key, id);
    progress.merges = int64_t(v.merges.size());
    if (on_progress) on_progress(progress);
  }
  return v;
}

std::string bpe_tokenizer_json(const BpeVocabulary& v) {
  // The ByteLevel sections as HF's trainer writes them: trim_offsets does nothing in a
  // pre-tokenizer; in the post-processor false keeps each token's offsets over its leading space
  // (as GPT-2's tokenizer.json does).
  auto byte_level = [](bool trim_offsets) {
    return OrderedJson{{"type", "ByteLevel"},
                       {"add_prefix_space", false},
                       {"trim_offsets", trim_offsets},
                       {"use_regex", true}};
  };
  OrderedJson added = OrderedJson::array();
  for (const int32_t id : v.special_ids)
    added.push_back({{"id", id},
                     {"content", v.tokens[size_t(id)]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  // Appended to the object's vector directly: its operator[] searches the keys, O(n) each, and
  // the tokens are distinct already.
  OrderedJson vocab = OrderedJson::object();
  auto& entries = vocab.get_ref<OrderedJson::object_t&>();
  entries.reserve(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) entries.emplace_back(v.tokens[i], i);
  OrderedJson merges = OrderedJson::array();
  for (const auto& [a, b] : v.merges) merges.push_back({v.tokens[size_t(a)], v.tokens[size_t(b)]});
  const OrderedJson j = {{"version", "1.0"},
                         {"truncation", nullptr},
                         {"padding", nullptr},
                         {"added_tokens", added},
                         {"normalizer", nullptr},
                         {"pre_tokenizer", byte_level(true)},
                         {"post_processor", byte_level(false)},
                         {"decoder", byte_level(false)},
                         {"model",
                          {{"type", "BPE"},
                           {"dropout", nullptr},
                           {"unk_token", nullptr},
                           {"continuing_subword_prefix", nullptr},
                           {"end_of_word_suffix", nullptr},
                           {"fuse_unk", false},
                           {"byte_fallback", false},
                           {"ignore_merges", false},
                           {"vocab", vocab},
                           {"merges", merges}}}};
  return j.dump(2) + "\n";
}

}  // namespace deg::text
