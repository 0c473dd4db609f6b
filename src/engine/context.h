// A document's context as the trunk reads it (DESIGN.md §3): text parts tokenized with their
// code-point ranges in the joined text, media parts as the family's open id, one placeholder per
// embedding row (a soft token) and its close id — all zero-width at the part's place, so spans
// never address media.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deg/engine.h"
#include "model/backbone.h"
#include "schema/spans.h"
#include "text/tokenizer.h"

namespace deg::engine {

struct DocumentContext {
  std::vector<int32_t> ids;               // the context tokens
  std::u32string text;                    // code points of the text parts, joined
  std::vector<schema::CharRange> ranges;  // [ids] each token's range in `text`
  std::vector<int32_t> soft_rows;         // [ids] -1, or a row of `embeddings`
  std::vector<float> embeddings;          // [n, C] the media parts' rows, in order
};

// Throws deg::Error (invalid_argument) naming the part (`the document` when there is one) this
// model cannot read: text that is not UTF-8, a media kind `spec` has no markers for, embeddings
// that are not [rows, C]. `model` names the model in messages.
DocumentContext document_context(const text::Tokenizer& tokenizer, const BackboneSpec& spec,
                                 const std::string& model, const DocumentParts& parts);

}  // namespace deg::engine
