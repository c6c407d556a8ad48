// Helpers for the multi-rank test binaries: a directory shared by all ranks, files that rank 0 writes
// for everyone, and a training run on rank 0 alone whose records every rank receives.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/mpi.hpp"
#include "tests/support/test_support.hpp"
#include "trainer/trainer.hpp"

namespace shardkit::testing {

// A temporary directory created by rank 0, its path broadcast; removed after a final barrier.
class SharedDir {
 public:
  explicit SharedDir(comm::MpiCollective& world);
  ~SharedDir();
  const std::filesystem::path& path() const noexcept { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

  // Rank 0 writes `count` deterministic byte-level tokens (ids 32..121) / a JSON file; every rank
  // waits until it is there.
  std::filesystem::path write_tokens(const std::string& name, int count);
  std::filesystem::path write_json(const std::string& name, const nlohmann::json& content);

 private:
  comm::MpiCollective& world_;
  std::unique_ptr<TempDir> local_;
  std::filesystem::path path_;
};

// Trains with `options` on every rank of `comm`; returns the records of the steps run.
std::vector<trainer::StepRecord> train(comm::MpiCollective& comm, const trainer::TrainOptions& options);

// Trains on rank 0 alone (a world of one); every rank receives the step, loss, lr and loss scale.
std::vector<trainer::StepRecord> train_on_rank0(comm::MpiCollective& world, const trainer::TrainOptions& options);

}  // namespace shardkit::testing
