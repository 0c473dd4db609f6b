#include "core/config.h"

#include <cstdlib>

namespace deg {

namespace {

std::string getenv_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

EnvConfig read_env() {
  EnvConfig c;
  c.threads = std::atoi(getenv_or("DEG_THREADS", "0").c_str());
  if (c.threads < 0) c.threads = 0;
  c.log_level = getenv_or("DEG_LOG_LEVEL", "warn");
  std::string home = getenv_or("HOME", "/root");
  c.hf_hub = getenv_or("DEG_HF_HUB", getenv_or("HF_HUB_CACHE", home + "/.cache/huggingface/hub"));
  return c;
}

}  // namespace

const EnvConfig& env_config() {
  static const EnvConfig config = read_env();
  return config;
}

}  // namespace deg
