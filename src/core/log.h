// Logging goes through spdlog; progress bars (progress.h) and results go to stdout, logs to stderr.
#pragma once
#include <spdlog/spdlog.h>

namespace trex::log {
void init(const std::string& level = "info");  // "trace" .. "off"; also reads TREX_LOG_LEVEL
using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::warn;
}  // namespace trex::log
