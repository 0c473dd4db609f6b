// Tokenizer: loading tokenizer.json and running the pipeline (HF's encode_single_sequence):
// added tokens and normalizer -> pre-tokenizer -> model per piece -> offsets back to the
// original text -> post-processor offset trimming. Decoding runs the decoder chain.
#include "text/tokenizer.h"

#include <algorithm>

#include "core/config.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "text/added_vocabulary.h"
#include "text/bpe.h"
#include "text/decoders.h"
#include "text/normalizers.h"
#include "text/post_processor.h"
#include "text/pre_tokenizers.h"

namespace deg::text {

namespace fs = std::filesystem;

struct Tokenizer::Impl {
  std::string source;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  AddedVocabulary added;
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<PostProcessor> post;
};

namespace {

// Pieces whose model tokens are computed on worker threads once a text is this long.
constexpr size_t kParallelBytes = 1 << 16;
constexpr size_t kParallelMinPieces = 512;

std::vector<AddedToken> parse_added_tokens(const Json& list) {
  std::vector<AddedToken> out;
  if (list.is_null()) return out;
  if (!list.is_array()) {
    throw Error(ErrorKind::format, "added_tokens must be an array", {.pointer = "/added_tokens"});
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& t = list[i];
    try {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      a.special = t.value("special", false);
      a.normalized = t.value("normalized", !a.special);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.single_word = t.value("single_word", false);
      out.push_back(std::move(a));
    } catch (const Json::exception& e) {
      throw Error(ErrorKind::format, fmt::format("bad added token: {}", e.what()),
                  {.pointer = "/added_tokens/" + std::to_string(i)});
    }
  }
  return out;
}

// Maps byte offsets of valid UTF-8 to the index of the code point holding them (HF's
// BytesToCharOffsetConverter), with its rule for offsets at or past the end.
class CharIndex {
 public:
  explicit CharIndex(std::string_view s) : size_(s.size()) {
    ascii_ = std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
    if (ascii_) return;
    index_.resize(s.size());
    uint32_t ci = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++ci;
      index_[i] = ci;
    }
  }
  Offsets convert(Offsets bytes) const {
    auto [start, end] = bytes;
    if (start < 0 || static_cast<size_t>(start) >= size_) return bytes;  // HF leaves these
    const int64_t cs = at(start);
    int64_t ce;
    if (static_cast<size_t>(end) < size_) {
      ce = at(end);
    } else if (static_cast<size_t>(end) == size_) {
      ce = at(end - 1) + 1;
    } else {
      ce = cs + 1;
    }
    return {cs, ce};
  }

 private:
  int64_t at(int64_t b) const { return ascii_ ? b : index_[static_cast<size_t>(b)]; }
  size_t size_;
  bool ascii_ = true;
  std::vector<uint32_t> index_;
};

// Model tokens of a run of pieces.
struct PieceTokens {
  std::vector<int32_t> ids;
  std::vector<ByteSpan> spans;              // original bytes (in the repaired text)
  std::vector<const std::string*> strings;  // token text, for offset trimming
};

void tokenize_pieces(const BpeModel& model, const Pieces& pieces, size_t begin, size_t end,
                     PieceTokens& out) {
  std::vector<WordToken> word;
  for (size_t k = begin; k < end; ++k) {
    const Piece& p = pieces[k];
    if (p.token_id >= 0) {
      out.ids.push_back(p.token_id);
      out.spans.push_back(p.text.to_original(0, p.text.text().size()));
      out.strings.push_back(&p.text.text());
      continue;
    }
    word.clear();
    model.tokenize(p.text.text(), word);
    for (const WordToken& t : word) {
      out.ids.push_back(t.id);
      out.spans.push_back(p.text.to_original(t.start, t.end));
      out.strings.push_back(model.id_to_token(t.id));
    }
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(const Json& json, const std::string& what) {
  try {
    if (!json.is_object()) throw Error(ErrorKind::format, "tokenizer.json must be an object");
    auto impl = std::make_shared<Impl>();
    impl->source = what;
    const Json null_json;
    auto member = [&](const char* key) -> const Json& {
      auto it = json.find(key);
      return it == json.end() ? null_json : *it;
    };
    const Json& model = member("model");
    const std::string type = model.is_object() ? model.value("type", std::string("BPE")) : "";
    if (type != "BPE") {
      throw Error(ErrorKind::unsupported,
                  fmt::format("model type {:?} is not supported; deg handles BPE tokenizers "
                              "(byte-level and SentencePiece-style with byte_fallback)",
                              type),
                  {.pointer = "/model/type"});
    }
    impl->model = std::make_unique<BpeModel>(model, "/model");
    impl->normalizer = make_normalizer(member("normalizer"), "/normalizer");
    impl->pre_tokenizer = make_pre_tokenizer(member("pre_tokenizer"), "/pre_tokenizer");
    impl->decoder = make_decoder(member("decoder"), "/decoder");
    impl->post = std::make_unique<PostProcessor>(member("post_processor"), "/post_processor");
    impl->added.add(parse_added_tokens(member("added_tokens")), *impl->model,
                    impl->normalizer.get());
    return Tokenizer(std::move(impl));
  } catch (const Error& e) {
    throw e.with_path(what);
  }
}

fs::path find_tokenizer_json(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  if (!fs::is_directory(path, ec)) {
    throw Error(ErrorKind::not_found,
                "no such file or directory; pass --model pointing at an HF snapshot directory "
                "(with tokenizer.json) or at the tokenizer.json file itself",
                {.path = path.string()});
  }
  if (fs::is_regular_file(path / "tokenizer.json", ec)) return path / "tokenizer.json";
  if (fs::is_regular_file(path / "deg.json", ec)) {
    const Json meta = json_load(path / "deg.json");
    const std::string base = meta.is_object() ? meta.value("base", std::string()) : "";
    std::vector<fs::path> candidates;
    if (!base.empty()) {
      candidates.push_back(fs::path(base).is_absolute() ? fs::path(base) : path / base);
      const size_t slash = base.find('/');
      if (slash != std::string::npos && base.find('/', slash + 1) == std::string::npos) {
        // An HF repo id: the hub cache layout models--ORG--NAME/snapshots/<revision>.
        fs::path snapshots = fs::path(env_config().hf_hub) /
                             ("models--" + base.substr(0, slash) + "--" + base.substr(slash + 1)) /
                             "snapshots";
        std::vector<fs::path> revisions;
        if (fs::is_directory(snapshots, ec)) {
          for (const auto& e : fs::directory_iterator(snapshots, ec)) revisions.push_back(e.path());
        }
        std::sort(revisions.begin(), revisions.end());
        candidates.insert(candidates.end(), revisions.begin(), revisions.end());
      }
    }
    for (const fs::path& c : candidates) {
      if (fs::is_regular_file(c / "tokenizer.json", ec)) return c / "tokenizer.json";
    }
    throw Error(
        ErrorKind::not_found,
        fmt::format("this deg checkpoint has no tokenizer.json{}; pass --model pointing "
                    "at its base HF snapshot (the directory with tokenizer.json)",
                    base.empty() ? " and deg.json names no \"base\""
                                 : fmt::format(" and none was found for its base {:?}", base)),
        {.path = path.string()});
  }
  throw Error(ErrorKind::not_found,
              "tokenizer.json not found in this directory; pass --model pointing at an HF "
              "snapshot (with tokenizer.json) or at the tokenizer.json file itself",
              {.path = path.string()});
}

Tokenizer Tokenizer::load(const fs::path& path) {
  const fs::path file = find_tokenizer_json(path);
  return from_json(json_load(file), file.string());
}

Encoding Tokenizer::encode(std::string_view input, const EncodeOptions& options) const {
  const Impl& impl = *impl_;
  Encoding enc;
  std::string repaired;
  std::vector<uint32_t> source_offset;
  std::string_view text = input;
  if (utf8_valid_prefix(input) != input.size()) {
    repaired = utf8_repair(input, &source_offset);
    text = repaired;
  }
  if (text.empty()) return enc;

  Pieces pieces;
  pieces.push_back({NormalizedText(text), -1});
  impl.added.split_and_normalize(pieces, impl.normalizer.get(), options.special_tokens);
  if (impl.pre_tokenizer) impl.pre_tokenizer->pre_tokenize(pieces);

  PieceTokens tokens;
  if (options.parallel && text.size() >= kParallelBytes && pieces.size() >= kParallelMinPieces) {
    const int chunks = std::max(1, std::min<int>(thread_pool().size() * 4, 64));
    std::vector<PieceTokens> parts(static_cast<size_t>(chunks));
    const size_t n = pieces.size();
    parallel_for(chunks, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const size_t lo = n * static_cast<size_t>(c) / static_cast<size_t>(chunks);
        const size_t hi = n * static_cast<size_t>(c + 1) / static_cast<size_t>(chunks);
        tokenize_pieces(*impl.model, pieces, lo, hi, parts[static_cast<size_t>(c)]);
      }
    });
    for (PieceTokens& p : parts) {
      tokens.ids.insert(tokens.ids.end(), p.ids.begin(), p.ids.end());
      tokens.spans.insert(tokens.spans.end(), p.spans.begin(), p.spans.end());
      tokens.strings.insert(tokens.strings.end(), p.strings.begin(), p.strings.end());
    }
  } else {
    tokenize_pieces(*impl.model, pieces, 0, pieces.size(), tokens);
  }

  const size_t n = tokens.ids.size();
  enc.ids = std::move(tokens.ids);
  enc.offsets.resize(n);
  enc.byte_offsets.resize(n);
  const CharIndex chars(text);
  for (size_t i = 0; i < n; ++i) {
    const ByteSpan s = tokens.spans[i];
    enc.byte_offsets[i] = {s.start, s.end};
    enc.offsets[i] = chars.convert({s.start, s.end});
  }
  if (impl.post->trims()) {
    // Trimming counts characters; the byte spans follow the trimmed character spans (HF's
    // byte-offset mode would shift them by the same count and could land inside a char).
    impl.post->trim_offsets(tokens.strings, enc.offsets);
    std::vector<int64_t> char_start;  // byte offset of each code point, plus the end
    for (size_t b = 0; b < text.size(); ++b) {
      if ((static_cast<unsigned char>(text[b]) & 0xC0) != 0x80) char_start.push_back(int64_t(b));
    }
    char_start.push_back(static_cast<int64_t>(text.size()));
    auto to_byte = [&](int64_t c) {
      return char_start[static_cast<size_t>(
          std::clamp<int64_t>(c, 0, int64_t(char_start.size()) - 1))];
    };
    for (size_t i = 0; i < n; ++i) {
      enc.byte_offsets[i] = {to_byte(enc.offsets[i].first), to_byte(enc.offsets[i].second)};
    }
  }
  if (!source_offset.empty()) {
    auto to_source = [&](int64_t b) {
      return static_cast<int64_t>(
          source_offset[std::min(static_cast<size_t>(b), source_offset.size() - 1)]);
    };
    for (Offsets& o : enc.byte_offsets) o = {to_source(o.first), to_source(o.second)};
  }
  return enc;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* s = impl.added.id_to_token(id);
    if (!s) s = impl.model->id_to_token(id);
    if (!s) continue;
    if (skip_special_tokens && impl.added.is_special_content(*s)) continue;
    tokens.push_back(*s);
  }
  std::string out;
  if (impl.decoder) {
    impl.decoder->decode_chain(tokens);
    for (const std::string& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
  }
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.token_to_id(token)) return id;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* s = impl_->added.id_to_token(id);
  if (!s) s = impl_->model->id_to_token(id);
  if (!s) return std::nullopt;
  return *s;
}

bool Tokenizer::is_special(int32_t id) const {
  return impl_->added.is_special_id(id);
}

int64_t Tokenizer::vocab_size() const {
  return impl_->model->vocab_size() + impl_->added.count_not_in(*impl_->model);
}

int64_t Tokenizer::id_limit() const {
  return int64_t(std::max(impl_->model->max_id(), impl_->added.max_id())) + 1;
}

const std::string& Tokenizer::source() const {
  return impl_->source;
}

}  // namespace deg::text
