// The DeepSpeed config's NVMe offload settings (offload_optimizer, aio) as the swapper's options, with
// a note for each setting that has no counterpart in shardkit's swapper. Shared by the backends.
#pragma once

#include <string>
#include <vector>

#include "trainer/ds_config.hpp"
#include "trainer/nvme/state_swapper.hpp"

namespace shardkit::trainer::nvme {

// config.zero.offload_optimizer.device must be "nvme". `notes` receives one line per setting accepted
// without effect (or adjusted).
SwapOptions optimizer_swap_options(const DsConfig& config, std::vector<std::string>& notes);

}  // namespace shardkit::trainer::nvme
