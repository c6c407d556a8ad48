// Subcommand registration. Each add_* function adds its subcommands to the app and sets `action`
// to the work the chosen one does; main() runs it after parsing and maps errors to exit codes.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace shardkit::cli {

// Returns the process exit code.
using Action = std::function<int()>;

void add_ckpt_commands(CLI::App& app, Action& action);
void add_convert_commands(CLI::App& app, Action& action);
void add_bench_commands(CLI::App& app, Action& action, int* argc, char*** argv);
void add_report_commands(CLI::App& app, Action& action);
void add_train_commands(CLI::App& app, Action& action, int* argc, char*** argv);

}  // namespace shardkit::cli
