#include "engine/context.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "core/error.h"

namespace deg::engine {

namespace {

// Appends one part; `what` names it in errors.
void append_part(const text::Tokenizer& tokenizer, const BackboneSpec& spec,
                 const std::string& model, const DocumentPart& part, const std::string& what,
                 DocumentContext& ctx) {
  const auto base = int64_t(ctx.text.size());
  if (part.media.empty()) {
    std::optional<std::u32string> cps = schema::utf8_to_code_points(part.text);
    if (!cps) {
      throw Error(ErrorKind::invalid_argument,
                  what + " is not valid UTF-8; convert it (e.g. iconv -t UTF-8) and retry");
    }
    if (part.text.empty()) return;
    // Plain text: a document's "<|im_end|>" is its text, never the template's control token.
    text::Encoding enc = tokenizer.encode(part.text, {.special_tokens = false});
    ctx.ids.insert(ctx.ids.end(), enc.ids.begin(), enc.ids.end());
    for (const auto& [s, e] : enc.offsets) ctx.ranges.push_back({base + s, base + e});
    ctx.soft_rows.resize(ctx.ids.size(), -1);
    ctx.text += *cps;
    return;
  }
  auto m = std::find_if(spec.media.begin(), spec.media.end(),
                        [&](const BackboneSpec::Media& k) { return k.kind == part.media; });
  if (m == spec.media.end()) {
    std::string known;
    for (const auto& k : spec.media) known += (known.empty() ? "" : ", ") + k.kind;
    throw Error(ErrorKind::invalid_argument,
                fmt::format("{}: {} reads no \"{}\" media ({})", what, model, part.media,
                            known.empty() ? "it reads text only" : "it reads: " + known));
  }
  const int64_t C = spec.hidden;
  if (part.rows <= 0 || int64_t(part.embeddings.size()) != part.rows * C) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("{}: {} embeddings must be [rows, {}] (the model's hidden size); got "
                            "{} floats for {} rows",
                            what, part.media, C, part.embeddings.size(), part.rows));
  }
  auto zero_width = [&](int32_t id, int32_t soft_row) {
    ctx.ids.push_back(id);
    ctx.ranges.push_back({base, base});
    ctx.soft_rows.push_back(soft_row);
  };
  const auto first = int32_t(int64_t(ctx.embeddings.size()) / C);
  zero_width(m->open, -1);
  for (int64_t r = 0; r < part.rows; ++r) zero_width(m->placeholder, first + int32_t(r));
  zero_width(m->close, -1);
  ctx.embeddings.insert(ctx.embeddings.end(), part.embeddings.begin(), part.embeddings.end());
}

}  // namespace

DocumentContext document_context(const text::Tokenizer& tokenizer, const BackboneSpec& spec,
                                 const std::string& model, const DocumentParts& parts) {
  DocumentContext ctx;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string what =
        parts.size() == 1 ? "the document" : fmt::format("part {} of the document", i);
    append_part(tokenizer, spec, model, parts[i], what, ctx);
  }
  return ctx;
}

}  // namespace deg::engine
