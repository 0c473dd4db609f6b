// Normalizers of tokenizer.json ("normalizer"): NFC, NFD, NFKC, NFKD, Lowercase, Replace,
// Prepend, Strip, StripAccents, ByteLevel and Sequence. Each edits a NormalizedText in place,
// keeping the alignment to the original text as HF does.
#pragma once

#include <memory>
#include <string>

#include "io/json.h"
#include "text/normalized.h"

namespace deg::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(NormalizedText& text) const = 0;
};

// Builds the normalizer described by `j` (a tokenizer.json "normalizer" object); null JSON
// gives nullptr. Throws deg::Error (unsupported / format) naming `pointer`.
std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& pointer);

}  // namespace deg::text
