// Added tokens; see added_vocabulary.h. Mirrors HF's AddedVocabulary (add_tokens,
// find_matches, split_with_indices, extract_and_normalize).
#include "text/added_vocabulary.h"

#include <algorithm>

namespace deg::text {

namespace {

// Regex-crate \w / \s at the edges of the text around a match.
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return is_word_char(utf8_next(s, i));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return is_word_char(utf8_next(s, i));
}

// Start of the whitespace run that ends `s` (s.size() when none).
size_t space_leftmost_at_end(std::string_view s) {
  size_t start = s.size();
  size_t i = s.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    size_t k = j;
    if (!is_whitespace(utf8_next(s, k))) break;
    start = j;
    i = j;
  }
  return start;
}

// Length of the whitespace run that starts `s`.
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t k = i;
    if (!is_whitespace(utf8_next(s, k))) break;
    i = k;
  }
  return i;
}

}  // namespace

void AddedVocabulary::Matcher::build(const std::vector<std::pair<std::string, int32_t>>& patterns) {
  nodes_.assign(1, Node{});
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (const auto& [pattern, id] : patterns) {
    if (pattern.empty()) continue;
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
    int32_t node = 0;
    for (unsigned char b : pattern) {
      auto& next = nodes_[static_cast<size_t>(node)].next;
      auto it = std::lower_bound(next.begin(), next.end(), b,
                                 [](const auto& e, unsigned char v) { return e.first < v; });
      if (it != next.end() && it->first == b) {
        node = it->second;
      } else {
        const auto child = static_cast<int32_t>(nodes_.size());
        next.insert(it, {b, child});
        nodes_.emplace_back();
        node = child;
      }
    }
    nodes_[static_cast<size_t>(node)].id = id;
  }
}

bool AddedVocabulary::Matcher::next(std::string_view text, size_t from, size_t& start, size_t& end,
                                    int32_t& id) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    int32_t node = 0;
    size_t best_end = 0;
    int32_t best_id = -1;
    for (size_t j = i; j < text.size(); ++j) {
      const auto& next = nodes_[static_cast<size_t>(node)].next;
      const auto b = static_cast<unsigned char>(text[j]);
      auto it = std::lower_bound(next.begin(), next.end(), b,
                                 [](const auto& e, unsigned char v) { return e.first < v; });
      if (it == next.end() || it->first != b) break;
      node = it->second;
      if (nodes_[static_cast<size_t>(node)].id >= 0) {
        best_end = j + 1;
        best_id = nodes_[static_cast<size_t>(node)].id;
      }
    }
    if (best_id >= 0) {
      start = i;
      end = best_end;
      id = best_id;
      return true;
    }
  }
  return false;
}

void AddedVocabulary::add(const std::vector<AddedToken>& tokens, const BpeModel& model,
                          const Normalizer* normalizer) {
  const int64_t vocab_size = model.vocab_size();
  int64_t next_id = vocab_size;
  if (!by_id_.empty()) {
    int64_t max_id = 0;
    for (const auto& [id, t] : by_id_) max_id = std::max<int64_t>(max_id, id);
    next_id = (max_id >= vocab_size || vocab_size == 0) ? max_id + 1 : vocab_size;
  }
  for (const AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    if (auto it = by_content_.find(token.content); it != by_content_.end()) {
      const AddedToken& old = by_id_[it->second];
      if (old.content == token.content && old.special == token.special &&
          old.normalized == token.normalized && old.lstrip == token.lstrip &&
          old.rstrip == token.rstrip && old.single_word == token.single_word) {
        continue;
      }
    }
    int32_t id;
    if (auto existing = token_to_id(token.content)) {
      id = *existing;
    } else if (auto in_model = model.token_to_id(token.content)) {
      id = *in_model;
    } else {
      id = static_cast<int32_t>(next_id++);
    }
    if (token.normalized && normalizer) {
      NormalizedText t(token.content);
      normalizer->normalize(t);
      if (t.text() != token.content) normalized_form_[id] = t.text();
    }
    by_content_[token.content] = id;
    if (token.special) special_.insert(token.content);
    by_id_[id] = token;
  }
  refresh();
}

void AddedVocabulary::refresh() {
  for (const bool special : {true, false}) {
    std::vector<std::pair<std::string, int32_t>> raw, normalized;
    for (const auto& [id, token] : by_id_) {
      if (token.special && !special) continue;
      if (token.normalized) {
        auto it = normalized_form_.find(id);
        normalized.emplace_back(it != normalized_form_.end() ? it->second : token.content, id);
      } else {
        raw.emplace_back(token.content, id);
      }
    }
    // Deterministic build order (a trie does not depend on it, but duplicates do).
    std::sort(raw.begin(), raw.end());
    std::sort(normalized.begin(), normalized.end());
    (special ? raw_ : raw_plain_).build(raw);
    (special ? normalized_ : normalized_plain_).build(normalized);
  }
}

void AddedVocabulary::split_with(Pieces& pieces, const Matcher& matcher) const {
  // HF re-slices every piece to its whole normalized range even when nothing matches, which
  // moves its original range to what its alignments say.
  if (matcher.empty()) {
    for (Piece& p : pieces) {
      if (p.token_id < 0) p.text.reslice_whole();
    }
    return;
  }
  Pieces out;
  out.reserve(pieces.size());
  for (Piece& piece : pieces) {
    if (piece.token_id >= 0) {
      out.push_back(std::move(piece));
      continue;
    }
    const std::string& s = piece.text.text();
    size_t start_offset = 0;
    size_t from = 0, start = 0, stop = 0;
    int32_t id = -1;
    auto push = [&](size_t a, size_t b, int32_t token) {
      if (a >= b) return;  // HF slices and then drops empty pieces
      out.push_back({piece.text.slice(a, b), token});
    };
    bool found_any = false;
    while (matcher.next(s, from, start, stop, id)) {
      from = stop;  // the scan resumes after the raw match, whatever is decided below
      const AddedToken& token = by_id_.at(id);
      if (token.single_word) {
        const bool start_space =
            start == 0 || !ends_with_word(std::string_view(s).substr(0, start));
        const bool stop_space =
            stop == s.size() || !starts_with_word(std::string_view(s).substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (token.lstrip) {
        start = std::max(space_leftmost_at_end(std::string_view(s).substr(0, start)), start_offset);
      }
      if (token.rstrip) stop += space_rightmost_at_start(std::string_view(s).substr(stop));
      if (start_offset < start) push(start_offset, start, -1);
      push(start, stop, id);
      start_offset = stop;
      found_any = true;
    }
    if (!found_any) {
      piece.text.reslice_whole();
      out.push_back(std::move(piece));
      continue;
    }
    if (start_offset < s.size()) push(start_offset, s.size(), -1);
  }
  pieces = std::move(out);
}

void AddedVocabulary::split_and_normalize(Pieces& pieces, const Normalizer* normalizer,
                                          bool special) const {
  split_with(pieces, special ? raw_ : raw_plain_);
  if (normalizer) {
    for (Piece& p : pieces) {
      if (p.token_id < 0) normalizer->normalize(p.text);
    }
    std::erase_if(pieces, [](const Piece& p) { return p.token_id < 0 && p.text.empty(); });
  }
  split_with(pieces, special ? normalized_ : normalized_plain_);
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::id_to_token(int32_t id) const {
  if (auto it = normalized_form_.find(id); it != normalized_form_.end()) return &it->second;
  if (auto it = by_id_.find(id); it != by_id_.end()) return &it->second.content;
  return nullptr;
}

bool AddedVocabulary::is_special_content(std::string_view content) const {
  return special_.find(content) != special_.end();
}

bool AddedVocabulary::is_special_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it != by_id_.end() && is_special_content(it->second.content);
}

int32_t AddedVocabulary::max_id() const {
  int32_t m = -1;
  for (const auto& [content, id] : by_content_) m = std::max(m, id);
  return m;
}

int64_t AddedVocabulary::count_not_in(const BpeModel& model) const {
  int64_t n = 0;
  for (const auto& [content, id] : by_content_) n += !model.token_to_id(content).has_value();
  return n;
}

}  // namespace deg::text
