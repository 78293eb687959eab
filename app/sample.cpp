#include "app/commands.h"
#include <cstdio>
namespace flashcos::app {
int run_sample(int, char**) { std::fprintf(stderr, "'sample' is not implemented yet\n"); return 1; }
}  // namespace flashcos::app
