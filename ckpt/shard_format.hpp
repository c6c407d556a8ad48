// Names and constants of the on-disk format (docs/FORMAT.md is the specification; keep them in step).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardkit::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr std::string_view kShardFormatName = "shardkit-shard";
inline constexpr std::string_view kManifestFormatName = "shardkit-checkpoint";
inline constexpr std::string_view kManifestFileName = "manifest.json";
inline constexpr std::string_view kLatestFileName = "latest";
inline constexpr std::string_view kChecksumName = "xxh64";

// The names of the fp32 states a checkpoint holds for every parameter element: the master weights,
// and the optimizer's moments (the manifest's `states` lists a checkpoint's, master weights first).
inline constexpr std::string_view kMasterWeights = "fp32";
inline constexpr std::string_view kExpAvg = "exp_avg";
inline constexpr std::string_view kExpAvgSq = "exp_avg_sq";
// AdamW's states, in the order a run keeps them: what DeepSpeed and DCP checkpoints of AdamW hold,
// what their imports write, and the trainer's AdamW descriptor (other optimizers name their own).
inline constexpr std::array<std::string_view, 3> kAdamWStates = {kMasterWeights, kExpAvg, kExpAvgSq};
// kAdamWStates as a manifest's or a writer's list of state names.
std::vector<std::string> adamw_state_names();

inline constexpr int64_t kDefaultChunkElems = int64_t{1} << 18;  // 1 MiB of fp32 per chunk
// 16 MiB of fp32: every reader holds a chunk or two per thread (decoded, and as stored), so this cap,
// which writers enforce as well, is what a shard can make a reader allocate; 16 times the default.
inline constexpr int64_t kMaxChunkElems = int64_t{1} << 22;
inline constexpr size_t kMaxStates = 16;
// A manifest of 65,536 ranks and a 7B model's ~300 tensors is about 9 MB (130 bytes per shard entry);
// twice that leaves room, and keeps the parsed tree of a crafted manifest in the low hundreds of MB.
inline constexpr size_t kMaxManifestBytes = size_t{16} << 20;
// The largest step a checkpoint may record: a trillion steps (31 years at one step a millisecond).
// Step directory names then have at most 12 digits.
inline constexpr int64_t kMaxStep = 999'999'999'999;

// Shard file of `rank` in a checkpoint of `world_size` ranks: "shard-00003-of-00008.h5".
std::string shard_file_name(int rank, int world_size);

// Step directory of a checkpoint: "step-00001000" (8 digits at least); Error(kInvalidInput) for a
// step outside [0, kMaxStep].
std::string step_dir_name(int64_t step);
// The step of a step directory name, or -1 when `name` is not one (or names a step above kMaxStep).
int64_t parse_step_dir_name(std::string_view name) noexcept;

// HDF5 paths and attribute names inside a shard.
namespace shard_path {
inline constexpr char kFragments[] = "fragments";
inline constexpr char kTensorNames[] = "tensor_names";
inline constexpr char kStateGroup[] = "state";
inline constexpr char kChecksumGroup[] = "checksum";
}  // namespace shard_path

namespace shard_attr {
inline constexpr char kFormat[] = "format";
inline constexpr char kFormatVersion[] = "format_version";
inline constexpr char kCheckpointUid[] = "checkpoint_uid";
inline constexpr char kStep[] = "step";
inline constexpr char kRank[] = "rank";
inline constexpr char kWorldSize[] = "world_size";
inline constexpr char kStage[] = "stage";
inline constexpr char kAlignment[] = "alignment";
inline constexpr char kFlatSize[] = "flat_size";
inline constexpr char kChunkElems[] = "chunk_elems";
inline constexpr char kLayoutFingerprint[] = "layout_fingerprint";
inline constexpr char kStates[] = "states";
}  // namespace shard_attr

}  // namespace shardkit::ckpt
