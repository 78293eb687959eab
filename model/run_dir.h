// The trainer's run folder (checkpoints/<run>/): its default name, claiming it without a race
// between processes started together, the files a run owns, and the free space shown when a save
// fails.
#pragma once

#include <filesystem>
#include <string>

namespace flashcos::model {

// "run-YYYYMMDD-HHMMSS", local time.
std::string default_run_name();

// Creates checkpoint_dir / run and returns it. A default name (`unique`) that is taken, even by a
// run started the same second, gets a -2, -3, ... suffix (written back to `run`): create_directory
// is atomic, so two processes never share one. A name the user gave is used as it is.
std::filesystem::path claim_run_dir(const std::filesystem::path& checkpoint_dir, std::string& run, bool unique);

// The run's own files, removed by --overwrite (never the folder itself or anything else in it).
inline constexpr const char* kRunFiles[] = {"latest.pt", "latest.pt.tmp", "metrics.jsonl", "config.json",
                                            "profile.json"};

// "123.4 MiB free" for the file system holding `dir`, or why that is unknown.
std::string free_space(const std::filesystem::path& dir);

}  // namespace flashcos::model
