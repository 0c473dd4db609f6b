// Decoders of tokenizer.json ("decoder"): ByteLevel, ByteFallback, Fuse, Strip, Replace,
// Metaspace, BPEDecoder and Sequence. A decoder rewrites the list of token strings; decode()
// joins what the chain leaves.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/json.h"

namespace deg::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// Null JSON gives nullptr. Throws deg::Error (unsupported / format) naming `pointer`.
std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& pointer);

}  // namespace deg::text
