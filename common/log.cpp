#include "common/log.h"

#include <spdlog/spdlog.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace flashcos::log {

void init(const std::string& level) {
  std::string lvl = level;
  if (lvl.empty()) {
    const char* env = std::getenv("FLASHCOS_LOG_LEVEL");
    lvl = env ? env : "info";
  }
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(lvl));
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
