// Helpers shared by the subcommands: parse with cxxopts, turn every parse or validation error
// into "error: ..." on stderr and exit code 2, print --help.
#pragma once

#include <cxxopts.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>

namespace flashcos::app {

namespace cli_detail {
// What option `name` takes, read from its default: "an integer", "a number", or "" when unknown.
inline std::string value_kind(const cxxopts::Options& options, const std::string& name) {
  for (const auto& group : options.groups()) {
    for (const auto& o : options.group_help(group).options) {
      // o.l: the option's long names (a list since cxxopts 3.1, which the exceptions namespace needs too).
      if (std::find(o.l.begin(), o.l.end(), name) == o.l.end() || !o.has_default || o.default_value.empty()) continue;
      const std::string& d = o.default_value;
      char* end = nullptr;
      std::strtoll(d.c_str(), &end, 10);
      if (*end == '\0') return "an integer";
      std::strtod(d.c_str(), &end);
      if (*end == '\0') return "a number";
      return "";
    }
  }
  return "";
}
}  // namespace cli_detail

// cxxopts reports a value that does not parse as "Argument 'abc' failed to parse". This names the
// option it was given to (--name abc or --name=abc in argv) and, where its default says, what the
// option takes (a number-taking option first, when the same text was given to several); "" when
// no argument of argv matches the message.
inline std::string describe_bad_value(const cxxopts::Options& options, int argc, char** argv, const std::string& what) {
  std::string first;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], name;
    std::string value;
    if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
      name = arg.substr(2, arg.find('=') - 2);
      value = arg.substr(arg.find('=') + 1);
    } else if (argv[i - 1][0] == '-' && argv[i - 1][1] == '-') {
      name = std::string(argv[i - 1]).substr(2);
      value = arg;
    } else {
      continue;
    }
    // The message quotes the value with ' or with the typographic quotes, whichever cxxopts uses.
    if (what.find("\xe2\x80\x98" + value + "\xe2\x80\x99") == std::string::npos &&
        what.find("'" + value + "'") == std::string::npos) {
      continue;
    }
    std::string kind = cli_detail::value_kind(options, name);
    if (kind == "an integer") {  // an integer that still failed: negative for an unsigned option, or too large
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (!value.empty() && *end == '\0') kind = errno == 0 && v < 0 ? "an integer >= 0" : "an integer in this option's range";
    }
    if (!kind.empty()) return "--" + name + " '" + value + "': expected " + kind;
    if (first.empty()) first = "--" + name + " '" + value + "': not a value this option takes";
  }
  return first;
}

// Parses argv; on --help prints the help and returns 0 through `exit_code`. Returns false when
// the caller should return exit_code.
inline bool parse_or_exit(cxxopts::Options& options, int argc, char** argv, cxxopts::ParseResult& result,
                          int& exit_code) {
  try {
    result = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    const std::string named = describe_bad_value(options, argc, argv, e.what());
    std::fprintf(stderr, "error: %s\n(see '%s --help')\n", named.empty() ? e.what() : named.c_str(),
                 options.program().c_str());
    exit_code = 2;
    return false;
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
