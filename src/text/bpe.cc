// BPE model; see bpe.h. merge_word follows HF's BPE::merge_word (initial symbols, byte
// fallback, unknown fusing) and merge_all its priority-queue merge: the pair with the lowest
// rank merges first, the leftmost on ties.
#include "text/bpe.h"

#include <fmt/format.h>

#include <mutex>
#include <queue>
#include <shared_mutex>

#include "core/error.h"
#include "text/unicode.h"

namespace deg::text {

// (left id, right id) -> (rank, merged id), open addressing on a 64-bit key.
class BpeModel::MergeMap {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t id = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  explicit MergeMap(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    table_.resize(cap);
    mask_ = cap - 1;
  }
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  // Later entries win, as when HF collects the merges into a hash map.
  void put(uint64_t k, uint32_t rank, int32_t id) {
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      if (table_[i].key == kEmpty || table_[i].key == k) {
        table_[i] = {k, rank, id};
        return;
      }
    }
  }
  const Entry* get(uint64_t k) const {
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = table_[i];
      if (e.key == k) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Entry> table_;
  size_t mask_ = 0;
};

// Tokenized words by text, in shards so concurrent encodes rarely contend. Bounded: once a
// shard is full it stops taking new words (as HF's cache does).
class BpeModel::WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kShards = 64;
  static constexpr size_t kPerShard = 4096;

  bool get(std::string_view word, std::vector<WordToken>& out) const {
    const Shard& s = shards_[shard_of(word)];
    std::shared_lock lock(s.mutex);
    auto it = s.map.find(word);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view word, const WordToken* begin, const WordToken* end) {
    if (word.size() >= kMaxWordBytes) return;
    Shard& s = shards_[shard_of(word)];
    std::unique_lock lock(s.mutex);
    if (s.map.size() >= kPerShard) return;
    s.map.emplace(std::string(word), std::vector<WordToken>(begin, end));
  }

 private:
  struct Shard {
    mutable std::shared_mutex mutex;
    std::unordered_map<std::string, std::vector<WordToken>, StringHash, std::equal_to<>> map;
  };
  static size_t shard_of(std::string_view w) {
    return (std::hash<std::string_view>{}(w) >> 7) % kShards;
  }
  Shard shards_[kShards];
};

namespace {

std::string optional_string(const Json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? std::string() : it->get<std::string>();
}

}  // namespace

BpeModel::BpeModel(const Json& model, const std::string& pointer)
    : cache_(std::make_unique<WordCache>()) {
  try {
    const Json& vocab = model.at("vocab");
    if (!vocab.is_object()) {
      throw Error(ErrorKind::format, "BPE vocab must be an object {token: id}",
                  {.pointer = pointer + "/vocab"});
    }
    if (vocab.empty()) {
      throw Error(ErrorKind::format,
                  "the BPE vocabulary is empty, so this tokenizer can encode nothing; use the "
                  "model's own tokenizer.json",
                  {.pointer = pointer + "/vocab"});
    }
    vocab_.reserve(vocab.size());
    int32_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id >= kMaxTokenIds) {
        throw Error(
            ErrorKind::format,
            fmt::format("token id {} is outside [0, {}), the ids deg supports", id, kMaxTokenIds),
            {.pointer = json_pointer_join(pointer + "/vocab", it.key())});
      }
      vocab_[it.key()] = static_cast<int32_t>(id);
      max_id = std::max(max_id, static_cast<int32_t>(id));
    }
    vocab_r_.assign(static_cast<size_t>(max_id + 1), nullptr);
    for (const auto& [token, id] : vocab_) vocab_r_[static_cast<size_t>(id)] = &token;

    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      unk_token_ = model["unk_token"].get<std::string>();
    }
    prefix_ = optional_string(model, "continuing_subword_prefix");
    suffix_ = optional_string(model, "end_of_word_suffix");
    fuse_unk_ = model.value("fuse_unk", false);
    byte_fallback_ = model.value("byte_fallback", false);
    ignore_merges_ = model.value("ignore_merges", false);
    if (model.contains("dropout") && model["dropout"].is_number() &&
        model["dropout"].get<double>() > 0.0) {
      throw Error(ErrorKind::unsupported,
                  "BPE dropout is random at encode time; deg encodes deterministically",
                  {.pointer = pointer + "/dropout"});
    }

    const Json& merges = model.at("merges");
    merges_ = std::make_unique<MergeMap>(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const Json& m = merges[rank];
      std::string a, b;
      if (m.is_string()) {  // legacy "a b"
        const std::string s = m.get<std::string>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          throw Error(ErrorKind::format, "a merge string must be two tokens: \"a b\"",
                      {.pointer = fmt::format("{}/merges/{}", pointer, rank)});
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        throw Error(ErrorKind::format, "a merge must be \"a b\" or [\"a\", \"b\"]",
                    {.pointer = fmt::format("{}/merges/{}", pointer, rank)});
      }
      auto ia = vocab_.find(a), ib = vocab_.find(b);
      std::string merged = a + b.substr(std::min(prefix_.size(), b.size()));
      auto im = vocab_.find(merged);
      if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end()) {
        throw Error(ErrorKind::format,
                    fmt::format("merge {:?} + {:?} uses a token missing from the vocab", a, b),
                    {.pointer = fmt::format("{}/merges/{}", pointer, rank)});
      }
      merges_->put(MergeMap::key(ia->second, ib->second), static_cast<uint32_t>(rank), im->second);
    }
  } catch (const Json::exception& e) {
    throw Error(ErrorKind::format, fmt::format("bad BPE model: {}", e.what()),
                {.pointer = pointer});
  }

  if (byte_fallback_) {
    byte_ids_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
      if (it != vocab_.end()) byte_ids_[static_cast<size_t>(b)] = it->second;
    }
  }
  if (prefix_.empty() && suffix_.empty()) {
    small_char_.assign(0x800, -1);
    std::string s;
    for (char32_t c = 0; c < 0x800; ++c) {
      s.clear();
      utf8_append(s, c);
      auto it = vocab_.find(s);
      if (it != vocab_.end()) small_char_[c] = it->second;
    }
  }
}

BpeModel::~BpeModel() = default;

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

int32_t BpeModel::max_id() const {
  return static_cast<int32_t>(vocab_r_.size()) - 1;  // vocab_r_ holds ids 0 .. the largest
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab_r_.size()) return nullptr;
  return vocab_r_[static_cast<size_t>(id)];
}

std::optional<int32_t> BpeModel::char_id(std::string_view ch, bool first, bool last) const {
  if (!small_char_.empty()) {
    if (ch.size() <= 2) {
      size_t i = 0;
      char32_t c = utf8_next(ch, i);
      int32_t id = small_char_[c];
      if (id < 0) return std::nullopt;
      return id;
    }
    return token_to_id(ch);
  }
  std::string s;
  if (!first) s += prefix_;
  s.append(ch);
  if (last) s += suffix_;
  return token_to_id(s);
}

void BpeModel::merge_word(std::string_view word, std::vector<Symbol>& symbols) const {
  symbols.clear();
  auto add = [&](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, len});
  };
  bool have_unk = false;
  int32_t unk_id = 0;
  uint32_t unk_len = 0;
  auto unk_token_id = [&]() -> int32_t {
    auto id = token_to_id(*unk_token_);
    if (!id) {
      throw Error(ErrorKind::format,
                  fmt::format("unk_token {:?} is not in the vocabulary", *unk_token_));
    }
    return *id;
  };
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    i += std::min(utf8_seq_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const std::string_view ch = word.substr(start, i - start);
    const auto byte_len = static_cast<uint32_t>(ch.size());
    if (auto id = char_id(ch, start == 0, i == word.size())) {
      if (have_unk) {
        add(unk_id, unk_len);
        have_unk = false;
      }
      add(*id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      // The bytes of the char with its prefix/suffix, as HF spells them.
      std::string s;
      if (start != 0) s += prefix_;
      s.append(ch);
      if (i == word.size()) s += suffix_;
      bool all = true;
      for (unsigned char b : s) all &= byte_ids_[b] >= 0;
      if (all) {  // a pending unknown stays pending, as in HF
        for (unsigned char b : s) add(byte_ids_[b], 1);
        continue;
      }
    }
    if (unk_token_) {
      if (have_unk && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (have_unk) add(unk_id, unk_len);
        unk_id = unk_token_id();
        unk_len = byte_len;
        have_unk = true;
      }
    }
  }
  if (have_unk) add(unk_id, unk_len);
  if (!symbols.empty()) symbols.back().next = -1;
  merge_all(symbols);
}

void BpeModel::merge_all(std::vector<Symbol>& symbols) const {
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Candidate& o) const {  // max-heap on "better"
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  if (symbols.size() < 2) return;
  std::vector<Candidate> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Candidate> queue(std::less<Candidate>(), std::move(storage));
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = merges_->get(MergeMap::key(symbols[i].id, symbols[i + 1].id))) {
      queue.push({m->rank, static_cast<int32_t>(i), m->id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(cur.next)];
    const auto* m = merges_->get(MergeMap::key(cur.id, right.id));
    if (!m || m->id != top.new_id) continue;  // an outdated candidate
    cur.id = top.new_id;
    cur.len += right.len;
    right.len = 0;
    cur.next = right.next;
    if (cur.next >= 0) symbols[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0) {
      const Symbol& prev = symbols[static_cast<size_t>(cur.prev)];
      if (const auto* pm = merges_->get(MergeMap::key(prev.id, cur.id))) {
        queue.push({pm->rank, cur.prev, pm->id});
      }
    }
    if (cur.next >= 0) {
      const Symbol& next = symbols[static_cast<size_t>(cur.next)];
      if (const auto* nm = merges_->get(MergeMap::key(cur.id, next.id))) {
        queue.push({nm->rank, top.pos, nm->id});
      }
    }
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<WordToken>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out.push_back({*id, 0, static_cast<uint32_t>(word.size())});
      return;
    }
  }
  if (cache_->get(word, out)) return;
  thread_local std::vector<Symbol> symbols;
  merge_word(word, symbols);
  const size_t first = out.size();
  uint32_t pos = 0;
  for (const Symbol& s : symbols) {
    if (s.len == 0) continue;
    out.push_back({s.id, pos, pos + s.len});
    pos += s.len;
  }
  cache_->put(word, out.data() + first, out.data() + out.size());
}

}  // namespace deg::text
