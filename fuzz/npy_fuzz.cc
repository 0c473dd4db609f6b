// Fuzz target: a .npy file image (media parts, golden fixtures) through the parser, then every
// byte of the tensor it gives is read. Any deg::Error is a correct answer; a crash, a sanitizer
// report or any other exception is a bug.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const deg::Tensor t =
        deg::npy_parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    uint8_t sum = 0;
    for (size_t i = 0; i < t.nbytes(); ++i) sum = uint8_t(sum + uint8_t(t.raw()[i]));
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const deg::Error&) {
  }
  return 0;
}
