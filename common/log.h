// Project logging. spdlog sits behind this header in its own translation unit (common/log.cpp,
// built without the libtorch include dirs): libtorch ships its own newer fmt, which clashes with
// the fmt that Debian's and Ubuntu's spdlog are built against. Callers format with strf().
#pragma once

#include <string>

namespace flashcos::log {

// Sets one pattern and the level ("trace", "debug", "info", "warn", "error", "off"; any case).
// An empty level reads FLASHCOS_LOG_LEVEL, defaulting to "info". An unknown level throws
// std::invalid_argument naming the option (or the variable) and the accepted values.
void init(const std::string& level = "");

void debug(const std::string& msg);
void info(const std::string& msg);
void warn(const std::string& msg);
void error(const std::string& msg);

}  // namespace flashcos::log

namespace flashcos {

// printf-style formatting into a std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace flashcos
