#include "app/commands.h"
#include <cstdio>
namespace flashcos::app {
int run_eval(int, char**) { std::fprintf(stderr, "'eval' is not implemented yet\n"); return 1; }
}  // namespace flashcos::app
