#include "ckpt/run_dir.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/write_target.hpp"
#include "ckpt/shard_format.hpp"

namespace shardkit::ckpt {

std::optional<std::string> read_latest(const std::filesystem::path& run_dir) {
  const std::filesystem::path path = run_dir / kLatestFileName;
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, ec);
  if (std::filesystem::is_symlink(status)) {
    fail(ErrorKind::kCorrupt,
         path.string() + ": a symbolic link, not followed (expected a file naming a step directory)");
  }
  if (!std::filesystem::is_regular_file(status)) return std::nullopt;
  std::string name = read_small_file(path, 4096);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (parse_step_dir_name(name) < 0) {
    fail(ErrorKind::kCorrupt, path.string() + ": does not name a step directory (expected step-NNNNNNNN)");
  }
  return name;
}

std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(ErrorKind::kInvalidInput, path.string() + ": no such directory");
  if (!std::filesystem::is_directory(path, ec)) {
    fail(ErrorKind::kInvalidInput, path.string() + ": not a directory (expected a step or run directory)");
  }
  if (std::filesystem::exists(path / kManifestFileName, ec)) return path;
  if (const auto latest = read_latest(path)) {
    const std::filesystem::path step_dir = path / *latest;
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(step_dir, ec))) {
      fail(ErrorKind::kCorrupt, (path / kLatestFileName).string() + " names " + *latest +
                                    ", a symbolic link, not a step directory of this run (not followed)");
    }
    if (!std::filesystem::exists(step_dir / kManifestFileName, ec)) {
      fail(ErrorKind::kCorrupt, (path / kLatestFileName).string() + " names " + *latest +
                                    ", which holds no committed checkpoint (no manifest.json)");
    }
    return step_dir;
  }
  if (parse_step_dir_name(path.filename().string()) >= 0) {
    fail(ErrorKind::kInvalidInput, path.string() + ": no manifest.json: the checkpoint was never committed");
  }
  fail(ErrorKind::kInvalidInput, path.string() + ": not a shardkit checkpoint (expected manifest.json or latest)");
}

std::vector<CheckpointListing> list_checkpoints(const std::filesystem::path& run_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(run_dir, ec)) {
    fail(ErrorKind::kInvalidInput, run_dir.string() + ": not a directory");
  }
  std::optional<std::string> latest;
  try {
    latest = read_latest(run_dir);
  } catch (const Error&) {
    latest.reset();  // a damaged `latest` marks nothing; the listing still shows every checkpoint
  }
  std::vector<CheckpointListing> out;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = parse_step_dir_name(name);
    if (step < 0 || !is_real_directory(entry.path())) continue;
    CheckpointListing item;
    item.name = name;
    item.step = step;
    item.latest = latest && *latest == name;
    if (!std::filesystem::exists(entry.path() / kManifestFileName)) {
      item.problem = "no manifest (incomplete save)";
    } else {
      try {
        item.manifest = read_manifest(entry.path());
        item.committed = true;
      } catch (const Error& e) {
        item.problem = e.what();
      }
    }
    out.push_back(std::move(item));
  }
  if (ec) fail(ErrorKind::kIo, run_dir.string() + ": cannot list: " + ec.message());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

bool remove_uncommitted(const std::filesystem::path& step_dir) noexcept {
  std::error_code ec;
  if (!is_real_directory(step_dir) || std::filesystem::exists(step_dir / kManifestFileName, ec)) {
    return false;
  }
  return std::filesystem::remove_all(step_dir, ec) > 0 && !ec;
}

RunDirCleanup clean_run_dir(const std::filesystem::path& run_dir) {
  RunDirCleanup out;
  std::error_code ec;
  if (!std::filesystem::is_directory(run_dir, ec)) return out;
  // remove(3) of a symbolic link removes the link, not what it points to.
  auto remove_file = [&](const std::filesystem::path& path) {
    std::error_code rc;
    if (!is_real_directory(path) && std::filesystem::remove(path, rc)) {
      out.removed.push_back("removed " + path.string() + " (temporary file)");
    }
  };
  std::vector<std::filesystem::path> entries;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) entries.push_back(entry.path());
  if (ec) fail(ErrorKind::kIo, run_dir.string() + ": cannot list: " + ec.message());
  for (const std::filesystem::path& path : entries) {
    const std::string name = path.filename().string();
    if (name == std::string(kLatestFileName) + ".tmp") {
      remove_file(path);
    } else if (parse_step_dir_name(name) >= 0 &&
               std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec))) {
      out.left_alone.push_back("left " + path.string() + " alone: a symbolic link, not a step directory of this run");
    } else if (parse_step_dir_name(name) >= 0 && is_real_directory(path)) {
      if (remove_uncommitted(path)) {
        out.removed.push_back("removed " + path.string() + " (a save that never committed: no manifest)");
        continue;
      }
      std::vector<std::filesystem::path> temporary;
      for (const auto& inner : std::filesystem::directory_iterator(path, ec)) {
        if (inner.path().extension() == ".tmp") temporary.push_back(inner.path());
      }
      for (const auto& file : temporary) remove_file(file);
    }
  }
  return out;
}

void prune_committed(const std::filesystem::path& run_dir, int keep_last) {
  std::vector<CheckpointListing> committed;
  for (auto& c : list_checkpoints(run_dir)) {
    if (c.committed) committed.push_back(std::move(c));
  }
  const auto keep = static_cast<size_t>(std::max(keep_last, 1));
  for (size_t i = 0; i + keep < committed.size(); ++i) {
    if (committed[i].latest) continue;
    std::error_code ec;
    std::filesystem::remove_all(run_dir / committed[i].name, ec);
  }
}

std::string set_aside_damaged(const std::filesystem::path& step_dir) {
  std::filesystem::path target = step_dir;
  target += ".damaged";
  std::error_code ec;
  std::filesystem::remove_all(target, ec);  // an older set-aside copy of the same step
  std::filesystem::rename(step_dir, target, ec);
  if (ec) return "could not move " + step_dir.string() + " aside: " + ec.message();
  return "moved " + step_dir.string() + " aside to " + target.filename().string();
}

}  // namespace shardkit::ckpt
