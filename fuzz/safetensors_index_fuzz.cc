// Fuzz target: a sharded snapshot's model.safetensors.index.json text through the index parser
// (which shard holds which tensor; no shard is opened). Any deg::Error is a correct answer; a
// crash, a sanitizer report or any other exception is a bug.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "io/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto shards = deg::safetensors_index_parse(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    for (const auto& [shard, names] : shards) {
      if (shard.empty() || shard.find('/') != std::string::npos || names.empty()) __builtin_trap();
    }
  } catch (const deg::Error&) {
  }
  return 0;
}
