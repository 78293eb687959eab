#include "common/log.h"

#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace flashcos::log {

spdlog::level::level_enum parse_level(const std::string& level, const char* source) {
  std::string lvl;
  for (const char ch : level) lvl += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lvl == "warning") lvl = "warn";
  if (lvl == "trace") return spdlog::level::trace;
  if (lvl == "debug") return spdlog::level::debug;
  if (lvl == "info") return spdlog::level::info;
  if (lvl == "warn") return spdlog::level::warn;
  if (lvl == "error") return spdlog::level::err;
  if (lvl == "off") return spdlog::level::off;
  // spdlog's from_str maps anything unknown to "off", which would silence even the divergence error.
  throw std::invalid_argument(std::string(source) + " must be trace, debug, info, warn, error or off (any case), got '" +
                              level + "'");
}

void init(const std::string& level) {
  spdlog::level::level_enum lvl = spdlog::level::info;
  if (!level.empty()) {
    lvl = parse_level(level, "--log-level");
  } else if (const char* env = std::getenv("FLASHCOS_LOG_LEVEL"); env && *env) {
    lvl = parse_level(env, "FLASHCOS_LOG_LEVEL");
  }
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_level(lvl);
}

void debug(const std::string& msg) { spdlog::debug(msg); }
void info(const std::string& msg) { spdlog::info(msg); }
void warn(const std::string& msg) { spdlog::warn(msg); }
void error(const std::string& msg) { spdlog::error(msg); }

}  // namespace flashcos::log

namespace flashcos {

std::string strf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::vector<char> buf(n > 0 ? n + 1 : 1);
  std::vsnprintf(buf.data(), buf.size(), fmt, args);
  va_end(args);
  return std::string(buf.data(), n > 0 ? n : 0);
}

}  // namespace flashcos
