// Run directories: a folder of step directories and the `latest` pointer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"

namespace shardkit::ckpt {

// The checkpoint named by `run_dir`/latest, if the file exists. Error(kCorrupt) when it does not hold
// a plain step directory name, or is a symbolic link (its content would come from outside the folder).
std::optional<std::string> read_latest(const std::filesystem::path& run_dir);

// Turns a user's CKPT argument into a step directory: a directory with manifest.json is one; a
// directory with `latest` is a run directory and `latest` is followed (to a step directory of the
// run itself: Error(kCorrupt) when it names a symbolic link). Error(kInvalidInput) with a
// hint otherwise.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

struct CheckpointListing {
  std::string name;  // step directory name
  int64_t step = 0;
  bool committed = false;  // manifest present and valid
  bool latest = false;     // `latest` names it
  std::string problem;     // why it is not committed
  std::optional<Manifest> manifest;
};

// Every step directory of `run_dir`, by step. A symbolic link named like one is not a step directory:
// listing it would let pruning, resuming and setting aside act on a folder outside the run.
std::vector<CheckpointListing> list_checkpoints(const std::filesystem::path& run_dir);

// Removes `step_dir` if it is a directory itself (not a symbolic link) that holds no manifest (a save
// that never committed); returns whether it did. Never throws: this is cleanup on an error path.
bool remove_uncommitted(const std::filesystem::path& step_dir) noexcept;

// What killed saves leave in `run_dir`: step directories without a manifest and temporary files
// (`latest.tmp`, `*.tmp` inside step directories). Removes them, following no symbolic link: a link
// named like a step directory is left alone (the folder it points to is not the run's).
// Only for a run directory no other job writes to (the trainer holds its lock).
struct RunDirCleanup {
  std::vector<std::string> removed;     // one line per item removed
  std::vector<std::string> left_alone;  // one line per symbolic link named like a step directory
};
RunDirCleanup clean_run_dir(const std::filesystem::path& run_dir);

// Removes all but the newest `keep_last` (at least 1) committed step directories of `run_dir`, never
// the one `latest` names; what cannot be removed stays (a later prune tries again).
void prune_committed(const std::filesystem::path& run_dir, int keep_last);

// Renames a damaged step directory to <name>.damaged (kept for inspection, out of the run's way: the
// resumed run saves those steps again), replacing an older copy set aside; returns a line saying so.
std::string set_aside_damaged(const std::filesystem::path& step_dir);

}  // namespace shardkit::ckpt
