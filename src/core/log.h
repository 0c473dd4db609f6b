// Logging: spdlog to stderr, so stdout stays clean for JSON output. Use deg::log::info(...) etc.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace deg::log {

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::trace;
using spdlog::warn;

// Routes logs to stderr at the given level name (trace, debug, info, warn, error, off).
// Throws deg::Error on an unknown level.
void setup(std::string_view level);

}  // namespace deg::log
