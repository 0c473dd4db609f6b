// Robustness of the plan compiler on real-world schemas (../shared/data/schemas/*.jsonl, subsets
// of JSONSchemaBench): every schema either plans or is rejected with a deg::Error whose JSON
// pointer is non-empty and resolves inside that schema. A floor: the schemas that planned when the
// baseline was taken (tests/fixtures/schema/corpus_rejected.json names the ones that did not)
// must still plan; a failure lists each schema that regressed with its error. Prints the share
// that plans per file (docs/schema.md records them), the most common rejection reasons and the
// schemas that newly plan. DEG_UPDATE_SCHEMA_BASELINE=1 rewrites the baseline from this run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "io/json.h"
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

// The schemas of each corpus file that did not plan when the baseline was taken.
const std::filesystem::path& baseline_path() {
  static const std::filesystem::path p = testing::fixture_path("schema/corpus_rejected.json");
  return p;
}

Json& baseline() {
  static Json b = std::filesystem::exists(baseline_path()) ? json_load(baseline_path()) : Json{};
  return b;
}

// Today's figures beside the floor each file must keep: schemas in the file, schemas that plan.
struct CorpusFloor {
  const char* file;
  int64_t total, planned;
};

void check_corpus(const CorpusFloor& floor) {
  const std::string file = floor.file;
  const auto path = data_dir() / "schemas" / file;
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  std::ifstream in(path);
  std::string line;
  int64_t total = 0, planned = 0;
  std::map<std::string, int> reasons;
  std::map<std::string, std::string> rejected;  // name -> error
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
      rejected[name] = e.what();
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
  EXPECT_EQ(total, floor.total) << file << " changed: take a new baseline";
  std::printf("%s: %lld of %lld schemas plan (%.1f%%; floor %lld)\n", file.c_str(),
              (long long)planned, (long long)total, 100.0 * double(planned) / double(total),
              (long long)floor.planned);
  std::vector<std::pair<int, std::string>> top;
  for (const auto& [r, n] : reasons) top.push_back({n, r});
  std::sort(top.rbegin(), top.rend());
  for (size_t i = 0; i < std::min<size_t>(top.size(), 8); ++i) {
    std::printf("  %5d  %s\n", top[i].first, top[i].second.c_str());
  }
  if (std::getenv("DEG_UPDATE_SCHEMA_BASELINE")) {
    Json names = Json::array();
    for (const auto& [name, why] : rejected) names.push_back(name);
    baseline()[file] = names;
    std::ofstream(baseline_path()) << baseline().dump(1) << "\n";
    return;
  }
  ASSERT_TRUE(baseline().contains(file)) << "no baseline for " << file << " in " << baseline_path();
  std::set<std::string> before;
  for (const auto& n : baseline()[file]) before.insert(n.get<std::string>());
  std::string regressed;
  for (const auto& [name, why] : rejected)
    if (!before.count(name)) regressed += "\n  " + name + ": " + why;
  EXPECT_TRUE(regressed.empty()) << file << ": schemas that planned and no longer do:" << regressed;
  EXPECT_GE(planned, floor.planned) << file;
  for (const std::string& name : before)
    if (!rejected.count(name)) std::printf("  newly plans: %s\n", name.c_str());
}

// Figures of 2026-12-01 (the baseline's run).
TEST(SchemaCorpus, Glaive) {
  check_corpus({"glaive.jsonl", 1707, 1637});
}
TEST(SchemaCorpus, GithubTrivial) {
  check_corpus({"github_trivial.jsonl", 444, 364});
}
TEST(SchemaCorpus, GithubEasy) {
  check_corpus({"github_easy.jsonl", 1943, 1763});
}
TEST(SchemaCorpus, Snowplow) {
  check_corpus({"snowplow.jsonl", 403, 346});
}

}  // namespace
}  // namespace deg::schema
