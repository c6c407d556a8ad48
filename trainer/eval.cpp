#include "trainer/eval.hpp"

#include <algorithm>
#include <mutex>
#include <thread>

#include "base/error.hpp"
#include "base/host_memory.hpp"
#include "base/thread_pool.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/shard_format.hpp"
#include "model/cpu/gemm.hpp"
#include "model/hf_weights.hpp"
#include "model/registry.hpp"
#include "trainer/data.hpp"
#include "trainer/dense_params.hpp"

namespace shardkit::trainer {
namespace {

constexpr int kBatch = 8;  // windows scored per forward pass (fewer where a GPU has no room for them)

// The CPU model's activations for forward passes alone: with checkpointing's buffers, one block's
// activations (no backward pass reads the others) beside the block outputs.
model::ActivationPlan scoring_plan(int batch, int seq_len) {
  return {.batch = batch, .seq_len = seq_len, .checkpointing = true};
}

// The manifest's model config decides what evaluate allocates: a crafted one must be refused before
// the allocation, not by the out-of-memory killer after it. DenseParams holds values and gradients
// of every parameter, on each rank of the node.
void require_memory_for(const model::Model& m, int seq_len, int node_ranks, const std::string& where) {
  const MemoryPart parts[] = {{"weights", 2.0 * static_cast<double>(m.table().total_elements()) * sizeof(float)},
                              {"activations", m.cpu_activation_bytes(scoring_plan(kBatch, seq_len))}};
  require_physical_memory(where + ": evaluating its model", parts, node_ranks);
}

// The CPU's scorer: every parameter in fp32 (DenseParams) and the family's CPU model.
class CpuScorer final : public WindowScorer {
 public:
  CpuScorer(const model::Model& m, const InitFn& read, int batch, int seq_len)
      : params_(m.table()), model_(m.make_cpu_model(scoring_plan(batch, seq_len))), batch_(batch), seq_len_(seq_len) {
    for (size_t t = 0; t < m.table().size(); ++t) read(static_cast<int>(t), 0, params_.values(static_cast<int>(t)));
  }
  int batch() const override { return batch_; }
  double score(const int32_t* inputs, const int32_t* targets, int rows) override {
    return model_->forward(params_, inputs, targets, rows, seq_len_);
  }

 private:
  DenseParams params_;
  std::unique_ptr<model::CpuModel> model_;
  int batch_, seq_len_;
};

// Where the weights come from: a checkpoint's fp32 master weights, or Hugging Face weights.
struct WeightSource {
  std::unique_ptr<ckpt::CheckpointReader> checkpoint;
  std::unique_ptr<model::HfWeights> hf;
  std::shared_ptr<const model::Model> model;
  std::string where;
  std::mutex mutex;
  InitFn read;  // safe to call from several threads at once

  WeightSource(const WeightSource&) = delete;  // `read` points back here
  WeightSource& operator=(const WeightSource&) = delete;
  explicit WeightSource(const std::filesystem::path& path) {
    if (model::is_hf_weights(path)) {
      hf = std::make_unique<model::HfWeights>(path);
      model = hf->model();
      where = path.string();
      read = [this](int t, int64_t offset, std::span<float> out) { hf->read(t, offset, out); };
      return;
    }
    checkpoint = std::make_unique<ckpt::CheckpointReader>(path, ThreadPool::default_threads(0) + 1);
    where = checkpoint->step_dir().string();
    model = model::model_from_manifest(checkpoint->manifest().model, where);
    if (!(checkpoint->tensors() == model->table())) {
      fail(ErrorKind::kCorrupt, where + ": tensor table does not match its model config");
    }
    const int state = checkpoint->find_state(ckpt::kMasterWeights);
    if (state < 0) fail(ErrorKind::kInvalidInput, where + ": no fp32 master weights to evaluate");
    // One read at a time (the reader is not thread-safe), each on the reader's own threads.
    read = [this, state](int t, int64_t offset, std::span<float> out) {
      const std::lock_guard<std::mutex> lock(mutex);
      checkpoint->read(t, state, offset, out);
    };
  }
};

}  // namespace

EvalResult evaluate(const std::filesystem::path& weights, const std::filesystem::path& data, const EvalOptions& options,
                    comm::MpiCollective& comm, const std::function<void(int64_t done, int64_t total)>& progress) {
  const int node_ranks = comm.node_place().size;  // share the node's cores and memory
  model::cpu::set_compute_threads(
      options.threads > 0 ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / node_ranks));
  const WeightSource source(weights);
  const std::string& where = source.where;
  const std::shared_ptr<const model::Model>& m = source.model;
  const int seq_len = options.seq_len;
  if (seq_len < 0 || seq_len > m->max_seq_len()) {
    fail(ErrorKind::kInvalidInput, "--seq-len " + std::to_string(seq_len) + " is outside [1, " +
                                       std::to_string(m->max_seq_len()) + "], the sequence lengths model " + m->name() +
                                       " supports");
  }
  const int T = seq_len > 0 ? seq_len : m->max_seq_len();

  const TokenFile tokens(data);
  const int64_t full = (tokens.size() - 1) / T;
  if (full < 1) {
    fail(ErrorKind::kInvalidInput, data.string() + ": " + std::to_string(tokens.size()) +
                                       " tokens, fewer than one window of " + std::to_string(T + 1));
  }
  int64_t windows = options.windows;
  if (windows < 0) fail(ErrorKind::kInvalidInput, "--windows must be positive");
  if (windows == 0) windows = std::min<int64_t>(full, 64);
  if (windows > full) {
    fail(ErrorKind::kInvalidInput, "--windows " + std::to_string(windows) + " exceeds the " + std::to_string(full) +
                                       " full windows of " + data.string());
  }
  const int batch = static_cast<int>(std::min<int64_t>(kBatch, windows));
  std::unique_ptr<WindowScorer> scorer;
  if (options.cuda) {
    scorer = make_cuda_scorer(*m, source.read, batch, T, options.dtype, comm);
  } else {
    require_memory_for(*m, T, node_ranks, where);
    scorer = std::make_unique<CpuScorer>(*m, source.read, batch, T);
  }
  // Batches of B windows, the same B on every rank (the smallest any rank's device holds), batch b on
  // rank b mod W; each batch's loss sum travels to every rank (zero from the others: adding them is
  // exact) and they are summed in batch order: the loss is the same bits on any number of ranks.
  const int B = static_cast<int>(-comm.allreduce_max(-static_cast<double>(scorer->batch())));
  const int64_t batches = (windows + B - 1) / B;
  std::vector<double> sums(static_cast<size_t>(batches), 0.0);
  std::vector<int32_t> in(static_cast<size_t>(B) * T), out(static_cast<size_t>(B) * T);
  const int W = comm.size();
  for (int64_t b = comm.rank(); b < batches; b += W) {
    const int64_t k0 = b * B;
    const int rows = static_cast<int>(std::min<int64_t>(B, windows - k0));
    for (int r = 0; r < rows; ++r) {
      const int64_t start = (k0 + r) * T;
      tokens.read(start, T, m->vocab_size(), in.data() + static_cast<size_t>(r) * T);
      tokens.read(start + 1, T, m->vocab_size(), out.data() + static_cast<size_t>(r) * T);
    }
    sums[static_cast<size_t>(b)] = scorer->score(in.data(), out.data(), rows) * rows * T;
    // This rank's share done, as a share of the whole (every rank has about as much).
    if (progress) progress(std::min(windows, (b + 1) * B) * T, windows * T);
  }
  comm.allreduce_sum(sums.data(), batches);
  double total = 0;
  for (const double s : sums) total += s;
  EvalResult r;
  r.windows = windows;
  r.tokens = windows * T;
  r.loss = total / static_cast<double>(r.tokens);
  r.batch = B;
  return r;
}

}  // namespace shardkit::trainer
