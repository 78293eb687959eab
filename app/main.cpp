// ./train [subcommand] [options]: a name -> handler table. No subcommand means "train".
#include "app/commands.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

constexpr Command kCommands[] = {
    {"train", flashcos::app::run_train, "train the byte-level GPT (default subcommand)"},
    {"sample", flashcos::app::run_sample, "generate text from a checkpoint"},
    {"eval", flashcos::app::run_eval, "bits per character on the test split"},
    {"bench", flashcos::app::run_bench, "benchmark attention implementations"},
};

void print_usage() {
  std::printf("usage: ./train [subcommand] [options]\n\nsubcommands:\n");
  for (const auto& c : kCommands) std::printf("  %-8s %s\n", c.name, c.help);
  std::printf("\n'./train <subcommand> --help' lists each subcommand's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (!std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "-h"))) {
    print_usage();
    return 0;
  }
  if (argc >= 2 && argv[1][0] != '-') {
    for (const auto& c : kCommands) {
      if (std::string(argv[1]) == c.name) return c.run(argc - 1, argv + 1);
    }
    std::fprintf(stderr, "error: unknown subcommand '%s'\n\n", argv[1]);
    print_usage();
    return 2;
  }
  // No subcommand: ./train --seq-len 8192 ... trains, as in the seed's train.py.
  return flashcos::app::run_train(argc, argv);
}
