// deg inspect MODEL_DIR [--json]: what a model directory holds (type, parameters, tensors).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>

#include "cli/commands.h"
#include "deg/json.h"
#include "deg/model_info.h"

namespace deg::cli {

namespace {

std::string human_count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f}B", double(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f}M", double(n) / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f}K", double(n) / 1e3);
  return std::to_string(n);
}

void print_text(const ModelInfo& info) {
  fmt::print("model        {}\n", info.path);
  fmt::print("format       {}\n", info.format);
  fmt::print("model type   {}", info.model_type.empty() ? "(unknown)" : info.model_type);
  if (info.text_model_type != info.model_type && !info.text_model_type.empty()) {
    fmt::print(" (text model: {})", info.text_model_type);
  }
  fmt::print("\nparameters   {} ({}){}\n", info.parameters, human_count(info.parameters),
             info.tied_embeddings ? ", LM head tied to the embedding" : "");
  for (const auto& [dtype, n] : info.parameters_by_dtype) {
    fmt::print("  {:<6} {:>14}\n", dtype, n);
  }
  fmt::print("tensors      {}\n", info.tensors.size());
  size_t width = 0;
  for (const auto& t : info.tensors) width = std::max(width, t.name.size());
  for (const auto& t : info.tensors) {
    fmt::print("  {:<{}}  {:<6} [{}]\n", t.name, width, t.dtype, fmt::join(t.shape, ", "));
  }
}

void print_json(const ModelInfo& info) {
  OrderedJson j;
  j["path"] = info.path;
  j["format"] = info.format;
  j["model_type"] = info.model_type;
  j["text_model_type"] = info.text_model_type;
  j["text_prefix"] = info.text_prefix;
  j["tied_embeddings"] = info.tied_embeddings;
  j["parameters"] = info.parameters;
  j["parameters_by_dtype"] = info.parameters_by_dtype;
  j["tensors"] = OrderedJson::array();
  for (const auto& t : info.tensors) {
    j["tensors"].push_back(
        {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"file", t.file}});
  }
  fmt::print("{}\n", j.dump(2));
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "inspect",
      "Show what a model directory holds: model type, parameter count (a tied LM head counted "
      "once), dtypes and every tensor with its shape. Reads headers only.");
  auto dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("MODEL_DIR", *dir, "HF snapshot (config.json + *.safetensors) or deg checkpoint")
      ->required();
  cmd->add_flag("--json", *json, "Print JSON instead of a table");
  cmd->callback([dir, json] {
    ModelInfo info = model_info(*dir);
    if (*json) {
      print_json(info);
    } else {
      print_text(info);
    }
  });
}

}  // namespace deg::cli
