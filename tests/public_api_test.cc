// The house rule of STYLE.md §11: the CLI and the server call only the public API in
// include/deg, and the public headers include nothing but each other. This reads their sources'
// #include lines.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace deg {
namespace {

namespace fs = std::filesystem;

// The quoted includes of `path` that start with none of `allowed`.
std::vector<std::string> foreign_includes(const fs::path& path,
                                          const std::vector<std::string>& allowed) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("#include \"")) continue;
    const std::string header = line.substr(10, line.find('"', 10) - 10);
    bool ok = false;
    for (const std::string& prefix : allowed) ok = ok || header.starts_with(prefix);
    if (!ok) out.push_back(header);
  }
  return out;
}

TEST(PublicApi, FrontendsIncludeOnlyThePublicApi) {
  int checked = 0;
  for (const auto& [dir, own] : std::vector<std::pair<std::string, std::string>>{
           {"src/cli", "cli/"}, {"src/server", "server/"}, {"include/deg", "deg/"}}) {
    for (const auto& entry : fs::directory_iterator(testing::source_path(dir))) {
      const std::string name = entry.path().filename().string();
      const auto foreign = foreign_includes(entry.path(), {"deg/", own});
      EXPECT_TRUE(foreign.empty()) << dir << "/" << name << " includes " << foreign.front();
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
  // The check can fail: a library file that includes internals is caught.
  EXPECT_FALSE(foreign_includes(testing::source_path("src/engine/runtime.cc"), {"deg/"}).empty());
}

}  // namespace
}  // namespace deg
