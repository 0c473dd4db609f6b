#include "test_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "io/json.h"

namespace deg::testing {

namespace fs = std::filesystem;

fs::path fixture_path(const std::string& rel) {
  return fs::path(DEG_FIXTURES_DIR) / rel;
}
fs::path source_path(const std::string& rel) {
  return fs::path(DEG_SOURCE_DIR) / rel;
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  path_ = fs::temp_directory_path() / ("deg_test_" + std::to_string(getpid()) + "_" +
                                       std::to_string(counter++) + "_" + std::to_string(rd()));
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  EXPECT_TRUE(ok) << "no free TCP port";
  return ntohs(a.sin_port);
}

CommandResult run_deg(const std::vector<std::string>& args, const std::string& stdin_text,
                      const std::vector<std::string>& env) {
  TempDir dir;
  write_text(dir / "stdin", stdin_text);
  std::string cmd = "env";
  for (const std::string& e : env) cmd += " '" + e + "'";
  cmd += std::string(" '") + DEG_BINARY + "'";
  for (const auto& a : args) {
    std::string quoted = "'";
    for (char c : a) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += " " + quoted + "'";
  }
  cmd += " <'" + (dir / "stdin").string() + "' >'" + (dir / "stdout").string() + "' 2>'" +
         (dir / "stderr").string() + "'";
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text(dir / "stdout");
  r.err = read_text(dir / "stderr");
  return r;
}

std::vector<CommandResult> run_deg_ranks(int n, const std::vector<std::string>& args) {
  const std::string port = std::to_string(free_tcp_port());
  std::vector<CommandResult> out(static_cast<size_t>(n));
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      out[size_t(r)] = run_deg(args, "",
                               {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n),
                                "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port});
    });
  for (std::thread& t : ranks) t.join();
  return out;
}

std::vector<double> jsonl_numbers(const std::filesystem::path& path, const std::string& key) {
  std::vector<double> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(Json::parse(line).at(key).get<double>());
  return out;
}

std::string expect_fill_support_example(const std::filesystem::path& ck) {
  const std::string schema = source_path("examples/support.schema.json").string();
  const std::string doc = source_path("examples/support.txt").string();
  CommandResult r = run_deg({"fill", "--model", ck.string(), "--schema", schema, doc});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json one = Json::parse(r.out, nullptr, false);
  EXPECT_TRUE(one.is_object() && one.contains("category")) << r.out;  // required: answered
  r = run_deg({"fill", "--model", ck.string(), "--schema", schema, "--report", doc, doc});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string l1, l2;
  std::getline(lines, l1);
  std::getline(lines, l2);
  EXPECT_EQ(l1, l2);  // the same document twice in one batch: the same report
  const Json report = Json::parse(l1, nullptr, false);
  EXPECT_TRUE(report.is_object() && report["fields"].is_array()) << l1;
  return l1;
}

}  // namespace deg::testing
