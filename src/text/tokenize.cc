// The public tokenizer (deg/tokenize.h) over text::Tokenizer.
#include "deg/tokenize.h"

#include "text/tokenizer.h"

namespace deg {

struct Tokenizer::Impl {
  text::Tokenizer tokenizer;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  return Tokenizer(std::make_unique<Impl>(Impl{text::Tokenizer::load(path)}));
}

TokenEncoding Tokenizer::encode(std::string_view text) const {
  text::Encoding e = impl_->tokenizer.encode(text);
  return {.ids = std::move(e.ids),
          .offsets = std::move(e.offsets),
          .byte_offsets = std::move(e.byte_offsets)};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->tokenizer.decode(ids, skip_special_tokens);
}

}  // namespace deg
