// The DeepSpeed config's NVMe offload settings (offload_optimizer / offload_param, aio) as the swapper's
// options, with a note for each setting that has no counterpart in shardkit's swapper, and the swap
// files a rank's engine opens from them. Shared by the backends.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi.hpp"
#include "trainer/ds_config.hpp"
#include "trainer/nvme/state_swapper.hpp"

namespace shardkit::trainer::nvme {

// The options of the swap that zero_optimization.`key` ("offload_optimizer" or "offload_param", whose
// device must be "nvme") asks for. `notes` receives one line per setting of that block accepted without
// effect (or adjusted).
// `gpu`: the states move between a GPU and the host optimizer (which changes what some settings mean).
SwapOptions swap_options(const DsConfig& config, const std::string& key, bool gpu, std::vector<std::string>& notes);
// One line per setting of the aio block accepted without effect.
void note_aio(const AioConfig& aio, bool gpu, std::vector<std::string>& notes);

// A rank's swaps: its optimizer states (master weights and moments) and its stage 3 parameter
// partition (one state); null where that is not swapped.
struct Swaps {
  std::unique_ptr<StateSwapper> optimizer, params;
};
// Opens a rank's swaps for `elements` elements of each state, once its engine knows its partition:
// checks the node's free space for every rank's files first (collective), then creates them.
using SwapFactory = std::function<Swaps(int64_t elements)>;
// The factory for what config.zero sends to NVMe (offload_optimizer, offload_param with device
// "nvme"); empty when nothing goes there. `optimizer_states`: the optimizer's fp32 states per element
// (the master weights included). `param_bytes`: the width of a parameter in its swap (4 on
// CPU ranks, which compute in fp32; the compute type's on GPUs). The notes on its settings go to
// `log` now.
SwapFactory swap_factory(const DsConfig& config, bool gpu, int param_bytes, int optimizer_states,
                         comm::MpiCollective& comm, const std::function<void(const std::string&)>& log);

}  // namespace shardkit::trainer::nvme
