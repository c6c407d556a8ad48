// `shardkit convert export-dcp`: any checkpoint shardkit reads (its own, DeepSpeed's, PyTorch DCP's)
// written as torch.distributed.checkpoint.save writes the state dict of an FSDP2 model and its AdamW
// optimizer on `world_size` ranks, in get_state_dict's key layout: `model.<fqn>` (tied names too),
// `optim.state.<fqn>.{step,exp_avg,exp_avg_sq}` and `optim.param_groups.<i>.<field>`. Each rank's file
// holds its dim-0 shard of every tensor as FSDP2's Shard(0) placement cuts it. dcp.load reads it into a
// model and optimizer at any world size (its planner reshards); set_state_dict then gives the optimizer
// its groups and states. docs/FORMAT-DCP.md describes the files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "convert/stream.hpp"

namespace shardkit::convert {

struct DcpExportRequest {
  std::filesystem::path source;  // a shardkit step or run folder, a DeepSpeed folder or a DCP folder
  std::filesystem::path output;  // a new folder: receives .metadata and __R_0.distcp
  int world_size = 1;            // the ranks whose shards the files hold
  std::string model;             // for a DeepSpeed or DCP source, as import's --model
};

struct DcpExportResult {
  std::filesystem::path folder;
  int64_t step = 0;
  int world_size = 0;
  bool optimizer = false;  // whether the optimizer's state was written (the source had the moments)
};

DcpExportResult export_dcp(const DcpExportRequest& request, const ConvertOptions& options);

}  // namespace shardkit::convert
