#include "core/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <iterator>

#include "core/error.h"

namespace deg {

namespace {

std::string getenv_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

EnvConfig read_env() {
  EnvConfig c;
  c.threads = parse_thread_count(getenv_or("DEG_THREADS", "0"), "DEG_THREADS");
  c.log_level = getenv_or("DEG_LOG_LEVEL", "warn");
  const char* levels[] = {"trace", "debug", "info", "warn", "error", "off"};
  if (std::find(std::begin(levels), std::end(levels), c.log_level) == std::end(levels)) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("DEG_LOG_LEVEL is \"{}\"; use trace, debug, info, warn, error or off",
                            c.log_level));
  }
  c.device = getenv_or("DEG_DEVICE", "");
  c.model = getenv_or("DEG_MODEL", "");
  if (!c.device.empty() && c.device != "cpu" && c.device != "cuda") {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("DEG_DEVICE is \"{}\"; use cpu or cuda (or unset it)", c.device));
  }
  std::string home = getenv_or("HOME", "/root");
  c.hf_hub = getenv_or("DEG_HF_HUB", getenv_or("HF_HUB_CACHE", home + "/.cache/huggingface/hub"));
  return c;
}

}  // namespace

int parse_thread_count(const std::string& text, const std::string& what) {
  int n = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 0 || n > kMaxThreads) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("{} is \"{}\"; it takes a thread count in [0, {}] (0: one per "
                            "available core)",
                            what, text, kMaxThreads));
  }
  return n;
}

const EnvConfig& env_config() {
  static const EnvConfig config = read_env();
  return config;
}

}  // namespace deg
