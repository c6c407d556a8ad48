#include "trainer/nvme/swap_config.hpp"

#include <optional>

#include "trainer/nvme/swap_file.hpp"

namespace shardkit::trainer::nvme {

namespace {
const std::string kPrefix = "note: NVMe offload: ";
}  // namespace

SwapOptions swap_options(const DsConfig& config, const std::string& key, bool gpu, std::vector<std::string>& notes) {
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
  if (o.pin_memory) {
    notes.push_back(kPrefix + key + ".pin_memory has no effect" +
                    (gpu ? std::string(": the swap's buffers meet only the disk; gradients and weights cross to the "
                                       "GPU through the host optimizer's own page-locked buffers")
                         : std::string(" on CPU ranks (no copies to a device)")));
  }
  if (o.fast_init) notes.push_back(kPrefix + key + ".fast_init has no effect: the swap file is allocated at start-up");
  return out;
}

void note_aio(const AioConfig& aio, bool gpu, std::vector<std::string>& notes) {
  if (aio.intra_op_parallelism != 1) {
    notes.push_back(kPrefix + "aio.intra_op_parallelism " + std::to_string(aio.intra_op_parallelism) +
                    " has no effect: io_uring runs the requests without a thread pool");
  }
  if (aio.single_submit)
    notes.push_back(kPrefix + "aio.single_submit has no effect: requests are submitted in batches");
  if (!aio.overlap_events)
    notes.push_back(kPrefix + "aio.overlap_events false has no effect: I/O always overlaps the update");
  if (aio.use_gds) {
    notes.push_back(kPrefix + "aio.use_gds has no effect: " +
                    std::string(gpu ? "the states are updated by the CPU, so they pass through host memory anyway"
                                    : "there is no GPU on CPU ranks"));
  }
}

SwapFactory swap_factory(const DsConfig& config, bool gpu, int param_bytes, int optimizer_states,
                         comm::MpiCollective& comm, const std::function<void(const std::string&)>& log) {
  const ZeroConfig& z = config.zero;
  std::optional<SwapOptions> optimizer, params;
  std::vector<std::string> notes;
  if (z.offload_optimizer.device == OffloadDevice::kNvme)
    optimizer = swap_options(config, "offload_optimizer", gpu, notes);
  if (z.offload_param.device == OffloadDevice::kNvme) params = swap_options(config, "offload_param", gpu, notes);
  if (!optimizer && !params) return {};
  note_aio(config.aio, gpu, notes);
  for (const std::string& line : notes) log(line);
  return [optimizer, params, param_bytes, optimizer_states, &comm, log](int64_t elements) {
    struct Kind {
      const std::optional<SwapOptions>& options;
      int states, element_bytes;
      const char* contents;
      const char* name;
    };
    const Kind kinds[] = {{optimizer, optimizer_states, 4, "optimizer states", "optimizer"},
                          {params, 1, param_bytes, "parameters", "params"}};
    std::vector<SwapNeed> needs;
    for (const Kind& k : kinds) {
      if (k.options) needs.push_back(StateSwapper::need(*k.options, elements, k.states, k.contents, k.element_bytes));
    }
    check_node_free_space(comm, needs);
    std::unique_ptr<StateSwapper> swaps[2];
    for (size_t i = 0; i < 2; ++i) {
      const Kind& k = kinds[i];
      if (k.options) {
        swaps[i] = std::make_unique<StateSwapper>(*k.options, rank_swap_name(comm, k.name), elements, k.states,
                                                  k.contents, log, k.element_bytes);
      }
    }
    return Swaps{std::move(swaps[0]), std::move(swaps[1])};
  };
}

}  // namespace shardkit::trainer::nvme
