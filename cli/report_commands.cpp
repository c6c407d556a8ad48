// `shardkit report`: a training metrics file as one self-contained HTML page of charts.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/write_target.hpp"
#include "cli/commands.hpp"
#include "cli/console.hpp"
#include "report/html_report.hpp"
#include "report/metrics.hpp"

namespace shardkit::cli {
namespace {

struct ReportCli {
  std::string metrics, output, title;
  bool force = false;
  bool quiet = false;
};

int run_report(const ReportCli& c) {
  // Checked first, as the converters do: a long file is not read only to be refused at the end.
  refuse_overlap(c.metrics, c.output);
  std::error_code ec;
  if (std::filesystem::exists(c.output, ec) && !c.force) {
    fail(ErrorKind::kInvalidInput, c.output + " already exists (use --force to replace it)");
  }
  const std::filesystem::path folder = std::filesystem::path(c.output).parent_path();
  if (!folder.empty() && !std::filesystem::is_directory(folder, ec)) {
    fail(ErrorKind::kInvalidInput, c.output + ": no folder " + folder.string());
  }
  Progress progress("report", c.quiet);
  const report::Metrics metrics =
      report::read_metrics(c.metrics, [&progress](int64_t done, int64_t total) { progress.update(done, total); });
  progress.finish();
  if (metrics.cut_off_last_line) {
    print_line(stderr, "warning: %s: the last line is cut off (a run killed while writing it); left out",
               c.metrics.c_str());
  }
  report::ReportOptions options;
  options.title = c.title;
  options.source_name = c.metrics;
  const std::string html = report::render_html(metrics, options);
  // Temp file and rename: a browser that has the old report open never sees half a page.
  write_file_durable(c.output, html);
  print_line(stdout, "%s: %zu steps, %zu checkpoint events, %s", c.output.c_str(), metrics.steps.size(),
             metrics.checkpoints.size(), format_bytes(static_cast<double>(html.size())).c_str());
  return 0;
}

}  // namespace

void add_report_commands(CLI::App& app, Action& action) {
  auto c = std::make_shared<ReportCli>();
  CLI::App* report = app.add_subcommand(
      "report", "Turn a training metrics file into one self-contained HTML page of charts (no script, no network)");
  report
      ->add_option("METRICS", c->metrics,
                   "Metrics file of `shardkit train --metrics` (JSON lines; of a step written more than once by "
                   "resumed runs, the last record counts)")
      ->required();
  report
      ->add_option("-o,--output", c->output,
                   "HTML file to write: summary, then loss, learning rate, gradient norm, loss scale, tokens/s "
                   "and each checkpoint's training time lost and write time against the step")
      ->required();
  report->add_option("--title", c->title, "Heading of the page (default: \"Training report: METRICS\")");
  report->add_flag("--force", c->force, "Replace the output if it exists");
  report->add_flag("-q,--quiet", c->quiet, "No progress output while a long metrics file is read");
  report->footer("Example: shardkit report runs/tiny.jsonl -o runs/tiny.html --title \"gpt2-tiny, 2 ranks\"");
  report->callback([&action, c] { action = [c] { return run_report(*c); }; });
}

}  // namespace shardkit::cli
