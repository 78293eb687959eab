// Shell helpers for tests: quoting an argument, and removing a temporary folder with `rm -rf` (not
// fs::remove_all: libtorch.so exports its own copy, which jumps to a null pointer when a test built
// with gcc 13 resolves to it; cuda-gdb backtrace, 2026-11-25).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace test_shell {

// Single-quotes `s` for the shell (an embedded ' becomes '\'').
inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (const char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// Removes `path` and everything below it; says so on stderr when that fails. Returns whether it worked.
inline bool remove_tree(const std::string& path) {
  const int rc = std::system(("rm -rf " + quote(path)).c_str());
  if (rc != 0) std::fprintf(stderr, "test cleanup: 'rm -rf %s' failed (status %d)\n", path.c_str(), rc);
  return rc == 0;
}

}  // namespace test_shell
