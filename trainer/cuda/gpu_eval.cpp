// `shardkit eval --device cuda`: the weights resident on the rank's GPU in the compute type, scored by
// the family's CUDA model with forward passes only (no gradients, no optimizer states: a 7B model in
// bf16 takes 13.5 GB beside its activations).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "base/error.hpp"
#include "base/thread_pool.hpp"
#include "model/cuda/gpu_family.hpp"
#include "model/cuda/gpu_model.hpp"
#include "model/cuda/kernels.hpp"
#include "model/model.hpp"
#include "trainer/cuda/device_context.hpp"
#include "trainer/eval.hpp"

namespace shardkit::trainer {
namespace cuda {

using model::cuda::cast_from_float;
using model::cuda::DeviceBuffer;
using model::cuda::GpuModel;
using model::cuda::GpuParamStore;
using model::cuda::make_gpu_model;
using model::cuda::PinnedBuffer;
using model::cuda::Stream;

namespace {

// Every parameter in T in one device buffer, each tensor at a 256-byte boundary (vectorised kernels
// read them in 16-byte pieces): nothing to gather or release, no gradients.
template <typename T>
class ResidentParams final : public GpuParamStore<T> {
 public:
  ResidentParams(const ckpt::TensorTable& table, const InitFn& read, int device) {
    constexpr int64_t kAlign = 256 / sizeof(T);
    int64_t total = 0;
    for (const ckpt::TensorInfo& t : table) {
      offsets_.push_back(total);
      numels_.push_back(t.numel());
      total += (t.numel() + kAlign - 1) / kAlign * kAlign;
    }
    values_.resize(static_cast<size_t>(total));
    // In pieces of at most 64 MiB of fp32 (a crafted table cannot make the host allocate more than that
    // per thread), read and widened by several host threads at once, each into its own page-locked
    // buffer, then copied up and narrowed on that thread's stream: reading a 7B model's weights is
    // host work (pread, bf16 to fp32) that one thread would take most of half a minute over.
    constexpr int64_t kPiece = int64_t{16} << 20;
    struct Piece {
      int tensor;
      int64_t from, count;
    };
    std::vector<Piece> pieces;
    for (size_t t = 0; t < table.size(); ++t) {
      for (int64_t from = 0; from < table[t].numel(); from += kPiece) {
        pieces.push_back({static_cast<int>(t), from, std::min(kPiece, table[t].numel() - from)});
      }
    }
    struct Worker {
      PinnedBuffer<float> host;
      DeviceBuffer<float> piece;
      std::unique_ptr<Stream> stream;
    };
    ThreadPool pool(ThreadPool::default_threads(0));
    std::vector<Worker> workers(static_cast<size_t>(pool.concurrency()));
    const auto size = static_cast<size_t>(std::min<int64_t>(kPiece, std::max<int64_t>(total, 1)));
    pool.parallel_for(pieces.size(), [&](size_t i, int w) {
      Worker& worker = workers[static_cast<size_t>(w)];
      if (!worker.stream) {
        CUDA_CHECK(cudaSetDevice(device));  // a new thread starts on device 0
        worker.host.resize(size);
        worker.piece.resize(size);
        worker.stream = std::make_unique<Stream>();
      }
      const Piece& p = pieces[i];
      const std::span<float> part(worker.host.data(), static_cast<size_t>(p.count));
      read(p.tensor, p.from, part);
      cudaStream_t st = worker.stream->get();
      CUDA_CHECK(cudaMemcpyAsync(worker.piece.data(), part.data(), part.size_bytes(), cudaMemcpyHostToDevice, st));
      cast_from_float(values_.data() + offsets_[static_cast<size_t>(p.tensor)] + p.from, worker.piece.data(), p.count,
                      st);
      worker.stream->synchronize();  // `host` and `piece` are filled again next
    });
  }

  void acquire(int) override {}
  void release(int) override {}
  const T* param(int tensor) const override { return values_.data() + offsets_.at(static_cast<size_t>(tensor)); }
  void open_grads(int) override {}
  float* grad(int) override { fail(ErrorKind::kInternal, "evaluation asked for a parameter gradient"); }
  void close_grads(int) override {}
  void synchronize(cudaStream_t stream) override { CUDA_CHECK(cudaStreamSynchronize(stream)); }
  bool params_back_to_back(int first, int last) const override {
    for (int t = first; t + 1 < last; ++t) {
      const auto at = static_cast<size_t>(t);
      if (offsets_.at(at) + numels_.at(at) != offsets_.at(at + 1)) return false;
    }
    return true;
  }
  bool grads_back_to_back(int, int) const override { return false; }  // no gradients
  bool grads_fresh(int) const override { return false; }

 private:
  std::vector<int64_t> offsets_, numels_;  // each tensor's first element in values_, and its size
  DeviceBuffer<T> values_;
};

template <typename T>
class GpuScorer final : public WindowScorer {
 public:
  GpuScorer(const model::Model& m, const InitFn& read, int batch, int seq_len, comm::MpiCollective& comm)
      : model_(m),
        seq_len_(seq_len),
        context_(comm, DeviceContext::Collectives::kNone),
        params_(m.table(), read, context_.device()) {
    // The most windows per pass, up to `batch`, whose activations fit beside the weights.
    for (int b = batch;; b /= 2) {
      try {
        open(b);
        break;
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kIo || b == 1) {
          fail(e.kind(), "evaluating " + m.name() + " on the GPU, one window of " + std::to_string(seq_len) +
                             " tokens at a time: " + e.what() + " (for eval: a shorter --seq-len or --dtype bf16)");
        }
      }
    }
    inputs_.resize(static_cast<size_t>(batch_) * seq_len);
    targets_.resize(static_cast<size_t>(batch_) * seq_len);
  }

  int batch() const override { return batch_; }

  double score(const int32_t* inputs, const int32_t* targets, int rows) override {
    if (rows != rows_) open(rows);  // the last, shorter batch: a model of its size (the other freed first)
    const size_t bytes = static_cast<size_t>(rows) * seq_len_ * sizeof(int32_t);
    CUDA_CHECK(cudaMemcpyAsync(inputs_.data(), inputs, bytes, cudaMemcpyHostToDevice, context_.stream()));
    CUDA_CHECK(cudaMemcpyAsync(targets_.data(), targets, bytes, cudaMemcpyHostToDevice, context_.stream()));
    return gpu_->forward(params_, inputs_.data(), targets_.data());
  }

 private:
  void open(int rows) {
    gpu_.reset();
    rows_ = 0;
    gpu_ = make_gpu_model<T>(model_, {.batch = rows, .seq_len = seq_len_}, context_.cublas(), context_.stream());
    rows_ = rows;
    if (batch_ == 0) batch_ = rows;
  }

  const model::Model& model_;
  int seq_len_;
  DeviceContext context_;  // before the buffers below, which it outlives
  ResidentParams<T> params_;
  std::unique_ptr<GpuModel<T>> gpu_;
  int batch_ = 0;  // windows per pass
  int rows_ = 0;   // windows the current model was made for
  DeviceBuffer<int32_t> inputs_, targets_;
};

}  // namespace
}  // namespace cuda

std::unique_ptr<WindowScorer> make_cuda_scorer(const model::Model& model, const InitFn& read, int batch, int seq_len,
                                               ckpt::DType dtype, comm::MpiCollective& comm) {
  model::cuda::require_gpu_kernels(model);  // before any device work
  switch (dtype) {
    case ckpt::DType::kF32:
      return std::make_unique<cuda::GpuScorer<float>>(model, read, batch, seq_len, comm);
    case ckpt::DType::kBF16:
      return std::make_unique<cuda::GpuScorer<__nv_bfloat16>>(model, read, batch, seq_len, comm);
    case ckpt::DType::kF16:
      return std::make_unique<cuda::GpuScorer<__half>>(model, read, batch, seq_len, comm);
  }
  fail(ErrorKind::kInternal, "unknown compute type");
}

}  // namespace shardkit::trainer
