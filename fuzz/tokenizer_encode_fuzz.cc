// Fuzz target: arbitrary bytes encoded by real tokenizers (invalid UTF-8, special-token text,
// long runs), checking the offsets invariants, then decoded. The tokenizers are loaded once:
// those $DEG_FUZZ_TOKENIZERS names (':'-separated directories, each holding a tokenizer.json or
// subdirectories that do; default: the source tree's .cache/tokenizers, filled by
// scripts/fetch-test-data; the first input byte picks one), or,
// when there is none, the tiny byte-level tokenizer of the engine tests. Nothing here may
// throw: encode and decode take any bytes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"
#include "tiny_model.h"

#ifndef DEG_SOURCE_DIR
#define DEG_SOURCE_DIR "."
#endif

namespace {

std::vector<deg::text::Tokenizer> load_tokenizers() {
  namespace fs = std::filesystem;
  const char* env = std::getenv("DEG_FUZZ_TOKENIZERS");
  const std::string roots = env ? env : std::string(DEG_SOURCE_DIR) + "/.cache/tokenizers";
  std::vector<fs::path> files;
  std::error_code ec;
  for (size_t at = 0; at <= roots.size();) {
    const size_t colon = std::min(roots.find(':', at), roots.size());
    const fs::path root = roots.substr(at, colon - at);
    at = colon + 1;
    if (fs::exists(root / "tokenizer.json")) {
      files.push_back(root / "tokenizer.json");
      continue;
    }
    for (const auto& e : fs::directory_iterator(root, ec)) {
      if (fs::exists(e.path() / "tokenizer.json")) files.push_back(e.path() / "tokenizer.json");
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<deg::text::Tokenizer> out;
  for (const auto& f : files) out.push_back(deg::text::Tokenizer::load(f));
  if (out.empty()) {
    std::fprintf(stderr, "tokenizer_encode_fuzz: no tokenizer.json under %s; using the tiny one\n",
                 roots.c_str());
    out.push_back(deg::text::Tokenizer::from_json(
        deg::json_parse(deg::testing::tiny_tokenizer_json(), "tiny"), "tiny"));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<deg::text::Tokenizer> tokenizers = load_tokenizers();
  if (size == 0 || size > 4096) return 0;
  const deg::text::Tokenizer& tok = tokenizers[data[0] % tokenizers.size()];
  const bool special = data[0] & 0x80;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const deg::text::Encoding e = tok.encode(text, {.parallel = false, .special_tokens = special});
  if (e.offsets.size() != e.ids.size() || e.byte_offsets.size() != e.ids.size()) __builtin_trap();
  int64_t last = 0;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    const auto [b, end] = e.byte_offsets[i];
    if (b < 0 || b > end || end > int64_t(text.size()) || b < last) __builtin_trap();
    if (e.offsets[i].first < 0 || e.offsets[i].first > e.offsets[i].second) __builtin_trap();
    if (!tok.id_to_token(e.ids[i])) __builtin_trap();
    last = b;
  }
  (void)tok.decode(e.ids, special);
  return 0;
}
