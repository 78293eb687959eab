// Helpers shared by the subcommands: parse with cxxopts, turn every parse or validation error
// into "error: ..." on stderr and exit code 2, print --help.
#pragma once

#include <cxxopts.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

namespace flashcos::app {

// Parses argv; on --help prints the help and returns 0 through `exit_code`. Returns false when
// the caller should return exit_code.
inline bool parse_or_exit(cxxopts::Options& options, int argc, char** argv, cxxopts::ParseResult& result,
                          int& exit_code) {
  try {
    result = options.parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n(see '%s --help')\n", e.what(), options.program().c_str());
    exit_code = 2;
    return false;
  }
  if (result.count("help")) {
    std::printf("%s\n", options.help().c_str());
    exit_code = 0;
    return false;
  }
  if (!result.unmatched().empty()) {
    std::fprintf(stderr, "error: unexpected argument '%s'\n(see '%s --help')\n", result.unmatched().front().c_str(),
                 options.program().c_str());
    exit_code = 2;
    return false;
  }
  return true;
}

// Runs body; std::invalid_argument -> exit 2 (bad input), other exceptions -> exit 1.
inline int run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    // c10::Error carries a C++ backtrace after the message ("Exception raised from ...", or the
    // frames alone, as an allocator's out-of-memory error has them): drop it.
    for (const char* marker : {"\nException raised from", "\nframe #0"}) {
      const auto at = msg.find(marker);
      if (at != std::string::npos) msg = msg.substr(0, at);
    }
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  }
}

}  // namespace flashcos::app
