// Fuzz target: a deg checkpoint's deg.json text through the meta reader. Any deg::Error is a
// correct answer; a crash, a sanitizer report or any other exception is a bug.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "model/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const deg::CheckpointMeta m = deg::checkpoint_meta_parse(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/deg.json");
    if (m.array_mode != "anchor" && m.array_mode != "index") __builtin_trap();
  } catch (const deg::Error&) {
  }
  return 0;
}
