// CUDA and cuBLAS error checks with file and line, and RAII owners of device memory, pinned host
// memory, streams, events and graphs. Host code only (no kernels), so it compiles in .cpp and .cu files.
// (NCCL's counterparts are the trainer's: trainer/cuda/nccl.hpp.)
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "base/error.hpp"

namespace shardkit::model::cuda {

[[noreturn]] void throw_cuda(const char* what, const char* detail, const char* file, int line);

enum class Memory { kDevice, kPinnedHost };
// A failed allocation of `bytes` of `where`: out of memory is Error(kIo) saying how much was asked, how
// much is free and which settings need less (the most common way a GPU run fails, so it must not read
// as a bug); any other status goes to throw_cuda.
[[noreturn]] void throw_allocation_failure(cudaError_t status, size_t bytes, Memory where);

#define CUDA_CHECK(call)                                                                                           \
  do {                                                                                                             \
    const cudaError_t e_ = (call);                                                                                 \
    if (e_ != cudaSuccess) ::shardkit::model::cuda::throw_cuda(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)
#define CUBLAS_CHECK(call)                                                                       \
  do {                                                                                           \
    const cublasStatus_t e_ = (call);                                                            \
    if (e_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      ::shardkit::model::cuda::throw_cuda(#call, cublasGetStatusString(e_), __FILE__, __LINE__); \
    }                                                                                            \
  } while (0)
// The multiprocessors of the current device: how many blocks of one block per multiprocessor make a
// wave.
int multiprocessors();

// Device memory of `count` elements of T (cudaMalloc), freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { resize(count); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Reallocates when the size changes; contents are not kept.
  void resize(size_t count) {
    if (count == count_) return;
    release();
    if (count > 0) {
      if (const cudaError_t e = cudaMalloc(&data_, count * sizeof(T)); e != cudaSuccess) {
        data_ = nullptr;
        throw_allocation_failure(e, count * sizeof(T), Memory::kDevice);
      }
    }
    count_ = count;
  }
  void release() noexcept {
    if (data_) cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data() const noexcept { return data_; }
  size_t size() const noexcept { return count_; }
  size_t bytes() const noexcept { return count_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

// Grows `buffer` to at least `count` elements. Scratch buffers only ever grow: reallocating (cudaFree)
// would synchronise the device.
template <typename T>
void grow(DeviceBuffer<T>& buffer, size_t count) {
  if (buffer.size() < count) buffer.resize(count);
}

// Page-locked host memory (cudaMallocHost): device copies run at full speed and asynchronously.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t count) { resize(count); }
  ~PinnedBuffer() {
    if (data_) cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void resize(size_t count) {
    if (count == count_) return;
    if (data_) cudaFreeHost(data_);
    data_ = nullptr;
    count_ = 0;
    if (count > 0) {
      if (const cudaError_t e = cudaMallocHost(&data_, count * sizeof(T)); e != cudaSuccess) {
        data_ = nullptr;
        throw_allocation_failure(e, count * sizeof(T), Memory::kPinnedHost);
      }
    }
    count_ = count;
  }
  T* data() const noexcept { return data_; }
  size_t size() const noexcept { return count_; }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const noexcept { return stream_; }
  void synchronize() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  // Events that order streams skip timing (cheaper); timed ones measure the time between two (benchmarks).
  enum class Timing { kOff, kOn };
  explicit Event(Timing timing = Timing::kOff) {
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing == Timing::kOn ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // `waiter` waits (on the device) for everything `stream` has queued so far.
  void order(cudaStream_t stream, cudaStream_t waiter) {
    CUDA_CHECK(cudaEventRecord(event_, stream));
    CUDA_CHECK(cudaStreamWaitEvent(waiter, event_, 0));
  }
  cudaEvent_t get() const noexcept { return event_; }
  // Milliseconds from `start` to this event: both timed, both recorded, this one complete.
  double ms_since(const Event& start) const {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// An instantiated CUDA graph: capture() records what `queue` puts on `stream` (nothing runs while it
// records) and replaces the graph held before; launch() replays it on a stream.
class Graph {
 public:
  Graph() = default;
  ~Graph() { reset(); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  template <typename Queue>
  void capture(cudaStream_t stream, Queue&& queue) {
    reset();
    // Thread-local: CUDA calls of other threads (a checkpoint writer's) do not disturb the capture.
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      queue();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);  // ends the capture; the error in flight is the one to report
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(made);
  }
  bool ready() const noexcept { return exec_ != nullptr; }
  void launch(cudaStream_t stream) const { CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  void reset() noexcept {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
  }
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace shardkit::model::cuda
