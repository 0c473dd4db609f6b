// Normalizers; see normalizers.h. Each class is the HF normalizer of the same name.
#include "text/normalizers.h"

#include <vector>

#include "core/error.h"
#include "text/byte_level.h"
#include "text/pattern.h"

namespace deg::text {

namespace {

class Unicode final : public Normalizer {
 public:
  explicit Unicode(NormForm form) : form_(form) {}
  void normalize(NormalizedText& text) const override { text.normalize(form_); }

 private:
  NormForm form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(NormalizedText& text) const override { text.lowercase(); }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const Json& j, const std::string& pointer)
      : pattern_(j.at("pattern"), pointer + "/pattern"), content_(j.at("content")) {}
  void normalize(NormalizedText& text) const override {
    text.replace(pattern_.find(text.text()), content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string s) : prepend_(std::move(s)) {}
  void normalize(NormalizedText& text) const override { text.prepend(prepend_); }

 private:
  std::string prepend_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(NormalizedText& text) const override { text.strip(left_, right_); }

 private:
  bool left_, right_;
};

class StripAccents final : public Normalizer {
 public:
  void normalize(NormalizedText& text) const override { text.filter_combining_marks(); }
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  void normalize(NormalizedText& text) const override { text.to_byte_level(); }
};

class NormalizerSequence final : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> items)
      : items_(std::move(items)) {}
  void normalize(NormalizedText& text) const override {
    for (const auto& n : items_) n->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> items_;
};

bool bool_field(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : it->get<bool>();
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& pointer) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw Error(ErrorKind::format, "a normalizer must be an object with a string \"type\"",
                {.pointer = pointer});
  }
  const std::string type = j["type"].get<std::string>();
  try {
    if (type == "NFC") return std::make_unique<Unicode>(NormForm::nfc);
    if (type == "NFD") return std::make_unique<Unicode>(NormForm::nfd);
    if (type == "NFKC") return std::make_unique<Unicode>(NormForm::nfkc);
    if (type == "NFKD") return std::make_unique<Unicode>(NormForm::nfkd);
    if (type == "Lowercase") return std::make_unique<Lowercase>();
    if (type == "Replace") return std::make_unique<ReplaceNormalizer>(j, pointer);
    if (type == "Prepend") return std::make_unique<Prepend>(j.at("prepend").get<std::string>());
    if (type == "Strip") {
      return std::make_unique<StripNormalizer>(bool_field(j, "strip_left", true),
                                               bool_field(j, "strip_right", true));
    }
    if (type == "StripAccents") return std::make_unique<StripAccents>();
    if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Normalizer>> items;
      const Json& list = j.at("normalizers");
      for (size_t i = 0; i < list.size(); ++i) {
        auto n = make_normalizer(list[i], pointer + "/normalizers/" + std::to_string(i));
        if (n) items.push_back(std::move(n));
      }
      return std::make_unique<NormalizerSequence>(std::move(items));
    }
  } catch (const Json::exception& e) {
    throw Error(ErrorKind::format, fmt::format("bad {} normalizer: {}", type, e.what()),
                {.pointer = pointer});
  }
  throw Error(ErrorKind::unsupported,
              fmt::format("normalizer type {:?} is not supported (deg handles NFC, NFD, NFKC, "
                          "NFKD, Lowercase, Replace, Prepend, Strip, StripAccents, ByteLevel, "
                          "Sequence)",
                          type),
              {.pointer = pointer});
}

}  // namespace deg::text
