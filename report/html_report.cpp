// Rendering of the report page. Every chart has the same geometry in SVG user units (CSS scales it to
// the card's width), a shared step axis so that charts line up, "nice" ticks (1, 2, 5 x 10^k; powers
// of two on the loss-scale chart, whose dynamic scaler moves by factors of two) and series drawn as
// polylines. No script: hover texts are SVG <title> elements, which browsers show as tooltips.
#include "report/html_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "base/text_format.hpp"

namespace shardkit::report {
namespace {

// ---- numbers as text

// "12.5", "3" (no trailing ".0"): one decimal is a tenth of a user unit, finer than any screen shows.
std::string coord(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", v);
  std::string s = buffer;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s == "-0" ? "0" : s;
}

// The shortest text of `v` that reads back as `v` to 1e-9 (ticks computed as lo + i * step carry
// rounding noise: 0.30000000000000004 is "0.3"): plain decimals ("10", "0.0002") where they are
// short enough, else an exponent without padding ("1e-5", not "1e-05").
std::string shortest(double v) {
  const auto close = [v](const char* text) {
    return std::abs(std::strtod(text, nullptr) - v) <= 1e-9 * std::max(std::abs(v), 1e-300);
  };
  char buffer[64];
  if (v == 0 || (std::abs(v) >= 1e-4 && std::abs(v) < 1e15)) {
    for (int decimals = 0; decimals <= 12; ++decimals) {
      std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, v);
      if (close(buffer)) break;
    }
    return buffer;
  }
  for (int digits = 1; digits <= 12; ++digits) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", digits - 1, v);
    if (close(buffer)) break;
  }
  std::string s = buffer;
  const size_t e = s.find('e');
  std::string exponent = s.substr(e + 1);
  const bool negative = exponent[0] == '-';
  exponent.erase(0, exponent.find_first_not_of("+-0"));
  return s.substr(0, e) + (negative ? "e-" : "e") + exponent;
}

enum class Scale { kLinear, kLog2 };

// Tick text (SVG): on a linear axis thousands and millions as "20k", "1.5M" so that labels stay
// narrow; on a log2 axis powers of two beyond 65536 or below 1/16 as 2 with a superscript exponent.
std::string tick_label(double v, Scale scale) {
  if (scale == Scale::kLog2) {
    if (v > 65536 || v < 0.0625) return "2<tspan class=\"exponent\" dy=\"-5\">" + shortest(std::log2(v)) + "</tspan>";
    return shortest(v);
  }
  if (std::abs(v) >= 1e9) return shortest(v / 1e9) + "G";
  if (std::abs(v) >= 1e6) return shortest(v / 1e6) + "M";
  if (std::abs(v) >= 1e4) return shortest(v / 1e3) + "k";
  return shortest(v);
}

std::string fixed(double v, int decimals) {
  char buffer[40];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, v);
  return buffer;
}

std::string significant(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof(buffer), "%.4g", v);
  return buffer;
}

double median(std::vector<double> values) {
  if (values.empty()) return std::nan("");
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  if (values.size() % 2 == 1) return *middle;
  return (*middle + *std::max_element(values.begin(), middle)) / 2;
}

// ---- axes

struct Axis {
  Scale scale = Scale::kLinear;
  double lo = 0;  // domain; for kLog2 the exponents of 2
  double hi = 1;
  std::vector<double> ticks;  // values, inside the domain

  std::string label(double tick) const { return tick_label(tick, scale); }

  // 0 at lo, 1 at hi.
  double fraction(double v) const {
    const double t = scale == Scale::kLog2 ? std::log2(v) : v;
    return (t - lo) / (hi - lo);
  }
};

// 1, 2 or 5 times a power of ten, near `rough`.
double nice_step(double rough) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  const double f = rough / magnitude;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * magnitude;
}

// A value axis covering [lo, hi], widened to whole ticks (about 4 to 8 of them).
Axis value_axis(double lo, double hi, bool from_zero) {
  if (from_zero) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  if (hi - lo <= std::abs(hi) * 1e-12) {  // a constant: a band around it
    const double pad = hi == 0 ? 1 : std::abs(hi) * 0.1;
    hi += pad;
    if (!(from_zero && lo == 0)) lo -= pad;
  }
  const double step = nice_step((hi - lo) / 4);
  Axis a;
  a.lo = std::floor(lo / step) * step;
  a.hi = std::ceil(hi / step) * step;
  for (int i = 0; a.lo + i * step <= a.hi + step * 1e-6; ++i) {
    const double t = a.lo + i * step;
    a.ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return a;
}

// A log2 axis over whole powers of two covering [lo, hi] (both > 0): ticks every 1, 2, 4, 8, ...
// exponents, about 7 of them.
Axis log2_axis(double lo, double hi) {
  Axis a;
  a.scale = Scale::kLog2;
  a.lo = std::floor(std::log2(lo));
  a.hi = std::ceil(std::log2(hi));
  if (a.lo == a.hi) {
    a.lo -= 1;
    a.hi += 1;
  }
  const double stride = std::exp2(std::ceil(std::log2(std::ceil((a.hi - a.lo) / 6))));
  a.lo = std::floor(a.lo / stride) * stride;  // both ends on a tick
  a.hi = std::ceil(a.hi / stride) * stride;
  for (double e = a.lo; e <= a.hi; e += stride) a.ticks.push_back(std::exp2(e));
  return a;
}

// The step axis: exactly the steps of the file, ticks on round steps.
Axis step_axis(double first, double last) {
  if (first == last) {
    first -= 1;
    last += 1;
  }
  const double step = std::max(1.0, nice_step((last - first) / 6));
  Axis a;
  a.lo = first;
  a.hi = last;
  for (double t = std::ceil(first / step) * step; t <= last; t += step) a.ticks.push_back(t);
  return a;
}

// ---- charts

// Geometry of every chart, in SVG user units.
constexpr double kWidth = 560;
constexpr double kHeight = 230;
constexpr double kLeft = 54;  // room for the y tick labels
constexpr double kRight = 22;
constexpr double kTop = 10;
constexpr double kBottom = 32;  // x tick labels, then "step"
constexpr double kPlotWidth = kWidth - kLeft - kRight;
constexpr double kPlotHeight = kHeight - kTop - kBottom;
// Series with at most this many drawn points also get a dot (with a tooltip) per point: checkpoints,
// short runs.
constexpr size_t kMaxDots = 60;

struct Series {
  std::string key;    // data-series: the metrics field drawn
  std::string label;  // legend
  std::string color;
  std::vector<Point> points;  // finite values, ascending step
};

// A step to mark, with its tooltip.
struct Mark {
  Point at;
  std::string note;
};

struct ChartSpec {
  std::string name;     // the <svg> is id="chart-<name>"
  std::string heading;  // shown above the chart
  std::string unit;     // of the values, for tooltips ("ms"); may be empty
  Scale scale = Scale::kLinear;
  bool from_zero = false;  // durations and rates: the y axis starts at 0
  std::vector<Series> series;
  std::vector<Mark> skipped;   // dots at the value of skipped steps
  std::vector<Mark> failures;  // vertical lines at failed saves (y unused)
  std::string empty_text;      // shown instead of lines when no series has a point
};

constexpr const char* kSkippedColor = "#f59e0b";
constexpr const char* kFailureColor = "#dc2626";

struct Frame {
  Axis x;
  Axis y;
  double px(double step) const { return kLeft + x.fraction(step) * kPlotWidth; }
  double py(double value) const { return kTop + (1 - y.fraction(value)) * kPlotHeight; }
};

Axis y_axis_of(const ChartSpec& chart) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  for (const Series& s : chart.series) {
    for (const Point& p : s.points) {
      lo = std::min(lo, p.y);
      hi = std::max(hi, p.y);
    }
  }
  if (lo > hi) return value_axis(0, 1, true);
  if (chart.scale == Scale::kLog2 && lo > 0) return log2_axis(lo, hi);
  return value_axis(lo, hi, chart.from_zero);
}

std::string grid_and_axes(const Frame& f) {
  std::string out = "<g class=\"grid\">";
  for (double t : f.y.ticks) {
    const std::string y = coord(f.py(t));
    out +=
        "<line x1=\"" + coord(kLeft) + "\" x2=\"" + coord(kWidth - kRight) + "\" y1=\"" + y + "\" y2=\"" + y + "\"/>";
  }
  for (double t : f.x.ticks) {
    const std::string x = coord(f.px(t));
    out += "<line class=\"minor\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + coord(kTop) + "\" y2=\"" +
           coord(kTop + kPlotHeight) + "\"/>";
  }
  out += "</g>\n<line class=\"baseline\" x1=\"" + coord(kLeft) + "\" x2=\"" + coord(kWidth - kRight) + "\" y1=\"" +
         coord(kTop + kPlotHeight) + "\" y2=\"" + coord(kTop + kPlotHeight) + "\"/>\n";
  out += "<g class=\"axis y-axis\" text-anchor=\"end\">";
  for (double t : f.y.ticks) {
    out += "<text x=\"" + coord(kLeft - 6) + "\" y=\"" + coord(f.py(t) + 3.5) + "\">" + f.y.label(t) + "</text>";
  }
  out += "</g>\n<g class=\"axis x-axis\" text-anchor=\"middle\">";
  for (double t : f.x.ticks) {
    out +=
        "<text x=\"" + coord(f.px(t)) + "\" y=\"" + coord(kTop + kPlotHeight + 14) + "\">" + f.x.label(t) + "</text>";
  }
  out += "<text class=\"axis-name\" x=\"" + coord(kWidth - kRight) + "\" y=\"" + coord(kHeight - 3) +
         "\" text-anchor=\"end\">step</text></g>\n";
  return out;
}

std::string value_text(double v, const std::string& unit) {
  return significant(v) + (unit.empty() ? "" : " " + unit);
}

std::string polyline(const Frame& f, const Series& s, const std::vector<Point>& drawn) {
  std::string points;
  points.reserve(drawn.size() * 12);
  for (const Point& p : drawn) {
    if (!points.empty()) points += ' ';
    points += coord(f.px(p.x)) + "," + coord(f.py(p.y));
  }
  return "<polyline class=\"series\" data-series=\"" + s.key + "\" stroke=\"" + s.color + "\" points=\"" + points +
         "\"/>\n";
}

std::string dots(const Frame& f, const Series& s, const std::vector<Point>& drawn, const std::string& unit) {
  std::string out = "<g class=\"dots\" fill=\"" + s.color + "\">";
  for (const Point& p : drawn) {
    out += "<circle cx=\"" + coord(f.px(p.x)) + "\" cy=\"" + coord(f.py(p.y)) + "\" r=\"2.6\"><title>step " +
           shortest(p.x) + ": " + html_escape(s.label) + " " + value_text(p.y, unit) + "</title></circle>";
  }
  return out + "</g>\n";
}

// Marks that would land on the same pixel column as the previous one are left out: a run of
// millions of steps draws at most one per column. `draw(mark, tooltip)` returns the element.
template <typename Draw>
std::string marks(const Frame& f, const std::vector<Mark>& list, const std::string& group, Draw draw) {
  if (list.empty()) return {};
  std::string out = "<g class=\"" + group + "\">";
  double last_column = -1;
  for (const Mark& m : list) {
    const double column = std::round(f.px(m.at.x));
    if (column == last_column) continue;
    last_column = column;
    out += draw(m, "<title>" + html_escape(m.note) + "</title>");
  }
  return out + "</g>\n";
}

std::string describe(const ChartSpec& chart) {
  std::string text = chart.heading + " against step";
  for (const Series& s : chart.series) {
    text += "; " + s.label + ": " + std::to_string(s.points.size()) + " point(s)";
    if (!s.points.empty()) {
      text += ", first " + value_text(s.points.front().y, chart.unit) + ", last " +
              value_text(s.points.back().y, chart.unit);
    }
  }
  if (!chart.skipped.empty()) text += "; " + std::to_string(chart.skipped.size()) + " skipped step(s)";
  if (!chart.failures.empty()) text += "; " + std::to_string(chart.failures.size()) + " failed save(s)";
  return html_escape(text);
}

std::string legend(const ChartSpec& chart, size_t max_points) {
  std::string out = "<div class=\"legend\">";
  for (const Series& s : chart.series) {
    out += "<span><i style=\"background:" + s.color + "\"></i>" + html_escape(s.label) + "</span>";
  }
  if (!chart.skipped.empty()) {
    out += "<span><i class=\"dot\" style=\"background:" + std::string(kSkippedColor) + "\"></i>skipped step (" +
           std::to_string(chart.skipped.size()) + ", fp16 overflow)</span>";
  }
  if (!chart.failures.empty()) {
    out += "<span><i class=\"dash\" style=\"border-color:" + std::string(kFailureColor) + "\"></i>failed save (" +
           std::to_string(chart.failures.size()) + ")</span>";
  }
  for (const Series& s : chart.series) {
    if (s.points.size() > max_points) {
      out += "<span class=\"note\">" + html_escape(s.label) + ": min and max of " +
             std::to_string(std::max<size_t>(max_points / 2, 1)) + " buckets of " +
             format_count(static_cast<int64_t>(s.points.size())) + " points</span>";
    }
  }
  return out + "</div>\n";
}

std::string render_chart(const ChartSpec& chart, const Axis& steps, size_t max_points) {
  const Frame f{steps, y_axis_of(chart)};
  const std::string id = "chart-" + chart.name;
  std::string out =
      "<section class=\"card\">\n<h2>" + html_escape(chart.heading) + "</h2>\n" + legend(chart, max_points);
  out += "<svg id=\"" + id + "\" class=\"chart\" viewBox=\"0 0 " + coord(kWidth) + " " + coord(kHeight) +
         "\" role=\"img\" aria-labelledby=\"" + id + "-title\">\n<title id=\"" + id + "-title\">" + describe(chart) +
         "</title>\n";
  const bool empty =
      std::all_of(chart.series.begin(), chart.series.end(), [](const Series& s) { return s.points.empty(); });
  if (empty) {
    Frame bare = f;
    bare.y.ticks.clear();
    out += grid_and_axes(bare) + "<text class=\"empty\" x=\"" + coord(kLeft + kPlotWidth / 2) + "\" y=\"" +
           coord(kTop + kPlotHeight / 2) + "\" text-anchor=\"middle\">" + html_escape(chart.empty_text) + "</text>\n";
  } else {
    out += grid_and_axes(f);
  }
  out += marks(f, chart.failures, "failures", [&](const Mark& m, const std::string& tooltip) {
    const std::string x = coord(std::round(f.px(m.at.x)));
    return "<line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + coord(kTop) + "\" y2=\"" + coord(kTop + kPlotHeight) +
           "\" stroke=\"" + kFailureColor + "\">" + tooltip + "</line>";
  });
  for (const Series& s : chart.series) {
    if (s.points.empty()) continue;
    const std::vector<Point> drawn = downsample_min_max(s.points, max_points);
    out += polyline(f, s, drawn);
    if (drawn.size() <= kMaxDots) out += dots(f, s, drawn, chart.unit);
  }
  out += marks(f, chart.skipped, "skipped", [&](const Mark& m, const std::string& tooltip) {
    return "<circle cx=\"" + coord(f.px(m.at.x)) + "\" cy=\"" + coord(f.py(m.at.y)) + "\" r=\"3.4\" fill=\"" +
           kSkippedColor + "\">" + tooltip + "</circle>";
  });
  return out + "</svg>\n</section>\n";
}

// ---- the page

// The points of one field of the step records, leaving out steps without a finite value.
template <typename Field>
std::vector<Point> step_series(const Metrics& m, Field field) {
  std::vector<Point> out;
  out.reserve(m.steps.size());
  for (const StepPoint& p : m.steps) {
    const double v = field(p);
    if (std::isfinite(v)) out.push_back({static_cast<double>(p.step), v});
  }
  return out;
}

// Skipped steps, marked at their value of `field` (those without one are not drawn).
template <typename Field>
std::vector<Mark> skipped_marks(const Metrics& m, Field field) {
  std::vector<Mark> out;
  for (const StepPoint& p : m.steps) {
    if (!p.skipped || !std::isfinite(field(p))) continue;
    out.push_back(
        {{static_cast<double>(p.step), field(p)},
         "step " + std::to_string(p.step) + ": skipped (fp16 overflow), loss scale " + significant(p.loss_scale)});
  }
  return out;
}

std::vector<ChartSpec> charts_of(const Metrics& m) {
  std::vector<ChartSpec> charts;
  const auto loss = [](const StepPoint& p) { return p.loss; };
  const auto lr = [](const StepPoint& p) { return p.lr; };
  const auto grad_norm = [](const StepPoint& p) { return p.grad_norm; };
  const auto loss_scale = [](const StepPoint& p) { return p.loss_scale; };
  const auto tokens_per_s = [](const StepPoint& p) { return p.tokens_per_s; };
  charts.push_back({"loss",
                    "Loss",
                    "",
                    Scale::kLinear,
                    false,
                    {{"loss", "loss", "#2563eb", step_series(m, loss)}},
                    skipped_marks(m, loss),
                    {},
                    "no finite loss in this file"});
  charts.push_back({"lr",
                    "Learning rate",
                    "",
                    Scale::kLinear,
                    true,
                    {{"lr", "learning rate", "#7c3aed", step_series(m, lr)}},
                    {},
                    {},
                    "no learning rate in this file"});
  // Skipped steps compute no gradient norm (null in the file): they are gaps here.
  charts.push_back({"grad-norm",
                    "Gradient norm",
                    "",
                    Scale::kLinear,
                    true,
                    {{"grad_norm", "gradient norm", "#0d9488", step_series(m, grad_norm)}},
                    {},
                    {},
                    "no gradient norm in this file"});
  charts.push_back({"loss-scale",
                    "Loss scale (log scale)",
                    "",
                    Scale::kLog2,
                    false,
                    {{"loss_scale", "loss scale", "#0891b2", step_series(m, loss_scale)}},
                    skipped_marks(m, loss_scale),
                    {},
                    "no loss scale in this file"});
  charts.push_back({"tokens-per-s",
                    "Throughput (tokens/s)",
                    "tokens/s",
                    Scale::kLinear,
                    true,
                    {{"tokens_per_s", "tokens/s", "#16a34a", step_series(m, tokens_per_s)}},
                    {},
                    {},
                    "no throughput in this file"});

  ChartSpec saves{"checkpoint",
                  "Checkpoints: training time lost and write time (ms)",
                  "ms",
                  Scale::kLinear,
                  true,
                  {{"training_lost_ms", "training time lost", "#ea580c", {}},
                   {"loop_blocked_ms", "of which save() held the loop", "#9333ea", {}},
                   {"write_ms", "write to durable", "#2563eb", {}}},
                  {},
                  {},
                  "no checkpoints in this file"};
  for (const CheckpointEvent& e : m.checkpoints) {
    const auto step = static_cast<double>(e.step);
    if (e.failed) {
      saves.failures.push_back({{step, 0}, "step " + std::to_string(e.step) + ": save failed: " + e.error});
      continue;
    }
    if (std::isfinite(e.training_lost_ms)) saves.series[0].points.push_back({step, e.training_lost_ms});
    if (std::isfinite(e.loop_blocked_ms)) saves.series[1].points.push_back({step, e.loop_blocked_ms});
    if (std::isfinite(e.write_ms)) saves.series[2].points.push_back({step, e.write_ms});
  }
  charts.push_back(std::move(saves));
  return charts;
}

struct Stat {
  std::string name;
  std::string value;
  std::string detail;  // smaller, under the value; may be empty
  bool alarm = false;  // drawn in red (failed saves)
};

std::vector<Stat> summary_of(const Metrics& m, const std::string& source) {
  const StepPoint& first = m.steps.front();
  const StepPoint& last = m.steps.back();
  const auto skipped = std::count_if(m.steps.begin(), m.steps.end(), [](const StepPoint& p) { return p.skipped; });
  std::vector<double> rates, lost, writes;
  for (const StepPoint& p : m.steps) {
    if (std::isfinite(p.tokens_per_s)) rates.push_back(p.tokens_per_s);
  }
  int64_t failed = 0;
  for (const CheckpointEvent& e : m.checkpoints) {
    if (e.failed) ++failed;
    if (std::isfinite(e.training_lost_ms)) lost.push_back(e.training_lost_ms);
    if (std::isfinite(e.write_ms)) writes.push_back(e.write_ms);
  }
  const auto saved = static_cast<int64_t>(m.checkpoints.size()) - failed;
  const auto finite_loss = step_series(m, [](const StepPoint& p) { return p.loss; });
  const auto ms = [](double v) { return std::isnan(v) ? std::string("-") : fixed(v, 1) + " ms"; };

  std::string step_detail = format_count(first.step) + " \u2013 " + format_count(last.step);
  if (skipped > 0) step_detail += ", " + std::to_string(skipped) + " skipped";
  if (m.replaced_records > 0) step_detail += ", " + std::to_string(m.replaced_records) + " rerun";
  std::vector<Stat> stats;
  stats.push_back({"Metrics file", source, "", false});
  stats.push_back({"Steps", format_count(static_cast<int64_t>(m.steps.size())), step_detail, false});
  if (finite_loss.empty()) {
    stats.push_back({"Loss", "-", "", false});
  } else {
    stats.push_back({"Loss", significant(finite_loss.front().y) + " \u2192 " + significant(finite_loss.back().y),
                     "first \u2192 last", false});
  }
  const double rate = median(rates);
  stats.push_back({"Tokens/s", std::isnan(rate) ? "-" : format_count(std::llround(rate)), "median", false});
  stats.push_back({"Checkpoints", std::to_string(saved), "committed", false});
  stats.push_back({"Checkpoint errors", std::to_string(failed), "failed saves", failed > 0});
  stats.push_back({"Training lost per save", ms(median(lost)), "median", false});
  stats.push_back({"Checkpoint write", ms(median(writes)), "median", false});
  return stats;
}

constexpr const char* kStyle = R"css(
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f3f4f6; color: #111827;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1320px; margin: 0 auto; padding: 24px 24px 32px; }
h1 { font-size: 22px; font-weight: 650; margin: 0 0 14px; overflow-wrap: anywhere; }
.summary { display: grid; grid-template-columns: repeat(auto-fill, minmax(132px, 1fr)); gap: 10px; margin: 0 0 18px; }
.stat { background: #fff; border: 1px solid #e5e7eb; border-radius: 8px; padding: 9px 12px; }
.stat dt { color: #6b7280; font-size: 12px; }
.stat dd { margin: 1px 0 0; font-size: 17px; font-weight: 600; font-variant-numeric: tabular-nums;
           overflow-wrap: anywhere; }
.stat dd small { display: block; color: #6b7280; font-size: 12px; font-weight: 400; }
.stat.file dd { font-size: 14px; }
.stat.alarm dd { color: #dc2626; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(440px, 1fr)); gap: 16px; }
.card { background: #fff; border: 1px solid #e5e7eb; border-radius: 10px; padding: 12px 14px 6px; }
.card h2 { font-size: 15px; font-weight: 600; margin: 0; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; min-height: 20px; margin: 2px 0 4px; color: #4b5563;
          font-size: 12px; }
.legend i { display: inline-block; width: 14px; height: 3px; border-radius: 2px; margin-right: 5px;
            vertical-align: middle; }
.legend i.dot { width: 8px; height: 8px; border-radius: 50%; }
.legend i.dash { width: 0; height: 12px; border-left: 2px dashed; border-radius: 0; }
.legend .note { color: #9ca3af; }
svg.chart { display: block; width: 100%; height: auto; }
svg.chart text { font: 11px system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; fill: #6b7280; }
svg.chart text.empty { font-size: 13px; fill: #9ca3af; }
svg.chart tspan.exponent { font-size: 8px; }
.grid line { stroke: #e5e7eb; stroke-width: 1; }
.grid line.minor { stroke: #f1f2f4; }
.baseline { stroke: #9ca3af; stroke-width: 1; }
.series { fill: none; stroke-width: 1.6; stroke-linejoin: round; stroke-linecap: round; }
.dots circle, .skipped circle { stroke: #fff; stroke-width: 1; }
.failures line { stroke-width: 1.5; stroke-dasharray: 4 3; }
footer { margin-top: 18px; color: #6b7280; font-size: 12px; }
)css";

}  // namespace

std::string html_escape(std::string_view raw) {
  // Control characters first, as on the console: a metrics file's strings are the run's inputs.
  const std::string text = escape_control(raw);
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_html(const Metrics& metrics, const ReportOptions& options) {
  const std::string title =
      html_escape(options.title.empty() ? "Training report: " + options.source_name : options.title);
  double first = static_cast<double>(metrics.steps.front().step);
  double last = static_cast<double>(metrics.steps.back().step);
  if (!metrics.checkpoints.empty()) {
    first = std::min(first, static_cast<double>(metrics.checkpoints.front().step));
    last = std::max(last, static_cast<double>(metrics.checkpoints.back().step));
  }
  const Axis steps = step_axis(first, last);

  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
      title + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n<main>\n<h1>" + title +
      "</h1>\n<dl class=\"summary\">\n";
  for (const Stat& s : summary_of(metrics, options.source_name)) {
    const std::string kind = s.name == "Metrics file" ? " file" : s.alarm ? " alarm" : "";
    out += "<div class=\"stat" + kind + "\"><dt>" + html_escape(s.name) + "</dt><dd>" + html_escape(s.value) +
           (s.detail.empty() ? "" : "<small>" + html_escape(s.detail) + "</small>") + "</dd></div>\n";
  }
  out += "</dl>\n<div class=\"charts\">\n";
  for (const ChartSpec& chart : charts_of(metrics)) out += render_chart(chart, steps, options.max_points);
  out += "</div>\n<footer>Made by <code>shardkit report</code> from " + html_escape(options.source_name) +
         ". Where a resumed run repeated steps, the last record of each step is shown. Series longer than " +
         format_count(static_cast<int64_t>(options.max_points)) +
         " points are drawn as the minimum and maximum of each bucket of steps, so spikes stay visible. "
         "Points drawn as dots show their value on hover.</footer>\n</main>\n</body>\n</html>\n";
  return out;
}

}  // namespace shardkit::report
