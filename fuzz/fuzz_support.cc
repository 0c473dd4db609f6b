// What tests/tiny_model.cc needs from tests/test_util.cc, without gtest: the fuzz targets that
// build a tiny model (fill, tokenizer encode) link this instead of the test helpers.
#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace deg::testing {

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out)
    throw Error(ErrorKind::io, "cannot write the fuzz target's fixture", {.path = path.string()});
}

}  // namespace deg::testing
