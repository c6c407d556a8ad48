// `shardkit eval`: the mean next-token cross-entropy of a checkpoint's weights -- or of Hugging Face
// weights, a save_pretrained folder or .safetensors file with its config.json -- over token windows,
// on the CPU (fp32, the family's CPU model) or on a GPU (its CUDA model, forward passes only).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>

#include "ckpt/tensor_table.hpp"
#include "trainer/backend.hpp"

namespace shardkit::trainer {

struct EvalOptions {
  int64_t windows = 0;                    // 0: every full window, at most 64
  int seq_len = 0;                        // 0: the model's longest sequence
  int threads = 0;                        // CPU compute threads (0: all cores)
  bool cuda = false;                      // on the first visible GPU
  ckpt::DType dtype = ckpt::DType::kF32;  // the GPU's compute precision (the CPU computes in fp32)
};

struct EvalResult {
  double loss = 0;     // mean cross-entropy per token
  int64_t tokens = 0;  // tokens scored
  int64_t windows = 0;
  int batch = 0;  // windows per forward pass
};

// Windows k = 0 .. windows-1 of T tokens: inputs tokens[kT, kT+T), targets tokens[kT+1, kT+T+1).
// `weights`: a checkpoint (step or run directory), or Hugging Face weights (a folder with config.json, or
// a .safetensors file). Every rank of `comm` holds the whole model and scores its share of the
// windows (one GPU each); the result, on every rank, is the same bits whatever the number of ranks.
// Collective. `progress`, if set, is called after each batch of windows with (tokens scored,
// tokens to score).
EvalResult evaluate(const std::filesystem::path& weights, const std::filesystem::path& data, const EvalOptions& options,
                    comm::MpiCollective& comm, const std::function<void(int64_t done, int64_t total)>& progress = {});

// Scores batches of windows of a fixed length with one set of weights.
class WindowScorer {
 public:
  virtual ~WindowScorer() = default;
  // Windows per call at most.
  virtual int batch() const = 0;
  // The mean loss per token of `rows` windows (rows <= batch()), row-major token ids.
  virtual double score(const int32_t* inputs, const int32_t* targets, int rows) = 0;
};

// The GPU's scorer: the weights `read` gives (fp32; it is called from several threads at once) in
// `dtype` on the rank's device (as training picks it, one rank a GPU), `batch` windows of `seq_len`
// tokens per pass, or fewer where their activations do not fit (halved until they do).
// Error(kInvalidInput) in a build without CUDA or with no device. Collective.
std::unique_ptr<WindowScorer> make_cuda_scorer(const model::Model& model, const InitFn& read, int batch, int seq_len,
                                               ckpt::DType dtype, comm::MpiCollective& comm);

}  // namespace shardkit::trainer
