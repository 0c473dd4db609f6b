// Post-processor offset trimming; see post_processor.h.
#include "text/post_processor.h"

#include "core/error.h"
#include "text/byte_level.h"
#include "text/unicode.h"

namespace deg::text {

PostProcessor::PostProcessor(const Json& j, const std::string& pointer) {
  parse(j, pointer);
}

void PostProcessor::parse(const Json& j, const std::string& pointer) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw Error(ErrorKind::format, "a post-processor must be an object with a string \"type\"",
                {.pointer = pointer});
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel" || type == "RobertaProcessing") {
    if (j.value("trim_offsets", true)) trims_.push_back(j.value("add_prefix_space", true));
    return;
  }
  if (type == "TemplateProcessing" || type == "BertProcessing") return;
  if (type == "Sequence") {
    const Json& list = j.at("processors");
    for (size_t i = 0; i < list.size(); ++i) {
      parse(list[i], pointer + "/processors/" + std::to_string(i));
    }
    return;
  }
  throw Error(ErrorKind::unsupported,
              fmt::format("post-processor type {:?} is not supported (deg handles ByteLevel, "
                          "RobertaProcessing, TemplateProcessing, BertProcessing, Sequence)",
                          type),
              {.pointer = pointer});
}

void PostProcessor::trim_offsets(const std::vector<const std::string*>& tokens,
                                 std::vector<std::pair<int64_t, int64_t>>& offsets) const {
  const char32_t space = byte_level_alphabet().char_of_byte[' '];
  auto is_space = [&](char32_t c) { return c == space || is_whitespace(c); };
  for (bool add_prefix_space : trims_) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::u32string chars = utf8_to_u32(*tokens[i]);
      int64_t leading = 0, trailing = 0;
      while (leading < int64_t(chars.size()) && is_space(chars[size_t(leading)])) ++leading;
      while (trailing < int64_t(chars.size()) &&
             is_space(chars[chars.size() - 1 - size_t(trailing)])) {
        ++trailing;
      }
      auto& [start, end] = offsets[i];
      if (leading > 0) {
        const bool is_first = i == 0 || start == 0;
        if (is_first && add_prefix_space && leading == 1) leading = 0;
        start = std::min(start + leading, end);
      }
      if (trailing > 0 && end >= trailing) end = std::max(end - trailing, start);
    }
  }
}

}  // namespace deg::text
