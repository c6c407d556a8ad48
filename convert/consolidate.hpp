// `shardkit convert consolidate`: full weights out of a sharded checkpoint, streamed.
//   safetensors:   the family's Hugging Face names and orientations, a tied output projection once,
//                  {"format": "pt"}, config.json for its from_pretrained, sharded with an
//                  index above max_shard_bytes; fp32, or bf16/fp16 rounded to nearest even. From a model
//                  of no family (or a DeepSpeed folder, read in place), the module's own names and the
//                  config.json found beside the source, if any.
//   hdf5:          model.h5, one fp32 dataset per tensor in its full shape, the model config in attributes
//                  (any tensor table, a model shardkit knows or not).
//   hdf5-virtual:  view.h5, HDF5 virtual datasets that present every full tensor straight out of the
//                  shard files (no copy; see ckpt/virtual_view.hpp).
// With with_optimizer, the Adam moments are exported too, as tensors named
// "optimizer.exp_avg.<name>" and "optimizer.exp_avg_sq.<name>" (always fp32).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "ckpt/tensor_table.hpp"
#include "convert/stream.hpp"

namespace shardkit::convert {

enum class ExportFormat { kSafetensors, kHdf5, kHdf5Virtual };

struct ConsolidateRequest {
  // A step or run directory; for safetensors also a DeepSpeed checkpoint folder, read in place.
  std::filesystem::path source;
  std::filesystem::path output;  // a new directory
  ExportFormat format = ExportFormat::kSafetensors;
  ckpt::DType dtype = ckpt::DType::kF32;
  bool with_optimizer = false;
  uint64_t max_shard_bytes = 5'000'000'000;  // Hugging Face's default "5GB"
  std::string model;                         // for a DeepSpeed source, as `import-deepspeed --model`
};

// Returns the files written, relative to the output directory.
std::vector<std::string> consolidate(const ConsolidateRequest& request, const ConvertOptions& options);

}  // namespace shardkit::convert
