// The public tokenizer trainer (deg/tokenizer_train.h) over text::BpeTrainer, and the atomic
// write of its tokenizer.json.
#include "deg/tokenizer_train.h"

#include <fstream>

#include "core/buffer.h"
#include "core/error.h"
#include "text/bpe_train.h"

namespace deg {

namespace fs = std::filesystem;

struct TokenizerTrainer::Impl {
  explicit Impl(const TokenizerTrainOptions& o)
      : trainer({.vocab_size = o.vocab_size,
                 .min_frequency = o.min_frequency,
                 .special_tokens = o.special_tokens}) {}
  text::BpeTrainer trainer;  // not movable: the public class moves its Impl
};

TokenizerTrainer::TokenizerTrainer(const TokenizerTrainOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
TokenizerTrainer::~TokenizerTrainer() = default;
TokenizerTrainer::TokenizerTrainer(TokenizerTrainer&&) noexcept = default;
TokenizerTrainer& TokenizerTrainer::operator=(TokenizerTrainer&&) noexcept = default;

void TokenizerTrainer::add_text(std::string_view text) {
  impl_->trainer.add_text(text);
}

int64_t TokenizerTrainer::add_file(const fs::path& path) {
  const std::string text = read_file(path, kMaxReadFileBytes, "training text");
  impl_->trainer.add_text(text);
  return int64_t(text.size());
}

int64_t TokenizerTrainer::word_count() const {
  return impl_->trainer.word_count();
}
int64_t TokenizerTrainer::unique_words() const {
  return impl_->trainer.unique_words();
}

TrainedTokenizer TokenizerTrainer::train(
    const std::function<void(const TokenizerTrainProgress&)>& on_progress) const {
  const text::BpeVocabulary v = impl_->trainer.train([&](const text::BpeTrainProgress& p) {
    if (on_progress) on_progress({.merges = p.merges, .max_merges = p.max_merges});
  });
  return {.json = text::bpe_tokenizer_json(v),
          .vocab_size = int64_t(v.tokens.size()),
          .merges = int64_t(v.merges.size()),
          .special_tokens = int64_t(v.special_ids.size())};
}

fs::path tokenizer_json_write(const fs::path& dir, const std::string& json) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(ErrorKind::io, fmt::format("cannot create the output directory: {}", ec.message()),
                {.path = dir.string()});
  const fs::path path = dir / "tokenizer.json", tmp = dir / "tokenizer.json.tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << json;
    if (!out.flush())
      throw Error(ErrorKind::io, "cannot write the tokenizer", {.path = tmp.string()});
  }
  fs::rename(tmp, path, ec);  // never a half-written tokenizer.json
  if (ec)
    throw Error(ErrorKind::io, fmt::format("cannot write the tokenizer: {}", ec.message()),
                {.path = path.string()});
  return path;
}

}  // namespace deg
