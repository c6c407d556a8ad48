// The DeepSpeed config's NVMe offload settings (offload_optimizer / offload_param, aio) as the swapper's
// options, with a note for each setting that has no counterpart in shardkit's swapper. Shared by the
// backends.
#pragma once

#include <string>
#include <vector>

#include "trainer/ds_config.hpp"
#include "trainer/nvme/state_swapper.hpp"

namespace shardkit::trainer::nvme {

// The options of the swap that zero_optimization.`key` ("offload_optimizer" or "offload_param", whose
// device must be "nvme") asks for. `notes` receives one line per setting of that block accepted without
// effect (or adjusted).
SwapOptions swap_options(const DsConfig& config, const std::string& key, std::vector<std::string>& notes);
// One line per setting of the aio block accepted without effect.
void note_aio(const AioConfig& aio, std::vector<std::string>& notes);

}  // namespace shardkit::trainer::nvme
