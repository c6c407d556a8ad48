// The shardkit command line: one binary, one subcommand per task. Errors become one line on stderr
// and an exit code (2 for bad input, 1 for everything else).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "ckpt/error.hpp"
#include "cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app("shardkit: ZeRO training with universal sharded checkpoints", "shardkit");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("shardkit ") + SHARDKIT_VERSION);
  shardkit::cli::Action action;
  shardkit::cli::add_train_commands(app, action, &argc, &argv);
  shardkit::cli::add_ckpt_commands(app, action);
  shardkit::cli::add_convert_commands(app, action);
  shardkit::cli::add_bench_commands(app, action, &argc, &argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0 in CLI11.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    return action ? action() : 2;
  } catch (const shardkit::Error& e) {
    std::fprintf(stderr, "shardkit: error: %s\n", e.what());
    return shardkit::exit_code_for(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardkit: internal error: %s\n", e.what());
    return 1;
  }
}
