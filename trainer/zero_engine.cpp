#include "trainer/zero_engine.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"
#include "base/parallel_memory.hpp"
#include "trainer/grad_wire.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer {

namespace {

// Elements of each buffer a rank's engine keeps for the whole run, by stage and by what is swapped to
// NVMe: the constructor allocates these, and planned_memory counts them before anything is allocated.
struct BufferSizes {
  size_t params_full = 0, grads_full = 0, grad_part = 0;
  size_t states = 0;  // each of the optimizer's states (none where they are swapped)
  size_t params_part = 0;
};

BufferSizes buffer_sizes(const ZeroPlan& plan, bool optimizer_swapped, bool params_swapped) {
  const auto flat = static_cast<size_t>(plan.owned_size());
  const auto full = static_cast<size_t>(plan.replicated_size());
  BufferSizes n;
  if (!plan.partitions_params()) n.params_full = full;  // stage 3 gathers each group when the model needs it
  if (!plan.partitions_grads()) n.grads_full = full;
  if (plan.partitions_optimizer()) n.grad_part = flat;
  if (!plan.partitions_optimizer()) {
    n.states = full;
  } else if (!optimizer_swapped) {
    n.states = flat;
  }
  // Stage 3 with the master weights on disk: the parameters the gathers read from stay in memory.
  if (plan.partitions_params() && optimizer_swapped && !params_swapped) n.params_part = flat;
  return n;
}

// The report of buffers of `n` elements. At stage 3 without NVMe offload the master weights are the
// parameters the groups are gathered from: the report names them as parameters too, unless
// `allocations` asks for each buffer once (what the memory check adds up).
MemoryReport bytes_of(const BufferSizes& n, const ZeroPlan& plan, const Optimizer& optimizer, bool params_swapped,
                      bool allocations = false) {
  const auto bytes = [](size_t elements) { return static_cast<int64_t>(elements * sizeof(float)); };
  MemoryReport r;
  if (!plan.partitions_params()) {
    r.parameters = bytes(n.params_full);
  } else if (n.params_part > 0) {
    r.parameters = bytes(n.params_part);
  } else if (!params_swapped && !allocations) {
    r.parameters = bytes(n.states);
  }
  r.gradients = bytes(plan.partitions_grads() ? n.grad_part : n.grads_full);
  r.optimizer_states = optimizer.num_states() * bytes(n.states);
  return r;
}

}  // namespace

ZeroEngine::ZeroEngine(const ckpt::TensorTable& table, std::vector<model::TensorGroup> groups,
                       const std::vector<bool>& decays, const ZeroConfig& config, const Optimizer& optimizer,
                       ckpt::DType wire, comm::MpiCollective& comm, const nvme::SwapFactory& swap)
    : table_(table),
      groups_(std::move(groups)),
      config_(config),
      wire_(comm.size() > 1 ? wire : ckpt::DType::kF32),  // one rank sends nothing, so rounds nothing
      comm_(comm),
      plan_(table, comm.size(), comm.rank(), config.stage),
      optimizer_(optimizer),
      states_(static_cast<size_t>(optimizer.num_states())) {
  if (!plan_.partitions_optimizer()) {
    if (swap) {
      fail(ErrorKind::kInvalidInput,
           "zero_optimization.offload_optimizer device nvme needs ZeRO stage 1, 2 or 3 (stage 0 keeps no optimizer "
           "partition)");
    }
  } else if (swap) {
    nvme::Swaps swaps = swap(plan_.owned_size());
    swap_ = std::move(swaps.optimizer);
    param_swap_ = std::move(swaps.params);
  }
  const BufferSizes n = buffer_sizes(plan_, swap_ != nullptr, param_swap_ != nullptr);
  params_full_.resize(n.params_full);
  grads_full_.resize(n.grads_full);
  grad_part_.resize(n.grad_part);
  for (LargeVector<float>& state : states_) state.resize(n.states);
  params_part_.resize(n.params_part);
  if (plan_.partitions_params()) gathered_.resize(table.size());
  acquired_count_.assign(groups_.size(), 0);
  if (plan_.partitions_grads()) grad_buffers_.resize(table.size());
  no_decay_ = no_decay_ranges(plan_.optimizer_fragments(), decays);
}

MemoryReport ZeroEngine::planned_memory(const ckpt::TensorTable& table, const ZeroConfig& config,
                                        const Optimizer& optimizer, int world_size, int rank) {
  const ZeroPlan plan(table, world_size, rank, config.stage);
  const bool optimizer_swapped = config.stage != 0 && config.offload_optimizer.device == OffloadDevice::kNvme;
  const bool params_swapped = config.stage == 3 && config.offload_param.device == OffloadDevice::kNvme;
  return bytes_of(buffer_sizes(plan, optimizer_swapped, params_swapped), plan, optimizer, params_swapped, true);
}

MemoryReport ZeroEngine::memory() const noexcept {
  const BufferSizes held{params_full_.size(), grads_full_.size(), grad_part_.size(), states_[0].size(),
                         params_part_.size()};
  MemoryReport r = bytes_of(held, plan_, optimizer_, param_swap_ != nullptr);
  r.nvme_parameters = param_swap_ ? param_swap_->file_bytes() : 0;
  r.nvme_optimizer_states = swap_ ? swap_->file_bytes() : 0;
  return r;
}

void ZeroEngine::initialize(const std::function<void(int, int64_t, std::span<float>)>& init) {
  fill_states([&](std::span<const ckpt::Fragment> plan, std::span<const std::span<float>> states) {
    const std::span<float> master = states[0];
    parallel_fill(master.data(), static_cast<int64_t>(master.size()), 0.0f);
    for (const ckpt::Fragment& f : plan) {
      init(f.tensor, f.tensor_offset,
           master.subspan(static_cast<size_t>(f.flat_offset), static_cast<size_t>(f.length)));
    }
    for (const std::span<float> moment : states.subspan(1)) {
      parallel_fill(moment.data(), static_cast<int64_t>(moment.size()), 0.0f);
    }
  });
}

void ZeroEngine::fill_states(const StateFill& fill) {
  if (swap_) {
    fill_swapped_states(fill);
  } else {
    const std::vector<std::span<float>> states(states_.begin(), states_.end());
    fill(plan_.optimizer_fragments(), states);
    if (param_swap_) write_param_swap();
  }
  publish_params();
}

void ZeroEngine::fill_swapped_states(const StateFill& fill) {
  const std::vector<ckpt::Fragment> plan = plan_.optimizer_fragments();
  visit_swapped(nvme::StateSwapper::Access::kWrite, [&](int64_t lo, std::span<const std::span<float>> states) {
    fill(fragments_within(plan, lo, lo + static_cast<int64_t>(states[0].size())), states);
  });
}

void ZeroEngine::visit_swapped(
    nvme::StateSwapper::Access access,
    const std::function<void(int64_t offset, std::span<const std::span<float>> states)>& update) {
  using nvme::StateSwapper;
  drop_read_ahead();  // it would hold the parameters from before this visit writes them
  static constexpr int kParams[] = {0};
  std::vector<StateSwapper::Part> parts = {{swap_.get(), access, swap_->all_states()}};
  if (param_swap_) parts.push_back({param_swap_.get(), StateSwapper::Access::kWrite, kParams});
  const std::span<float> params = params_partition();
  StateSwapper::visit(parts, [&](std::span<const StateSwapper::Chunk> chunks) {
    const StateSwapper::Chunk& chunk = chunks[0];
    update(chunk.offset, std::span(chunk.states).first(static_cast<size_t>(optimizer_.num_states())));
    const std::span<const float> master = chunk.states[0];
    std::ranges::copy(master, param_swap_ ? chunks[1].states[0].begin() : params.begin() + chunk.offset);
  });
}

void ZeroEngine::write_param_swap() {
  drop_read_ahead();  // it would hold the parameters from before this write
  param_swap_->visit(nvme::StateSwapper::Access::kWrite, [&](const nvme::StateSwapper::Chunk& chunk) {
    const auto from = states_[0].begin() + chunk.offset;
    std::copy(from, from + static_cast<std::ptrdiff_t>(chunk.states[0].size()), chunk.states[0].begin());
  });
}

std::span<float> ZeroEngine::params_partition() noexcept {
  // (Empty at stage 3 with the parameters swapped.)
  if (plan_.partitions_params()) return swap_ ? std::span<float>(params_part_) : std::span<float>(states_[0]);
  return {params_full_.data() + plan_.partition_offset(plan_.rank()), static_cast<size_t>(plan_.partition_size())};
}

void ZeroEngine::publish_params() {
  if (!plan_.partitions_optimizer()) {
    std::ranges::copy(states_[0], params_full_.begin());
  } else if (plan_.gathers_updated_params()) {
    if (!swap_) std::ranges::copy(states_[0], params_partition().begin());
    comm_.allgather_inplace(params_full_.data(), plan_.partition_size());
  }
  // Stage 3: the partition is the source of every gather; nothing to publish.
}

void ZeroEngine::acquire(int group) {
  if (!plan_.partitions_params()) return;
  if (acquired_count_[static_cast<size_t>(group)]++ == 0) gather_stage3(group);
}

void ZeroEngine::release(int group) {
  if (!plan_.partitions_params()) return;
  if (--acquired_count_[static_cast<size_t>(group)] > 0) return;
  const model::TensorGroup& g = groups_[static_cast<size_t>(group)];
  for (int t = g.first; t < g.last; ++t) LargeVector<float>().swap(gathered_[static_cast<size_t>(t)]);
}

void ZeroEngine::gather_stage3(int group) {
  const model::TensorGroup& g = groups_[static_cast<size_t>(group)];
  const std::vector<SlotRun> buckets = plan_.buckets(g.first, g.last, config_.allgather_bucket_size);
  const auto start_read = [&](size_t k) {
    param_swap_->start_read(param_reads_[k % 2], 0, buckets[k].base, buckets[k].span);
  };
  if (param_swap_ && read_ahead_group_ == group) {
    read_ahead_group_ = -1;  // bucket 0's slice is on its way into param_reads_[0]
  } else if (param_swap_) {
    drop_read_ahead();
    start_read(0);
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    const SlotRun& run = buckets[k];
    const float* source = params_partition().data() + run.base;
    if (param_swap_) {
      // The next bucket's slice is read while this one is gathered.
      if (k + 1 < buckets.size()) start_read(k + 1);
      source = param_swap_->finish_read(param_reads_[k % 2]).data();
    }
    recv_buffer_.resize(static_cast<size_t>(run.span * plan_.world_size()));
    comm_.allgather(source, recv_buffer_.data(), run.span);
    for (int t = run.first; t < run.last; ++t) gathered_[static_cast<size_t>(t)].resize(static_cast<size_t>(numel(t)));
    for (const PieceCopy& p : plan_.pieces(run)) {
      const float* src = recv_buffer_.data() + p.block_offset;
      std::copy(src, src + p.count, gathered_[static_cast<size_t>(p.tensor)].data() + p.tensor_offset);
    }
  }
  if (param_swap_) read_ahead_after(group);
}

void ZeroEngine::read_ahead_after(int group) {
  // A wrong guess costs one read, dropped later.
  const int next = likely_next_group(group, last_gathered_, static_cast<int>(groups_.size()));
  last_gathered_ = group;
  if (next < 0 || acquired_count_[static_cast<size_t>(next)] > 0) return;
  const model::TensorGroup& g = groups_[static_cast<size_t>(next)];
  const std::vector<SlotRun> buckets = plan_.buckets(g.first, g.last, config_.allgather_bucket_size);
  if (buckets.empty()) return;
  param_swap_->start_read(param_reads_[0], 0, buckets[0].base, buckets[0].span);
  read_ahead_group_ = next;
}

void ZeroEngine::drop_read_ahead() {
  if (read_ahead_group_ < 0) return;
  read_ahead_group_ = -1;
  param_swap_->finish_read(param_reads_[0]);
}

const float* ZeroEngine::param(int tensor) const {
  if (!plan_.partitions_params()) return params_full_.data() + layout().global_offset(tensor);
  const LargeVector<float>& full = gathered_[static_cast<size_t>(tensor)];
  if (full.size() != static_cast<size_t>(numel(tensor))) {
    fail(ErrorKind::kInternal, "parameter " + table_[static_cast<size_t>(tensor)].name + " used while not acquired");
  }
  return full.data();
}

void ZeroEngine::open_grads(int group) {
  if (!plan_.partitions_grads()) return;
  const model::TensorGroup& g = groups_[static_cast<size_t>(group)];
  for (int t = g.first; t < g.last; ++t) grad_buffers_[static_cast<size_t>(t)].assign(static_cast<size_t>(numel(t)), 0);
}

float* ZeroEngine::grad(int tensor) {
  if (!plan_.partitions_grads()) return grads_full_.data() + layout().global_offset(tensor);
  return grad_buffers_[static_cast<size_t>(tensor)].data();
}

void ZeroEngine::close_grads(int group) {
  if (!plan_.partitions_grads()) return;
  pending_groups_.push_back(group);
  const model::TensorGroup& g = groups_[static_cast<size_t>(group)];
  for (int t = g.first; t < g.last; ++t) pending_elems_ += numel(t);
  // Reduce a bucket once it is full, and whatever waits once the backward pass has closed every group
  // (counted: with an untied head no group is open for a moment after the last one closes).
  const bool pass_done = ++closed_groups_ == static_cast<int>(groups_.size());
  if (pass_done) closed_groups_ = 0;
  if (pending_elems_ >= config_.reduce_bucket_size || pass_done) flush_pending_grads();
}

void ZeroEngine::flush_pending_grads() {
  for (const model::TensorGroup& run : consecutive_runs(groups_, pending_groups_)) {
    if (!plan_.partitions_params()) {
      reduce_stage2(run.first, run.last);
    } else {
      reduce_stage3(run.first, run.last);
    }
    for (int t = run.first; t < run.last; ++t) LargeVector<float>().swap(grad_buffers_[static_cast<size_t>(t)]);
  }
  pending_groups_.clear();
  pending_elems_ = 0;
}

void ZeroEngine::reduce_stage2(int first, int last) {
  // The run covers global positions [lo, hi), which the partitions split in rank order: one
  // reduce-scatter with per-rank counts hands each rank the sum over ranks of its own part.
  const GlobalRun run = plan_.global_run(first, last);
  send_buffer_.resize(static_cast<size_t>(run.hi - run.lo));
  for (int t = first; t < last; ++t) {
    const auto& g = grad_buffers_[static_cast<size_t>(t)];
    std::copy(g.begin(), g.end(), send_buffer_.begin() + (layout().global_offset(t) - run.lo));
  }
  std::vector<int> counts(static_cast<size_t>(plan_.world_size()));
  for (int r = 0; r < plan_.world_size(); ++r)
    counts[static_cast<size_t>(r)] = static_cast<int>(plan_.share(run, r).count);
  const PartitionShare mine = plan_.share(run, plan_.rank());
  recv_buffer_.resize(static_cast<size_t>(std::max<int64_t>(mine.count, 1)));
  round_to_wire(send_buffer_, wire_);
  comm_.reduce_scatter(send_buffer_.data(), recv_buffer_.data(), counts);
  round_to_wire({recv_buffer_.data(), static_cast<size_t>(mine.count)}, wire_);
  float* dst = grad_part_.data() + mine.offset;
  for (int64_t i = 0; i < mine.count; ++i) dst[i] += recv_buffer_[static_cast<size_t>(i)];
}

void ZeroEngine::reduce_stage3(int first, int last) {
  // Every rank's slots for tensors [first, last) span the same range [base, base + span): block r of
  // the send buffer holds rank r's pieces at their slot positions (zeros in the padding).
  const SlotRun run = plan_.slots(first, last);
  send_buffer_.assign(static_cast<size_t>(run.span * plan_.world_size()), 0.0f);
  for (const PieceCopy& p : plan_.pieces(run)) {
    const auto& g = grad_buffers_[static_cast<size_t>(p.tensor)];
    std::copy(g.begin() + p.tensor_offset, g.begin() + p.tensor_offset + p.count,
              send_buffer_.begin() + p.block_offset);
  }
  recv_buffer_.resize(static_cast<size_t>(run.span));
  round_to_wire(send_buffer_, wire_);
  comm_.reduce_scatter_block(send_buffer_.data(), recv_buffer_.data(), run.span);
  round_to_wire(recv_buffer_, wire_);
  float* dst = grad_part_.data() + run.base;
  for (int64_t i = 0; i < run.span; ++i) dst[i] += recv_buffer_[static_cast<size_t>(i)];
}

void ZeroEngine::zero_grads() {
  std::fill(grads_full_.begin(), grads_full_.end(), 0.0f);
  std::fill(grad_part_.begin(), grad_part_.end(), 0.0f);
}

void ZeroEngine::reduce_grads() {
  if (!plan_.partitions_optimizer()) {
    round_to_wire(grads_full_, wire_);
    comm_.allreduce_sum(grads_full_.data(), static_cast<int64_t>(grads_full_.size()));
    round_to_wire(grads_full_, wire_);
  } else if (!plan_.partitions_grads()) {
    round_to_wire(grads_full_, wire_);
    comm_.reduce_scatter_block(grads_full_.data(), grad_part_.data(), plan_.partition_size());
    round_to_wire(grad_part_, wire_);
  } else if (!pending_groups_.empty() || closed_groups_ != 0) {
    fail(ErrorKind::kInternal, "gradients still open at the end of the step");
  }
}

std::span<float> ZeroEngine::optimizer_grads() noexcept {
  return plan_.partitions_optimizer() ? grad_part_ : grads_full_;
}

std::span<const float> ZeroEngine::owned(const LargeVector<float>& buffer) const noexcept {
  return std::span<const float>(buffer.data() + plan_.owned_offset(), static_cast<size_t>(plan_.owned_size()));
}

double ZeroEngine::global_grad_sq() {
  // Each element counted once: stage 0 counts the rank's slice of the replicated gradients.
  const std::span<const float> g = owned(plan_.partitions_optimizer() ? grad_part_ : grads_full_);
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (size_t i = 0; i < g.size(); ++i) sum += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  return comm_.allreduce_sum(sum);
}

void ZeroEngine::step(const OptimizerStep& s) {
  const NoDecayRanges no_decay{no_decay_.data(), static_cast<int64_t>(no_decay_.size())};
  if (swap_) {
    // Element-wise, so chunk by chunk gives the same bits as the whole partition at once.
    const std::span<const float> grads = grad_part_;
    visit_swapped(nvme::StateSwapper::Access::kUpdate, [&](int64_t offset, std::span<const std::span<float>> states) {
      optimizer_.cpu_update(
          s, {states, grads.subspan(static_cast<size_t>(offset), states[0].size()), no_decay.at(offset)});
    });
  } else {
    const std::vector<std::span<float>> states(states_.begin(), states_.end());
    optimizer_.cpu_update(s, {states, optimizer_grads(), no_decay});
    if (param_swap_) write_param_swap();
  }
  publish_params();
}

void ZeroEngine::read_state(int state, const StateSink& sink) {
  if (swap_) {
    const int states[] = {state};
    swap_->visit(nvme::StateSwapper::Access::kRead, states,
                 [&](const nvme::StateSwapper::Chunk& chunk) { sink(chunk.states[static_cast<size_t>(state)]); });
    return;
  }
  sink(owned(states_[static_cast<size_t>(state)]));
}

}  // namespace shardkit::trainer
