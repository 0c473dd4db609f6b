// Helpers shared by the tests: fixture paths, scratch directories, running the `deg` binary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace deg::testing {

// tests/fixtures/<rel>
std::filesystem::path fixture_path(const std::string& rel);
// The source tree root (for ../shared data and scripts).
std::filesystem::path source_path(const std::string& rel);

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& rel) const { return path_ / rel; }

 private:
  std::filesystem::path path_;
};

// n draws of N(0, sd^2) from a generator seeded with `seed`.
inline std::vector<float> random_normal(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void write_text(const std::filesystem::path& path, const std::string& text);
std::string read_text(const std::filesystem::path& path);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs the built `deg` binary with `args`, feeding `stdin_text` on standard input.
// A TCP port free on this machine now (bound on the loopback, read, released).
int free_tcp_port();
// `deg args` as ranks 0 .. n-1 of one launch, as torchrun starts them (RANK, WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, MASTER_PORT a free port), all at once; their results by rank.
std::vector<CommandResult> run_deg_ranks(int n, const std::vector<std::string>& args);
// Field `key` (a number) of every line of a JSON-lines file, in order.
std::vector<double> jsonl_numbers(const std::filesystem::path& path, const std::string& key);

// env: NAME=value settings for this run only.
CommandResult run_deg(const std::vector<std::string>& args, const std::string& stdin_text = "",
                      const std::vector<std::string>& env = {});

// `deg fill` with checkpoint `ck` on examples/support.{schema.json,txt}: one document prints an
// object that answers the required choice; the document twice with --report prints the same
// report twice (gtest failures otherwise). Returns that report line.
std::string expect_fill_support_example(const std::filesystem::path& ck);

}  // namespace deg::testing
