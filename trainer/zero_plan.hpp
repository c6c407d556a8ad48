// The ZeRO plan: what one rank of a ZeRO engine holds and exchanges, derived from the layout function
// (ckpt/layout.hpp) for a given rank. Both engines -- CPU ranks (zero_engine.hpp) and GPUs
// (cuda/gpu_engine.hpp) -- size their buffers, place the rank's partition and cut their collectives
// with it, so the partitioning arithmetic lives in the layout and here, and nowhere else.
//
//   replicated buffers (stages 0-2): W * P elements, tensor t at the layout's global offset, rank r's
//     partition at r * P. Parameters (stages 0-2) and gradients (stages 0-1) live there.
//   optimizer view: where master weights, moments and reduced gradients live. Stage 0: the whole
//     replicated buffer (every rank updates everything); stages 1-2: the rank's partition (P);
//     stage 3: the rank's slots (the layout's flat buffer). Its checkpointed slice is the rank's flat
//     buffer: at stage 0 the rank's partition of the view, else all of it.
//   slot runs (stage 3): consecutive tensors [first, last) occupy [base, base + span) of every rank's
//     flat buffer, so a gather or reduce-scatter of the run moves W blocks of `span` elements, rank
//     r's block at r * span.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ckpt/layout.hpp"
#include "ckpt/tensor_table.hpp"
#include "model/param_store.hpp"

namespace shardkit::trainer {

// Stages 0-2: consecutive tensors [first, last) in the replicated buffer, elements [lo, hi).
struct GlobalRun {
  int64_t lo = 0, hi = 0;
};

// The part of a GlobalRun inside one rank's partition: `count` elements from `offset` of the partition
// (count 0: none).
struct PartitionShare {
  int64_t offset = 0, count = 0;
};

// Stage 3: consecutive tensors [first, last) and the range of every rank's flat buffer their slots
// occupy.
struct SlotRun {
  int first = 0, last = 0;
  int64_t base = 0, span = 0;
};

// One rank's piece of one tensor in a slot run: elements [tensor_offset, tensor_offset + count) of the
// tensor sit at `block_offset` of a buffer holding the run's W blocks (rank r's at r * span).
struct PieceCopy {
  int tensor = 0;
  int rank = 0;
  int64_t tensor_offset = 0, block_offset = 0, count = 0;
};

class ZeroPlan {
 public:
  // Throws Error(kInvalidInput) for a spec the layout refuses; rank must be in [0, world_size).
  ZeroPlan(const ckpt::TensorTable& table, int world_size, int rank, int stage);

  const ckpt::Layout& layout() const noexcept { return layout_; }
  int stage() const noexcept { return layout_.stage(); }
  // What the stage partitions across the ranks (ZeRO's definition: 1 the optimizer states, 2 also the
  // gradients, 3 also the parameters); the engines ask these rather than compare stage numbers.
  bool partitions_optimizer() const noexcept { return stage() >= 1; }
  bool partitions_grads() const noexcept { return stage() >= 2; }
  bool partitions_params() const noexcept { return stage() == 3; }
  // Stages 1-2: each rank updates its partition of the replicated parameters, which an all-gather
  // then brings to every rank.
  bool gathers_updated_params() const noexcept { return partitions_optimizer() && !partitions_params(); }
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return layout_.world_size(); }
  int num_tensors() const noexcept { return static_cast<int>(numel_.size()); }
  int64_t numel(int tensor) const noexcept { return numel_[static_cast<size_t>(tensor)]; }

  // Stages 0-2: the size of the replicated buffers (0 at stage 3), the partition size P, and where rank
  // r's partition starts in them (Error(kInternal) at stage 3).
  int64_t replicated_size() const noexcept;
  int64_t partition_size() const { return layout_.partition_size(); }
  int64_t partition_offset(int rank) const { return rank * layout_.partition_size(); }

  // The optimizer view's size, and the rank's checkpointed slice of it: [owned_offset(), owned_offset()
  // + owned_size()), in the layout of the rank's checkpoint shard.
  int64_t optimizer_size() const noexcept;
  int64_t owned_offset() const noexcept;
  int64_t owned_size() const noexcept { return layout_.flat_size(); }
  // What the rank keeps optimizer states for, at positions of the optimizer view, by increasing
  // position: the layout's fragments of the rank, or at stage 0 every tensor whole.
  std::vector<ckpt::Fragment> optimizer_fragments() const;

  // Stages 0-2: tensors [first, last) in the replicated buffer, and the part of them in rank r's
  // partition. A reduce-scatter of the run hands rank r share(run, r).count elements.
  GlobalRun global_run(int first, int last) const;
  PartitionShare share(const GlobalRun& run, int rank) const noexcept;

  // Stage 3: the slots of tensors [first, last); the same range cut into runs of consecutive tensors
  // whose slots fit `max_elements` (at least one tensor each), as gathers move them; and the pieces of
  // a run, tensor by tensor and rank by rank (empty pieces left out).
  SlotRun slots(int first, int last) const;
  std::vector<SlotRun> buckets(int first, int last, int64_t max_elements) const;
  std::vector<PieceCopy> pieces(const SlotRun& run) const;

 private:
  int64_t slot_end(int last) const;

  ckpt::Layout layout_;
  std::vector<int64_t> numel_;
  int rank_;
};

// The parts of `fragments` (flat offsets in one buffer) inside its elements [lo, hi), with flat
// offsets relative to lo: what one chunk of a buffer filled chunk by chunk receives.
std::vector<ckpt::Fragment> fragments_within(std::span<const ckpt::Fragment> fragments, int64_t lo, int64_t hi);

// Stage 3's guess of the group gathered after `group` (of `count`), `previous` having been gathered
// before it (-1: none): the model walks the groups up in the forward pass and down in the backward
// pass, so the next one in the same direction; -1 when there is no guess or it would leave the model.
// What the engines gather or read ahead while the model computes.
int likely_next_group(int group, int previous, int count) noexcept;

// The tensors of the groups `closed` (indices into `groups`, in the order they closed) as runs of
// consecutive tensors [first, last), by increasing first: the backward pass closes a bucket's groups
// from the last one down, and the engines reduce each run with one collective.
std::vector<model::TensorGroup> consecutive_runs(std::span<const model::TensorGroup> groups,
                                                 std::span<const int> closed);

}  // namespace shardkit::trainer
