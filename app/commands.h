// The subcommands of ./train. Each parses its own options (cxxopts) into a typed config and
// returns the process exit code. argv[0] is the subcommand's name ("train", "sample", ...).
#pragma once

namespace flashcos::app {

int run_train(int argc, char** argv);
int run_sample(int argc, char** argv);
int run_eval(int argc, char** argv);
int run_bench(int argc, char** argv);

}  // namespace flashcos::app
