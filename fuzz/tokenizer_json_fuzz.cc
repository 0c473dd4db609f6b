// Fuzz target: tokenizer.json text through Tokenizer::from_json (model, normalizer,
// pre-tokenizer, post-processor, decoder, added tokens), then a fixed mixed-script text encoded
// with and without special-token matching and the ids decoded back. Any deg::Error is a
// correct answer; a crash, a sanitizer report or any other exception is a bug.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "io/json.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string_view kText =
      "Hello world! Invoice No. 12, total 1,204.50 EUR.\n  caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
      "\xf0\x9f\x98\x80 <|im_end|><s> \xff\xfe end";
  try {
    const deg::Json json =
        deg::json_parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    const deg::text::Tokenizer tok = deg::text::Tokenizer::from_json(json, "fuzz");
    for (bool special : {true, false}) {
      const deg::text::Encoding e =
          tok.encode(kText, {.parallel = false, .special_tokens = special});
      if (e.offsets.size() != e.ids.size() || e.byte_offsets.size() != e.ids.size())
        __builtin_trap();
      for (const auto& [b, end] : e.byte_offsets) {
        if (b < 0 || b > end || end > int64_t(kText.size())) __builtin_trap();
      }
      (void)tok.decode(e.ids, false);
      (void)tok.decode(e.ids, true);
    }
    (void)tok.vocab_size();
    (void)tok.id_to_token(0);
    (void)tok.token_to_id("<|im_end|>");
  } catch (const deg::Error&) {
  }
  return 0;
}
