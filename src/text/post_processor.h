// The post-processor of tokenizer.json ("post_processor"), reduced to what matters when no
// special tokens are added (deg always encodes with add_special_tokens=False): the offset
// trimming of ByteLevel / RobertaProcessing with trim_offsets. TemplateProcessing and
// BertProcessing only add tokens, so they are accepted and do nothing here.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/json.h"

namespace deg::text {

class PostProcessor {
 public:
  // Null JSON gives a processor that does nothing. Throws deg::Error naming `pointer`.
  PostProcessor(const Json& j, const std::string& pointer);

  bool trims() const { return !trims_.empty(); }
  // Trims leading/trailing spaces off each token's offsets (HF's process_offsets), in place.
  // `tokens` are the tokens' strings; `offsets` their [start, end) pairs.
  void trim_offsets(const std::vector<const std::string*>& tokens,
                    std::vector<std::pair<int64_t, int64_t>>& offsets) const;

 private:
  void parse(const Json& j, const std::string& pointer);
  std::vector<bool> trims_;  // one trimming pass per processor, with its add_prefix_space
};

}  // namespace deg::text
