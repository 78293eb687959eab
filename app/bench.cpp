#include "app/commands.h"
#include <cstdio>
namespace flashcos::app {
int run_bench(int, char**) { std::fprintf(stderr, "'bench' is not implemented yet\n"); return 1; }
}  // namespace flashcos::app
