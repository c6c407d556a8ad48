#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <thread>

#include "base/fault.hpp"
#include "base/huge_pages.hpp"
#include "base/parallel_memory.hpp"
#include "model/cuda/device_type.hpp"
#include "model/cuda/kernels.hpp"
#include "trainer/cuda/gpu_engine.hpp"
#include "trainer/cuda/optimizer_kernels.hpp"
#include "trainer/cuda/random_init.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer::cuda {

using model::cuda::cast_from_float;
using model::cuda::delay_stream;
using model::cuda::DeviceBuffer;
using model::cuda::DeviceType;
using model::cuda::Event;
using model::cuda::grow;
using model::cuda::kSumScratch;
using model::cuda::read_back;
using model::cuda::sum_squares;

namespace {

// Stages 0 and 1 on one rank reduce nothing: the full gradient buffer is the partition.
bool grads_full_is_partition_of(const ZeroPlan& plan) {
  return !plan.partitions_optimizer() || (!plan.partitions_grads() && plan.world_size() == 1);
}

// Elements of the engine's fixed buffers for one rank: what the constructor allocates and
// engine_footprint() counts, from one place.
struct FixedBuffers {
  size_t params_full = 0;  // T, stages 0-2
  size_t grads_full = 0;   // fp32, stages 0-1
  size_t grad_part = 0;    // fp32, the reduced partition where grads_full is not it
  size_t param_part = 0;   // T, stage 3
  ParamHome param_home = ParamHome::kDevice;
  size_t states = 0;            // fp32 per optimizer state
  bool states_on_host = false;  // the host optimizer's, in host memory or swapped to NVMe
  bool states_on_nvme = false;
};

FixedBuffers fixed_buffers_of(const ZeroPlan& plan, const ZeroConfig& config) {
  FixedBuffers b;
  const auto full = static_cast<size_t>(plan.replicated_size());
  const auto owned = static_cast<size_t>(plan.owned_size());
  if (!plan.partitions_params()) b.params_full = full;
  if (!plan.partitions_grads()) b.grads_full = full;
  if (!grads_full_is_partition_of(plan)) b.grad_part = owned;
  if (plan.partitions_params()) b.param_part = owned;
  // offload_param cpu: page-locked whatever its pin_memory says. Copies from and to pageable memory
  // make the host wait (for the stream, for the copy), which would stall every gather and defeat
  // the prefetch. DeepSpeed takes pin_memory as a speed hint; pinned memory is only faster.
  if (plan.partitions_params() && config.offload_param.device == OffloadDevice::kCpu) b.param_home = ParamHome::kHost;
  if (plan.partitions_params() && config.offload_param.device == OffloadDevice::kNvme) b.param_home = ParamHome::kSwap;
  b.states = static_cast<size_t>(plan.optimizer_size());
  b.states_on_nvme = config.offload_optimizer.device == OffloadDevice::kNvme;
  b.states_on_host = b.states_on_nvme || config.offload_optimizer.device == OffloadDevice::kCpu;
  return b;
}

// The type gradients travel in: one rank sends nothing, so rounds nothing.
ckpt::DType wire_of(ckpt::DType wire, int world) {
  return world > 1 ? wire : ckpt::DType::kF32;
}

int64_t elements_of(const ZeroPlan& plan, const model::TensorGroup& g) {
  int64_t n = 0;
  for (int t = g.first; t < g.last; ++t) n += plan.numel(t);
  return n;
}

// Stage 3: the most elements of its partition a rank sends into one gather (gather()'s buckets).
int64_t largest_gather_span(const ZeroPlan& plan, const std::vector<model::TensorGroup>& groups,
                            const ZeroConfig& config) {
  int64_t span = 0;
  for (const model::TensorGroup& group : groups) {
    for (const SlotRun& run : plan.buckets(group.first, group.last, config.allgather_bucket_size)) {
      span = std::max(span, run.span);
    }
  }
  return span;
}

// The rank's swaps where offload_optimizer or offload_param sends states to NVMe, opened in one call
// (which checks the node's free space for all of them first).
nvme::Swaps open_swaps(const nvme::SwapFactory& swaps, const FixedBuffers& fixed) {
  if (!fixed.states_on_nvme && fixed.param_home != ParamHome::kSwap) return {};
  if (!swaps) fail(ErrorKind::kInternal, "NVMe offload without a swap factory");
  return swaps(static_cast<int64_t>(fixed.states));
}

// Device bytes of the working buffers at their peak, following what the engine does below: the
// gradient pool keeps as many buffers as were open and pending at once, send_, recv_ and
// gather_recv_ keep their largest size, the gather pool as many groups as were gathered at once. The
// backward pass closes the groups from the last to the first (every family walks its blocks down)
// and may keep group 0's gradients open throughout (a tied embedding, used by the head first):
// counted so for every family.
template <typename T>
int64_t working_bytes(const ZeroPlan& plan, const std::vector<model::TensorGroup>& groups, const ZeroConfig& config,
                      ckpt::DType wire, bool accumulates, const FixedBuffers& fixed) {
  const int world = plan.world_size();
  const bool narrow = wire != ckpt::DType::kF32;
  const auto wb = static_cast<int64_t>(wire_bytes(wire));
  if (!plan.partitions_grads()) return narrow ? plan.replicated_size() * wb : 0;  // reduce_grads()'s narrowed copy
  if (groups.empty()) return 0;

  // Gradient buffers and the reductions' staging, flush by flush (flush_pending_grads()).
  int64_t send = 0, recv = 0;
  const auto flush = [&](int first, int last) {
    int64_t mine = 0;
    if (!plan.partitions_params()) {  // stage 2: reduced to the owners from the global buffer
      const GlobalRun run = plan.global_run(first, last);
      if (narrow) send = std::max(send, (run.hi - run.lo) * wb);
      mine = plan.share(run, plan.rank()).count;
    } else {
      const SlotRun run = plan.slots(first, last);
      send = std::max(send, run.span * world * wb);
      mine = run.span;
    }
    if (narrow || accumulates) recv = std::max(recv, std::max<int64_t>(1, mine) * wb);
  };
  const int G = static_cast<int>(groups.size());
  int64_t pending = 0, peak_pending = 0;
  int run_last = -1;
  for (int g = G - 1; g >= 1; --g) {
    const model::TensorGroup& group = groups[static_cast<size_t>(g)];
    pending += elements_of(plan, group);
    if (run_last < 0) run_last = group.last;
    peak_pending = std::max(peak_pending, pending);
    if (pending >= config.reduce_bucket_size) {
      flush(group.first, run_last);
      pending = 0;
      run_last = -1;
    }
  }
  flush(groups[0].first, run_last < 0 ? groups[0].last : run_last);  // group 0 closes the pass
  int64_t bytes = (elements_of(plan, groups[0]) + peak_pending) * static_cast<int64_t>(sizeof(float)) + send + recv;
  if (!plan.partitions_params()) return bytes;

  // Stage 3: gathered groups -- group 0, the last group, and the block computing with the next one
  // prefetched (where overlap_comm prefetches one that size) -- and the gathers' receive buffer.
  int64_t largest = 0;
  for (int g = 1; g < G - 1; ++g) largest = std::max(largest, elements_of(plan, groups[static_cast<size_t>(g)]));
  const int64_t receive = largest_gather_span(plan, groups, config) * world;
  const bool prefetches = config.overlap_comm && largest <= config.stage3_prefetch_bucket_size;
  const int64_t gathered = elements_of(plan, groups[0]) +
                           (G > 1 ? elements_of(plan, groups[static_cast<size_t>(G - 1)]) : 0) +
                           largest * (prefetches ? 2 : 1);
  bytes += (gathered + receive) * static_cast<int64_t>(sizeof(T));
  // A partition in host memory that the GPU optimizer updates goes down through a device chunk.
  if (fixed.param_home == ParamHome::kHost && !fixed.states_on_host) {
    bytes += std::min<int64_t>(static_cast<int64_t>(fixed.param_part), ParamPartition<T>::kChunk) *
             static_cast<int64_t>(sizeof(T));
  }
  return bytes;
}

}  // namespace

template <typename T>
EngineFootprint engine_footprint(const ZeroPlan& plan, const std::vector<model::TensorGroup>& groups,
                                 const ZeroConfig& config, const Optimizer& optimizer, ckpt::DType wire,
                                 bool accumulates) {
  const FixedBuffers b = fixed_buffers_of(plan, config);
  const auto bytes = [](size_t n, size_t element) { return static_cast<int64_t>(n * element); };
  EngineFootprint f;
  const int64_t part = bytes(b.param_part, sizeof(T));
  f.held.parameters = bytes(b.params_full, sizeof(T)) + (b.param_home == ParamHome::kDevice ? part : 0);
  f.held.host_parameters = b.param_home == ParamHome::kHost ? part : 0;
  // The swap holds T (its file rounded up to whole chunks, which the plan leaves out).
  f.held.nvme_parameters = b.param_home == ParamHome::kSwap ? part : 0;
  f.held.gradients = bytes(b.grads_full + b.grad_part, sizeof(float));
  const int64_t states = optimizer.num_states() * bytes(b.states, sizeof(float));
  (b.states_on_nvme   ? f.held.nvme_optimizer_states
   : b.states_on_host ? f.held.host_optimizer_states
                      : f.held.optimizer_states) = states;
  f.pinned_host = f.held.host_parameters;
  if (b.param_home == ParamHome::kSwap) {
    f.pinned_host += ParamPartition<T>::swap_pinned_bytes(largest_gather_span(plan, groups, config));
  }
  if (b.states_on_host) f.pinned_host += HostOptimizer<T>::pinned_bytes(b.states, b.param_home);
  f.working = working_bytes<T>(plan, groups, config, wire_of(wire, plan.world_size()), accumulates, b);
  return f;
}

template <typename T>
GpuZeroEngine<T>::GpuZeroEngine(const ckpt::TensorTable& table, std::vector<model::TensorGroup> groups,
                                const std::vector<bool>& decays, const ZeroConfig& config, const Optimizer& optimizer,
                                ckpt::DType wire, comm::MpiCollective& mpi, ncclComm_t nccl, cudaStream_t stream,
                                const nvme::SwapFactory& swaps)
    : table_(table),
      groups_(std::move(groups)),
      config_(config),
      wire_(wire_of(wire, mpi.size())),
      mpi_(mpi),
      nccl_(nccl),
      stream_(stream),
      plan_(table, mpi.size(), mpi.rank(), config.stage),
      optimizer_(optimizer),
      opened_swaps_(open_swaps(swaps, fixed_buffers_of(plan_, config))),
      param_part_(fixed_buffers_of(plan_, config).param_part, fixed_buffers_of(plan_, config).param_home,
                  std::move(opened_swaps_.params),
                  fixed_buffers_of(plan_, config).param_home == ParamHome::kSwap
                      ? largest_gather_span(plan_, groups_, config)
                      : 0) {
  const FixedBuffers fixed = fixed_buffers_of(plan_, config);
  params_full_.resize(fixed.params_full);
  grads_full_.resize(fixed.grads_full);
  // Once: the padding between tensors is never written, and the passes store the tensors' gradients.
  if (fixed.grads_full > 0) CUDA_CHECK(cudaMemsetAsync(grads_full_.data(), 0, grads_full_.bytes(), stream_));
  if (fixed.states_on_host) {
    host_ = std::make_unique<HostOptimizer<T>>(fixed.states, optimizer, fixed.param_home,
                                               std::move(opened_swaps_.optimizer), param_part_.swap());
  } else {
    for (int i = 0; i < optimizer.num_states(); ++i) states_.emplace_back(fixed.states);
  }
  grad_part_.resize(fixed.grad_part);
  if (fixed.grad_part > 0) CUDA_CHECK(cudaMemsetAsync(grad_part_.data(), 0, grad_part_.bytes(), stream_));
  if (plan_.partitions_params()) gathered_.resize(table.size());
  if (plan_.partitions_grads()) grad_buffers_.resize(table.size());
  if (plan_.partitions_grads() && !plan_.partitions_params()) {
    for (int t = 0; t < static_cast<int>(table.size()); ++t) placements_.push_back(layout().locate(t, 0, numel(t)));
  }
  acquired_count_.assign(groups_.size(), 0);
  prefetched_.assign(groups_.size(), 0);
  for (size_t g = 0; g < groups_.size(); ++g) gathered_at_.push_back(std::make_unique<Event>());
  scalar_.resize(kSumScratch);
  scalar_host_.resize(1);
  no_decay_ = no_decay_ranges(plan_.optimizer_fragments(), decays);
  if (!host_ && !no_decay_.empty()) {
    no_decay_device_.resize(no_decay_.size());
    CUDA_CHECK(cudaMemcpy(no_decay_device_.data(), no_decay_.data(), no_decay_device_.bytes(), cudaMemcpyHostToDevice));
  }
}

template <typename T>
MemoryReport GpuZeroEngine<T>::memory() const noexcept {
  MemoryReport r;
  r.parameters = static_cast<int64_t>(params_full_.bytes()) + param_part_.device_bytes();
  r.host_parameters = param_part_.host_bytes();
  r.nvme_parameters = param_part_.nvme_bytes();
  r.gradients = static_cast<int64_t>(grads_full_.bytes() + grad_part_.bytes());
  for (const DeviceBuffer<float>& state : states_) r.optimizer_states += static_cast<int64_t>(state.bytes());
  r.snapshot_staging = static_cast<int64_t>(staging_.bytes());
  if (host_) r.host_optimizer_states = host_->host_state_bytes();
  if (const nvme::StateSwapper* swap = swapper()) r.nvme_optimizer_states = swap->file_bytes();
  return r;
}

template <typename T>
void GpuZeroEngine<T>::initialize(const InitFn& init) {
  const std::vector<ckpt::Fragment> fragments = plan_.optimizer_fragments();
  if (host_) {
    host_->fill([&](int64_t lo, std::span<const std::span<float>> states) {  // moments stay zero
      for (const ckpt::Fragment& f : fragments_within(fragments, lo, lo + static_cast<int64_t>(states[0].size()))) {
        init(f.tensor, f.tensor_offset,
             states[0].subspan(static_cast<size_t>(f.flat_offset), static_cast<size_t>(f.length)));
      }
    });
    publish_params();
    return;
  }
  // Zeroed on the compute threads, not one: billions of elements (the padding between fragments must
  // be zero; the rest is overwritten).
  DeviceBuffer<float>& master = states_[0];
  HugeBuffer<float> staging(master.size());
  parallel_fill(staging.data(), static_cast<int64_t>(master.size()), 0.0f);
  const std::span<float> host = staging.span();
  zero_moments();
  for (const ckpt::Fragment& f : fragments) {
    init(f.tensor, f.tensor_offset, host.subspan(static_cast<size_t>(f.flat_offset), static_cast<size_t>(f.length)));
  }
  CUDA_CHECK(cudaMemcpy(master.data(), host.data(), master.bytes(), cudaMemcpyHostToDevice));
  publish_params();
}

template <typename T>
void GpuZeroEngine<T>::initialize(const RandomInit& init) {
  const std::vector<ckpt::Fragment> fragments = plan_.optimizer_fragments();
  const auto draw = [&](float* out, const ckpt::Fragment& f, int64_t from, int64_t n) {
    draw_init_values(out, n, init.tensors.at(static_cast<size_t>(f.tensor)), init.seed, f.tensor_offset + from,
                     stream_);
  };
  if (host_) {
    // The master weights live in host memory or on NVMe: drawn here in pieces and copied down, far
    // faster than the host threads draw them.
    constexpr int64_t kPiece = int64_t{64} << 20;  // elements
    DeviceBuffer<float> piece(static_cast<size_t>(std::min<int64_t>(kPiece, static_cast<int64_t>(host_->size()))));
    host_->fill([&](int64_t lo, std::span<const std::span<float>> states) {  // moments stay zero
      for (const ckpt::Fragment& f : fragments_within(fragments, lo, lo + static_cast<int64_t>(states[0].size()))) {
        for (int64_t from = 0; from < f.length; from += kPiece) {
          const int64_t n = std::min(kPiece, f.length - from);
          draw(piece.data(), f, from, n);
          CUDA_CHECK(cudaMemcpyAsync(states[0].data() + f.flat_offset + from, piece.data(),
                                     static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost, stream_));
          CUDA_CHECK(cudaStreamSynchronize(stream_));  // the piece is drawn into again next
        }
      }
    });
  } else {
    DeviceBuffer<float>& master = states_[0];
    CUDA_CHECK(cudaMemsetAsync(master.data(), 0, master.bytes(), stream_));  // the padding between fragments
    for (const ckpt::Fragment& f : fragments) draw(master.data() + f.flat_offset, f, 0, f.length);
    zero_moments();
  }
  publish_params();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

template <typename T>
void GpuZeroEngine<T>::load(const LoadFn& read) {
  const std::vector<ckpt::Fragment> fragments = plan_.optimizer_fragments();
  if (host_) {  // offloaded: read where the states live, in one pass (chunk by chunk when swapped)
    host_->fill([&](int64_t lo, std::span<const std::span<float>> states) {
      read(load_requests(fragments_within(fragments, lo, lo + static_cast<int64_t>(states[0].size())), states));
    });
    publish_params();
    return;
  }
  // State by state into host memory, each copied to the device by a helper thread while the next is
  // read: the copy hides behind the disk.
  const size_t n = states_[0].size();
  HugeBuffer<float> staging[2] = {HugeBuffer<float>(n),
                                  HugeBuffer<float>(n)};  // the reads touch the pages, in parallel
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::thread copier;
  std::exception_ptr copy_error;
  auto join_copier = [&] {
    if (copier.joinable()) copier.join();
    if (copy_error) std::rethrow_exception(copy_error);
  };
  try {
    for (int s = 0; s < optimizer_.num_states(); ++s) {
      const std::span<float> host = staging[s % 2].span();
      read(load_requests(fragments, {&host, 1}, s));
      join_copier();  // the previous state's copy, which also frees the other staging buffer
      copier = std::thread([&, s, host] {
        try {
          CUDA_CHECK(cudaSetDevice(device));
          CUDA_CHECK(cudaMemcpy(states_[static_cast<size_t>(s)].data(), host.data(), host.size_bytes(),
                                cudaMemcpyHostToDevice));
        } catch (...) {
          copy_error = std::current_exception();
        }
      });
    }
    join_copier();
  } catch (...) {
    if (copier.joinable()) copier.join();
    throw;
  }
  publish_params();
}

template <typename T>
void GpuZeroEngine<T>::begin_snapshot(std::span<const std::span<float>> targets) {
  const int states = optimizer_.num_states();
  if (host_) {  // offloaded: the states are in host memory already; the host step would change them
    if (fault_armed("slow-snapshot")) {
      fault_delay();
    }
    for (int s = 0; s < states; ++s) {
      float* out = targets[static_cast<size_t>(s)].data();
      read_offloaded(s, [&](std::span<const float> piece) {
        parallel_copy(out, piece.data(), static_cast<int64_t>(piece.size()));  // all threads: gigabytes
        out += piece.size();
      });
    }
    return;
  }
  const size_t bytes = static_cast<size_t>(plan_.owned_size()) * sizeof(float);
  if (staging_.size() > 0) {
    // The compute stream makes the device copy itself, so its time (and any wait for the previous
    // drain, which may still read the buffer) is timed where training pays it; the drain to host
    // memory then runs beside the following steps, which never wait for it.
    CUDA_CHECK(cudaEventRecord(snapshot_wait_begin_.get(), stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, snapshot_done_.get(), 0));
    if (fault_armed("slow-snapshot")) delay_stream(stream_, fault_delay_ms());
    for (int s = 0; s < states; ++s) {
      CUDA_CHECK(cudaMemcpyAsync(staging_.data() + s * plan_.owned_size(),
                                 states_[static_cast<size_t>(s)].data() + plan_.owned_offset(), bytes,
                                 cudaMemcpyDeviceToDevice, stream_));
    }
    CUDA_CHECK(cudaEventRecord(snapshot_wait_end_.get(), stream_));
    snapshot_wait_timed_ = true;
    wait(snapshot_stream_.get(), stream_);
    for (int s = 0; s < states; ++s) {
      CUDA_CHECK(cudaMemcpyAsync(targets[static_cast<size_t>(s)].data(), staging_.data() + s * plan_.owned_size(),
                                 bytes, cudaMemcpyDeviceToHost, snapshot_stream_.get()));
    }
    CUDA_CHECK(cudaEventRecord(snapshot_done_.get(), snapshot_stream_.get()));
    return;
  }
  // The copies run beside the next micro-batches; only the next optimizer step waits for them.
  wait(snapshot_stream_.get(), stream_);
  if (fault_armed("slow-snapshot")) delay_stream(snapshot_stream_.get(), fault_delay_ms());
  snapshot_reads_states_ = true;
  for (int s = 0; s < states; ++s) {
    CUDA_CHECK(cudaMemcpyAsync(targets[static_cast<size_t>(s)].data(),
                               states_[static_cast<size_t>(s)].data() + plan_.owned_offset(), bytes,
                               cudaMemcpyDeviceToHost, snapshot_stream_.get()));
  }
  CUDA_CHECK(cudaEventRecord(snapshot_done_.get(), snapshot_stream_.get()));
}

template <typename T>
void GpuZeroEngine<T>::wait_snapshot() {
  CUDA_CHECK(cudaEventSynchronize(snapshot_done_.get()));
}

template <typename T>
double GpuZeroEngine<T>::snapshot_wait_ms() {
  if (!snapshot_wait_timed_) return 0;
  snapshot_wait_timed_ = false;
  CUDA_CHECK(cudaEventSynchronize(snapshot_wait_end_.get()));
  return snapshot_wait_end_.ms_since(snapshot_wait_begin_);
}

template <typename T>
void GpuZeroEngine<T>::read_offloaded(int state, const std::function<void(std::span<const float>)>& sink) {
  host_->read(state, plan_.owned_offset(), plan_.owned_size(), sink);
}

template <typename T>
int64_t GpuZeroEngine<T>::staging_bytes() const noexcept {
  return host_ ? 0 : optimizer_.state_bytes() * plan_.owned_size();
}

template <typename T>
void GpuZeroEngine<T>::zero_moments() {
  for (size_t i = 1; i < states_.size(); ++i) {
    CUDA_CHECK(cudaMemsetAsync(states_[i].data(), 0, states_[i].bytes(), stream_));
  }
}

template <typename T>
void GpuZeroEngine<T>::reserve_staging() {
  if (!host_ && staging_.size() == 0)
    staging_ = DeviceBuffer<float>(static_cast<size_t>(optimizer_.num_states() * plan_.owned_size()));
}

template <typename T>
T* GpuZeroEngine<T>::owned_params() {
  if (!plan_.partitions_optimizer()) return params_full_.data();
  if (!plan_.partitions_params()) return params_full_.data() + plan_.partition_offset(plan_.rank());
  return param_part_.data();
}

template <typename T>
void GpuZeroEngine<T>::write_params(const typename ParamPartition<T>::Producer& produce) {
  if (plan_.partitions_params()) {
    param_part_.store(stream_, produce);
  } else {
    produce(0, static_cast<int64_t>(states_[0].size()), owned_params());
  }
}

template <typename T>
void GpuZeroEngine<T>::publish_params() {
  T* mine = owned_params();
  if (host_) {
    host_->upload(mine, stream_);
  } else {
    write_params([&](int64_t lo, int64_t n, T* out) { cast_from_float(out, states_[0].data() + lo, n, stream_); });
  }
  if (plan_.gathers_updated_params()) all_gather_params();
}

template <typename T>
void GpuZeroEngine<T>::all_gather_params() {
  NCCL_CHECK(ncclAllGather(owned_params(), params_full_.data(), static_cast<size_t>(plan_.partition_size()),
                           NcclType<T>::kValue, nccl_, stream_));
}

template <typename T>
void GpuZeroEngine<T>::wait(cudaStream_t waiter, cudaStream_t producer) {
  if (waiter != producer) order_.order(producer, waiter);
}

template <typename T>
void GpuZeroEngine<T>::acquire(int group) {
  if (!plan_.partitions_params() || acquired_count_[static_cast<size_t>(group)]++ > 0) return;
  if (!prefetched_[static_cast<size_t>(group)]) gather(group);
  prefetched_[static_cast<size_t>(group)] = 0;
  CUDA_CHECK(cudaStreamWaitEvent(stream_, gathered_at_[static_cast<size_t>(group)]->get(), 0));
  // Gather the group likely needed next while this one computes.
  const int next = likely_next_group(group, last_acquired_, static_cast<int>(groups_.size()));
  last_acquired_ = group;
  if (!config_.overlap_comm || next < 0) return;
  if (acquired_count_[static_cast<size_t>(next)] == 0 && !prefetched_[static_cast<size_t>(next)] &&
      elements_of(plan_, groups_[static_cast<size_t>(next)]) <= config_.stage3_prefetch_bucket_size) {
    gather(next);
    prefetched_[static_cast<size_t>(next)] = 1;
  }
}

template <typename T>
void GpuZeroEngine<T>::gather(int group) {
  const model::TensorGroup& g = groups_[static_cast<size_t>(group)];
  cudaStream_t st = comm();
  // The partition is current: the optimizer step wrote it on the compute stream (the host optimizer
  // into host memory: before this call).
  wait(st, stream_);
  for (const SlotRun& run : plan_.buckets(g.first, g.last, config_.allgather_bucket_size)) {
    grow(gather_recv_, static_cast<size_t>(run.span * plan_.world_size()));
    // A partition in host memory is copied up into this rank's own block of the receive buffer, from
    // where NCCL gathers in place.
    const T* mine = param_part_.on_device(run.base, run.span, gather_recv_.data() + plan_.rank() * run.span, st);
    NCCL_CHECK(ncclAllGather(mine, gather_recv_.data(), static_cast<size_t>(run.span), NcclType<T>::kValue, nccl_, st));
    for (int t = run.first; t < run.last; ++t) {
      gathered_[static_cast<size_t>(t)] = gather_pool_.take(static_cast<size_t>(numel(t)), st);
    }
    for (const PieceCopy& p : plan_.pieces(run)) {
      CUDA_CHECK(cudaMemcpyAsync(gathered_[static_cast<size_t>(p.tensor)].data() + p.tensor_offset,
                                 gather_recv_.data() + p.block_offset, static_cast<size_t>(p.count) * sizeof(T),
                                 cudaMemcpyDeviceToDevice, st));
    }
  }
  CUDA_CHECK(cudaEventRecord(gathered_at_[static_cast<size_t>(group)]->get(), st));
}

template <typename T>
void GpuZeroEngine<T>::release(int group) {
  if (!plan_.partitions_params() || --acquired_count_[static_cast<size_t>(group)] > 0) return;
  // Back to the pool as soon as the kernels that read them are queued: the next gather into the same
  // memory waits for them on the device, not here.
  const model::TensorGroup& g = groups_[static_cast<size_t>(group)];
  for (int t = g.first; t < g.last; ++t) gather_pool_.give(std::move(gathered_[static_cast<size_t>(t)]), stream_);
}

template <typename T>
void GpuZeroEngine<T>::drop_prefetched() {
  for (size_t group = 0; group < groups_.size(); ++group) {
    if (!prefetched_[group]) continue;
    prefetched_[group] = 0;
    const model::TensorGroup& g = groups_[group];
    for (int t = g.first; t < g.last; ++t) gather_pool_.give(std::move(gathered_[static_cast<size_t>(t)]), comm());
  }
  last_acquired_ = -1;
}

template <typename T>
const T* GpuZeroEngine<T>::param(int tensor) const {
  if (!plan_.partitions_params()) return params_full_.data() + layout().global_offset(tensor);
  const DeviceBuffer<T>& full = gathered_[static_cast<size_t>(tensor)];
  if (full.size() != static_cast<size_t>(numel(tensor))) {
    fail(ErrorKind::kInternal, "parameter " + table_[static_cast<size_t>(tensor)].name + " used while not acquired");
  }
  return full.data();
}

template <typename T>
void GpuZeroEngine<T>::open_grads(int group) {
  if (!plan_.partitions_grads()) return;
  const model::TensorGroup& g = groups_[static_cast<size_t>(group)];
  // Uncleared: the model stores every element (grads_fresh).
  for (int t = g.first; t < g.last; ++t) {
    grad_buffers_[static_cast<size_t>(t)] = grad_pool_.take(static_cast<size_t>(numel(t)), stream_);
  }
}

template <typename T>
bool GpuZeroEngine<T>::grads_fresh(int) const {
  return plan_.partitions_grads() || !grads_written_;
}

template <typename T>
bool GpuZeroEngine<T>::params_back_to_back(int first, int last) const {
  return !plan_.partitions_params() && flat_back_to_back(first, last);
}

template <typename T>
bool GpuZeroEngine<T>::grads_back_to_back(int first, int last) const {
  return !plan_.partitions_grads() && flat_back_to_back(first, last);
}

template <typename T>
bool GpuZeroEngine<T>::flat_back_to_back(int first, int last) const {
  for (int t = first; t + 1 < last; ++t) {
    if (layout().global_offset(t) + numel(t) != layout().global_offset(t + 1)) return false;
  }
  return true;
}

template <typename T>
float* GpuZeroEngine<T>::grad(int tensor) {
  if (!plan_.partitions_grads()) return grads_full_.data() + layout().global_offset(tensor);
  return grad_buffers_[static_cast<size_t>(tensor)].data();
}

template <typename T>
void GpuZeroEngine<T>::close_grads(int group) {
  if (!plan_.partitions_grads()) {
    if (++closed_groups_ == static_cast<int>(groups_.size())) pass_done();
    return;
  }
  pending_groups_.push_back(group);
  pending_elems_ += elements_of(plan_, groups_[static_cast<size_t>(group)]);
  // The micro-batch's backward pass is through once it has closed every group, whatever the family's
  // order (an untied head closes the last group first, and then no group is open for a moment).
  const bool through = ++closed_groups_ == static_cast<int>(groups_.size());
  if (pending_elems_ >= config_.reduce_bucket_size || through) flush_pending_grads();
  if (through) {
    closed_groups_ = 0;
    grads_reduced_ = true;  // this micro-batch is reduced: later ones add to it
  }
}

template <typename T>
void GpuZeroEngine<T>::flush_pending_grads() {
  wait(comm(), stream_);  // the closed groups' gradients are complete
  for (const model::TensorGroup& run : consecutive_runs(groups_, pending_groups_)) {
    if (!plan_.partitions_params()) {
      reduce_stage2(run.first, run.last);
    } else {
      reduce_stage3(run.first, run.last);
    }
    for (int t = run.first; t < run.last; ++t)
      grad_pool_.give(std::move(grad_buffers_[static_cast<size_t>(t)]), comm());
  }
  pending_groups_.clear();
  pending_elems_ = 0;
}

template <typename T>
void GpuZeroEngine<T>::reduce_stage2(int first, int last) {
  // Each tensor's gradient goes from its own buffer to the rank(s) whose partition holds it, piece by
  // piece as the layout places it: one ncclReduce per piece, all in one NCCL group (one launch), no
  // copy into a send buffer -- unless it travels narrowed, then from its narrowed copy. Stages 1-2
  // concatenate the tensors, so this rank's pieces lie back to back in its partition: one range,
  // received in one place.
  const GlobalRun run = plan_.global_run(first, last);
  const PartitionShare mine = plan_.share(run, plan_.rank());
  if (narrow_wire()) {
    grow(send_, static_cast<size_t>(run.hi - run.lo) * wire_bytes(wire_));
    for (int t = first; t < last; ++t) {
      to_wire(wire_advance(send_.data(), layout().global_offset(t) - run.lo), wire_,
              grad_buffers_[static_cast<size_t>(t)].data(), numel(t), comm());
    }
  }
  auto source = [&](int t, int64_t offset) -> const void* {
    if (!narrow_wire()) return grad_buffers_[static_cast<size_t>(t)].data() + offset;
    return wire_advance(send_.data(), layout().global_offset(t) - run.lo + offset);
  };
  void* into = mine.count == 0 ? nullptr : receive_into(mine.offset, mine.count);
  NCCL_CHECK(ncclGroupStart());
  for (int t = first; t < last; ++t) {
    for (const ckpt::Placement& p : placements_[static_cast<size_t>(t)]) {
      // Read by the root only.
      void* recv = p.rank == plan_.rank() ? wire_advance(into, p.flat_offset - mine.offset) : nullptr;
      NCCL_CHECK(ncclReduce(source(t, p.tensor_offset), recv, static_cast<size_t>(p.length), nccl_type(wire_), ncclSum,
                            p.rank, nccl_, comm()));
    }
  }
  NCCL_CHECK(ncclGroupEnd());
  if (mine.count > 0) land(mine.offset, mine.count);
}

template <typename T>
void* GpuZeroEngine<T>::wire_advance(void* p, int64_t elements) const noexcept {
  return static_cast<std::byte*>(p) + elements * static_cast<int64_t>(wire_bytes(wire_));
}

template <typename T>
bool GpuZeroEngine<T>::lands_in_place() const noexcept {
  return !narrow_wire() && !grads_reduced_;
}

template <typename T>
void* GpuZeroEngine<T>::receive_into(int64_t offset, int64_t count) {
  if (lands_in_place()) return grad_part_.data() + offset;
  grow(recv_, static_cast<size_t>(std::max<int64_t>(1, count)) * wire_bytes(wire_));
  return recv_.data();
}

template <typename T>
void GpuZeroEngine<T>::land(int64_t offset, int64_t count) {
  if (!lands_in_place()) from_wire(grad_part_.data() + offset, wire_, recv_.data(), count, grads_reduced_, comm());
}

template <typename T>
void GpuZeroEngine<T>::reduce_stage3(int first, int last) {
  // Block r of the send buffer holds rank r's pieces at their slot positions, zeros in the padding,
  // in the wire's type.
  const SlotRun run = plan_.slots(first, last);
  const size_t bytes = static_cast<size_t>(run.span * plan_.world_size()) * wire_bytes(wire_);
  cudaStream_t st = comm();
  grow(send_, bytes);
  CUDA_CHECK(cudaMemsetAsync(send_.data(), 0, bytes, st));
  for (const PieceCopy& p : plan_.pieces(run)) {
    to_wire(wire_advance(send_.data(), p.block_offset), wire_,
            grad_buffers_[static_cast<size_t>(p.tensor)].data() + p.tensor_offset, p.count, st);
  }
  NCCL_CHECK(ncclReduceScatter(send_.data(), receive_into(run.base, run.span), static_cast<size_t>(run.span),
                               nccl_type(wire_), ncclSum, nccl_, st));
  land(run.base, run.span);
}

template <typename T>
bool GpuZeroEngine<T>::grads_full_is_partition() const noexcept {
  return grads_full_is_partition_of(plan_);
}

template <typename T>
const float* GpuZeroEngine<T>::reduced_grads() const noexcept {
  return grads_full_is_partition() ? grads_full_.data() : grad_part_.data();
}

template <typename T>
void GpuZeroEngine<T>::zero_grads() {
  // Stages 2-3: the first micro-batch's reductions overwrite every gradient of the partition (the
  // padding, never written, stays zero from the start); stage 1's reduce-scatter overwrites it all.
  grads_reduced_ = false;
  grads_written_ = false;
}

template <typename T>
void GpuZeroEngine<T>::pass_done() {
  closed_groups_ = 0;
  grads_written_ = true;
}

template <typename T>
void GpuZeroEngine<T>::reduce_grads() {
  const bool replicated = !plan_.partitions_grads();  // stages 0-1: reduced from the full buffer
  const int64_t P = replicated ? plan_.partition_size() : 0;
  if (replicated && narrow_wire()) {
    // Narrowed into the wire buffer, reduced there in place, widened back: stage 0 all of it, stage 1
    // this rank's block (NCCL's in-place reduce-scatter leaves it at rank * P).
    const size_t n = grads_full_.size();
    grow(send_, n * wire_bytes(wire_));
    to_wire(send_.data(), wire_, grads_full_.data(), static_cast<int64_t>(n), stream_);
    if (!plan_.partitions_optimizer()) {
      NCCL_CHECK(ncclAllReduce(send_.data(), send_.data(), n, nccl_type(wire_), ncclSum, nccl_, stream_));
      from_wire(grads_full_.data(), wire_, send_.data(), static_cast<int64_t>(n), false, stream_);
    } else {
      void* mine = wire_advance(send_.data(), plan_.partition_offset(plan_.rank()));
      NCCL_CHECK(
          ncclReduceScatter(send_.data(), mine, static_cast<size_t>(P), nccl_type(wire_), ncclSum, nccl_, stream_));
      from_wire(grad_part_.data(), wire_, mine, P, false, stream_);
    }
  } else if (!plan_.partitions_optimizer()) {
    NCCL_CHECK(
        ncclAllReduce(grads_full_.data(), grads_full_.data(), grads_full_.size(), ncclFloat, ncclSum, nccl_, stream_));
  } else if (replicated && !grads_full_is_partition()) {
    NCCL_CHECK(ncclReduceScatter(grads_full_.data(), grad_part_.data(), static_cast<size_t>(P), ncclFloat, ncclSum,
                                 nccl_, stream_));
  } else if (replicated) {
    // One rank: nothing to reduce, and the optimizer reads grads_full_ in place.
  } else if (!pending_groups_.empty() || closed_groups_ != 0) {
    fail(ErrorKind::kInternal, "gradients still open at the end of the step");
  } else {
    wait(stream_, comm());  // every bucket's reduction has landed in the partition
  }
}

template <typename T>
double GpuZeroEngine<T>::global_grad_sq() {
  const float* g = reduced_grads() + plan_.owned_offset();
  sum_squares(scalar_.data(), g, plan_.owned_size(), stream_);
  read_back(scalar_host_.data(), scalar_.data(), 1, stream_);
  synchronize(stream_);  // the host decides on overflow and clipping from it
  return mpi_.allreduce_sum(scalar_host_.data()[0]);
}

template <typename T>
void GpuZeroEngine<T>::step(const OptimizerStep& s) {
  const float* grads = reduced_grads();
  // The update writes the compute-precision copy directly where the model reads it (stage 0: the
  // replicated buffer; 1-2: this rank's partition of it, then all-gathered; 3: the partition, which
  // in host memory the host optimizer writes directly and the GPU one through device staging).
  T* params = owned_params();
  // Gathers issued ahead hold the old weights and may still read the partition: drop them, and let
  // the update wait for the communication stream.
  if (plan_.partitions_params()) drop_prefetched();
  wait(stream_, comm());
  // A snapshot still reads the states. The first wait after one is timed: begin completes when the
  // stream's own work does, end when the copy does, so their distance is the time the copy cost.
  if (snapshot_reads_states_) {
    CUDA_CHECK(cudaEventRecord(snapshot_wait_begin_.get(), stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, snapshot_done_.get(), 0));
    CUDA_CHECK(cudaEventRecord(snapshot_wait_end_.get(), stream_));
    snapshot_reads_states_ = false;  // the steps after this one are ordered after the copy too
    snapshot_wait_timed_ = true;
  }
  // The update is elementwise: updating in chunks (for the pipelined gather below, or a partition in
  // host memory) gives the same results.
  const NoDecayRanges no_decay{no_decay_device_.data(), static_cast<int64_t>(no_decay_device_.size())};
  const typename ParamPartition<T>::Producer update = [&](int64_t lo, int64_t n, T* out) {
    std::vector<float*> at;
    for (DeviceBuffer<float>& state : states_) at.push_back(state.data() + lo);
    optimizer_update(s, at, grads + lo, out, n, no_decay.at(lo), stream_);
  };
  if (host_) {
    host_->step(grads, params, s, {no_decay_.data(), static_cast<int64_t>(no_decay_.size())}, stream_);
    if (plan_.gathers_updated_params()) all_gather_params();
  } else if (plan_.gathers_updated_params()) {
    update_and_gather(update);
  } else {
    write_params(update);
  }
}

template <typename T>
void GpuZeroEngine<T>::update_and_gather(const typename ParamPartition<T>::Producer& update) {
  // Chunk k's gather runs on the communication stream while the compute stream updates chunk k + 1.
  // Every rank's chunk k sits at its own partition's offset in params_full_, so the gather is one
  // in-place broadcast per rank, in one NCCL group.
  const int64_t P = plan_.partition_size();
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(config_.allgather_bucket_size, (P + 7) / 8));
  T* mine = owned_params();
  cudaStream_t st = comm();
  for (int64_t lo = 0; lo < P; lo += chunk) {
    const int64_t n = std::min(chunk, P - lo);
    update(lo, n, mine + lo);
    wait(st, stream_);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < plan_.world_size(); ++r) {
      T* at = params_full_.data() + plan_.partition_offset(r) + lo;
      NCCL_CHECK(ncclBroadcast(at, at, static_cast<size_t>(n), NcclType<T>::kValue, r, nccl_, st));
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  wait(stream_, st);  // the next forward pass reads the gathered weights
}

template class GpuZeroEngine<float>;
template class GpuZeroEngine<__nv_bfloat16>;
template class GpuZeroEngine<__half>;
template EngineFootprint engine_footprint<float>(const ZeroPlan&, const std::vector<model::TensorGroup>&,
                                                 const ZeroConfig&, const Optimizer&, ckpt::DType, bool);
template EngineFootprint engine_footprint<__nv_bfloat16>(const ZeroPlan&, const std::vector<model::TensorGroup>&,
                                                         const ZeroConfig&, const Optimizer&, ckpt::DType, bool);
template EngineFootprint engine_footprint<__half>(const ZeroPlan&, const std::vector<model::TensorGroup>&,
                                                  const ZeroConfig&, const Optimizer&, ckpt::DType, bool);

}  // namespace shardkit::trainer::cuda
