#include "trainer/nvme/swap_config.hpp"

namespace shardkit::trainer::nvme {

namespace {
const std::string kPrefix = "note: NVMe offload: ";
}  // namespace

SwapOptions swap_options(const DsConfig& config, const std::string& key, std::vector<std::string>& notes) {
  const OffloadConfig& o = key == "offload_param" ? config.zero.offload_param : config.zero.offload_optimizer;
  SwapOptions out;
  out.dir = o.nvme_path;
  out.chunk_bytes = config.aio.block_size;
  out.queue_depth = static_cast<unsigned>(config.aio.queue_depth);
  out.buffer_count = static_cast<int>(o.buffer_count);
  if (o.buffer_count < 3) {
    notes.push_back(kPrefix + key + ".buffer_count " + std::to_string(o.buffer_count) +
                    " raised to 3 (one chunk read ahead, one updated, one written back)");
  }
  if (o.pin_memory) notes.push_back(kPrefix + key + ".pin_memory has no effect on CPU ranks (no copies to a device)");
  if (o.fast_init) notes.push_back(kPrefix + key + ".fast_init has no effect: the swap file is allocated at start-up");
  return out;
}

void note_aio(const AioConfig& aio, std::vector<std::string>& notes) {
  if (aio.intra_op_parallelism != 1) {
    notes.push_back(kPrefix + "aio.intra_op_parallelism " + std::to_string(aio.intra_op_parallelism) +
                    " has no effect: io_uring runs the requests without a thread pool");
  }
  if (aio.single_submit)
    notes.push_back(kPrefix + "aio.single_submit has no effect: requests are submitted in batches");
  if (!aio.overlap_events)
    notes.push_back(kPrefix + "aio.overlap_events false has no effect: I/O always overlaps the update");
  if (aio.use_gds) notes.push_back(kPrefix + "aio.use_gds has no effect: there is no GPU on CPU ranks");
}

}  // namespace shardkit::trainer::nvme
