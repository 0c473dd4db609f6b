// Decoders; see decoders.h. Each class is the HF decoder of the same name.
#include "text/decoders.h"

#include "core/error.h"
#include "text/byte_level.h"
#include "text/pattern.h"
#include "text/unicode.h"

namespace deg::text {

namespace {

// Bytes to text the way Rust's String::from_utf8_lossy does it.
std::string lossy(std::string_view bytes) {
  return utf8_repair(bytes, nullptr);
}

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    const ByteLevelAlphabet& a = byte_level_alphabet();
    std::string bytes;
    for (const std::string& t : tokens) {
      // A token with a char outside the alphabet passes through as its own UTF-8.
      std::string mapped;
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        char32_t c = utf8_next(t, i);
        if (c < a.byte_of_char.size() && a.byte_of_char[c] >= 0) {
          mapped.push_back(static_cast<char>(a.byte_of_char[c]));
        } else {
          ok = false;
        }
      }
      bytes += ok ? mapped : t;
    }
    tokens.assign(1, lossy(bytes));
  }
};

class ByteFallback final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_valid_prefix(pending) == pending.size()) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      int byte = parse_byte(t);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // "<0xNN>" -> NN, else -1 (u8::from_str_radix accepts either case).
  static int parse_byte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class Fuse final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::u32string chars = utf8_to_u32(t);
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start_, chars.size()); ++i) {
        if (chars[i] != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        size_t index = chars.size() - i - 1;
        if (chars[index] != content_) break;
        stop_cut = index;
      }
      std::string out;
      for (size_t i = start_cut; i < stop_cut; ++i) utf8_append(out, chars[i]);
      t = std::move(out);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(const Json& j, const std::string& pointer)
      : pattern_(j.at("pattern"), pointer + "/pattern"),
        content_(j.at("content").get<std::string>()) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      for (const MatchRange& m : pattern_.find(t)) {
        if (m.is_match) {
          out += content_;
        } else {
          out.append(t, m.start, m.end - m.start);
        }
      }
      t = std::move(out);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool prepend)
      : replacement_(replacement), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      for (size_t i = 0; i < t.size();) {
        char32_t c = utf8_next(t, i);
        if (c == replacement_) {
          if (!(k == 0 && prepend_)) out.push_back(' ');
        } else {
          utf8_append(out, c);
        }
      }
      tokens[k] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool prepend_;  // prepend_scheme is not "never": the first token's marker is dropped
};

// BPEDecoder: the end-of-word suffix becomes a space (none after the last token).
class BpeSuffix final : public Decoder {
 public:
  explicit BpeSuffix(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      std::string out;
      const std::string replacement = k + 1 == tokens.size() ? "" : " ";
      for (size_t pos = 0;;) {
        size_t hit = suffix_.empty() ? std::string::npos : t.find(suffix_, pos);
        if (hit == std::string::npos) {
          out.append(t, pos);
          break;
        }
        out.append(t, pos, hit - pos);
        out += replacement;
        pos = hit + suffix_.size();
      }
      t = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class DecoderSequence final : public Decoder {
 public:
  explicit DecoderSequence(std::vector<std::unique_ptr<Decoder>> items)
      : items_(std::move(items)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& d : items_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> items_;
};

char32_t one_char(const Json& j, const std::string& pointer) {
  const std::string s = j.get<std::string>();
  if (utf8_count(s) != 1 || utf8_valid_prefix(s) != s.size()) {
    throw Error(ErrorKind::format, "expected a single character", {.pointer = pointer});
  }
  size_t i = 0;
  return utf8_next(s, i);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& pointer) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw Error(ErrorKind::format, "a decoder must be an object with a string \"type\"",
                {.pointer = pointer});
  }
  const std::string type = j["type"].get<std::string>();
  try {
    if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
    if (type == "ByteFallback") return std::make_unique<ByteFallback>();
    if (type == "Fuse") return std::make_unique<Fuse>();
    if (type == "Strip") {
      return std::make_unique<StripDecoder>(one_char(j.at("content"), pointer + "/content"),
                                            j.at("start").get<size_t>(),
                                            j.at("stop").get<size_t>());
    }
    if (type == "Replace") return std::make_unique<ReplaceDecoder>(j, pointer);
    if (type == "Metaspace") {
      const std::string scheme = j.value("prepend_scheme", std::string("always"));
      bool prepend = scheme != "never";
      if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean() &&
          !j["add_prefix_space"].get<bool>()) {
        prepend = false;
      }
      return std::make_unique<MetaspaceDecoder>(
          one_char(j.at("replacement"), pointer + "/replacement"), prepend);
    }
    if (type == "BPEDecoder") {
      return std::make_unique<BpeSuffix>(j.value("suffix", std::string("</w>")));
    }
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Decoder>> items;
      const Json& list = j.at("decoders");
      for (size_t i = 0; i < list.size(); ++i) {
        auto d = make_decoder(list[i], pointer + "/decoders/" + std::to_string(i));
        if (d) items.push_back(std::move(d));
      }
      return std::make_unique<DecoderSequence>(std::move(items));
    }
  } catch (const Json::exception& e) {
    throw Error(ErrorKind::format, fmt::format("bad {} decoder: {}", type, e.what()),
                {.pointer = pointer});
  }
  throw Error(ErrorKind::unsupported,
              fmt::format("decoder type {:?} is not supported (deg handles ByteLevel, "
                          "ByteFallback, Fuse, Strip, Replace, Metaspace, BPEDecoder, Sequence)",
                          type),
              {.pointer = pointer});
}

}  // namespace deg::text
