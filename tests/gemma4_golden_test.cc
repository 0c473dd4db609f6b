// Golden tests: deg's Gemma 4 forward against HF transformers' Gemma4ForCausalLM logits
// (soft-capped) and final-norm hidden states on tiny random configs. Metric: max |deg - hf| /
// max |hf| over all [T, V] logits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "backbone_test_util.h"
#include "deg/model_info.h"
#include "io/json.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "model/load.h"
#include "test_util.h"

namespace deg {
namespace {

using testing::rel_max_error;

const char* kGemma4Fixtures[] = {"ssf_shared_f32", "sssf_wide_bf16", "sfssf_multimodal",
                                 "ssf_plain_untied"};

std::vector<int32_t> gemma4_fixture_ids(const std::string& name) {
  return testing::npy_ids(testing::fixture_path("gemma4/" + name + "/ids.npy"));
}

// Each fixture on each backend (CUDA where a GPU is visible).
class Gemma4Golden : public ::testing::TestWithParam<std::tuple<const char*, Device>> {};

TEST_P(Gemma4Golden, LogitsHiddenAndForksMatchHf) {
  // Forks over prefixes shorter and longer than the sliding window; 64-token reads make the
  // sliding tails cross reads.
  const char* name = std::get<0>(GetParam());
  const auto dir = testing::fixture_path(std::string("gemma4/") + name);
  const auto T = int64_t(gemma4_fixture_ids(name).size());
  const double err = testing::expect_matches_hf(dir, {1, T / 2, T - 1}, std::get<1>(GetParam()));
  RecordProperty("logits_rel_max_error", fmt::format("{:.3g}", err));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Gemma4Golden,
                         ::testing::Combine(::testing::ValuesIn(kGemma4Fixtures),
                                            ::testing::ValuesIn(testing::test_devices())),
                         testing::FixtureOnDevice());

// A device backend against the CPU's (instantiated where a GPU is visible).
class Gemma4Backends : public ::testing::TestWithParam<std::tuple<const char*, Device>> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Gemma4Backends);

TEST_P(Gemma4Backends, AgreeWithTheCpu) {
  // sssf_wide_bf16 amplifies rounding ~100x (Gemma4GoldenBf16 below): there two backends' bf16
  // roundings are each held to the fp32 reference instead of to each other.
  const std::string name = std::get<0>(GetParam());
  testing::expect_backend_agrees_with_cpu(testing::fixture_path("gemma4/" + name),
                                          std::get<1>(GetParam()), name != "sssf_wide_bf16");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Gemma4Backends,
                         ::testing::Combine(::testing::ValuesIn(kGemma4Fixtures),
                                            ::testing::ValuesIn(testing::gpu_devices())));

TEST(Gemma4GoldenBf16, DotProductsStayCloseToHfBf16) {
  // bf16 dot products round the activations to bf16 at every projection; HF's bf16 model keeps
  // everything in bf16 (the residual stream too). Both sit well away from the fp32 reference on
  // this 8-layer fixture (a 1e-7 weight change moves its logits ~1e-5: ~100x amplification), and
  // deg's bf16 path must stay closer to it than HF's own bf16 run.
  // On each backend (CUDA also rounds the attention's operands to bf16 for its tensor cores).
  for (Device device : testing::test_devices()) {
    const auto [deg_bf16, hf_bf16] =
        testing::bf16_distances(testing::fixture_path("gemma4/sssf_wide_bf16"), device);
    const std::string on = device == Device::cuda ? "cuda" : "cpu";
    std::cout << "sssf_wide_bf16, bf16 dot products on " << on << ": " << deg_bf16
              << " from fp32 (HF bf16: " << hf_bf16 << ")\n";
    // The CPU keeps the attention in f32 (0.049 on this fixture); CUDA rounds its operands to
    // bf16 as HF's bf16 model does (0.178 on an H200, HF's own 0.218): there only the
    // comparison with HF's bf16 run holds.
    if (device == Device::cpu) {
      EXPECT_LT(deg_bf16, 1e-1) << on;
    }
    EXPECT_LT(deg_bf16, hf_bf16) << on << ": deg bf16 " << deg_bf16 << " vs HF bf16 " << hf_bf16;
    RecordProperty("bf16_rel_max_error_" + on,
                   fmt::format("{:.3g} (HF bf16: {:.3g})", deg_bf16, hf_bf16));
  }
}

TEST(Gemma4GoldenMeta, ParameterCountsMatchPyTorch) {
  // meta.json: num_parameters (torch, tied weights once) and the persistent buffers HF saves
  // beside them (layer_scalar). The file holds exactly those; `deg inspect` counts every stored
  // tensor once.
  for (const char* name : kGemma4Fixtures) {
    const auto dir = testing::fixture_path(std::string("gemma4/") + name);
    Json meta = json_load(dir / "meta.json");
    int64_t buffers = 0;
    for (const auto& [key, n] : meta["saved_buffers"].items()) buffers += n.get<int64_t>();
    auto store = SafetensorsFile::open(dir / "model.safetensors");
    int64_t n = 0;
    for (const TensorInfo& t : store.tensors()) n += shape_numel(t.shape);
    EXPECT_EQ(n, meta["num_parameters"].get<int64_t>() + buffers) << name;
    ModelInfo info = model_info(dir);
    EXPECT_EQ(info.parameters, meta["num_parameters"].get<int64_t>() + buffers) << name;
    EXPECT_EQ(info.text_prefix,
              meta["layout"] == "multimodal" ? "model.language_model." : "model.");
  }
}

}  // namespace
}  // namespace deg

namespace deg {
namespace {

// Soft tokens: media given as embeddings where HF's placeholders stand, against HF
// Gemma4ForConditionalGeneration merging the same features (tools/reference/
// gemma4_soft_fixtures.py: two images and an audio clip, the text pad id 5, window 16).
TEST(Gemma4GoldenSoft, MediaEmbeddingsMatchHfMerge) {
  const auto dir = testing::fixture_path("gemma4/soft_media");
  for (Device device : testing::test_devices()) {
    SCOPED_TRACE(device == Device::cuda ? "cuda" : "cpu");
    // The second image crosses a read.
    auto bb = backbone_open(dir, {.device = device, .read_chunk = 64});
    ASSERT_EQ(bb->spec().soft_id, 5);
    ASSERT_EQ(bb->spec().media.size(), 2u);
    const std::vector<int32_t> ids = testing::npy_ids(dir / "ids.npy");
    const SoftTokens soft = soft_at_placeholders(bb->spec(), ids, npy_read(dir / "soft.npy"));
    const Tensor want = npy_read(dir / "logits.npy");
    Tensor logits = backbone_forward(*bb, ids, true, 0, &soft);
    const double err = rel_max_error(logits, want);
    EXPECT_LT(err, 1e-4);
    RecordProperty(device == Device::cuda ? "logits_rel_max_error_cuda" : "logits_rel_max_error",
                   fmt::format("{:.3g}", err));
    // Forks over trunks that end before, inside and after the media.
    for (int64_t k : {int64_t(10), int64_t(27), int64_t(60), int64_t(ids.size() - 1)}) {
      EXPECT_LT(rel_max_error(backbone_forward(*bb, ids, true, k, &soft), want), 1e-4)
          << "fork at " << k;
    }
    // One read of the whole input: bitwise the same.
    bb->set_options({.device = device, .read_chunk = 4096});
    EXPECT_EQ(rel_max_error(backbone_forward(*bb, ids, true, 0, &soft), logits), 0.0);
    // The placeholders read as plain tokens give other logits: the embeddings mattered.
    EXPECT_GT(rel_max_error(backbone_forward(*bb, ids, true), want), 1e-2);
  }
}

}  // namespace
}  // namespace deg
