// Helpers for tests that run the real ./train binary on a tiny CPU model: a temporary folder
// with a small text corpus, a blocking run (exit code + output) and a background run that a test
// can signal. Every run is a real process; nothing is mocked.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/shell_util.h"

namespace train_test {
namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;  // WEXITSTATUS, or -1 when killed by a signal
  std::string output;  // stdout and stderr together
};

using test_shell::quote;
using test_shell::remove_tree;

// Runs a shell command, stdout and stderr together, and waits.
inline RunResult run_shell(const std::string& cmd) {
  RunResult result;
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Runs `/bin/bash -c "<prefix> exec train <args>"` and waits. `prefix` may set limits (ulimit).
inline RunResult run_train(const std::string& args, const std::string& prefix = "") {
  const std::string script = prefix + " exec " + quote(FLASHCOS_TRAIN_BIN) + " " + args + " 2>&1";
  return run_shell("/bin/bash -c " + quote(script));
}

// A fresh temporary folder holding corpus.txt (64 KB of varied text); removed by the destructor.
class TempRun {
 public:
  TempRun() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/flashcos_train_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    dir_ = buf.data();
    std::mt19937 rng(1234);
    const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dogs ", "run ", "far, ", "and\n"};
    std::ofstream out(corpus());
    for (int i = 0; i < 12000; ++i) out << words[rng() % 10];
  }
  ~TempRun() { remove_tree(dir_); }  // not fs::remove_all: tests/shell_util.h says why
  std::string dir() const { return dir_; }
  std::string corpus() const { return dir_ + "/corpus.txt"; }
  std::string ckpts() const { return dir_ + "/ckpts"; }
  std::string run_dir(const std::string& run) const { return ckpts() + "/" + run; }

  // Options for a tiny CPU run on the corpus (a few ms per step); `extra` may replace any of them.
  std::string tiny(const std::string& extra) const {
    const std::vector<std::pair<std::string, std::string>> defaults = {
        {"--data", quote(corpus())}, {"--split", "0.8,0.1,0.1"}, {"--seq-len", "16"}, {"--batch", "2"},
        {"--grad-accum", "1"}, {"--dim", "16"}, {"--depth", "1"}, {"--heads", "2"}, {"--dim-head", "8"},
        {"--device", "cpu"}, {"--lr", "2e-4"}, {"--warmup", "0"}, {"--schedule", "constant"}, {"--val-windows", "2"}, {"--validate-every", "1000"}, {"--generate-every", "0"},
        {"--log-every", "1"}, {"--checkpoint-dir", quote(ckpts())}};
    std::string args;
    for (const auto& [flag, value] : defaults) {
      if ((" " + extra + " ").find(" " + flag + " ") == std::string::npos) args += flag + " " + value + " ";
    }
    return args + extra;
  }

  // Entries in the checkpoint folder (0 when it does not exist).
  size_t run_count() const {
    if (!fs::exists(ckpts())) return 0;
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(ckpts())) n += e.exists() ? 1 : 0;
    return n;
  }

 private:
  std::string dir_;
};

// A TCP port on the loopback that was free a moment ago (for MASTER_PORT of a two-rank run).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// metrics.jsonl records of one event kind ("train" or "val").
inline std::vector<nlohmann::json> metrics(const std::string& run_dir, const std::string& event = "train") {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == event) out.push_back(j);
  }
  return out;
}

// The runs in run_a and run_b logged `steps` train records each, with the same losses and gradient
// norms, bit for bit (`what` names the pair in a failure).
inline void expect_same_training(const std::string& run_a, const std::string& run_b, size_t steps,
                                 const std::string& what = "") {
  const auto a = metrics(run_a), b = metrics(run_b);
  ASSERT_EQ(a.size(), steps) << what;
  ASSERT_EQ(b.size(), steps) << what;
  for (size_t i = 0; i < steps; ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << what << " step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << what << " step " << i + 1;
  }
}

inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json j;
  if (in) in >> j;
  return j;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A ./train process in the background, its output going to a file.
class BackgroundTrain {
 public:
  BackgroundTrain(const std::string& args, const std::string& log_path) : log_(log_path) {
    const std::string script = "exec " + quote(FLASHCOS_TRAIN_BIN) + " " + args + " > " + quote(log_path) + " 2>&1";
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/bash", "bash", "-c", script.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~BackgroundTrain() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string log() const { return read_text(log_); }

  // Waits up to `seconds` for the process to exit; returns the raw wait status or -1 on timeout.
  int wait(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// Polls `pred` every 20 ms for up to `seconds`.
template <typename Pred>
bool wait_until(Pred pred, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

}  // namespace train_test
