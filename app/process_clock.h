// Seconds since this process started, from the kernel's record of its start (Linux: field 22 of
// /proc/self/stat, in clock ticks since boot, against CLOCK_BOOTTIME), so a command can say how
// much of its wall time went before main() ran: exec, the dynamic loader, static initialisers
// (libtorch registers its operators there). Resolution one clock tick (10 ms); -1 if unknown.
#pragma once

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace flashcos::app {

inline double seconds_since_process_start() {
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  if (f == nullptr) return -1;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) is parenthesised and may hold spaces: count fields after its ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return -1;
  unsigned long long start_ticks = 0;
  int field = 2;
  for (const char* c = p + 1; *c != '\0'; ++c) {
    if (*c != ' ') continue;
    if (++field == 22) {
      start_ticks = std::strtoull(c + 1, nullptr, 10);
      break;
    }
  }
  const long hz = sysconf(_SC_CLK_TCK);
  timespec now{};
  if (field != 22 || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9 -
         static_cast<double>(start_ticks) / static_cast<double>(hz);
}

}  // namespace flashcos::app
