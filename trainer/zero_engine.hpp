// The ZeRO engine on CPU ranks: owns the rank's share of parameters, gradients and AdamW states as the
// layout function (ckpt/layout.hpp) partitions them, and serves the model through ParameterStore.
//
//   stage 0: everything replicated; gradients all-reduced; every rank runs the optimizer on all of it.
//   stage 1: parameters and gradients replicated; optimizer states partitioned; gradients
//            reduce-scattered once per step; updated partitions all-gathered.
//   stage 2: as stage 1, but gradients are reduce-scattered during the backward pass, in buckets of
//            reduce_bucket_size elements, and only the rank's own partition of them is kept.
//   stage 3: parameters partitioned too: each group is all-gathered (in buckets of at most
//            allgather_bucket_size elements) when the model acquires it and freed when released;
//            gradients are reduce-scattered into their owners' pieces as groups complete.
//
// Gradients are summed across ranks; the caller divides by the world size (in step()'s multiplier).
//
// With NVMe offload of the optimizer (stages 1-3) the optimizer states live in the rank's swap file
// instead: the step streams them through the swapper chunk by chunk and writes each updated chunk of
// master weights into the parameters the model reads (stage 3: a partition of its own in memory, the
// source of the gathers, since the master weights are on disk). With NVMe offload of the parameters
// (stage 3) that partition lives in a swap file of its own: each gather reads the rank's slice of the
// bucket from it, the next bucket's read under way while this one is gathered, and the step writes
// the updated master weights into it (in its pass over the swapped optimizer states where those are
// swapped too). CPU ranks train in fp32, so the parameters are a copy of the master weights: the
// parameter swap saves host memory only together with the optimizer's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/huge_pages.hpp"
#include "ckpt/layout.hpp"
#include "comm/mpi.hpp"
#include "model/param_store.hpp"
#include "trainer/ds_config.hpp"
#include "trainer/memory_report.hpp"
#include "trainer/nvme/swap_config.hpp"
#include "trainer/optimizer.hpp"
#include "trainer/zero_plan.hpp"

namespace shardkit::trainer {

class ZeroEngine final : public model::ParameterStore {
 public:
  // What fills the rank's states chunk by chunk (the whole buffers in one call without NVMe offload):
  // `plan` holds the fragments of the chunk, flat offsets relative to its start; `states` the chunk of
  // each of the optimizer's states (master weights first), every element of which the call must set
  // (padding to 0).
  using StateFill = std::function<void(std::span<const ckpt::Fragment> plan, std::span<const std::span<float>> states)>;
  using StateSink = std::function<void(std::span<const float>)>;

  // `decays`: per tensor, whether weight decay applies (weight_decay.hpp). `wire`:
  // communication_data_type (grad_wire.hpp). `swap`: NVMe offload (stages 1-3; parameters stage 3).
  ZeroEngine(const ckpt::TensorTable& table, std::vector<model::TensorGroup> groups, const std::vector<bool>& decays,
             const ZeroConfig& config, const Optimizer& optimizer, ckpt::DType wire, comm::MpiCollective& comm,
             const nvme::SwapFactory& swap = {});

  const ckpt::Layout& layout() const noexcept { return plan_.layout(); }
  MemoryReport memory() const noexcept;
  // What rank `rank` of `world_size` will allocate with `config` (NVMe offload as it asks), before
  // anything is: memory()'s figures, except that each buffer counts once (at stage 3 without NVMe,
  // memory() names the master weights as the parameters too). The trainer checks these against the
  // machine's memory.
  static MemoryReport planned_memory(const ckpt::TensorTable& table, const ZeroConfig& config,
                                     const Optimizer& optimizer, int world_size, int rank);

  // Fills every parameter element this rank keeps master weights for: init(tensor, offset, out)
  // writes elements [offset, offset + out.size()) of the tensor. Moments start at zero.
  void initialize(const std::function<void(int tensor, int64_t offset, std::span<float> out)>& init);
  // Sets every state (an initialisation, a checkpoint's load) through `fill`, then publishes the
  // parameters. Collective.
  void fill_states(const StateFill& fill);

  // ParameterStore.
  void acquire(int group) override;
  void release(int group) override;
  const float* param(int tensor) const override;
  void open_grads(int group) override;
  float* grad(int tensor) override;
  void close_grads(int group) override;

  // Per optimizer step: zero the gradient accumulators, run the micro-batches, then reduce.
  void zero_grads();
  // Stages 0 and 1: all-reduce / reduce-scatter the accumulated gradients. (Stages 2 and 3 reduced
  // during the backward passes.)
  void reduce_grads();
  // Sum of squares of the rank's reduced gradient partition, summed over ranks (all ranks agree).
  double global_grad_sq();
  // The optimizer's update of the rank's partition (each element decayed as its tensor is), then the updated
  // parameters are made visible to the model.
  void step(const OptimizerStep& step);

  // The rank's flat buffer of the optimizer's state `state` (0: master weights) in the checkpoint layout
  // (layout().flat_size() elements), handed to `sink` in order: whole, or chunk by chunk from the swap.
  void read_state(int state, const StateSink& sink);
  // The NVMe swap of the optimizer states, or nullptr.
  const nvme::StateSwapper* swapper() const noexcept { return swap_.get(); }
  // The NVMe swap of the stage 3 parameter partition, or nullptr.
  const nvme::StateSwapper* param_swapper() const noexcept { return param_swap_.get(); }

 private:
  // The rank's parameters in its partition's layout, in memory: what the step updates and stage 3
  // gathers from (unless they are swapped).
  std::span<float> params_partition() noexcept;
  void fill_swapped_states(const StateFill& fill);
  // Visits the swapped optimizer states chunk by chunk with `access`: `update` sets or changes the
  // chunk's states (offset, the optimizer's states), whose master weights then become the
  // parameters (written to the parameter swap in the same pass, or copied into params_partition()).
  void visit_swapped(nvme::StateSwapper::Access access,
                     const std::function<void(int64_t offset, std::span<const std::span<float>> states)>& update);
  // Optimizer states in memory, parameters swapped: the master weights into the parameter swap.
  void write_param_swap();
  // Stages 0-2: the partitions' parameters to every rank (after copying the master weights, unless
  // the swapped step wrote them already).
  void publish_params();
  std::span<float> optimizer_grads() noexcept;
  std::span<const float> owned(const LargeVector<float>& buffer) const noexcept;
  void flush_pending_grads();
  void reduce_stage2(int first_tensor, int last_tensor);
  void reduce_stage3(int first_tensor, int last_tensor);
  void gather_stage3(int group);
  // Parameters on NVMe: starts reading the first bucket of the group likely gathered after `group`,
  // so that the read runs while the model computes with `group`.
  void read_ahead_after(int group);
  // Waits out a read ahead that no gather took (a wrong guess, or the swap is about to be written).
  void drop_read_ahead();
  int64_t numel(int t) const noexcept { return plan_.numel(t); }

  const ckpt::TensorTable& table_;
  std::vector<model::TensorGroup> groups_;
  ZeroConfig config_;
  ckpt::DType wire_;  // communication_data_type; fp32 on one rank
  comm::MpiCollective& comm_;
  ZeroPlan plan_;
  const Optimizer& optimizer_;

  // Stages 0-2: the model's parameters, replicated (W * P elements, tensors at global offsets).
  LargeVector<float> params_full_;
  // Stages 0-1: gradients, replicated, accumulated in place across micro-batches.
  LargeVector<float> grads_full_;
  // The optimizer's view: stage 0 full (W * P), stages 1-2 the partition (P), stage 3 the slots (F).
  // Empty with NVMe offload, where swap_ holds the states.
  std::vector<LargeVector<float>> states_;  // the optimizer's, master weights first
  LargeVector<float> grad_part_;
  std::vector<ElementRange> no_decay_;  // positions of the optimizer view that weight decay skips
  std::unique_ptr<nvme::StateSwapper> swap_, param_swap_;
  // Stage 3 with the optimizer on NVMe and the parameters in memory: the parameters of the slots (F).
  LargeVector<float> params_part_;
  nvme::RangeRead param_reads_[2];  // stage 3, parameters on NVMe: a gather's bucket and the next
  // The group whose first bucket's slice is being read ahead into param_reads_[0] (-1: none), and the
  // group gathered last (which way the model walks).
  int read_ahead_group_ = -1;
  int last_gathered_ = -1;

  // Stage 3: gathered parameters of acquired groups, one buffer per tensor.
  std::vector<LargeVector<float>> gathered_;
  std::vector<int> acquired_count_;  // per group
  // Stages 2-3: gradient buffers of open groups (one per tensor) and closed groups awaiting reduction.
  std::vector<LargeVector<float>> grad_buffers_;
  std::vector<int> pending_groups_;
  int64_t pending_elems_ = 0;
  int closed_groups_ = 0;  // groups the current micro-batch has closed
  LargeVector<float> send_buffer_, recv_buffer_;
};

}  // namespace shardkit::trainer
