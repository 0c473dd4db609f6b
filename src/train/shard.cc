// `deg shard`'s library side (include/deg/train.h): text files -> modded-nanogpt token shards +
// data.json, with the tokenizer.json copied next to them (pretrain copies it into its checkpoint).
#include <fstream>

#include "core/buffer.h"
#include "core/error.h"
#include "deg/train.h"
#include "text/tokenizer.h"
#include "train/data.h"

namespace deg::train {
namespace fs = std::filesystem;

ShardTextResult shard_text_files(const ShardTextOptions& o) {
  const text::Tokenizer tok = text::Tokenizer::load(o.tokenizer);
  if (tok.vocab_size() > 65536)
    throw Error(ErrorKind::unsupported,
                fmt::format("the tokenizer has {} tokens; token shards store uint16 ids (at "
                            "most 65536): use a smaller vocabulary",
                            tok.vocab_size()),
                {o.tokenizer.string()});
  ShardTextResult r;
  r.separator = o.separator;
  if (r.separator.empty()) {
    for (const char* s : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<s>", "<bos>"})
      if (tok.token_to_id(s)) {
        r.separator = s;
        break;
      }
  }
  const auto id = r.separator.empty() ? std::nullopt : tok.token_to_id(r.separator);
  if (!id)
    throw Error(ErrorKind::invalid_argument,
                "no end-of-text token found in the tokenizer; pass --separator TOKEN",
                {o.tokenizer.string()});
  r.bos_id = *id;
  fs::create_directories(o.out_dir);
  // Documents of `files` into <prefix>_000000.bin, ...; returns the token count.
  auto run = [&](const std::vector<fs::path>& files, const std::string& prefix) {
    std::vector<uint16_t> buf;
    int index = 0;
    int64_t total = 0;
    auto flush = [&] {
      if (buf.empty()) return;
      shard_write(o.out_dir / fmt::format("{}_{:06}.bin", prefix, index++), buf);
      total += int64_t(buf.size());
      buf.clear();
    };
    for (const auto& f : files) {
      const std::string text = read_file(f);
      size_t begin = 0;
      while (begin <= text.size()) {
        size_t end = text.find(r.separator, begin);
        if (end == std::string::npos) end = text.size();
        const std::string_view doc(text.data() + begin, end - begin);
        if (!doc.empty()) {
          buf.push_back(uint16_t(r.bos_id));
          for (int32_t t : tok.encode(doc).ids) buf.push_back(uint16_t(t));
          ++r.documents;
          if (int64_t(buf.size()) >= o.shard_tokens) flush();
        }
        begin = end + r.separator.size();
      }
    }
    flush();
    return total;
  };
  r.train_tokens = run(o.train_files, "train");
  r.val_tokens = run(o.val_files, "val");
  data_info_write(o.out_dir, {.bos_id = r.bos_id, .vocab_size = tok.vocab_size()});
  fs::copy_file(text::find_tokenizer_json(o.tokenizer), o.out_dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  return r;
}

}  // namespace deg::train
