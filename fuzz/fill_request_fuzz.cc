// Fuzz target: one fill request line (`deg fill --jsonl`: a string, {"document": ...} or
// {"parts": [...]}) through document_from_line, with file parts refused (no parts root) and
// small limits so the limit checks are reached. Any deg::Error is a correct answer; a crash, a
// sanitizer report or any other exception is a bug.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "deg/engine.h"
#include "deg/input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const deg::PartsAccess access{};  // an empty root refuses every file part
  const deg::InputLimits limits{
      .document_bytes = 256, .line_bytes = 4096, .parts = 8, .media_bytes = 4096};
  try {
    const deg::DocumentParts parts = deg::document_from_line(
        std::string_view(reinterpret_cast<const char*>(data), size), access, limits, "fuzz");
    if (int64_t(parts.size()) > limits.parts) __builtin_trap();
    int64_t bytes = 0;
    for (const deg::DocumentPart& p : parts) bytes += int64_t(p.text.size());
    if (bytes > limits.document_bytes) __builtin_trap();
  } catch (const deg::Error&) {
  }
  return 0;
}
