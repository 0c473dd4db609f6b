#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.h"

namespace deg::log {

void setup(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    throw Error(
        ErrorKind::invalid_argument,
        fmt::format("unknown log level '{}'; use trace, debug, info, warn, error or off", level));
  }
  auto logger = spdlog::get("deg");
  if (!logger) logger = spdlog::stderr_color_mt("deg");
  logger->set_pattern("deg: %^%l%$: %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

}  // namespace deg::log
