// The metrics file of `shardkit train --metrics` read back: one JSON object per line, step records
// ({"step", "loss", "lr", ...}) and events ({"event": "checkpoint" | "checkpoint_error", "step", ...}).
// A resumed run appends to the same file and repeats the steps after its checkpoint, so the last
// record of a step is the one that counts. Also the downsampling that keeps long series drawable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <istream>
#include <string>
#include <vector>

namespace shardkit::report {

// One optimizer step. Values the record lacks or holds as null (grad_norm of a skipped step; a NaN
// loss, which JSON cannot represent) are NaN.
struct StepPoint {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double loss_scale = 0;
  double tokens_per_s = 0;
  bool skipped = false;  // fp16 overflow: the update was dropped and the loss scale lowered
};

// One save: committed ("checkpoint") or failed ("checkpoint_error", times NaN, `error` set).
struct CheckpointEvent {
  int64_t step = 0;
  bool failed = false;
  double training_lost_ms = 0;  // what the save cost training (NaN in files older than the field)
  double loop_blocked_ms = 0;   // of which save() held the training loop (older files: "stall_ms")
  double write_ms = 0;          // snapshot to committed and durable
  std::string error;
};

struct Metrics {
  std::vector<StepPoint> steps;              // ascending step, one per step (the last record of it)
  std::vector<CheckpointEvent> checkpoints;  // ascending step, one per step (the last event of it)
  int64_t replaced_records = 0;              // step records superseded by a later one (resumed runs)
  // The file ended in a line that is not JSON and has no newline: the run was killed while writing
  // it. That line is left out (the caller warns); anywhere else such a line is an error.
  bool cut_off_last_line = false;
};

// Told (bytes read, file size) every MiB or so while a file is read: files of long runs take seconds.
using ReadProgress = std::function<void(int64_t done, int64_t total)>;

// Reads `file`. Errors are Error(kInvalidInput) naming the file (and the line, as FILE:LINE:): a file
// that cannot be read, a line that is not JSON or not an object, a field of the wrong type, no step
// records at all. Blank lines and events of other kinds are ignored.
Metrics read_metrics(const std::filesystem::path& file, const ReadProgress& progress = {});

// The same from a stream; `name` stands for the file in error messages.
Metrics parse_metrics(std::istream& in, const std::string& name);

struct Point {
  double x = 0;
  double y = 0;
};

// At most `max_points` of `points` (ascending x) that draw the same envelope: the points are cut into
// max_points / 2 buckets of consecutive points and each bucket keeps its minimum and its maximum (in
// x order), so spikes survive. Returns `points` unchanged when they are few enough. A `max_points`
// below 2 counts as 2.
std::vector<Point> downsample_min_max(const std::vector<Point>& points, size_t max_points);

}  // namespace shardkit::report
