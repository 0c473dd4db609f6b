// The `deg` subcommands. Each lives in its own file and registers itself on the app; the CLI is a
// thin layer over the library (STYLE.md §11): parse flags, call the API, print, map errors to
// exit codes. A command's callback throws deg::Error for user errors; main() prints them.
// Option storage must outlive add_*_command: keep it in shared_ptrs captured by the callback.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace deg::cli {

// --device on the commands that run a model: cpu, cuda, or auto (kernels/cuda_runtime.h's
// pick_device says what auto picks).
CLI::Option* add_device_option(CLI::App* cmd, std::string& device);
CLI::Option* add_gemm_option(CLI::App* cmd, std::string& gemm);

void add_inspect_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_forward_command(CLI::App& app);
void add_fill_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_init_command(CLI::App& app);
void add_pack_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_pretrain_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_shard_command(CLI::App& app);
void add_tokenizer_command(CLI::App& app);  // a group: `deg tokenizer train`, ...
void add_serve_command(CLI::App& app);

}  // namespace deg::cli
