// Pre-tokenizers; see pre_tokenizers.h. Each class is the HF pre-tokenizer of the same name.
#include "text/pre_tokenizers.h"

#include "core/error.h"
#include "text/pattern.h"
#include "text/regex.h"

namespace deg::text {

namespace {

std::vector<NormalizedText> single(NormalizedText&& t) {
  std::vector<NormalizedText> out;
  out.push_back(std::move(t));
  return out;
}

class Split final : public PreTokenizer {
 public:
  Split(const Json& j, const std::string& pointer)
      : pattern_(j.at("pattern"), pointer + "/pattern"),
        behavior_(parse_split_behavior(j.at("behavior"), pointer + "/behavior")),
        invert_(j.value("invert", false)) {}
  void pre_tokenize(Pieces& pieces) const override {
    split_pieces(pieces, [&](NormalizedText&& t) {
      auto matches = pattern_.find(t.text());
      if (invert_) invert_matches(matches);
      return t.split(matches, behavior_);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(const Json& j, const std::string& pointer)
      : add_prefix_space_(j.value("add_prefix_space", true)),
        use_regex_(j.value("use_regex", true)) {
    if (use_regex_) regex_ = std::make_unique<Regex>(kGpt2SplitPattern, pointer);
  }
  void pre_tokenize(Pieces& pieces) const override {
    split_pieces(pieces, [&](NormalizedText&& t) {
      if (add_prefix_space_ && (t.text().empty() || t.text()[0] != ' ')) t.prepend(" ");
      if (!use_regex_) return single(std::move(t));
      return t.split(regex_->match_ranges(t.text()), SplitBehavior::isolated);
    });
    for (Piece& p : pieces) {
      if (p.token_id < 0) p.text.to_byte_level();
    }
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
  std::unique_ptr<Regex> regex_;
};

enum class PrependScheme { first, never, always };

class Metaspace final : public PreTokenizer {
 public:
  Metaspace(const Json& j, const std::string& pointer) {
    const std::string rep = j.at("replacement").get<std::string>();
    if (rep.empty() || utf8_count(rep) != 1) {
      throw Error(ErrorKind::format, "Metaspace replacement must be one character",
                  {.pointer = pointer + "/replacement"});
    }
    replacement_ = rep;
    size_t i = 0;
    replacement_char_ = utf8_next(rep, i);
    const std::string scheme = j.value("prepend_scheme", std::string("always"));
    scheme_ = scheme == "first"   ? PrependScheme::first
              : scheme == "never" ? PrependScheme::never
                                  : PrependScheme::always;
    if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean() &&
        !j["add_prefix_space"].get<bool>()) {
      scheme_ = PrependScheme::never;
    }
    split_ = j.value("split", true);
  }
  void pre_tokenize(Pieces& pieces) const override {
    split_pieces(pieces, [&](NormalizedText&& t) {
      t.replace(match_chars(t.text(), [](char32_t c) { return c == ' '; }), replacement_);
      const bool starts = t.text().compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::always ||
                      (scheme_ == PrependScheme::first && t.original_range().start == 0))) {
        t.prepend(replacement_);
      }
      if (!split_) return single(std::move(t));
      const char32_t r = replacement_char_;
      return t.split(match_chars(t.text(), [r](char32_t c) { return c == r; }),
                     SplitBehavior::merged_with_next);
    });
  }

 private:
  std::string replacement_;
  char32_t replacement_char_ = 0;
  PrependScheme scheme_ = PrependScheme::always;
  bool split_ = true;
};

class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void pre_tokenize(Pieces& pieces) const override {
    split_pieces(pieces, [&](NormalizedText&& t) {
      return t.split(match_chars(t.text(), is_numeric),
                     individual_ ? SplitBehavior::isolated : SplitBehavior::contiguous);
    });
  }

 private:
  bool individual_;
};

class Punctuation final : public PreTokenizer {
 public:
  explicit Punctuation(SplitBehavior behavior) : behavior_(behavior) {}
  void pre_tokenize(Pieces& pieces) const override {
    split_pieces(pieces, [&](NormalizedText&& t) {
      return t.split(match_chars(t.text(), is_punctuation), behavior_);
    });
  }

 private:
  SplitBehavior behavior_;
};

// HF uses the Rust regex crate here (\w+|[^\w\s]+, inverted, removed); Oniguruma's \w and \s
// agree with it except for rare Other_Alphabetic symbols.
class Whitespace final : public PreTokenizer {
 public:
  explicit Whitespace(const std::string& pointer) : regex_(R"(\w+|[^\w\s]+)", pointer) {}
  void pre_tokenize(Pieces& pieces) const override {
    split_pieces(pieces, [&](NormalizedText&& t) {
      auto matches = regex_.match_ranges(t.text());
      invert_matches(matches);
      return t.split(matches, SplitBehavior::removed);
    });
  }

 private:
  Regex regex_;
};

class WhitespaceSplit final : public PreTokenizer {
 public:
  void pre_tokenize(Pieces& pieces) const override {
    split_pieces(pieces, [&](NormalizedText&& t) {
      return t.split(match_chars(t.text(), is_whitespace), SplitBehavior::removed);
    });
  }
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> items) : items_(std::move(items)) {}
  void pre_tokenize(Pieces& pieces) const override {
    for (const auto& p : items_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> items_;
};

}  // namespace

SplitBehavior parse_split_behavior(const Json& j, const std::string& pointer) {
  const std::string s = j.is_string() ? j.get<std::string>() : "";
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  throw Error(ErrorKind::format,
              "split behavior must be Removed, Isolated, MergedWithPrevious, MergedWithNext "
              "or Contiguous",
              {.pointer = pointer});
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& pointer) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw Error(ErrorKind::format, "a pre-tokenizer must be an object with a string \"type\"",
                {.pointer = pointer});
  }
  const std::string type = j["type"].get<std::string>();
  try {
    if (type == "Split") return std::make_unique<Split>(j, pointer);
    if (type == "ByteLevel") return std::make_unique<ByteLevel>(j, pointer);
    if (type == "Metaspace") return std::make_unique<Metaspace>(j, pointer);
    if (type == "Digits") return std::make_unique<Digits>(j.value("individual_digits", false));
    if (type == "Punctuation") {
      SplitBehavior b = j.contains("behavior")
                            ? parse_split_behavior(j["behavior"], pointer + "/behavior")
                            : SplitBehavior::isolated;
      return std::make_unique<Punctuation>(b);
    }
    if (type == "Whitespace") return std::make_unique<Whitespace>(pointer);
    if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
    if (type == "Sequence") {
      std::vector<std::unique_ptr<PreTokenizer>> items;
      const Json& list = j.at("pretokenizers");
      for (size_t i = 0; i < list.size(); ++i) {
        auto p = make_pre_tokenizer(list[i], pointer + "/pretokenizers/" + std::to_string(i));
        if (p) items.push_back(std::move(p));
      }
      return std::make_unique<Sequence>(std::move(items));
    }
  } catch (const Json::exception& e) {
    throw Error(ErrorKind::format, fmt::format("bad {} pre-tokenizer: {}", type, e.what()),
                {.pointer = pointer});
  }
  throw Error(ErrorKind::unsupported,
              fmt::format("pre-tokenizer type {:?} is not supported (deg handles Split, "
                          "ByteLevel, Metaspace, Digits, Punctuation, Whitespace, "
                          "WhitespaceSplit, Sequence)",
                          type),
              {.pointer = pointer});
}

}  // namespace deg::text
