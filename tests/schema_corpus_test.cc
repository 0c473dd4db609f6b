// Robustness of the plan compiler on real-world schemas (../shared/data/schemas/*.jsonl, subsets
// of JSONSchemaBench): every schema either plans or is rejected with a deg::Error whose JSON
// pointer is non-empty and resolves inside that schema. Prints the share that plans per file
// (docs/schema.md records them) and the most common rejection reasons.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "core/error.h"
#include "schema/plan.h"
#include "test_util.h"

namespace deg::schema {
namespace {

std::filesystem::path data_dir() {
  return testing::source_path("../shared/data");
}

// The reason of a rejection without its specifics (numbers, names), for the summary.
std::string reason_of(const Error& e) {
  std::string m = e.message();
  m = m.substr(0, std::min(m.find_first_of("({\"0123456789"), size_t(70)));
  return std::string(error_kind_name(e.kind())) + ": " + m;
}

void check_corpus(const std::string& file) {
  const auto path = data_dir() / "schemas" / file;
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  std::ifstream in(path);
  std::string line;
  int64_t total = 0, planned = 0;
  std::map<std::string, int> reasons;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++total;
    const OrderedJson record = OrderedJson::parse(line);
    const OrderedJson& schema = record.at("schema");
    const std::string name = record.at("name").get<std::string>();
    try {
      const Plan plan = plan_compile(schema);
      ++planned;
      EXPECT_GT(plan.units, 0) << name;
    } catch (const Error& e) {
      const std::string& pointer = e.context().pointer;
      EXPECT_FALSE(pointer.empty()) << name << ": " << e.what();
      bool resolves = false;
      try {
        resolves = schema.contains(OrderedJson::json_pointer(pointer));
      } catch (const std::exception&) {
      }
      EXPECT_TRUE(resolves) << name << ": pointer " << pointer << " of: " << e.what();
      EXPECT_TRUE(e.kind() == ErrorKind::unsupported || e.kind() == ErrorKind::format)
          << name << ": " << e.what();
      ++reasons[reason_of(e)];
    }
  }
  EXPECT_GT(total, 100);
  std::printf("%s: %lld of %lld schemas plan (%.1f%%)\n", file.c_str(), (long long)planned,
              (long long)total, 100.0 * double(planned) / double(total));
  std::vector<std::pair<int, std::string>> top;
  for (const auto& [r, n] : reasons) top.push_back({n, r});
  std::sort(top.rbegin(), top.rend());
  for (size_t i = 0; i < std::min<size_t>(top.size(), 8); ++i) {
    std::printf("  %5d  %s\n", top[i].first, top[i].second.c_str());
  }
}

TEST(SchemaCorpus, Glaive) {
  check_corpus("glaive.jsonl");
}
TEST(SchemaCorpus, GithubTrivial) {
  check_corpus("github_trivial.jsonl");
}
TEST(SchemaCorpus, GithubEasy) {
  check_corpus("github_easy.jsonl");
}
TEST(SchemaCorpus, Snowplow) {
  check_corpus("snowplow.jsonl");
}

}  // namespace
}  // namespace deg::schema
