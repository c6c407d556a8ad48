#include "trainer/nvme/state_swapper.hpp"

#include <algorithm>
#include <optional>

#include "ckpt/error.hpp"

namespace shardkit::trainer::nvme {
namespace {

constexpr int kAllStates[kStates] = {0, 1, 2};

// 12 bytes per element of the partition, in whole chunks.
int64_t file_size(int64_t elements, int64_t chunk_elems) {
  const int64_t chunks = std::max<int64_t>(1, (elements + chunk_elems - 1) / chunk_elems);
  return kStates * chunks * chunk_elems * static_cast<int64_t>(sizeof(float));
}

int64_t checked_chunk_elems(const SwapOptions& o) {
  if (o.chunk_bytes <= 0 || o.chunk_bytes % static_cast<int64_t>(kDirectAlignment) != 0) {
    fail(ErrorKind::kInvalidInput, "optimizer swap: chunk size " + std::to_string(o.chunk_bytes) +
                                       " bytes must be a positive multiple of " + std::to_string(kDirectAlignment));
  }
  return o.chunk_bytes / static_cast<int64_t>(sizeof(float));
}

}  // namespace

SwapNeed StateSwapper::need(const SwapOptions& options, int64_t elements) {
  return {
      options.dir, file_size(elements, checked_chunk_elems(options)),
      "the optimizer states of this rank's " + std::to_string(elements) + "-element partition (12 bytes per element)"};
}

StateSwapper::StateSwapper(const SwapOptions& options, const std::string& file_name, int64_t elements,
                           const std::function<void(const std::string&)>& notice)
    : elements_(elements),
      chunk_elems_(checked_chunk_elems(options)),
      file_(options.dir, file_name, need(options, elements).bytes, need(options, elements).what, notice),
      io_(open_async_io(file_.fd(), file_.path(), options.queue_depth, static_cast<size_t>(options.chunk_bytes))) {
  // Three is the least a pipeline needs: one chunk read ahead, one computed, one written behind.
  const int count = std::max(3, options.buffer_count);
  for (int i = 0; i < count; ++i) buffers_.emplace_back(static_cast<size_t>(kStates * options.chunk_bytes));
}

AsyncIo::Batch StateSwapper::transfer(IoOp op, int64_t chunk, std::span<const int> states) {
  const size_t bytes = static_cast<size_t>(chunk_elems_) * sizeof(float);
  std::byte* buffer = buffers_[static_cast<size_t>(chunk) % buffers_.size()].data();
  std::vector<IoRequest> requests;
  for (const int s : states) {
    const int64_t offset = (s * chunk_count() + chunk) * static_cast<int64_t>(bytes);
    requests.push_back({op, buffer + static_cast<size_t>(s) * bytes, bytes, offset});
  }
  return io_->submit(requests);
}

void StateSwapper::visit(Access access, const Visit& visit_chunk) {
  visit(access, kAllStates, visit_chunk);
}

void StateSwapper::visit(Access access, std::span<const int> states, const Visit& visit_chunk) {
  const std::lock_guard lock(mutex_);
  try {
    run(access, states, visit_chunk);
  } catch (...) {
    io_->drain();  // nothing in flight may outlive the visit that started it
    throw;
  }
}

void StateSwapper::run(Access access, std::span<const int> states, const Visit& visit_chunk) {
  const int64_t chunks = chunk_count();
  const int64_t B = static_cast<int64_t>(buffers_.size());
  const bool reads = access != Access::kWrite, writes = access != Access::kRead;
  // Chunk c lives in buffer c % B. Reads run `ahead` chunks in front of the one computed; an update
  // keeps one buffer for the write of the chunk before.
  const int64_t ahead = writes ? B - 2 : B - 1;
  std::vector<std::optional<AsyncIo::Batch>> reading(static_cast<size_t>(B)), writing(static_cast<size_t>(B));
  const auto settle_write = [&](int64_t c) {
    auto& w = writing[static_cast<size_t>(c % B)];
    if (w) io_->wait(*std::exchange(w, std::nullopt));
  };
  int64_t next_read = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    if (reads) {
      for (; next_read < chunks && next_read <= c + ahead; ++next_read) {
        settle_write(next_read);  // the buffer's previous chunk is on disk before it is overwritten
        reading[static_cast<size_t>(next_read % B)] = transfer(IoOp::kRead, next_read, states);
      }
      io_->wait(*std::exchange(reading[static_cast<size_t>(c % B)], std::nullopt));
    } else {
      settle_write(c);
    }
    const int64_t lo = c * chunk_elems_;
    const size_t n = static_cast<size_t>(std::min(chunk_elems_, elements_ - lo));
    auto* base = reinterpret_cast<float*>(buffers_[static_cast<size_t>(c % B)].data());
    Chunk chunk{lo, {}};
    for (const int s : states) {
      chunk.states[static_cast<size_t>(s)] = {base + static_cast<size_t>(s * chunk_elems_), n};
    }
    visit_chunk(chunk);
    if (writes) writing[static_cast<size_t>(c % B)] = transfer(IoOp::kWrite, c, states);
  }
  for (int64_t b = 0; b < B; ++b) settle_write(b);
}

}  // namespace shardkit::trainer::nvme
