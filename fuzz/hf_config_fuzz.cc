// Fuzz target: config.json text through every family's config reader (qwen3_5, lfm2, gemma4,
// gpt) and its tensor table, the way model loading reads it. Any deg::Error is a correct answer;
// a crash, a sanitizer report or any other exception is a bug.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/json.h"
#include "model/gemma4.h"
#include "model/gpt.h"
#include "model/gpt_config.h"
#include "model/lfm2.h"
#include "model/qwen35.h"

namespace {

template <class F>
void expect_error_or_ok(F&& f) {
  try {
    f();
  } catch (const deg::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  deg::Json json;
  try {
    json = deg::json_parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const deg::Error&) {
    return 0;
  }
  if (!json.is_object()) return 0;
  const deg::JsonConfig root(json, "fuzz");
  expect_error_or_ok([&] {
    (void)root.text().model_type();
    (void)deg::gpt_handles(root.json());
  });
  expect_error_or_ok([&] { (void)deg::gpt_tensor_table(deg::gpt_config_from_json(json, "fuzz")); });
  expect_error_or_ok([&] { (void)deg::qwen35_tensor_table(deg::Qwen35Config::from_json(root)); });
  expect_error_or_ok([&] { (void)deg::lfm2_tensor_table(deg::Lfm2Config::from_json(root)); });
  expect_error_or_ok([&] { (void)deg::gemma4_tensor_table(deg::Gemma4Config::from_json(root)); });
  return 0;
}
