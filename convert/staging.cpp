#include "convert/staging.hpp"

#include <random>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/write_target.hpp"

namespace shardkit::convert {
namespace {

std::filesystem::path parent_of(const std::filesystem::path& p) {
  const std::filesystem::path abs = std::filesystem::absolute(p);
  return abs.parent_path();
}

}  // namespace

StagedDirectory::StagedDirectory(std::filesystem::path destination, const std::vector<std::filesystem::path>& inputs,
                                 bool force)
    : destination_(std::filesystem::absolute(destination).lexically_normal()), force_(force) {
  if (destination_.filename().empty()) destination_ = destination_.parent_path();
  // --force replaces the destination: one that holds or is an input would delete it.
  for (const std::filesystem::path& input : inputs) refuse_overlap(input, destination);
  std::error_code ec;
  if (std::filesystem::exists(destination_, ec) && !force) {
    fail(ErrorKind::kInvalidInput, destination_.string() + " already exists (use --force to replace it)");
  }
  const std::filesystem::path parent = destination_.parent_path();
  std::filesystem::create_directories(parent, ec);
  if (ec) fail(ErrorKind::kIo, parent.string() + ": cannot create directory: " + ec.message());
  std::random_device random;
  staging_ = parent / ("." + destination_.filename().string() + ".partial-" + std::to_string(random()));
  std::filesystem::create_directory(staging_, ec);
  if (ec) fail(ErrorKind::kIo, staging_.string() + ": cannot create directory: " + ec.message());
}

StagedDirectory::~StagedDirectory() {
  if (committed_) return;
  std::error_code ec;
  std::filesystem::remove_all(staging_, ec);
}

void StagedDirectory::commit() {
  std::error_code ec;
  if (std::filesystem::exists(destination_, ec)) {
    if (!force_) fail(ErrorKind::kInvalidInput, destination_.string() + " appeared while converting");
    std::filesystem::remove_all(destination_, ec);
    if (ec) fail(ErrorKind::kIo, destination_.string() + ": cannot remove: " + ec.message());
  }
  fsync_directory(staging_);
  std::filesystem::rename(staging_, destination_, ec);
  if (ec) fail(ErrorKind::kIo, "rename " + staging_.string() + " -> " + destination_.string() + ": " + ec.message());
  committed_ = true;
  fsync_directory(parent_of(destination_));
}

}  // namespace shardkit::convert
