// Golden tests: deg's Qwen3.5 forward against HF transformers' Qwen3_5ForCausalLM /
// Qwen3_5ForConditionalGeneration logits on tiny random configs (tests/fixtures/qwen35, made by
// tools/reference/qwen35_fixtures.py). Metric: max |deg - hf| / max |hf| over all [T, V] logits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backbone_test_util.h"
#include "io/json.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "kernels/cuda_runtime.h"
#include "model/load.h"
#include "model/qwen35.h"
#include "test_util.h"

namespace deg {
namespace {

using testing::rel_max_error;

const char* kQwen35Fixtures[] = {"lllf_untied", "fl_tied", "lflf_multimodal", "lllf_bf16",
                                 "ll_conv3"};

std::vector<int32_t> qwen35_fixture_ids(const std::string& name) {
  return testing::npy_ids(testing::fixture_path("qwen35/" + name + "/ids.npy"));
}

// Each fixture on each backend (CUDA where a GPU is visible).
class Qwen35Golden : public ::testing::TestWithParam<std::tuple<const char*, Device>> {};

TEST_P(Qwen35Golden, LogitsHiddenAndForksMatchHf) {
  const auto dir = testing::fixture_path(std::string("qwen35/") + std::get<0>(GetParam()));
  const auto T = int64_t(testing::npy_ids(dir / "ids.npy").size());
  const double err = testing::expect_matches_hf(dir, {1, T / 2, T - 1}, std::get<1>(GetParam()));
  RecordProperty("logits_rel_max_error", fmt::format("{:.3g}", err));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Qwen35Golden,
                         ::testing::Combine(::testing::ValuesIn(kQwen35Fixtures),
                                            ::testing::ValuesIn(testing::test_devices())),
                         testing::FixtureOnDevice());

// A device backend against the CPU's (instantiated where a GPU is visible).
class Qwen35Backends : public ::testing::TestWithParam<std::tuple<const char*, Device>> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Qwen35Backends);

TEST_P(Qwen35Backends, AgreeWithTheCpu) {
  testing::expect_backend_agrees_with_cpu(
      testing::fixture_path(std::string("qwen35/") + std::get<0>(GetParam())),
      std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Qwen35Backends,
                         ::testing::Combine(::testing::ValuesIn(kQwen35Fixtures),
                                            ::testing::ValuesIn(testing::gpu_devices())));

TEST(Qwen35Golden, Bf16DotProductsStayCloseToHfBf16) {
  // bf16 dot products round the activations to bf16 at every projection, as HF's bf16 model
  // does; both sit about 1e-2 from the fp32 reference, not 1e-4.
  for (Device device : testing::test_devices()) {
    const auto [deg_bf16, hf_bf16] =
        testing::bf16_distances(testing::fixture_path("qwen35/lllf_bf16"), device);
    EXPECT_LT(deg_bf16, 3e-2);
    EXPECT_LT(deg_bf16, 4 * hf_bf16) << "deg bf16 " << deg_bf16 << " vs HF bf16 " << hf_bf16;
  }
}

TEST(Qwen35Golden, TensorTableCountsHfParameters) {
  // deg's tensor table, built from the fixture's config.json, against PyTorch's parameter count
  // (meta.json: sum of numel over the text model's parameters(), tied weights once): an entry
  // missing, duplicated or of the wrong shape changes the sum. Every entry is in the file with its
  // shape.
  for (const char* name : kQwen35Fixtures) {
    const auto dir = testing::fixture_path(std::string("qwen35/") + name);
    const Qwen35Config cfg = Qwen35Config::from_json(JsonConfig::load(dir / "config.json"));
    auto store = SafetensorsFile::open(dir / "model.safetensors");
    std::map<std::string, Shape> in_file;
    for (const TensorInfo& t : store.tensors()) in_file[t.name] = t.shape;
    int64_t n = 0;
    for (const auto& [tensor, shape] : qwen35_tensor_table(cfg)) {
      n += shape_numel(shape);
      auto it = in_file.find(tensor);  // lm_head.weight
      for (const char* prefix : {"model.", "model.language_model."})
        if (it == in_file.end()) it = in_file.find(prefix + tensor);
      ASSERT_NE(it, in_file.end()) << name << ": " << tensor;
      EXPECT_EQ(it->second, shape) << name << ": " << tensor;
    }
    // Multimodal snapshots count the vision tower too; meta.json then says the text model's.
    const Json meta = json_load(dir / "meta.json");
    EXPECT_EQ(n, meta.value("num_text_parameters", meta["num_parameters"].get<int64_t>())) << name;
  }
}

TEST(Qwen35Cli, ForwardWritesLogitsAndForkAtAgrees) {
  for (Device device : testing::test_devices()) {
    const std::string dev = device == Device::cuda ? "cuda" : "cpu";
    testing::TempDir tmp;
    const auto dir = testing::fixture_path("qwen35/fl_tied");
    auto a = testing::run_deg({"forward", "--model", dir.string(), "--ids-file",
                               (dir / "ids.npy").string(), "--out", (tmp / "a.npy").string(),
                               "--device", dev});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    Tensor expected = npy_read(dir / "logits.npy");
    EXPECT_LT(rel_max_error(npy_read(tmp / "a.npy"), expected), 1e-4) << dev;
    // Text ids file, --fork-at and --hidden.
    std::vector<int32_t> ids = qwen35_fixture_ids("fl_tied");
    std::string text;
    for (int32_t id : ids) text += std::to_string(id) + " ";
    testing::write_text(tmp / "ids.txt", text);
    auto b = testing::run_deg({"forward", "--model", dir.string(), "--ids-file",
                               (tmp / "ids.txt").string(), "--out", (tmp / "b.npy").string(),
                               "--fork-at", "37", "--hidden", "--device", dev});
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_LT(rel_max_error(npy_read(tmp / "b.npy"), npy_read(dir / "hidden.npy")), 1e-4) << dev;
  }
}

TEST(Qwen35Cli, DeviceChoiceIsChecked) {
  testing::TempDir tmp;
  const auto dir = testing::fixture_path("qwen35/fl_tied");
  auto run = [&](const std::string& device) {
    return testing::run_deg({"forward", "--model", dir.string(), "--ids-file",
                             (dir / "ids.npy").string(), "--out", (tmp / "o.npy").string(),
                             "--device", device});
  };
  auto r = run("tpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cpu, cuda or auto"), std::string::npos) << r.err;
  // cuda without a GPU (or without a CUDA build) says so; with one it runs.
  r = run("cuda");
  if (cuda_available()) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
  } else {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << r.err;
  }
  // auto runs wherever it lands.
  r = run("auto");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(Qwen35Cli, BadInputsFailWithAMessage) {
  testing::TempDir tmp;
  const auto dir = testing::fixture_path("qwen35/fl_tied");
  testing::write_text(tmp / "ids.txt", "1 2 x3");
  auto r = testing::run_deg({"forward", "--model", dir.string(), "--ids-file",
                             (tmp / "ids.txt").string(), "--out", (tmp / "o.npy").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("x3"), std::string::npos) << r.err;
  testing::write_text(tmp / "big.txt", "1 2 99999");
  r = testing::run_deg({"forward", "--model", dir.string(), "--ids-file",
                        (tmp / "big.txt").string(), "--out", (tmp / "o.npy").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("vocabulary"), std::string::npos) << r.err;
  r = testing::run_deg({"forward", "--model", tmp.path().string(), "--ids-file",
                        (tmp / "big.txt").string(), "--out", (tmp / "o.npy").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deg
