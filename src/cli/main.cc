// deg: fill JSON Schemas from documents with small language models.
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "deg/version.h"
#include "kernels/cuda_runtime.h"

int main(int argc, char** argv) {
  CLI::App app{
      "deg turns documents into JSON that fits a JSON Schema, using small language models.\n"
      "Every value comes with a confidence and, when copied from the document, its character "
      "span.\n"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] {
    std::string v = std::string("deg ") + deg::kVersion + " (" + deg::kGitDescribe + ")\nCUDA: ";
    if (!deg::cuda_built()) return v + "not built";
    std::vector<deg::CudaDeviceInfo> devices = deg::cuda_devices();
    if (devices.empty()) return v + "built; no device visible";
    for (const auto& d : devices) {
      v += fmt::format("\n  [{}] {} (sm_{}, {} SMs, {:.0f} GiB)", d.index, d.name,
                       d.compute_capability, d.sm_count, double(d.memory_bytes) / (1 << 30));
    }
    return v;
  });
  int threads = 0;
  app.add_option("--threads", threads, "Worker threads (default: one per available core)")
      ->check(CLI::NonNegativeNumber);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.parse_complete_callback([&] {
    deg::log::setup(log_level);
    if (threads > 0) deg::set_thread_count(threads);
  });

  deg::cli::add_inspect_command(app);
  deg::cli::add_bench_command(app);
  deg::cli::add_forward_command(app);
  deg::cli::add_fill_command(app);
  deg::cli::add_tokenize_command(app);
  deg::cli::add_plan_command(app);
  deg::cli::add_init_command(app);
  deg::cli::add_eval_command(app);
  deg::cli::add_pretrain_command(app);
  deg::cli::add_shard_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const deg::Error& e) {
    std::fprintf(stderr, "deg: %s\n", e.what());
    return e.kind() == deg::ErrorKind::invalid_argument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deg: %s\n", e.what());
    return 1;
  }
  return 0;
}
