#include "ckpt/bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "base/clock.hpp"
#include "base/error.hpp"
#include "base/xxh64.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/synthetic.hpp"

namespace shardkit::ckpt {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The benchmark writes an AdamW run's states.
constexpr int kStates = static_cast<int>(kAdamWStates.size());
constexpr int64_t kStateBytes = kStates * int64_t{sizeof(float)};

}  // namespace

SaveBenchResult run_save_bench(Collective& group, const SaveBenchOptions& options) {
  if (options.bytes < 1024) fail(ErrorKind::kInvalidInput, "bench ckpt: --size must be at least 1 KiB");
  if (options.repeat < 1) fail(ErrorKind::kInvalidInput, "bench ckpt: --repeat must be at least 1");
  const TensorTable table = synthetic_table(options.bytes / kStateBytes);
  const int64_t payload = table.total_elements() * kStateBytes;
  const Layout layout(table, {group.size(), options.stage, kDefaultAlignment});
  std::vector<std::vector<float>> buffers(kStates);
  SaveRequest request;
  request.run_dir = options.dir;
  request.meta.table = &table;
  request.meta.layout = layout.spec();
  request.meta.states = adamw_state_names();
  request.meta.shard = options.shard;
  request.meta.model = {{"synthetic", true}, {"seed", options.seed}};
  for (int s = 0; s < kStates; ++s) {
    buffers[s].resize(static_cast<size_t>(layout.flat_size()));
    fill_synthetic(layout, group.rank(), options.seed, s, buffers[s]);
    request.buffers.push_back(buffers[s]);
  }

  // Continue after the newest step already in the directory; agree on it through rank 0.
  int64_t first_step = 1;
  if (group.rank() == 0) {
    std::error_code ec;
    if (std::filesystem::is_directory(options.dir, ec)) {
      for (const auto& c : list_checkpoints(options.dir)) first_step = std::max(first_step, c.step + 1);
    }
  }
  first_step = std::stoll(group.broadcast(std::to_string(first_step)));

  SaveBenchResult result;
  result.durable = options.shard.durable;
  for (int i = 0; i < options.repeat; ++i) {
    request.meta.step = first_step + i;
    if (group.rank() == 0) {
      // Keep only the newest checkpoint this run wrote, so that repeats do not fill the disk; and
      // flush what earlier repeats left dirty, so that its write-back does not throttle this one.
      if (!result.last_checkpoint.empty()) std::filesystem::remove_all(result.last_checkpoint);
      ::sync();
    }
    group.broadcast("");  // start together
    const auto start = Clock::now();
    const SaveResult saved = save_checkpoint(group, request);
    result.all_seconds.push_back(seconds_since(start));
    result.bytes = saved.bytes;
    result.last_checkpoint = saved.step_dir;
    if (options.progress) options.progress((i + 1) * payload, options.repeat * payload);
  }
  result.seconds = median(result.all_seconds);
  return result;
}

ChecksumBenchResult run_checksum_bench(int64_t bytes,
                                       const std::function<void(int64_t done, int64_t total)>& progress) {
  if (bytes < 1024) fail(ErrorKind::kInvalidInput, "bench checksum: --size must be at least 1 KiB");
  std::vector<unsigned char> data(static_cast<size_t>(bytes));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  std::vector<unsigned char> copy(data.size());
  ChecksumBenchResult result;
  result.bytes = bytes;
  double best_hash = 1e30, best_copy = 1e30;
  volatile uint64_t sink = 0;
  constexpr int kPasses = 5;
  for (int pass = 0; pass < kPasses; ++pass) {
    auto start = Clock::now();
    sink = sink + xxh64(data.data(), data.size());
    best_hash = std::min(best_hash, seconds_since(start));
    start = Clock::now();
    std::memcpy(copy.data(), data.data(), data.size());
    best_copy = std::min(best_copy, seconds_since(start));
    sink = sink + copy[static_cast<size_t>(pass)];
    if (progress) progress((pass + 1) * bytes, kPasses * bytes);
  }
  result.xxh64_gb_per_s = static_cast<double>(bytes) / best_hash / 1e9;
  result.memcpy_gb_per_s = static_cast<double>(bytes) / best_copy / 1e9;
  return result;
}

}  // namespace shardkit::ckpt
