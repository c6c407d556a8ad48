// The page of `shardkit report`: one self-contained HTML file (inline CSS and SVG, no script, nothing
// fetched) with a summary of the run and one chart per quantity against the step.
//
// What a test can rely on: each chart is <svg id="chart-NAME" class="chart"> with a <title>, NAME in
// page order loss, lr, grad-norm, loss-scale, tokens-per-s, checkpoint; each series with data is
// <polyline class="series" data-series="KEY" points="x,y ..."> with one point per step that has a
// finite value of KEY (loss, lr, grad_norm, loss_scale, tokens_per_s; on the checkpoint chart
// training_lost_ms, loop_blocked_ms and write_ms, one per committed checkpoint), or for long series the
// points downsample_min_max keeps.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "report/metrics.hpp"

namespace shardkit::report {

struct ReportOptions {
  std::string title;         // heading and <title> of the page; empty: "Training report: <source_name>"
  std::string source_name;   // the metrics file as the user named it, shown in the summary
  size_t max_points = 2000;  // drawn points per series at most (see downsample_min_max)
};

// The whole page.
std::string render_html(const Metrics& metrics, const ReportOptions& options);

// `text` with & < > " ' replaced by character references, after escape_control: safe in element
// content and in quoted attribute values, and free of control characters.
std::string html_escape(std::string_view text);

}  // namespace shardkit::report
