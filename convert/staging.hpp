// An output directory that appears only when complete: converters write into a hidden staging folder
// beside the destination and rename it into place at the end, so that a failed or interrupted
// conversion never leaves anything that looks valid.
#pragma once

#include <filesystem>
#include <vector>

namespace shardkit::convert {

class StagedDirectory {
 public:
  // Refuses a `destination` that overlaps one of `inputs` (the files and folders the conversion reads),
  // and an existing one unless `force` (then it is replaced at commit()), before anything is written.
  // Error(kInvalidInput) naming it.
  StagedDirectory(std::filesystem::path destination, const std::vector<std::filesystem::path>& inputs, bool force);
  // Removes the staging folder unless committed.
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  // Where to write.
  const std::filesystem::path& path() const noexcept { return staging_; }
  // fsyncs the staging folder's files' directory entries, moves it to the destination (replacing an
  // old one when forced) and fsyncs the parent.
  void commit();

 private:
  std::filesystem::path destination_;
  std::filesystem::path staging_;
  bool force_;
  bool committed_ = false;
};

}  // namespace shardkit::convert
