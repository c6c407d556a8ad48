// `shardkit eval --device cuda`: a checkpoint's weights resident on one GPU in the compute type, scored
// by the family's CUDA model with forward passes only (no gradients, no optimizer states: a 7B model in
// bf16 takes 13.5 GB beside its activations).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "model/model.hpp"
#include "trainer/cuda/device_context.hpp"
#include "trainer/cuda/gpu_model.hpp"
#include "trainer/cuda/kernels.hpp"
#include "trainer/eval.hpp"

namespace shardkit::trainer {
namespace cuda {
namespace {

// Every parameter in T in one device buffer, each tensor at a 256-byte boundary (vectorised kernels
// read them in 16-byte pieces): nothing to gather or release, no gradients.
template <typename T>
class ResidentParams final : public GpuParamStore<T> {
 public:
  ResidentParams(const ckpt::TensorTable& table, ckpt::CheckpointReader& reader, int state, cudaStream_t stream) {
    constexpr int64_t kAlign = 256 / sizeof(T);
    int64_t total = 0;
    for (const ckpt::TensorInfo& t : table) {
      offsets_.push_back(total);
      total += (t.numel() + kAlign - 1) / kAlign * kAlign;
    }
    values_.resize(static_cast<size_t>(total));
    // Tensor by tensor in pieces of at most 64 MiB of fp32 (a crafted table cannot make the host allocate
    // more than that), widened or narrowed on the device.
    constexpr int64_t kPiece = int64_t{16} << 20;
    std::vector<float> host(static_cast<size_t>(std::min<int64_t>(kPiece, std::max<int64_t>(total, 1))));
    DeviceBuffer<float> piece(host.size());
    for (size_t t = 0; t < table.size(); ++t) {
      const int64_t n = table[t].numel();
      for (int64_t from = 0; from < n; from += kPiece) {
        const int64_t len = std::min(kPiece, n - from);
        const std::span<float> part(host.data(), static_cast<size_t>(len));
        reader.read(static_cast<int>(t), state, from, part);
        CUDA_CHECK(cudaMemcpyAsync(piece.data(), part.data(), part.size_bytes(), cudaMemcpyHostToDevice, stream));
        cast_from_float(values_.data() + offsets_[t] + from, piece.data(), len, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` and `piece` are filled again next
      }
    }
  }

  void acquire(int) override {}
  void release(int) override {}
  const T* param(int tensor) const override { return values_.data() + offsets_.at(static_cast<size_t>(tensor)); }
  void open_grads(int) override {}
  float* grad(int) override { fail(ErrorKind::kInternal, "evaluation asked for a parameter gradient"); }
  void close_grads(int) override {}
  void synchronize(cudaStream_t stream) override { CUDA_CHECK(cudaStreamSynchronize(stream)); }

 private:
  std::vector<int64_t> offsets_;
  DeviceBuffer<T> values_;
};

template <typename T>
class GpuScorer final : public WindowScorer {
 public:
  GpuScorer(const model::Model& m, ckpt::CheckpointReader& reader, int state, int batch, int seq_len)
      : model_(m), seq_len_(seq_len), params_(m.table(), reader, state, context_.stream()) {
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
    gpu_ = make_gpu_model<T>(model_, rows, seq_len_, context_.cublas(), context_.stream());
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

std::unique_ptr<WindowScorer> make_cuda_scorer(const model::Model& model, ckpt::CheckpointReader& reader, int state,
                                               int batch, int seq_len, ckpt::DType dtype) {
  cuda::require_gpu_kernels(model);  // before any device work
  switch (dtype) {
    case ckpt::DType::kF32:
      return std::make_unique<cuda::GpuScorer<float>>(model, reader, state, batch, seq_len);
    case ckpt::DType::kBF16:
      return std::make_unique<cuda::GpuScorer<__nv_bfloat16>>(model, reader, state, batch, seq_len);
    case ckpt::DType::kF16:
      return std::make_unique<cuda::GpuScorer<__half>>(model, reader, state, batch, seq_len);
  }
  fail(ErrorKind::kInternal, "unknown compute type");
}

}  // namespace shardkit::trainer
