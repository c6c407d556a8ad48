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
// reductions is left after them. Times are the slowest rank's median of --reps runs, in ms.
// Usage: mpirun -n 2 shardkit_gpu_comm_bench [--model gpt2] [--batch 16] [--seq 1024]
//        [--bucket 25000000] [--wire fp32|bf16] [--reps 10] [--json]
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/mpi.hpp"
#include "model/gpt2_config.hpp"
#include "trainer/cuda/device_context.cuh"
#include "trainer/cuda/gpu_engine.cuh"
#include "trainer/gpt2_groups.hpp"

namespace shardkit::trainer::cuda {
namespace {

using T = __nv_bfloat16;

struct Options {
  std::string model = "gpt2";
  int batch = 16, seq = 1024, reps = 10;
  int64_t bucket = 25'000'000;
  ckpt::DType wire = ckpt::DType::kF32;
  bool json = false;
};

class Timer {
 public:
  Timer(comm::MpiCollective& world, cudaStream_t stream, int reps) : world_(world), stream_(stream), reps_(reps) {}

  // The slowest rank's median over the runs (after one warm-up run) of the stream time from the start
  // of run() to the end of what it queued; prepare() runs before the clock starts, every rank starts
  // together. With `marks`, also the median time to the event run() records as its mark.
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
      total.push_back(elapsed(stop_.get()));
      if (mark_ms) marked.push_back(elapsed(mark_.get()));
    }
    if (mark_ms) *mark_ms = slowest_median(marked);
    return slowest_median(total);
  }

 private:
  class TimedEvent {
   public:
    TimedEvent() { CUDA_CHECK(cudaEventCreate(&event_)); }
    ~TimedEvent() { cudaEventDestroy(event_); }
    TimedEvent(const TimedEvent&) = delete;
    TimedEvent& operator=(const TimedEvent&) = delete;
    cudaEvent_t get() const noexcept { return event_; }

   private:
    cudaEvent_t event_ = nullptr;
  };

  double elapsed(cudaEvent_t end) const {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start_.get(), end));
    return ms;
  }
  double slowest_median(std::vector<double> v) const {
    std::sort(v.begin(), v.end());
    return world_.allreduce_max(v[v.size() / 2]);
  }

  comm::MpiCollective& world_;
  cudaStream_t stream_;
  int reps_;
  TimedEvent start_, stop_, mark_;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--model" && has_value) {
      o.model = argv[++i];
    } else if (a == "--batch" && has_value) {
      o.batch = std::stoi(argv[++i]);
    } else if (a == "--seq" && has_value) {
      o.seq = std::stoi(argv[++i]);
    } else if (a == "--bucket" && has_value) {
      o.bucket = std::stoll(argv[++i]);
    } else if (a == "--reps" && has_value) {
      o.reps = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--wire" && has_value &&
               (std::string(argv[i + 1]) == "fp32" || std::string(argv[i + 1]) == "bf16")) {
      o.wire = std::string(argv[++i]) == "bf16" ? ckpt::DType::kBF16 : ckpt::DType::kF32;
    } else if (a == "--json") {
      o.json = true;
    } else {
      fail(ErrorKind::kInvalidInput,
           "usage: shardkit_gpu_comm_bench [--model NAME] [--batch B] [--seq S] "
           "[--bucket ELEMENTS] [--wire fp32|bf16] [--reps N] [--json]; got '" +
               a + "'");
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
  BackwardStandIn(const model::GptConfig& c, int tokens, cublasHandle_t cublas)
      : c_(c), n_(tokens), vp_(padded_vocab(c.vocab_size)), cublas_(cublas) {
    const size_t C = static_cast<size_t>(c.n_embd), N = static_cast<size_t>(tokens);
    for (auto* b : {&a_, &b_, &out_}) {
      b->resize(std::max(N * static_cast<size_t>(vp_), 4 * C * C + N * 4 * C));
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

  model::GptConfig c_;
  int n_, vp_;
  cublasHandle_t cublas_;
  DeviceBuffer<T> a_, b_, out_;
};

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  comm::MpiCollective world(MPI_COMM_WORLD);
  DeviceContext context(world);
  const model::GptConfig config = model::resolve_model(o.model);
  const ckpt::TensorTable table = model::gpt2_tensor_table(config);
  const std::vector<TensorGroup> groups = gpt2_groups(config);
  const int last = static_cast<int>(groups.size()) - 1;
  cudaStream_t stream = context.stream();
  Timer timer(world, stream, o.reps);

  ZeroConfig zero;
  zero.reduce_bucket_size = o.bucket;
  zero.contiguous_gradients = true;
  zero.overlap_comm = true;
  zero.stage = 2;
  GpuZeroEngine<T> stage2(table, groups, zero, o.wire, world, context.nccl(), stream);
  // Every group open before the clock starts (their buffers zeroed), closed in the backward pass's order.
  auto open_all = [&] {
    stage2.zero_grads();
    for (int g = 0; g <= last; ++g) stage2.open_grads(g);
  };
  auto close_in_order = [&](int group) { stage2.close_grads(group); };
  const double stage2_alone = timer.ms(open_all, [&](cudaEvent_t) {
    close_in_order(last);
    for (int g = last - 1; g >= 0; --g) close_in_order(g);
    stage2.reduce_grads();
  });

  double stage1_alone = 0;
  {
    ZeroConfig one = zero;
    one.stage = 1;
    GpuZeroEngine<T> stage1(table, groups, one, o.wire, world, context.nccl(), stream);
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

  BackwardStandIn backward(config, o.batch * o.seq, context.cublas());
  const double products_alone = timer.ms([] {}, [&](cudaEvent_t) { backward.run([](int) {}); });
  double products_beside = 0;
  const double with_reductions = timer.ms(
      open_all,
      [&](cudaEvent_t mark) {
        backward.run(close_in_order);
        CUDA_CHECK(cudaEventRecord(mark, stream));
        stage2.reduce_grads();
      },
      &products_beside);

  const double gradient_mb = static_cast<double>(elements) * 4 / 1e6;
  nlohmann::json out = {{"model", o.model},
                        {"ranks", W},
                        {"device", context.props().name},
                        {"gradient_mb", gradient_mb},
                        {"bucket_elements", o.bucket},
                        {"wire", ckpt::dtype_name(o.wire)},
                        {"stage2_reductions_ms", stage2_alone},
                        {"stage1_reduce_scatter_ms", stage1_alone},
                        {"contiguous_bucket_reduce_scatters_ms", contiguous},
                        {"products_alone_ms", products_alone},
                        {"products_beside_reductions_ms", products_beside},
                        {"products_and_reductions_ms", with_reductions}};
  if (world.rank() == 0) {
    std::printf("GPT-2 %s gradients, %.0f MB fp32, %d ranks on %s, buckets of %lld elements, reduced in %s\n",
                o.model.c_str(), gradient_mb, W, context.props().name, static_cast<long long>(o.bucket),
                std::string(ckpt::dtype_name(o.wire)).c_str());
    std::printf("%-62s %9s\n", "", "ms");
    std::printf("%-62s %9.3f\n", "stage 2 reductions alone (ncclReduce per piece, bucketed)", stage2_alone);
    std::printf("%-62s %9.3f\n", "stage 1 reduce-scatter alone (one call)", stage1_alone);
    std::printf("%-62s %9.3f\n", "reduce-scatters of contiguous buckets, the same bytes", contiguous);
    std::printf("%-62s %9.3f\n", "backward products alone", products_alone);
    std::printf("%-62s %9.3f\n", "backward products, stage 2 reductions beside them", products_beside);
    std::printf("%-62s %9.3f\n", "  ... and to the end of the reductions", with_reductions);
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
