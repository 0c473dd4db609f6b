// The whole fill on a device backend against the CPU's, over real documents (issue #13): deg
// checkpoints made by `deg init` (checkpoint_init) on tiny random Qwen3.5, LFM2 and Gemma 4
// snapshots (tests/tiny_model.h) fill the dev documents of every task in shared/data (SNIPS,
// ATIS, CoNLL-2003, MIT movie and restaurant, the e-mails; every tenth, or every
// $DEG_DEV_STRIDE-th: all 6,693 take a few minutes a family, mostly the CPU's) with exact f32
// dot products on both backends. Each field must get the
// same value and span, with confidences within 1e-3; a field that does not is listed (its path,
// both answers and confidences) and at most 0.5% of the fields may (two outcomes that tie
// within the backends' rounding). Instantiated where a GPU is visible (scripts/device-test,
// which unpacks the dev data scripts/device-deps packed and names it in $DEG_DATA_DIR; the
// default is ../shared/data beside the tree).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "backbone_test_util.h"
#include "deg/checkpoint.h"
#include "deg/engine.h"
#include "test_util.h"
#include "tiny_model.h"

namespace deg {
namespace {

namespace fs = std::filesystem;

fs::path data_dir() {
  const char* env = std::getenv("DEG_DATA_DIR");
  return env && *env ? fs::path(env) : testing::source_path("../shared/data");
}

struct Task {
  nlohmann::ordered_json schema;
  std::vector<DocumentParts> docs;
};

// Every stride-th document of the task's dev split.
Task read_task(const fs::path& dir, int64_t stride) {
  Task t{.schema = nlohmann::ordered_json::parse(testing::read_text(dir / "schema.json"))};
  std::ifstream in(dir / "dev.jsonl");
  int64_t k = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || k++ % stride != 0) continue;
    const auto j = nlohmann::json::parse(line);
    t.docs.push_back({DocumentPart::of_text(j.at("document").get<std::string>())});
  }
  return t;
}

class FillDevices : public ::testing::TestWithParam<Device> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FillDevices);

TEST_P(FillDevices, DevDocumentsGetTheCpuAnswers) {  // GetParam() is Device::cuda
  const fs::path data = data_dir();
  const char* env = std::getenv("DEG_DEV_STRIDE");
  const int64_t stride = env && *env ? std::max<int64_t>(1, std::atoll(env)) : 10;
  const std::vector<std::string> tasks = {"snips",     "atis",           "conll2003",
                                          "mit_movie", "mit_restaurant", "emails"};
  for (const std::string& task : tasks)
    ASSERT_TRUE(fs::exists(data / task / "dev.jsonl")) << data / task << ": no dev.jsonl";
  testing::TempDir dir;
  testing::write_tiny_qwen35(dir / "qwen35", 3);
  testing::write_tiny_lfm2(dir / "lfm2", 5);
  testing::write_tiny_gemma4(dir / "gemma4", 7);
  int64_t fields = 0, differ = 0;
  for (const char* family_name : {"qwen35", "lfm2", "gemma4"}) {
    const std::string family = family_name;
    checkpoint_init({.base = dir / family, .out = dir / (family + "-deg"), .seed = 9});
    Engine cpu = Engine::open({.model = dir / (family + "-deg"), .device = "cpu", .gemm = "exact"});
    Engine gpu = Engine::open({.model = dir / (family + "-deg"),
                               .device = GetParam() == Device::cuda ? "cuda" : "cpu",
                               .gemm = "exact"});
    for (const std::string& task : tasks) {
      const Task t = read_task(data / task, stride);
      const std::vector<FillResult> a = cpu.fill(t.schema, t.docs), b = gpu.fill(t.schema, t.docs);
      ASSERT_EQ(a.size(), b.size());
      int64_t task_fields = 0, task_differ = 0;
      for (size_t d = 0; d < a.size(); ++d) {
        ASSERT_TRUE(a[d].ok() && b[d].ok()) << family << " " << task << " document " << d
                                            << ": cpu: " << a[d].error << "; cuda: " << b[d].error;
        // A field missing on one side (an array with another item count) counts as differing.
        std::map<std::string, const FieldReport*> on_gpu;
        for (const FieldReport& f : b[d].fields) on_gpu[f.path] = &f;
        for (const FieldReport& g : b[d].fields) {  // on the GPU's side only
          if (std::any_of(a[d].fields.begin(), a[d].fields.end(),
                          [&](const FieldReport& f) { return f.path == g.path; }))
            continue;
          ++task_fields;
          ++task_differ;
          std::cout << family << " " << task << " document " << d << " " << g.path
                    << ": cpu absent, cuda " << g.value.dump() << " (" << g.confidence << ")\n";
        }
        for (const FieldReport& f : a[d].fields) {
          ++task_fields;
          const auto it = on_gpu.find(f.path);
          const FieldReport* g = it == on_gpu.end() ? nullptr : it->second;
          if (g && g->value == f.value && g->span == f.span &&
              std::fabs(g->confidence - f.confidence) <= 1e-3)
            continue;
          ++task_differ;
          std::cout << family << " " << task << " document " << d << " " << f.path << ": cpu "
                    << f.value.dump() << " (" << f.confidence << "), cuda "
                    << (g ? g->value.dump() + " (" + std::to_string(g->confidence) + ")"
                          : std::string("absent"))
                    << "\n";
        }
      }
      std::cout << family << " " << task << ": " << t.docs.size() << " documents, " << task_fields
                << " fields, " << task_differ << " differ\n";
      fields += task_fields;
      differ += task_differ;
    }
  }
  EXPECT_GT(fields, 0);
  EXPECT_LE(double(differ), 0.005 * double(fields)) << differ << " of " << fields << " fields";
}

INSTANTIATE_TEST_SUITE_P(Device, FillDevices, ::testing::ValuesIn(testing::gpu_devices()),
                         [](const auto&) { return std::string("cuda"); });

}  // namespace
}  // namespace deg
