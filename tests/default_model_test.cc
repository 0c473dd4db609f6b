// The default model deg ships (models/default, issue #16), through the `deg` binary. In the
// release pass: a real model's fills take seconds at -O0 under the sanitizers.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/json.h"
#include "schema/validate.h"
#include "test_util.h"

namespace deg {
namespace {

namespace fs = std::filesystem;

// The default model ships in models/default (issue #16): `deg fill` finds it without --model,
// and it fills every example with JSON that validates against the example's schema — the same
// bytes on 1 and 2 threads, and the same values when the document is one of a batch of three.
// (Whether the values are right is `make run`'s question, docs/default-model.md.)
TEST(DefaultModel, FillsEveryExampleValidlyTheSameAcrossThreadsAndBatches) {
  ASSERT_TRUE(fs::exists(testing::source_path("models/default/deg.json")));
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(testing::source_path("examples"))) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".schema.json")) continue;
    const std::string stem = name.substr(0, name.size() - std::strlen(".schema.json"));
    SCOPED_TRACE(stem);
    const std::string schema_path = entry.path().string();
    const std::string doc = (entry.path().parent_path() / (stem + ".txt")).string();
    const std::string other = testing::source_path("examples/support.txt").string();
    auto fill = [&](const char* threads, const std::vector<std::string>& docs) {
      std::vector<std::string> args = {"--threads",       threads,    "fill",
                                       "--allow-missing", "--schema", schema_path};
      args.insert(args.end(), docs.begin(), docs.end());
      const auto r = testing::run_deg(args);
      EXPECT_EQ(r.exit_code, 0) << r.err;
      return r.out;
    };
    const std::string one = fill("1", {doc});
    EXPECT_EQ(fill("2", {doc}), one);
    const OrderedJson value = OrderedJson::parse(one);
    const auto why =
        schema::schema_violations(OrderedJson::parse(testing::read_text(entry.path())), value);
    EXPECT_TRUE(why.empty()) << one << "\n" << fmt::format("{}", fmt::join(why, "; "));
    // In a batch (one line a document): the example's line is its value alone.
    const std::string batch = fill("2", {other, doc, other});
    std::vector<std::string> lines;
    for (size_t at = 0; at < batch.size();) {
      const size_t end = batch.find('\n', at);
      lines.push_back(batch.substr(at, end - at));
      at = end == std::string::npos ? batch.size() : end + 1;
    }
    ASSERT_EQ(lines.size(), 3u) << batch;
    EXPECT_EQ(OrderedJson::parse(lines[1]).dump(), value.dump());
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

}  // namespace
}  // namespace deg
