// ZeRO on GPUs: the rank's share of parameters (in T), fp32 gradients, fp32 master weights and AdamW
// moments in device memory -- or, with offload_optimizer {device: cpu}, the master weights and moments
// in host memory (device nvme: in a swap file) and the update on the CPU (host_optimizer.hpp) --
// partitioned by ckpt's layout
// function exactly as the CPU engine does (zero_engine.hpp describes the stages). At stage 3,
// offload_param {device: cpu} keeps the rank's partition of the parameters in host memory, and
// {device: nvme} in a swap file (param_partition.hpp): each gather copies the rank's slice up first. NCCL collectives
// of stages 2 and 3 run on a communication stream when overlap_comm is set (ordered against the compute stream by
// events): gradient buckets are reduced while the backward pass goes on, and stage 3 prefetches the next block's
// parameters while the current block computes.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "ckpt/layout.hpp"
#include "model/cuda/gpu_model.hpp"
#include "trainer/backend.hpp"
#include "trainer/cuda/buffer_pool.hpp"
#include "trainer/cuda/grad_wire.hpp"
#include "trainer/cuda/host_optimizer.hpp"
#include "trainer/cuda/nccl.hpp"
#include "trainer/cuda/param_partition.hpp"
#include "trainer/nvme/swap_config.hpp"
#include "trainer/zero_plan.hpp"

namespace shardkit::trainer::cuda {

// What a rank's engine allocates, known before it is made: the fixed buffers memory() reports, the
// page-locked host memory of stage 3's offloaded partition and the offloaded optimizer's transfers,
// and the device memory its working buffers reach as it runs (stages 2-3: gradients of open and
// pending groups, the reductions' staging, gathered groups; a narrowed gradient copy at stages 0-1).
// A snapshot staging copy, when reserve_staging() is called, is on top.
struct EngineFootprint {
  MemoryReport held;
  int64_t pinned_host = 0;
  int64_t working = 0;
};
// `wire`: communication_data_type as the engine is given it; `accumulates`: more than one micro-batch
// a step (later ones land their reductions through a receive buffer).
template <typename T>
EngineFootprint engine_footprint(const ZeroPlan& plan, const std::vector<model::TensorGroup>& groups,
                                 const ZeroConfig& config, const Optimizer& optimizer, ckpt::DType wire,
                                 bool accumulates);

template <typename T>
class GpuZeroEngine final : public model::cuda::GpuParamStore<T> {
 public:
  // `decays`: per tensor, whether weight decay applies (weight_decay.hpp). `wire`:
  // communication_data_type, the type gradients are reduced in (grad_wire.hpp). `swaps`: opens the
  // swaps of the optimizer states and of stage 3's parameters where offload_optimizer's or
  // offload_param's device is nvme.
  GpuZeroEngine(const ckpt::TensorTable& table, std::vector<model::TensorGroup> groups, const std::vector<bool>& decays,
                const ZeroConfig& config, const Optimizer& optimizer, ckpt::DType wire, comm::MpiCollective& mpi,
                ncclComm_t nccl, cudaStream_t stream, const nvme::SwapFactory& swaps = {});

  const ckpt::Layout& layout() const noexcept { return plan_.layout(); }
  MemoryReport memory() const noexcept;
  // Stages 0-1: acquire, release, open_grads and close_grads do nothing and param() and grad() point
  // into buffers that never move, so the passes can be captured once and replayed (a CUDA graph).
  bool fixed_buffers() const noexcept { return !plan_.partitions_grads(); }

  void initialize(const InitFn& init);
  void initialize(const RandomInit& init);
  void load(const LoadFn& read);
  // Starts copying the rank's states into the (page-locked) host spans, one per state of the optimizer. Directly: on a
  // side stream, and the next step() waits for the copy on the device. Through the device staging buffer, once
  // reserve_staging() has allocated it: the compute stream copies the states into it (device to
  // device, a few milliseconds) and goes on, and the side stream drains it to the host spans over the
  // following steps, which never wait for that. wait_snapshot() blocks until the host spans are full.
  void begin_snapshot(std::span<const std::span<float>> targets);
  void wait_snapshot();
  // The device time the last snapshot took from the compute stream (ms): the direct copy's wait in
  // step() (0 when no step has reached it yet), or the staging copy (with any wait for the previous
  // drain). Read once per snapshot.
  double snapshot_wait_ms();
  // The device staging buffer: the optimizer's states of the rank's slice. None with the optimizer
  // offloaded (the states are in host memory or on NVMe, where the snapshot reads them directly).
  int64_t staging_bytes() const noexcept;
  void reserve_staging();
  bool offloaded() const noexcept { return host_ != nullptr; }
  // Offloaded to NVMe: the optimizer states' swap file (else null).
  const nvme::StateSwapper* swapper() const noexcept { return host_ ? host_->swapper() : nullptr; }
  // Stage 3 with offload_param nvme: the parameters' swap file (else null).
  const nvme::StateSwapper* param_swapper() const noexcept { return param_part_.swap(); }
  // Offloaded: the rank's slice of the optimizer's state `state` (0: master weights), where it lives
  // (which step() changes), handed to `sink` in order, in one piece or several.
  void read_offloaded(int state, const std::function<void(std::span<const float>)>& sink);

  void acquire(int group) override;
  void release(int group) override;
  const T* param(int tensor) const override;
  void open_grads(int group) override;
  float* grad(int tensor) override;
  void close_grads(int group) override;
  void synchronize(cudaStream_t stream) override { wait_checking_nccl(stream, nccl_); }
  // Stages 0-2 keep the parameters, stages 0-1 the gradients, in one flat buffer of the layout.
  bool params_back_to_back(int first, int last) const override;
  bool grads_back_to_back(int first, int last) const override;
  bool grads_fresh(int group) const override;

  // A new step: its first micro-batch's pass stores its gradients rather than adding them, so nothing
  // is cleared here (the padding between tensors, never written, stays zero from the allocation).
  void zero_grads();
  // Stages 0-1: a micro-batch's pass is through -- at its last close_grads, or after a CUDA graph
  // replayed it (making none of the calls): later passes of the step add to its gradients.
  void pass_done();
  void reduce_grads();
  double global_grad_sq();
  void step(const OptimizerStep& step);

 private:
  bool flat_back_to_back(int first, int last) const;  // tensors [first, last) adjacent in the layout's flat buffer
  void publish_params();
  void zero_moments();       // every state but the master weights, on the device
  void all_gather_params();  // stages 1-2: every rank's partition into params_full_, on the compute stream
  T* owned_params();         // where this rank's share of the parameters lives in T (stage 3: maybe host memory)
  // Makes what `produce` queues on the compute stream -- device work writing the rank's share of the
  // parameters in T, [lo, lo + n) of the optimizer view, to `out` -- land where that share lives.
  void write_params(const typename ParamPartition<T>::Producer& produce);
  // Stages 1-2 with the GPU optimizer: `update` (the optimizer over [lo, lo + n) of the partition) and the
  // all-gather of the updated weights, pipelined in chunks.
  void update_and_gather(const typename ParamPartition<T>::Producer& update);
  // Whether the optimizer view's gradients are grads_full_ itself: stage 0, and stage 1 on one rank
  // (whose partition is everything: a reduce-scatter into grad_part_ would copy 4 bytes per parameter
  // for nothing, 0.4 ms a step for GPT-2 124M on an H200). Else they are reduced into grad_part_.
  bool grads_full_is_partition() const noexcept;
  const float* reduced_grads() const noexcept;
  void flush_pending_grads();
  void reduce_stage2(int first, int last);
  void reduce_stage3(int first, int last);
  // Gradients travel narrowed to 16 bits (fp32 ones go from and to their buffers without a copy).
  bool narrow_wire() const noexcept { return wire_ != ckpt::DType::kF32; }
  // `elements` on from p, in the type gradients travel in.
  void* wire_advance(void* p, int64_t elements) const noexcept;
  // Where a reduction of count elements for the partition at offset lands (in the wire's type): the
  // partition itself when fp32 travels, in the step's first micro-batch (lands_in_place); else recv_,
  // which land() then writes (first micro-batch) or adds (later ones) into the partition, on the comm
  // stream.
  bool lands_in_place() const noexcept;
  void* receive_into(int64_t offset, int64_t count);
  void land(int64_t offset, int64_t count);
  int64_t numel(int t) const noexcept { return plan_.numel(t); }
  void gather(int group);  // stage 3: all-gathers the group's tensors on the comm stream
  void drop_prefetched();  // stage 3: gives back gathers issued ahead that were never used
  cudaStream_t comm() const noexcept { return config_.overlap_comm ? comm_stream_.get() : stream_; }
  void wait(cudaStream_t waiter, cudaStream_t producer);  // waiter waits for what producer queued so far

  const ckpt::TensorTable& table_;
  std::vector<model::TensorGroup> groups_;
  ZeroConfig config_;
  ckpt::DType wire_;  // communication_data_type; fp32 on one rank
  comm::MpiCollective& mpi_;
  ncclComm_t nccl_;
  cudaStream_t stream_;
  ZeroPlan plan_;
  const Optimizer& optimizer_;
  nvme::Swaps opened_swaps_;  // NVMe offload: the swaps as opened, until param_part_ and host_ take them

  model::cuda::DeviceBuffer<T> params_full_;     // stages 0-2: W * P, tensors at global offsets
  model::cuda::DeviceBuffer<float> grads_full_;  // stages 0-1: W * P (one rank at stage 1: also its partition)
  ParamPartition<T> param_part_;                 // stage 3: the partition in T, gathered from
  // Optimizer view: stage 0 the full W * P, stages 1-2 the partition P, stage 3 the slots F.
  // The optimizer's states on the device, master weights first (none when offloaded).
  std::vector<model::cuda::DeviceBuffer<float>> states_;
  model::cuda::DeviceBuffer<float> grad_part_;
  std::unique_ptr<HostOptimizer<T>> host_;  // offloaded: the optimizer's states (then not on the device)
  // Positions of the optimizer view that weight decay skips: for the host optimizer, and a copy in
  // device memory for the kernel.
  std::vector<ElementRange> no_decay_;
  model::cuda::DeviceBuffer<ElementRange> no_decay_device_;

  model::cuda::Stream comm_stream_;
  model::cuda::Event order_;
  model::cuda::Stream snapshot_stream_;
  model::cuda::Event snapshot_done_;          // recorded after the last snapshot copy (never recorded: complete)
  model::cuda::DeviceBuffer<float> staging_;  // the states' snapshot in device memory, drained to the host spans
  // Around the device time a snapshot takes from the compute stream: the first step()'s wait for a
  // direct copy, or the staging copy.
  model::cuda::Event snapshot_wait_begin_{model::cuda::Event::Timing::kOn},
      snapshot_wait_end_{model::cuda::Event::Timing::kOn};
  bool snapshot_reads_states_ = false;                  // a direct copy the next step() must wait for
  bool snapshot_wait_timed_ = false;                    // the events above hold a time not yet read
  std::vector<model::cuda::DeviceBuffer<T>> gathered_;  // stage 3: full tensors of acquired (or prefetched) groups
  BufferPool<T> gather_pool_;
  std::vector<int> acquired_count_;
  std::vector<char> prefetched_;                                  // stage 3: gathered ahead of its acquire
  std::vector<std::unique_ptr<model::cuda::Event>> gathered_at_;  // stage 3: the point of the comm stream a gather ends
  int last_acquired_ = -1;
  std::vector<std::vector<ckpt::Placement>> placements_;        // stage 2: where each tensor's gradient is reduced to
  std::vector<model::cuda::DeviceBuffer<float>> grad_buffers_;  // stages 2-3: gradients of open / pending groups
  BufferPool<float> grad_pool_;
  std::vector<int> pending_groups_;
  int64_t pending_elems_ = 0;
  int closed_groups_ = 0;                             // groups the current micro-batch has closed
  bool grads_reduced_ = false;                        // a micro-batch of this step has reduced into grad_part_ already
  bool grads_written_ = false;                        // stages 0-1: a pass of this step has written grads_full_
  model::cuda::DeviceBuffer<std::byte> send_, recv_;  // reductions' staging, in the wire's type
  model::cuda::DeviceBuffer<T> gather_recv_;
  model::cuda::DeviceBuffer<double> scalar_;
  model::cuda::PinnedBuffer<double> scalar_host_;  // pinned for the reason GpuModel::loss_host_ is
};

}  // namespace shardkit::trainer::cuda
