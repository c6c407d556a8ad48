// What ZeRO's gradient reductions cost on this host's GPUs, alone and beside the backward pass: the
// question behind stage 2's shortfall in bench/RESULTS.md (overlapped reductions slowed the backward
// pass by about what they hid). GPT-2's fp32 gradients, one rank per GPU, reduced
//   - by the engine's stage-2 path: buckets of reduce_bucket_size closed in backward order, each tensor
//     piece reduced to its owner (ncclReduce per piece, one NCCL group per bucket), on the
//     communication stream;
//   - by the engine's stage-1 path: one reduce-scatter of everything after the backward pass;
//   - by ncclReduceScatter of the same bytes from one contiguous buffer, in reduce_bucket_size pieces
//     (what a bucketed reduce-scatter with gradients copied into a contiguous bucket would send);
// and a stand-in for the backward pass (the bf16 matrix products of the output projection and of every
// block, at the step's shapes) alone and with the stage-2 reductions issued between its blocks as the
// model issues them: how much slower the products run beside the reductions, and how much of the
// reductions is left after them -- with NCCL's own choice of thread blocks and with its kernels held
// to at most --ctas blocks (a communicator split off with maxCTAs), fewer SMs taken from the products
// against slower reductions. Times are the slowest rank's median of --reps runs, in ms.
// Usage: mpirun -n 2 shardkit_gpu_comm_bench [--model gpt2] [--batch 16] [--seq 1024]
//        [--bucket 25000000] [--wire fp32|bf16] [--ctas 4,8,16] [--reps 10] [--json]
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "comm/mpi.hpp"
#include "model/gpt2/model.hpp"
#include "trainer/cuda/device_context.hpp"
#include "trainer/cuda/gpu_engine.hpp"
#include "trainer/cuda/nccl.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer::cuda {
namespace {

using namespace model::cuda;

using T = __nv_bfloat16;

struct Options {
  std::string model = "gpt2";
  int batch = 16, seq = 1024, reps = 10;
  int64_t bucket = 25'000'000;
  ckpt::DType wire = ckpt::DType::kF32;
  std::vector<int> ctas = {4, 8, 16};  // NCCL CTA limits to try for stage 2's reductions
  bool json = false;
};

class Timer {
 public:
  Timer(comm::MpiCollective& world, cudaStream_t stream, int reps) : world_(world), stream_(stream), reps_(reps) {}

  // The slowest rank's median over the runs (after one warm-up run) of the stream time from the start
  // of run() to the end of what it queued; prepare() runs before the clock starts, every rank starts
  // together. With `mark_ms`, also the median time to the event run() records as its mark.
  double ms(const std::function<void()>& prepare, const std::function<void(cudaEvent_t mark)>& run,
            double* mark_ms = nullptr) {
    std::vector<double> total, marked;
    for (int r = 0; r <= reps_; ++r) {
      prepare();
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      world_.barrier();
      CUDA_CHECK(cudaEventRecord(start_.get(), stream_));
      run(mark_.get());
      CUDA_CHECK(cudaEventRecord(stop_.get(), stream_));
      CUDA_CHECK(cudaEventSynchronize(stop_.get()));
      if (r == 0) continue;
      total.push_back(stop_.ms_since(start_));
      if (mark_ms) marked.push_back(mark_.ms_since(start_));
    }
    if (mark_ms) *mark_ms = slowest_median(marked);
    return slowest_median(total);
  }

 private:
  double slowest_median(std::vector<double> v) const {
    std::sort(v.begin(), v.end());
    return world_.allreduce_max(v[v.size() / 2]);
  }

  comm::MpiCollective& world_;
  cudaStream_t stream_;
  int reps_;
  Event start_{Event::Timing::kOn}, stop_{Event::Timing::kOn}, mark_{Event::Timing::kOn};
};

// A positive count given to `flag`, or Error(kInvalidInput) naming both.
int64_t positive(const std::string& flag, const std::string& text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || v < 1 || v > (int64_t{1} << 40)) {
    fail(ErrorKind::kInvalidInput, flag + " expects a positive count, got '" + text + "'");
  }
  return v;
}

Options parse(int argc, char** argv) {
  const std::string usage =
      "usage: shardkit_gpu_comm_bench [--model NAME] [--batch B] [--seq S] [--bucket ELEMENTS] "
      "[--wire fp32|bf16] [--ctas 4,8,16] [--reps N] [--json]";
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= argc) fail(ErrorKind::kInvalidInput, usage + "; '" + a + "' without a value");
    const std::string v = argv[++i];
    if (a == "--model") {
      o.model = v;
    } else if (a == "--batch") {
      o.batch = static_cast<int>(std::min<int64_t>(positive(a, v), 1 << 20));
    } else if (a == "--seq") {
      o.seq = static_cast<int>(std::min<int64_t>(positive(a, v), 1 << 20));
    } else if (a == "--bucket") {
      o.bucket = positive(a, v);
    } else if (a == "--reps") {
      o.reps = static_cast<int>(std::min<int64_t>(positive(a, v), 1000));
    } else if (a == "--wire" && (v == "fp32" || v == "bf16")) {
      o.wire = v == "bf16" ? ckpt::DType::kBF16 : ckpt::DType::kF32;
    } else if (a == "--ctas") {
      o.ctas.clear();
      std::stringstream list(v);
      for (std::string n; std::getline(list, n, ',');)
        o.ctas.push_back(static_cast<int>(std::min<int64_t>(positive(a, n), 64)));
    } else {
      fail(ErrorKind::kInvalidInput, usage + "; got '" + a + " " + v + "'");
    }
  }
  return o;
}

// The backward pass's matrix products at the step's shapes, bf16 with fp32 accumulation: the output
// projection's input and weight gradients, then per block those of the attention's qkv and output
// projections and the MLP's two layers. `between(group)` runs where the model closes a group's
// gradients (the final LayerNorm after the head, block l after its products, the embeddings last).
class BackwardStandIn {
 public:
  BackwardStandIn(const model::gpt2::GptConfig& c, int tokens, cublasHandle_t cublas)
      : c_(c), n_(tokens), vp_(padded_vocab(c.vocab_size)), cublas_(cublas) {
    const size_t C = static_cast<size_t>(c.n_embd), N = static_cast<size_t>(tokens);
    for (auto* b : {&a_, &b_, &out_}) {  // the largest operand: the logits' gradient, N x Vp
      b->resize(std::max({N * static_cast<size_t>(vp_), N * 4 * C, 4 * C * C}));
      CUDA_CHECK(cudaMemset(b->data(), 0, b->bytes()));
    }
  }

  void run(const std::function<void(int group)>& between) {
    const int C = c_.n_embd, N = n_, L = c_.n_layer;
    product(false, false, N, C, vp_);  // dx = dlogits . wte
    product(true, false, vp_, C, N);   // dwte = dlogits^T . x
    between(L + 1);
    for (int l = L - 1; l >= 0; --l) {
      for (const auto& [in, out] : {std::pair{4 * C, C}, {C, 4 * C}, {C, C}, {C, 3 * C}}) {
        product(false, true, N, in, out);  // dx = dy . W^T
        product(true, false, in, out, N);  // dW = x^T . dy
      }
      between(1 + l);
    }
    between(0);
  }

 private:
  void product(bool trans_a, bool trans_b, int m, int n, int k) {
    gemm<T, T>(cublas_, trans_a, trans_b, m, n, k, 1.0f, a_.data(), trans_a ? m : k, b_.data(), trans_b ? k : n, 0.0f,
               out_.data(), n);
  }

  model::gpt2::GptConfig c_;
  int n_, vp_;
  cublasHandle_t cublas_;
  DeviceBuffer<T> a_, b_, out_;
};

// An NCCL communicator split off another (the same ranks) whose kernels use at most `ctas` thread
// blocks: the SMs the reductions may take from the computation beside them.
class LimitedComm {
 public:
  LimitedComm(ncclComm_t parent, int rank, int ctas) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.minCTAs = 1;
    config.maxCTAs = ctas;
    NCCL_CHECK(ncclCommSplit(parent, 0, rank, comm_.out(), &config));
  }
  ncclComm_t get() const noexcept { return comm_.get(); }

 private:
  NcclComm comm_;
};

struct Stage2Times {
  double alone = 0;            // the reductions with nothing beside them
  double products_beside = 0;  // the products, the reductions issued between their blocks
  double to_the_end = 0;       // ... until the last reduction has landed
};

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  comm::MpiCollective world(MPI_COMM_WORLD);
  DeviceContext context(world);
  const std::shared_ptr<const model::Model> m = model::resolve_model(o.model);
  const model::gpt2::GptConfig* gpt2 = model::gpt2::config_of(*m);
  if (!gpt2) fail(ErrorKind::kInvalidInput, "--model " + o.model + ": the backward pass stood in for is GPT-2's");
  const model::gpt2::GptConfig& config = *gpt2;
  const ckpt::TensorTable& table = m->table();
  const std::vector<model::TensorGroup>& groups = m->groups();
  const std::vector<bool> decays = decay_flags(*m);
  const int last = static_cast<int>(groups.size()) - 1;
  cudaStream_t stream = context.stream();
  Timer timer(world, stream, o.reps);
  BackwardStandIn backward(config, o.batch * o.seq, context.cublas());
  const double products_alone = timer.ms([] {}, [&](cudaEvent_t) { backward.run([](int) {}); });

  ZeroConfig zero;
  zero.reduce_bucket_size = o.bucket;
  zero.contiguous_gradients = true;
  zero.overlap_comm = true;
  zero.stage = 2;
  // Stage 2's reductions over `nccl`, alone and beside the products: every group opened before the
  // clock starts (their buffers zeroed) and closed in the backward pass's order.
  auto stage2_times = [&](ncclComm_t nccl) {
    GpuZeroEngine<T> engine(table, groups, decays, zero, optimizer(OptimizerKind::kAdamW), o.wire, world, nccl, stream);
    auto open_all = [&] {
      engine.zero_grads();
      for (int g = 0; g <= last; ++g) engine.open_grads(g);
    };
    auto close = [&](int group) { engine.close_grads(group); };
    Stage2Times t;
    t.alone = timer.ms(open_all, [&](cudaEvent_t) {
      close(last);
      for (int g = last - 1; g >= 0; --g) close(g);
      engine.reduce_grads();
    });
    t.to_the_end = timer.ms(
        open_all,
        [&](cudaEvent_t mark) {
          backward.run(close);
          CUDA_CHECK(cudaEventRecord(mark, stream));
          engine.reduce_grads();
        },
        &t.products_beside);
    return t;
  };
  std::vector<std::pair<int, Stage2Times>> stage2;  // (CTA limit, 0: NCCL's choice; times)
  stage2.emplace_back(0, stage2_times(context.nccl()));
  for (const int ctas : o.ctas) {
    const LimitedComm limited(context.nccl(), world.rank(), ctas);
    stage2.emplace_back(ctas, stage2_times(limited.get()));
  }

  double stage1_alone = 0;
  {
    ZeroConfig one = zero;
    one.stage = 1;
    GpuZeroEngine<T> stage1(table, groups, decays, one, optimizer(OptimizerKind::kAdamW), o.wire, world, context.nccl(),
                            stream);
    stage1_alone = timer.ms([&] { stage1.zero_grads(); }, [&](cudaEvent_t) { stage1.reduce_grads(); });
  }

  // The same bytes from one contiguous buffer, in bucket-sized reduce-scatters.
  const int W = world.size();
  int64_t elements = 0;
  for (const auto& t : table) elements += t.numel();
  const int64_t per_bucket = (std::min(o.bucket, elements) + W - 1) / W;  // elements each rank receives
  const int64_t buckets = (elements + per_bucket * W - 1) / (per_bucket * W);
  double contiguous = 0;
  {
    DeviceBuffer<float> send(static_cast<size_t>(buckets * per_bucket * W)), recv(static_cast<size_t>(per_bucket));
    CUDA_CHECK(cudaMemset(send.data(), 0, send.bytes()));
    contiguous = timer.ms(
        [] {},
        [&](cudaEvent_t) {
          for (int64_t b = 0; b < buckets; ++b) {
            NCCL_CHECK(ncclReduceScatter(send.data() + b * per_bucket * W, recv.data(), static_cast<size_t>(per_bucket),
                                         ncclFloat, ncclSum, context.nccl(), stream));
          }
        });
  }

  const double gradient_mb = static_cast<double>(elements) * 4 / 1e6;
  const std::string wire(ckpt::dtype_name(o.wire));
  nlohmann::json out = {{"model", o.model},
                        {"ranks", W},
                        {"device", context.props().name},
                        {"gradient_mb", gradient_mb},
                        {"bucket_elements", o.bucket},
                        {"wire", wire},
                        {"products_alone_ms", products_alone},
                        {"stage1_reduce_scatter_ms", stage1_alone},
                        {"contiguous_bucket_reduce_scatters_ms", contiguous},
                        {"stage2", nlohmann::json::array()}};
  for (const auto& [ctas, t] : stage2) {
    out["stage2"].push_back({{"max_ctas", ctas},
                             {"reductions_alone_ms", t.alone},
                             {"products_beside_reductions_ms", t.products_beside},
                             {"products_and_reductions_ms", t.to_the_end}});
  }
  if (world.rank() == 0) {
    std::printf("GPT-2 %s gradients, %.0f MB fp32, %d ranks on %s, buckets of %lld elements, reduced in %s (ms)\n",
                o.model.c_str(), gradient_mb, W, context.props().name, static_cast<long long>(o.bucket), wire.c_str());
    std::printf("  stage 1: one reduce-scatter after the backward pass   %8.3f\n", stage1_alone);
    std::printf("  reduce-scatters of contiguous buckets, the same bytes %8.3f\n", contiguous);
    std::printf("  backward products alone                               %8.3f\n", products_alone);
    std::printf("  stage 2 (ncclReduce per piece, bucketed):\n");
    std::printf("  %-12s %16s %22s %20s\n", "NCCL CTAs", "reductions alone", "products beside them",
                "to the last landing");
    for (const auto& [ctas, t] : stage2) {
      const std::string limit = ctas == 0 ? "NCCL's choice" : "at most " + std::to_string(ctas);
      std::printf("  %-12s %16.3f %22.3f %20.3f\n", limit.c_str(), t.alone, t.products_beside, t.to_the_end);
    }
    if (o.json) std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace shardkit::trainer::cuda

int main(int argc, char** argv) {
  shardkit::comm::MpiRuntime mpi(&argc, &argv);
  try {
    return shardkit::trainer::cuda::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardkit_gpu_comm_bench: %s\n", e.what());
    shardkit::comm::MpiRuntime::abort(1);
  }
}
