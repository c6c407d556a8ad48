#include "trainer/eval.hpp"

#include <algorithm>
#include <thread>

#include "base/error.hpp"
#include "base/text_format.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/shard_format.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/host_memory.hpp"
#include "model/registry.hpp"
#include "trainer/data.hpp"
#include "trainer/dense_params.hpp"

namespace shardkit::trainer {
namespace {

constexpr int kBatch = 8;  // windows scored per forward pass

// The manifest's model config decides what evaluate allocates: a crafted one must be refused before
// the allocation, not by the out-of-memory killer after it.
void require_memory_for(const model::Model& m, int seq_len, const std::string& where) {
  // DenseParams holds values and gradients of every parameter.
  const double weights = 2.0 * static_cast<double>(m.table().total_elements()) * sizeof(float);
  const double activations = m.cpu_activation_bytes(kBatch, seq_len);
  const double machine = model::cpu::physical_memory_bytes();
  if (weights + activations > machine) {
    fail(ErrorKind::kInvalidInput, where + ": evaluating its model needs " + format_bytes(weights + activations) +
                                       " (weights " + format_bytes(weights) + ", activations " +
                                       format_bytes(activations) + "), more than this machine's " +
                                       format_bytes(machine) + " of memory");
  }
}

}  // namespace

EvalResult evaluate(const std::filesystem::path& checkpoint, const std::filesystem::path& data, int64_t windows,
                    int seq_len, int threads, const std::function<void(int64_t done, int64_t total)>& progress) {
  model::cpu::set_compute_threads(threads > 0 ? threads
                                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  ckpt::CheckpointReader reader(checkpoint);
  const std::string where = reader.step_dir().string();
  const std::shared_ptr<const model::Model> m = model::model_from_manifest(reader.manifest().model, where);
  const ckpt::TensorTable& table = m->table();
  if (!(reader.tensors() == table)) fail(ErrorKind::kCorrupt, where + ": tensor table does not match its model config");
  if (seq_len < 0 || seq_len > m->max_seq_len()) {
    fail(ErrorKind::kInvalidInput, "--seq-len " + std::to_string(seq_len) + " is outside [1, " +
                                       std::to_string(m->max_seq_len()) + "], the sequence lengths model " + m->name() +
                                       " supports");
  }
  const int T = seq_len > 0 ? seq_len : m->max_seq_len();
  const int state = reader.find_state(ckpt::kMasterWeights);
  if (state < 0) fail(ErrorKind::kInvalidInput, where + ": no fp32 master weights to evaluate");
  require_memory_for(*m, T, where);

  DenseParams params(table);
  for (size_t t = 0; t < table.size(); ++t)
    reader.read(static_cast<int>(t), state, 0, params.values(static_cast<int>(t)));

  const TokenFile tokens(data);
  const int64_t full = (tokens.size() - 1) / T;
  if (full < 1) {
    fail(ErrorKind::kInvalidInput, data.string() + ": " + std::to_string(tokens.size()) +
                                       " tokens, fewer than one window of " + std::to_string(T + 1));
  }
  if (windows < 0) fail(ErrorKind::kInvalidInput, "--windows must be positive");
  if (windows == 0) windows = std::min<int64_t>(full, 64);
  if (windows > full) {
    fail(ErrorKind::kInvalidInput, "--windows " + std::to_string(windows) + " exceeds the " + std::to_string(full) +
                                       " full windows of " + data.string());
  }
  const std::unique_ptr<model::CpuModel> cpu = m->make_cpu_model(kBatch, T);
  std::vector<int32_t> in(static_cast<size_t>(kBatch) * T), out(static_cast<size_t>(kBatch) * T);
  double total = 0;
  for (int64_t k0 = 0; k0 < windows; k0 += kBatch) {
    const int rows = static_cast<int>(std::min<int64_t>(kBatch, windows - k0));
    for (int r = 0; r < rows; ++r) {
      const int64_t start = (k0 + r) * T;
      tokens.read(start, T, m->vocab_size(), in.data() + static_cast<size_t>(r) * T);
      tokens.read(start + 1, T, m->vocab_size(), out.data() + static_cast<size_t>(r) * T);
    }
    total += cpu->forward(params, in.data(), out.data(), rows, T) * rows * T;
    if (progress) progress((k0 + rows) * T, windows * T);
  }
  EvalResult r;
  r.windows = windows;
  r.tokens = windows * T;
  r.loss = total / static_cast<double>(r.tokens);
  return r;
}

}  // namespace shardkit::trainer
