// The corpus that eval and sample read by default: --data / --split given on their command line,
// else the ones the run trained on (its recorded train options), else enwik8's defaults.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

namespace flashcos::app {

struct RunData {
  std::string path, split;
  bool path_from_run = false;  // the path is the run's --data, not one given here
};

// train: the run's train options ({"data": ..., "split": ...}), if known; data / split: the command
// line's, "" when not given.
inline RunData run_data_or(const nlohmann::json* train, const std::string& data, const std::string& split) {
  RunData d;
  const bool known = train != nullptr && train->is_object();
  d.path_from_run = data.empty() && known && train->contains("data");
  d.path = !data.empty() ? data : known ? train->value("data", "data/enwik8") : "data/enwik8";
  d.split = !split.empty() ? split : known ? train->value("split", "90M,5M,5M") : "90M,5M,5M";
  return d;
}

// A run's recorded --data that is not there (resolved: the path or path.gz): say where it came from.
inline void check_run_data_found(const RunData& d, const std::string& resolved) {
  std::error_code ec;
  if (!d.path_from_run || std::filesystem::exists(resolved, ec)) return;
  throw std::runtime_error("the run trained on --data '" + d.path + "', which is not found from here (" +
                           std::filesystem::current_path(ec).string() + "): pass --data <corpus>");
}

}  // namespace flashcos::app
