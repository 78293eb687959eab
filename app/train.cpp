#include "app/commands.h"
#include <cstdio>
namespace flashcos::app {
int run_train(int, char**) { std::fprintf(stderr, "'train' is not implemented yet\n"); return 1; }
}  // namespace flashcos::app
