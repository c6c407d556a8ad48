#include "report/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/error.hpp"

namespace shardkit::report {
namespace {

using nlohmann::json;

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

// Errors name the source and the line as compilers do, so that editors jump to it.
class LineContext {
 public:
  LineContext(const std::string& name, int64_t line) : name_(name), line_(line) {}

  [[noreturn]] void fail(const std::string& what) const {
    shardkit::fail(ErrorKind::kInvalidInput, name_ + ":" + std::to_string(line_) + ": " + what);
  }

  // The number under `key`; NaN when absent or null (the trainer writes null for a grad norm it did
  // not compute, and nlohmann::json writes NaN and infinities as null).
  double number(const json& record, const char* key) const {
    const auto it = record.find(key);
    if (it == record.end() || it->is_null()) return kMissing;
    if (!it->is_number()) fail(std::string("\"") + key + "\" is " + it->type_name() + ", not a number");
    return it->get<double>();
  }

  int64_t step(const json& record) const {
    const auto it = record.find("step");
    if (it == record.end()) fail("record without \"step\"");
    if (!it->is_number_integer()) fail(std::string("\"step\" is ") + it->type_name() + ", not an integer");
    return it->get<int64_t>();
  }

 private:
  const std::string& name_;
  int64_t line_;
};

StepPoint step_point(const json& record, const LineContext& at) {
  StepPoint p;
  p.step = at.step(record);
  p.loss = at.number(record, "loss");
  p.lr = at.number(record, "lr");
  p.grad_norm = at.number(record, "grad_norm");
  p.loss_scale = at.number(record, "loss_scale");
  p.tokens_per_s = at.number(record, "tokens_per_s");
  if (const auto it = record.find("skipped"); it != record.end()) {
    if (!it->is_boolean()) at.fail(std::string("\"skipped\" is ") + it->type_name() + ", not true or false");
    p.skipped = it->get<bool>();
  }
  return p;
}

CheckpointEvent checkpoint_event(const json& record, bool failed, const LineContext& at) {
  CheckpointEvent e;
  e.step = at.step(record);
  e.failed = failed;
  e.training_lost_ms = at.number(record, "training_lost_ms");
  // Files written before training_lost_ms called the time save() held the loop "stall_ms".
  e.loop_blocked_ms = at.number(record, record.contains("loop_blocked_ms") ? "loop_blocked_ms" : "stall_ms");
  e.write_ms = at.number(record, "write_ms");
  if (const auto it = record.find("error"); it != record.end() && it->is_string()) e.error = it->get<std::string>();
  return e;
}

// Sorts by step and keeps, of each step, the record that came last in the file. Returns how many
// records were dropped.
template <typename Record>
int64_t keep_last_of_each_step(std::vector<Record>& records) {
  const auto by_step = [](const Record& a, const Record& b) { return a.step < b.step; };
  // stable: records of one step stay in file order, so the last of a run of equal steps is the newest.
  if (!std::is_sorted(records.begin(), records.end(), by_step)) {
    std::stable_sort(records.begin(), records.end(), by_step);
  }
  size_t kept = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    if (i + 1 < records.size() && records[i + 1].step == records[i].step) continue;
    if (kept != i) records[kept] = std::move(records[i]);  // (a self-move would empty the strings)
    ++kept;
  }
  const auto dropped = static_cast<int64_t>(records.size() - kept);
  records.resize(kept);
  return dropped;
}

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

Metrics parse(std::istream& in, const std::string& name, int64_t total_bytes, const ReadProgress& progress) {
  constexpr int64_t kProgressBytes = int64_t{1} << 20;
  Metrics m;
  std::string line;
  int64_t number = 0;
  int64_t bytes = 0;
  int64_t reported = 0;
  while (std::getline(in, line)) {
    ++number;
    bytes += static_cast<int64_t>(line.size()) + 1;
    if (progress && bytes - reported >= kProgressBytes) {
      progress(bytes, total_bytes);
      reported = bytes;
    }
    if (blank(line)) continue;
    const LineContext at(name, number);
    json record;
    try {
      record = json::parse(line);
    } catch (const json::parse_error& e) {
      // getline sets eof only for a last line without its newline.
      if (in.eof()) {
        m.cut_off_last_line = true;
        break;
      }
      at.fail("not JSON (syntax error at column " + std::to_string(e.byte) + ")");
    }
    if (!record.is_object()) at.fail(std::string("not a JSON object but ") + record.type_name());
    const auto event = record.find("event");
    if (event == record.end()) {
      m.steps.push_back(step_point(record, at));
    } else if (*event == "checkpoint" || *event == "checkpoint_error") {
      m.checkpoints.push_back(checkpoint_event(record, *event == "checkpoint_error", at));
    }
    // Events of other kinds are not charted; ignoring them lets newer trainers add some.
  }
  if (m.steps.empty()) {
    fail(ErrorKind::kInvalidInput, name + ": no step records in " + std::to_string(number) +
                                       " line(s) (expected the file of `shardkit train --metrics`)");
  }
  m.replaced_records = keep_last_of_each_step(m.steps);
  keep_last_of_each_step(m.checkpoints);
  return m;
}

}  // namespace

Metrics parse_metrics(std::istream& in, const std::string& name) {
  return parse(in, name, 0, {});
}

Metrics read_metrics(const std::filesystem::path& file, const ReadProgress& progress) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) fail(ErrorKind::kInvalidInput, file.string() + ": is a directory");
  std::ifstream in(file);
  if (!in) fail(ErrorKind::kInvalidInput, file.string() + ": cannot open: " + std::strerror(errno));
  const auto size = std::filesystem::file_size(file, ec);
  Metrics m = parse(in, file.string(), ec ? 0 : static_cast<int64_t>(size), progress);
  if (in.bad()) fail_errno(file.string() + ": read failed", errno);
  return m;
}

std::vector<Point> downsample_min_max(const std::vector<Point>& points, size_t max_points) {
  if (points.size() <= max_points) return points;
  const size_t buckets = std::max<size_t>(max_points / 2, 1);
  std::vector<Point> out;
  out.reserve(2 * buckets);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * points.size() / buckets;
    const size_t end = (b + 1) * points.size() / buckets;
    const auto by_y = [](const Point& p, const Point& q) { return p.y < q.y; };
    const auto [lo, hi] = std::minmax_element(points.begin() + static_cast<std::ptrdiff_t>(begin),
                                              points.begin() + static_cast<std::ptrdiff_t>(end), by_y);
    if (lo == hi) {
      out.push_back(*lo);
    } else {
      out.push_back(lo < hi ? *lo : *hi);
      out.push_back(lo < hi ? *hi : *lo);
    }
  }
  return out;
}

}  // namespace shardkit::report
