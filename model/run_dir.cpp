// The run folder (run_dir.h).
#include "model/run_dir.h"

#include <ctime>
#include <system_error>

#include "common/log.h"

namespace flashcos::model {
namespace fs = std::filesystem;

std::string default_run_name() {
  std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "run-%Y%m%d-%H%M%S", std::localtime(&now));
  return buf;
}

fs::path claim_run_dir(const fs::path& checkpoint_dir, std::string& run, bool unique) {
  fs::create_directories(checkpoint_dir);
  if (!unique) {
    fs::create_directories(checkpoint_dir / run);
    return checkpoint_dir / run;
  }
  const std::string base = run;
  for (int i = 2; !fs::create_directory(checkpoint_dir / run); ++i) run = base + "-" + std::to_string(i);
  return checkpoint_dir / run;
}

std::string free_space(const fs::path& dir) {
  std::error_code ec;
  const auto sp = fs::space(dir, ec);
  if (ec) return "free space unknown (" + ec.message() + ")";
  return strf("%.1f MiB free", static_cast<double>(sp.available) / (1024.0 * 1024.0));
}

}  // namespace flashcos::model
