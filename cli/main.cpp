// The shardkit command line: one binary, one subcommand per task. Errors become one line on stderr
// and an exit code (2 for bad input, 1 for everything else).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "base/error.hpp"
#include "base/text_format.hpp"
#include "cli/commands.hpp"

namespace {

// "unknown command 'x' for shardkit ckpt (one of: ls, inspect, ...)" when argv names a command that
// does not exist, else empty. (CLI11 would say only that a subcommand is required.)
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* current = &app;
  std::string path = "shardkit";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto subcommands = current->get_subcommands([](CLI::App*) { return true; });
    if (subcommands.empty() || arg.empty() || arg[0] == '-') return {};
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* sub : subcommands) {
      if (sub->check_name(arg)) next = sub;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!next) return "unknown command '" + arg + "' for " + path + " (one of: " + names + ")";
    current = next;
    path += " " + next->get_name();
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("shardkit: ZeRO training with universal sharded checkpoints", "shardkit");
  // One line per error, set before the subcommands are added (they copy it).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "shardkit: error: " + shardkit::escape_control(e.what()) + " (see --help)\n";
  });
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("shardkit ") + SHARDKIT_VERSION);
  shardkit::cli::Action action;
  shardkit::cli::add_train_commands(app, action, &argc, &argv);
  shardkit::cli::add_ckpt_commands(app, action);
  shardkit::cli::add_convert_commands(app, action);
  shardkit::cli::add_bench_commands(app, action, &argc, &argv);
  shardkit::cli::add_report_commands(app, action);
  // Footers are set last: a subcommand copies its parent's footer when it is added.
  const auto all = [](CLI::App*) { return true; };
  for (CLI::App* sub : app.get_subcommands(all)) {
    if (sub->get_subcommands(all).empty()) continue;
    sub->footer("Run 'shardkit " + sub->get_name() + " COMMAND --help' for a command's options and an example.");
  }
  app.footer(
      "Run 'shardkit COMMAND --help' for a command's options and an example; samples/quickstart.sh runs a whole job.\n"
      "Start with: shardkit data encode samples/data/checkpoints.txt -o runs/text.bin\n"
      "Then:       mpirun -n 2 shardkit train --config samples/configs/tiny_zero2.json --model gpt2-tiny \\\n"
      "              --data runs/text.bin --steps 100 --save-dir runs/tiny --save-interval 50");
  if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) {
    shardkit::print_line(stderr, "shardkit: error: %s", unknown.c_str());
    return 2;
  }
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
    shardkit::print_line(stderr, "shardkit: error: %s", e.what());
    return shardkit::exit_code_for(e.kind());
  } catch (const std::exception& e) {
    shardkit::print_line(stderr, "shardkit: internal error: %s", e.what());
    return 1;
  }
}
