// The whole gpt model's loss and every parameter's gradient on a fixed batch, against PyTorch
// autograd of tools/reference/gpt_reference.py (float64, written from seed 003 and
// modded-nanogpt's track_1_short code). Fixture: tests/fixtures/gpt/.
#include <gtest/gtest.h>

#include <cmath>

#include "backbone_test_util.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/gpt_config.h"
#include "test_util.h"
#include "train/gpt_params.h"
#include "train/gpt_step.h"

namespace deg::train {
namespace {

struct Fixture {
  GptParams params;
  GptBatch batch;
  GptStepOptions options;
};

Fixture load_fixture() {
  const auto dir = testing::fixture_path("gpt");
  const GptConfig c = gpt_config_resolve((dir / "config.json").string());
  Fixture f{GptParams::load(c, dir / "weights.safetensors"), {}, {}};
  const Json b = json_load(dir / "batch.json");
  f.batch.inputs = b["inputs"].get<std::vector<int32_t>>();
  f.batch.targets = b["targets"].get<std::vector<int32_t>>();
  f.batch.prefix = b["prefix"].get<std::vector<int32_t>>();
  f.batch.seg_start = b["seg_start"].get<std::vector<int32_t>>();
  f.options = {.mtp_weights = b["mtp_weights"].get<std::vector<float>>(),
               .prefix_weight = b["prefix_weight"].get<float>(),
               .window_short = b["window_short"].get<int64_t>(),
               .window_long = b["window_long"].get<int64_t>()};
  return f;
}

// On every backend the build and machine have (the CPU; CUDA where a GPU is visible): the same
// one definition of the model, each backend's ops.
TEST(TrainGptReference, LossAndEveryGradientMatchPyTorch) {
  Fixture f = load_fixture();
  const SafetensorsFile expected =
      SafetensorsFile::open(testing::fixture_path("gpt/expected.safetensors"));
  const double ref_loss = std::stod(expected.metadata().at("loss"));
  std::vector<ParamTensor> cpu_grads;
  for (Device device : testing::test_devices()) {
    SCOPED_TRACE(device == Device::cuda ? "cuda" : "cpu");
    f.options.device = device;
    auto grads = f.params.zeros_like();
    const double loss = gpt_loss_and_grad(f.params, f.batch, f.options, grads);
    EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));
    EXPECT_NEAR(gpt_loss(f.params, f.batch, f.options), loss, 1e-6 * std::fabs(loss));
    // Gradients: max |deg - torch| <= 1e-4 x the tensor's largest |gradient|; on CUDA, the
    // same bound against the CPU backend's.
    for (size_t k = 0; k < grads.size(); ++k) {
      const ParamTensor& g = grads[k];
      const std::vector<float> ref = expected.tensor("grad." + g.name).to_f32_vector();
      ASSERT_EQ(ref.size(), g.data.size()) << g.name;
      float rmax = 0, err = 0, cpu_err = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        rmax = std::max(rmax, std::fabs(ref[i]));
        err = std::max(err, std::fabs(ref[i] - g.data[i]));
        if (!cpu_grads.empty())
          cpu_err = std::max(cpu_err, std::fabs(cpu_grads[k].data[i] - g.data[i]));
      }
      EXPECT_GT(rmax, 0.0f) << g.name << " has no reference gradient";
      EXPECT_LE(err, 1e-4f * rmax) << g.name << ": max error " << err << " of max " << rmax;
      EXPECT_LE(cpu_err, 1e-4f * rmax) << g.name << ": " << cpu_err << " from the CPU's";
    }
    if (cpu_grads.empty()) cpu_grads = std::move(grads);
  }
}

}  // namespace
}  // namespace deg::train
