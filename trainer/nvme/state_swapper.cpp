#include "trainer/nvme/state_swapper.hpp"

#include <algorithm>
#include <optional>

#include "base/error.hpp"
#include "base/host_memory.hpp"
#include "base/text_format.hpp"

namespace shardkit::trainer::nvme {
namespace {

constexpr int kAllStates[kMaxStates] = {0, 1, 2};

// element_bytes per element and state, in whole chunks.
int64_t file_size(int64_t elements, int states, int64_t chunk_elems, int element_bytes) {
  const int64_t chunks = std::max<int64_t>(1, (elements + chunk_elems - 1) / chunk_elems);
  return states * chunks * chunk_elems * element_bytes;
}

int checked_element_bytes(int element_bytes) {
  if (element_bytes != 4 && element_bytes != 2) {
    fail(ErrorKind::kInternal, "NVMe swap: elements of " + std::to_string(element_bytes) + " bytes, expected 4 or 2");
  }
  return element_bytes;
}

// Elements per chunk: the chunk size's in fp32, whose bytes at the swap's width stay aligned for O_DIRECT.
int64_t checked_chunk_elems(const SwapOptions& o, int element_bytes) {
  const int64_t A = static_cast<int64_t>(kDirectAlignment);
  const int64_t multiple = A * 4 / checked_element_bytes(element_bytes);
  if (o.chunk_bytes <= 0 || o.chunk_bytes % multiple != 0) {
    fail(ErrorKind::kInvalidInput,
         "NVMe swap: chunk size (aio.block_size) " + std::to_string(o.chunk_bytes) +
             " bytes must be a positive multiple of " + std::to_string(multiple) +
             (multiple == A ? "" : " for a swap of 16-bit elements (each chunk holds half those bytes)"));
  }
  return o.chunk_bytes / static_cast<int64_t>(sizeof(float));
}

int checked_states(int states) {
  if (states < 1 || states > kMaxStates) {
    fail(ErrorKind::kInternal,
         "NVMe swap: " + std::to_string(states) + " states per file, expected 1 to " + std::to_string(kMaxStates));
  }
  return states;
}

// Three is the least a pipeline needs: one chunk read ahead, one computed, one written behind.
int buffer_count(const SwapOptions& o) {
  return std::max(3, o.buffer_count);
}

// The bounce buffers' bytes: buffer_count buffers, each a chunk of every state. Both figures come from
// the config, so the product is checked for overflow and against the memory available before
// anything is allocated: beyond it the allocation would end in std::bad_alloc, or in the
// out-of-memory killer once the pages are touched.
void require_buffer_memory(const SwapOptions& o, int states, int element_bytes, const std::string& contents) {
  const int64_t chunk_bytes = checked_chunk_elems(o, element_bytes) * element_bytes;
  const int count = buffer_count(o);
  int64_t per_buffer = 0, total = 0;
  const bool overflow = __builtin_mul_overflow(chunk_bytes, int64_t{states}, &per_buffer) ||
                        __builtin_mul_overflow(per_buffer, int64_t{count}, &total);
  const double available = available_memory_bytes();
  if (!overflow && static_cast<double>(total) <= available) return;
  fail(ErrorKind::kInvalidInput,
       "NVMe swap of the " + contents + ": " + std::to_string(count) + " buffers (buffer_count) of " +
           std::to_string(states) + " x " + std::to_string(chunk_bytes) + " bytes (aio.block_size" +
           (element_bytes == 4 ? "" : ", at 16 bits") + ") need " +
           (overflow ? std::string("more than 2^63 bytes") : format_bytes(static_cast<double>(total))) +
           ", more than the " + format_bytes(available) + " of memory available (" + kHostMemoryVariable +
           " overrides what the kernel says); lower buffer_count or aio.block_size");
}

}  // namespace

// One visit's pipeline over one swapper. Chunk c lives in buffer c % B. Reads run `ahead` chunks in
// front of the one computed; an access that writes keeps one buffer for the write of the chunk before.
class StateSwapper::Pipeline {
 public:
  Pipeline(StateSwapper& swap, Access access, std::span<const int> states)
      : swap_(swap),
        states_(states),
        B_(static_cast<int64_t>(swap.buffers_.size())),
        reads_(access != Access::kWrite),
        writes_(access != Access::kRead),
        ahead_(writes_ ? B_ - 2 : B_ - 1),
        reading_(static_cast<size_t>(B_)),
        writing_(static_cast<size_t>(B_)) {}

  // Chunk c in its buffer: read (with the reads ahead of it started) where the access reads, its
  // buffer's previous write settled in any case.
  Chunk open(int64_t c) {
    const int64_t chunks = swap_.chunk_count();
    if (reads_) {
      for (; next_read_ < chunks && next_read_ <= c + ahead_; ++next_read_) {
        settle_write(next_read_);  // the buffer's previous chunk is on disk before it is overwritten
        reading_[slot(next_read_)] = swap_.transfer(IoOp::kRead, next_read_, states_);
      }
      swap_.io_->wait(*std::exchange(reading_[slot(c)], std::nullopt));
    } else {
      settle_write(c);
    }
    const int64_t lo = c * swap_.chunk_elems_;
    const size_t n = static_cast<size_t>(std::min(swap_.chunk_elems_, swap_.elements_ - lo));
    std::byte* base = swap_.buffers_[slot(c)].data();
    const size_t state_bytes = static_cast<size_t>(swap_.chunk_elems_ * swap_.element_bytes_);
    Chunk chunk{lo, {}, {}};
    for (const int s : states_) {
      std::byte* first = base + static_cast<size_t>(s) * state_bytes;
      if (swap_.element_bytes_ == 4) {
        chunk.states[static_cast<size_t>(s)] = {reinterpret_cast<float*>(first), n};
      } else {
        chunk.bits16[static_cast<size_t>(s)] = {reinterpret_cast<uint16_t*>(first), n};
      }
    }
    return chunk;
  }
  // After the caller's work on chunk c: written back where the access writes.
  void close(int64_t c) {
    if (writes_) writing_[slot(c)] = swap_.transfer(IoOp::kWrite, c, states_);
  }
  // Waits for every write.
  void finish() {
    for (int64_t b = 0; b < B_; ++b) settle_write(b);
  }

 private:
  size_t slot(int64_t c) const noexcept { return static_cast<size_t>(c % B_); }
  void settle_write(int64_t c) {
    auto& w = writing_[slot(c)];
    if (w) swap_.io_->wait(*std::exchange(w, std::nullopt));
  }

  StateSwapper& swap_;
  std::span<const int> states_;
  int64_t B_;
  bool reads_, writes_;
  int64_t ahead_;
  std::vector<std::optional<AsyncIo::Batch>> reading_, writing_;
  int64_t next_read_ = 0;
};

RangeRead::RangeRead(std::span<std::byte> buffer) : external_(buffer) {
  if (reinterpret_cast<uintptr_t>(buffer.data()) % kDirectAlignment != 0) {
    fail(ErrorKind::kInternal,
         "a range read's buffer is not aligned to " + std::to_string(kDirectAlignment) + " bytes");
  }
}

RangeRead::~RangeRead() {
  if (swapper_ == nullptr) return;
  const std::lock_guard lock(swapper_->mutex_);
  swapper_->io_->drain();  // the kernel may not write into a freed buffer
}

SwapNeed StateSwapper::need(const SwapOptions& options, int64_t elements, int states, const std::string& contents,
                            int element_bytes) {
  require_buffer_memory(options, checked_states(states), element_bytes, contents);
  return {options.dir,
          file_size(elements, checked_states(states), checked_chunk_elems(options, element_bytes), element_bytes),
          "the " + contents + " of this rank's " + std::to_string(elements) + "-element partition (" +
              std::to_string(element_bytes * states) + " bytes per element)"};
}

StateSwapper::StateSwapper(const SwapOptions& options, const std::string& file_name, int64_t elements, int states,
                           const std::string& contents, const std::function<void(const std::string&)>& notice,
                           int element_bytes)
    : elements_(elements),
      states_(checked_states(states)),
      element_bytes_(checked_element_bytes(element_bytes)),
      chunk_elems_(checked_chunk_elems(options, element_bytes)),
      file_(options.dir, file_name, need(options, elements, states, contents, element_bytes).bytes,
            need(options, elements, states, contents, element_bytes).what, notice),
      io_(open_async_io(file_.fd(), file_.path(), options.queue_depth, static_cast<size_t>(options.chunk_bytes))) {
  const int count = buffer_count(options);  // within the memory available (need() checked)
  for (int i = 0; i < count; ++i) buffers_.emplace_back(static_cast<size_t>(states_ * chunk_elems_ * element_bytes_));
}

size_t StateSwapper::range_bytes(int64_t count, int element_bytes) noexcept {
  const size_t A = kDirectAlignment;
  return ((static_cast<size_t>(count) * static_cast<size_t>(element_bytes) + A - 1) / A + 1) * A;
}

std::span<const int> StateSwapper::all_states() const noexcept {
  return std::span<const int>(kAllStates).first(static_cast<size_t>(states_));
}

AsyncIo::Batch StateSwapper::transfer(IoOp op, int64_t chunk, std::span<const int> states) {
  const size_t bytes = static_cast<size_t>(chunk_elems_ * element_bytes_);
  std::byte* buffer = buffers_[static_cast<size_t>(chunk) % buffers_.size()].data();
  std::vector<IoRequest> requests;
  for (const int s : states) {
    const int64_t offset = (s * chunk_count() + chunk) * static_cast<int64_t>(bytes);
    requests.push_back({op, buffer + static_cast<size_t>(s) * bytes, bytes, offset});
  }
  return io_->submit(requests);
}

void StateSwapper::visit(Access access, const Visit& visit_chunk) {
  visit(access, all_states(), visit_chunk);
}

void StateSwapper::visit(Access access, std::span<const int> states, const Visit& visit_chunk) {
  const Part parts[] = {{this, access, states}};
  visit(parts, [&](std::span<const Chunk> chunks) { visit_chunk(chunks[0]); });
}

void StateSwapper::visit(std::span<const Part> parts, const std::function<void(std::span<const Chunk>)>& visit_chunks) {
  for (const Part& p : parts) {
    if (p.swapper->elements_ != parts[0].swapper->elements_ ||
        p.swapper->chunk_elems_ != parts[0].swapper->chunk_elems_) {
      fail(ErrorKind::kInternal, p.swapper->path().string() + ": visited together with a swap of another shape");
    }
  }
  // One visit at a time per swapper; several are locked in one order, so that two visits never wait
  // for each other.
  std::vector<StateSwapper*> order;
  for (const Part& p : parts) order.push_back(p.swapper);
  std::ranges::sort(order);
  std::vector<std::unique_lock<std::mutex>> locks;
  for (StateSwapper* s : order) locks.emplace_back(s->mutex_);
  try {
    std::vector<Pipeline> pipelines;
    pipelines.reserve(parts.size());
    for (const Part& p : parts) pipelines.emplace_back(*p.swapper, p.access, p.states);
    std::vector<Chunk> chunks(parts.size());
    const int64_t count = parts.empty() ? 0 : parts[0].swapper->chunk_count();
    for (int64_t c = 0; c < count; ++c) {
      for (size_t i = 0; i < parts.size(); ++i) chunks[i] = pipelines[i].open(c);
      visit_chunks(chunks);
      for (Pipeline& p : pipelines) p.close(c);
    }
    for (Pipeline& p : pipelines) p.finish();
  } catch (...) {
    for (StateSwapper* s : order) s->io_->drain();  // nothing in flight may outlive the visit that started it
    throw;
  }
}

void StateSwapper::start_read(RangeRead& read, int state, int64_t offset, int64_t count) {
  if (read.swapper_ != nullptr) fail(ErrorKind::kInternal, path().string() + ": a range read started twice");
  if (state < 0 || state >= states_ || offset < 0 || count < 0 || count > elements_ - offset) {
    fail(ErrorKind::kInternal, path().string() + ": a range read of elements [" + std::to_string(offset) + ", " +
                                   std::to_string(offset + count) + ") of state " + std::to_string(state) +
                                   "; the swap holds " + std::to_string(states_) +
                                   (states_ == 1 ? " state" : " states") + " of " + std::to_string(elements_) +
                                   " elements");
  }
  // The aligned byte range around the elements: each state is contiguous in the file.
  const int64_t A = static_cast<int64_t>(kDirectAlignment);
  const int64_t first = (state * chunk_count() * chunk_elems_ + offset) * element_bytes_;
  const int64_t lo = first / A * A;
  const int64_t hi = (first + count * element_bytes_ + A - 1) / A * A;
  const size_t bytes = static_cast<size_t>(hi - lo);
  if (read.external_.empty() && read.buffer_.size() < bytes) read.buffer_ = AlignedBuffer(bytes);
  if (!read.external_.empty() && read.external_.size() < bytes) {
    fail(ErrorKind::kInternal, path().string() + ": a range read of " + std::to_string(bytes) +
                                   " bytes into a buffer of " + std::to_string(read.external_.size()));
  }
  read.skip_ = static_cast<size_t>(first - lo);
  read.count_ = static_cast<size_t>(count);
  const std::lock_guard lock(mutex_);
  const IoRequest request{IoOp::kRead, read.data(), bytes, lo};
  // Tracked before the submission: pieces queued by a submission that then fails are drained by
  // ~RangeRead before the buffer they write into can go.
  read.swapper_ = this;
  read.batch_ = io_->submit(std::span(&request, 1));
}

const std::byte* StateSwapper::finish_read_bytes(RangeRead& read, size_t element_bytes) {
  if (read.swapper_ != this) fail(ErrorKind::kInternal, path().string() + ": a range read finished before it started");
  if (element_bytes != static_cast<size_t>(element_bytes_)) {
    fail(ErrorKind::kInternal, path().string() + ": read as elements of " + std::to_string(element_bytes) +
                                   " bytes, holds elements of " + std::to_string(element_bytes_));
  }
  const std::lock_guard lock(mutex_);
  io_->wait(read.batch_);  // if the ring itself fails here, the read stays tracked for ~RangeRead to drain
  read.swapper_ = nullptr;
  return read.data() + read.skip_;
}

}  // namespace shardkit::trainer::nvme
