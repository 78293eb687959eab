// What the trainer writes about a run besides its checkpoints: the start-up table, the run's
// config.json, the metrics file (metrics.jsonl, one JSON record a line) and the ETA's format. A
// failed write of either file (a full disk) is logged once and training goes on: the checkpoints
// record the same configuration and have their own checks and retries.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/trainer.h"

namespace flashcos::model {

// What the start-up table shows that the TrainConfig does not hold.
struct RunStart {
  std::string device;           // device_description
  std::string precision;        // the resolved precision's name
  int64_t train_bytes = 0, val_bytes = 0, test_bytes = 0;
  std::string parallel, comm;   // [dp] DataParallel::describe / backend_settings; empty for one process
  int64_t world = 1;
  int64_t tokens_per_step = 0;
  int64_t resumed_at = -1;      // the checkpoint's step, or -1 for a fresh run
  bool determinism = false;     // --deterministic: the line naming what it turned on
  std::string run_dir;
};

// The table logged before the first step (rank 0 only).
void log_run_start(const TrainConfig& cfg, const RunStart& start);

// run_dir / config.json: the train and model configurations, indented.
void write_run_config(const std::filesystem::path& run_dir, const TrainConfig& cfg);

// "12m05s", "3h07m"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);

// run_dir / metrics.jsonl, appended to (a resumed run continues the file). Throws when the file
// cannot be opened; a later failed write is logged once and the records from there on are lost.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path);
  void write(const std::string& json_line);

 private:
  std::string path_;
  std::ofstream out_;
  bool warned_ = false;
};

}  // namespace flashcos::model
