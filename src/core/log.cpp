#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace trex::log {
void init(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("trex");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  const char* env = std::getenv("TREX_LOG_LEVEL");
  spdlog::set_level(spdlog::level::from_str(env ? env : level));
}
}  // namespace trex::log
