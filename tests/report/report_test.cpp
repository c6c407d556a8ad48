// `shardkit report` as a library: reading metrics files (repeated steps, nulls, bad input) and the
// page it renders (every chart, one drawn point per step, downsampling, escaping, nothing fetched).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "report/html_report.hpp"
#include "report/metrics.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit::report {
namespace {

std::string step_line(int64_t step, double loss, bool skipped = false) {
  std::ostringstream s;
  s << R"({"grad_norm":)" << (skipped ? "null" : "1.5") << R"(,"loss":)" << loss
    << R"(,"loss_scale":65536.0,"lr":0.001,"skipped":)" << (skipped ? "true" : "false") << R"(,"step":)" << step
    << R"(,"step_ms":80.0,"tokens":768,"tokens_per_s":9600.0})";
  return s.str();
}

std::string checkpoint_line(int64_t step, double lost_ms, double write_ms) {
  std::ostringstream s;
  s << R"({"bytes":5275648,"device_wait_ms":)" << lost_ms / 2 << R"(,"event":"checkpoint","loop_blocked_ms":)"
    << lost_ms / 2 << R"(,"path":"runs/x/step-)" << step << R"(","step":)" << step << R"(,"training_lost_ms":)"
    << lost_ms << R"(,"write_ms":)" << write_ms << "}";
  return s.str();
}

std::string error_line(int64_t step) {
  return R"({"error":"No space left on device","event":"checkpoint_error","path":"runs/x","step":)" +
         std::to_string(step) + "}";
}

Metrics parse(const std::string& text) {
  std::istringstream in(text);
  return parse_metrics(in, "m.jsonl");
}

// `steps` steps with losses 10 - step / 10, the steps in `skipped` skipped, checkpoints every 10 steps
// (the one of step 20 failed).
std::string run_text(int64_t steps, const std::vector<int64_t>& skipped = {}) {
  std::string text;
  for (int64_t step = 1; step <= steps; ++step) {
    const bool skip = std::find(skipped.begin(), skipped.end(), step) != skipped.end();
    text += step_line(step, 10 - static_cast<double>(step) / 10, skip) + "\n";
    if (step % 10 == 0) text += (step == 20 ? error_line(step) : checkpoint_line(step, 1.5, 20)) + "\n";
  }
  return text;
}

TEST(ReportMetrics, LastRecordOfARepeatedStepWins) {
  // Steps 1-5 and a checkpoint at 4, then a run resumed from step 3 that redoes steps 4 and 5 (and its
  // save at 4 fails this time) and goes on to 6; a blank line between the runs.
  std::string text;
  for (int step = 1; step <= 5; ++step) text += step_line(step, 5.0 - step) + "\n";
  text += checkpoint_line(4, 1, 2) + "\n\n";
  for (int step = 4; step <= 6; ++step) text += step_line(step, 50.0 - step) + "\n";
  text += error_line(4) + "\n";
  const Metrics m = parse(text);
  ASSERT_EQ(m.steps.size(), 6u);
  for (size_t i = 0; i < m.steps.size(); ++i) EXPECT_EQ(m.steps[i].step, static_cast<int64_t>(i + 1));
  EXPECT_DOUBLE_EQ(m.steps[2].loss, 2.0);   // step 3: only the first run wrote it
  EXPECT_DOUBLE_EQ(m.steps[3].loss, 46.0);  // steps 4 and 5: the resumed run's records
  EXPECT_DOUBLE_EQ(m.steps[4].loss, 45.0);
  EXPECT_EQ(m.replaced_records, 2);
  ASSERT_EQ(m.checkpoints.size(), 1u);
  EXPECT_TRUE(m.checkpoints[0].failed);
  EXPECT_EQ(m.checkpoints[0].error, "No space left on device");
}

TEST(ReportMetrics, NullsAndMissingFieldsAreNaNAndSkippedStepsAreKept) {
  const Metrics m = parse(step_line(1, 3.0, true) + "\n" + R"({"step":2,"loss":null})" + "\n" +
                          R"({"event":"resumed","step":1})" + "\n");
  ASSERT_EQ(m.steps.size(), 2u);
  EXPECT_TRUE(m.steps[0].skipped);
  EXPECT_TRUE(std::isnan(m.steps[0].grad_norm));
  EXPECT_DOUBLE_EQ(m.steps[0].loss, 3.0);
  EXPECT_FALSE(m.steps[1].skipped);
  EXPECT_TRUE(std::isnan(m.steps[1].loss));
  EXPECT_TRUE(std::isnan(m.steps[1].lr));
  EXPECT_TRUE(m.checkpoints.empty());  // events of unknown kinds are ignored
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A run killed while writing a record leaves a last line without its newline: that line is left
// out and said so; the same text with its newline is an error (above).
TEST(ReportMetrics, ACutOffLastLineIsLeftOut) {
  const Metrics m = parse(step_line(1, 3.0) + "\n" + step_line(2, 2.0) + "\n{\"step\": 3, \"lo");
  EXPECT_TRUE(m.cut_off_last_line);
  ASSERT_EQ(m.steps.size(), 2u);
  EXPECT_EQ(m.steps.back().step, 2);
  EXPECT_FALSE(parse(step_line(1, 3.0) + "\n" + step_line(2, 2.0)).cut_off_last_line);
}

TEST(ReportMetrics, EachBadInputIsAnErrorNamingTheFileAndLine) {
  testing::TempDir dir;
  const std::string ok = step_line(1, 3.0) + "\n";
  struct Case {
    std::string text;
    std::string message;  // after "<file>"
  };
  const std::vector<Case> cases = {
      {ok + ok + "{\"step\": 3, \"loss\": \n", ":3: not JSON"},
      {ok + "{\"step\": 2, \"lo\n" + ok, ":2: not JSON"},
      {ok + "\n[1, 2, 3]\n", ":3: not a JSON object but array"},
      {ok + "42\n", ":2: not a JSON object but number"},
      {ok + R"({"loss": 1.0})" + "\n", ":2: record without \"step\""},
      {R"({"step": "7"})", ":1: \"step\" is string, not an integer"},
      {ok + R"({"step": 2, "loss": "low"})", ":2: \"loss\" is string, not a number"},
      {ok + R"({"step": 2, "skipped": 1})", ":2: \"skipped\" is number, not true or false"},
      {checkpoint_line(10, 1, 2) + "\n", ": no step records in 1 line(s)"},
      {"", ": no step records in 0 line(s)"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::filesystem::path file = dir / ("case" + std::to_string(i) + ".jsonl");
    write(file, cases[i].text);
    try {
      read_metrics(file);
      ADD_FAILURE() << "accepted: " << cases[i].text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_EQ(std::string(e.what()).rfind(file.string() + cases[i].message, 0), 0u) << e.what();
    }
  }
  for (const auto& [path, message] : {std::pair{dir / "missing.jsonl", ": cannot open: No such file or directory"},
                                      std::pair{dir.path(), ": is a directory"}}) {
    try {
      read_metrics(path);
      ADD_FAILURE() << "accepted " << path;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_EQ(std::string(e.what()), path.string() + message);
    }
  }
}

TEST(ReportDownsample, KeepsTheMinimumAndMaximumOfEveryBucket) {
  std::vector<Point> points;
  for (int i = 0; i < 100000; ++i) points.push_back({static_cast<double>(i), std::sin(i * 0.01)});
  points[12345].y = 1000;   // a spike
  points[54321].y = -1000;  // and a dip, each alone in its bucket
  const std::vector<Point> drawn = downsample_min_max(points, 2000);
  ASSERT_LE(drawn.size(), 2000u);
  ASSERT_GE(drawn.size(), 1900u);
  for (size_t i = 1; i < drawn.size(); ++i) EXPECT_LT(drawn[i - 1].x, drawn[i].x);
  // Bucket b holds points [b * n / 1000, (b + 1) * n / 1000): its extremes are among the drawn points.
  for (size_t b = 0; b < 1000; ++b) {
    const size_t begin = b * points.size() / 1000, end = (b + 1) * points.size() / 1000;
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = begin; i < end; ++i) lo = std::min(lo, points[i].y), hi = std::max(hi, points[i].y);
    bool found_lo = false, found_hi = false;
    for (const Point& p : drawn) {
      if (p.x < static_cast<double>(begin) || p.x >= static_cast<double>(end)) continue;
      found_lo |= p.y == lo;
      found_hi |= p.y == hi;
    }
    EXPECT_TRUE(found_lo && found_hi) << "bucket " << b;
  }
  // Few points are kept as they are.
  const std::vector<Point> few(points.begin(), points.begin() + 2000);
  const std::vector<Point> same = downsample_min_max(few, 2000);
  ASSERT_EQ(same.size(), few.size());
  for (size_t i = 0; i < few.size(); ++i) EXPECT_EQ(same[i].y, few[i].y);
}

// The <svg> of chart `name`, or "" when the page has none.
std::string chart(const std::string& html, const std::string& name) {
  const std::string open = "<svg id=\"chart-" + name + "\"";
  const size_t begin = html.find(open);
  if (begin == std::string::npos) return {};
  return html.substr(begin, html.find("</svg>", begin) + 6 - begin);
}

// Points of the polyline drawing `series` in `svg`; -1 when there is none.
int drawn_points(const std::string& svg, const std::string& series) {
  std::smatch match;
  const std::regex polyline("<polyline class=\"series\" data-series=\"" + series + "\"[^>]* points=\"([^\"]*)\"");
  if (!std::regex_search(svg, match, polyline)) return -1;
  std::istringstream points(match[1].str());
  int n = 0;
  for (std::string point; points >> point; ++n) {
    EXPECT_TRUE(std::regex_match(point, std::regex("-?[0-9.]+,-?[0-9.]+"))) << point;
  }
  return n;
}

TEST(ReportHtml, EveryChartDrawsOnePointPerStep) {
  const Metrics m = parse(run_text(50, {7, 8}));
  const std::string html = render_html(m, {"", "m.jsonl", 2000});
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>> expected = {
      {"loss", {{"loss", 50}}},
      {"lr", {{"lr", 50}}},
      {"grad-norm", {{"grad_norm", 48}}},  // skipped steps have no gradient norm
      {"loss-scale", {{"loss_scale", 50}}},
      {"tokens-per-s", {{"tokens_per_s", 50}}},
      // 10, 30, 40, 50 committed; 20 failed
      {"checkpoint", {{"training_lost_ms", 4}, {"loop_blocked_ms", 4}, {"write_ms", 4}}},
  };
  for (const auto& [name, series] : expected) {
    const std::string svg = chart(html, name);
    ASSERT_FALSE(svg.empty()) << "no chart " << name;
    EXPECT_NE(svg.find("<title id=\"chart-" + name + "-title\">"), std::string::npos) << name;
    EXPECT_NE(svg.find("class=\"axis y-axis\""), std::string::npos) << name;
    for (const auto& [key, points] : series) EXPECT_EQ(drawn_points(svg, key), points) << name << " " << key;
  }
  // Skipped steps are marked on the loss and loss-scale charts, the failed save on the checkpoint chart.
  for (const std::string name : {"loss", "loss-scale"}) {
    EXPECT_NE(chart(html, name).find("step 7: skipped"), std::string::npos) << name;
    EXPECT_NE(chart(html, name).find("step 8: skipped"), std::string::npos) << name;
  }
  EXPECT_NE(chart(html, "checkpoint").find("step 20: save failed: No space left on device"), std::string::npos);
  // The summary.
  EXPECT_NE(html.find("<dt>Steps</dt><dd>50<small>1 \u2013 50, 2 skipped</small>"), std::string::npos);
  EXPECT_NE(html.find("<dt>Checkpoint errors</dt><dd>1<"), std::string::npos);
  EXPECT_NE(html.find("<dt>Tokens/s</dt><dd>9,600<"), std::string::npos);
}

TEST(ReportHtml, LongSeriesAreDrawnDownsampled) {
  const Metrics m = parse(run_text(10000));
  std::vector<Point> losses;
  for (const StepPoint& p : m.steps) losses.push_back({static_cast<double>(p.step), p.loss});
  const std::string html = render_html(m, {"", "m.jsonl", 500});
  const int drawn = drawn_points(chart(html, "loss"), "loss");
  EXPECT_EQ(drawn, static_cast<int>(downsample_min_max(losses, 500).size()));
  EXPECT_LE(drawn, 500);
  // 999 committed saves (of 1000): above 500 too, so drawn as 250 minima and 250 maxima.
  EXPECT_EQ(drawn_points(chart(html, "checkpoint"), "training_lost_ms"), 500);
  EXPECT_NE(html.find("loss: min and max of 250 buckets of 10,000 points"), std::string::npos);
}

TEST(ReportHtml, TitleAndFileNameAreEscaped) {
  const Metrics m = parse(run_text(3));
  const std::string html = render_html(m, {"<script>alert(\"x\") & 'y'</script>", "runs/<b>.jsonl", 2000});
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  const std::string escaped = "&lt;script&gt;alert(&quot;x&quot;) &amp; &#39;y&#39;&lt;/script&gt;";
  EXPECT_NE(html.find("<title>" + escaped + "</title>"), std::string::npos);
  EXPECT_NE(html.find("<h1>" + escaped + "</h1>"), std::string::npos);
  EXPECT_NE(html.find("runs/&lt;b&gt;.jsonl"), std::string::npos);
  // Without --title, the file names the page.
  EXPECT_NE(render_html(m, {"", "a&b.jsonl", 2000}).find("<title>Training report: a&amp;b.jsonl</title>"),
            std::string::npos);
}

TEST(ReportHtml, PageIsSelfContained) {
  const std::string html = render_html(parse(run_text(30)), {"", "m.jsonl", 2000});
  for (const char* fetch : {"<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import", "http"}) {
    EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;
  }
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<style>"), std::string::npos);
}

TEST(ReportHtml, ChartWithoutDataSaysSo) {
  const std::string html = render_html(parse(step_line(1, 2.0) + "\n"), {"", "m.jsonl", 2000});
  const std::string svg = chart(html, "checkpoint");
  ASSERT_FALSE(svg.empty());
  EXPECT_EQ(drawn_points(svg, "training_lost_ms"), -1);
  EXPECT_NE(svg.find("no checkpoints in this file"), std::string::npos);
  EXPECT_EQ(drawn_points(chart(html, "loss"), "loss"), 1);
}

// Files written before the training-time-lost measure called the time save() held the loop
// "stall_ms": it is read as that, and the time lost, which they do not hold, is missing (not 0).
TEST(ReportMetrics, AnOlderFilesStallIsTheLoopBlockedTimeAndTheTimeLostIsUnknown) {
  const Metrics m =
      parse(step_line(1, 3.0) + "\n" +
            R"({"bytes":10,"event":"checkpoint","path":"p","stall_ms":0.5,"step":1,"write_ms":9})" + "\n");
  ASSERT_EQ(m.checkpoints.size(), 1u);
  EXPECT_DOUBLE_EQ(m.checkpoints[0].loop_blocked_ms, 0.5);
  EXPECT_TRUE(std::isnan(m.checkpoints[0].training_lost_ms));
  const std::string html = render_html(m, {"", "m.jsonl", 2000});
  EXPECT_EQ(drawn_points(chart(html, "checkpoint"), "loop_blocked_ms"), 1);
  EXPECT_EQ(drawn_points(chart(html, "checkpoint"), "training_lost_ms"), -1);
  EXPECT_NE(html.find("<dt>Training lost per save</dt><dd>-<"), std::string::npos);
}

}  // namespace
}  // namespace shardkit::report
