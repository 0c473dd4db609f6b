// deg: fill JSON Schemas from documents with small language models.
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "deg/error.h"
#include "deg/runtime.h"

int main(int argc, char** argv) {
  CLI::App app{
      "deg turns documents into JSON that fits a JSON Schema, using small language models.\n"
      "Every value comes with a confidence and, when copied from the document, its character "
      "span.\n"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return deg::build_description(); });
  std::string threads;
  app.add_option("--threads", threads,
                 fmt::format("Worker threads, 0 to {} (default: $DEG_THREADS, else one per "
                             "available core)",
                             deg::kMaxThreads));
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "trace, debug, info, warn, error or off (default: $DEG_LOG_LEVEL, else warn); "
                 "debug and trace say what deg does and how long it takes");
  app.parse_complete_callback(
      [&] { deg::runtime_setup({.log_level = log_level, .threads = threads}); });

  deg::cli::add_inspect_command(app);
  deg::cli::add_bench_command(app);
  deg::cli::add_forward_command(app);
  deg::cli::add_fill_command(app);
  deg::cli::add_tokenize_command(app);
  deg::cli::add_plan_command(app);
  deg::cli::add_init_command(app);
  deg::cli::add_pack_command(app);
  deg::cli::add_eval_command(app);
  deg::cli::add_pretrain_command(app);
  deg::cli::add_train_command(app);
  deg::cli::add_shard_command(app);
  deg::cli::add_tokenizer_command(app);
  deg::cli::add_serve_command(app);

  // Exit codes (README): 0 success, 1 an error, 2 bad usage.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (app.get_subcommands().empty() && !app.remaining().empty() &&
        dynamic_cast<const CLI::RequiredError*>(&e)) {
      std::string names;
      for (const CLI::App* cmd : app.get_subcommands([](CLI::App*) { return true; }))
        names += " " + cmd->get_name();
      std::fprintf(stderr,
                   "deg: unknown command '%s'; the commands are:%s (`deg --help` says what "
                   "each does)\n",
                   app.remaining().front().c_str(), names.c_str());
      return 2;
    }
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const deg::Error& e) {
    std::fprintf(stderr, "deg: %s\n", e.what());
    return e.kind() == deg::ErrorKind::invalid_argument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deg: %s\n", e.what());
    return 1;
  }
  return 0;
}
