// Fuzz target: a whole safetensors file image through the parser. Any deg::Error is a correct
// answer; a crash, a sanitizer report or any other exception is a bug.
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto copy = deg::buffer_alloc(size);
  if (size) std::memcpy(copy->data(), data, size);
  try {
    deg::SafetensorsFile f = deg::SafetensorsFile::from_buffer(copy, "fuzz");
    for (const auto& t : f.tensors()) {
      deg::Tensor x = f.tensor(t.name);
      if (x.nbytes()) {
        volatile uint8_t sink = uint8_t(x.raw()[x.nbytes() - 1]);
        (void)sink;
      }
    }
  } catch (const deg::Error&) {
  }
  return 0;
}
