// Where a GPT-2 or Llama training step spends its GPU time: every kernel and matrix product of one
// step, timed alone with CUDA events at the step's shapes, times the number of calls per step. Prints a table and
// (with --json) one JSON object. Usage: shardkit_gpu_kernels_bench [--model gpt2] [--batch 16]
// [--seq 1024] [--json]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/cuda/cuda_common.hpp"
#include "model/cuda/encoder_backward.hpp"
#include "model/cuda/gpu_model.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/matmul.hpp"
#include "model/cuda/norms.hpp"
#include "model/gpt2/cuda/kernels.hpp"
#include "model/gpt2/model.hpp"
#include "model/llama/config.hpp"
#include "model/llama/cuda/kernels.hpp"
#include "model/llama/model.hpp"
#include "model/registry.hpp"
#include "trainer/cuda/optimizer_kernels.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer::cuda {
namespace {

using namespace model::cuda;

using T = __nv_bfloat16;

struct Row {
  std::string name;
  int calls_per_step;
  double ms_per_call;
};

// Median of `reps` timed runs of fn (the row `name`, which a failure names), after two warm-up runs.
// Every run ends in a synchronisation, so a kernel's fault surfaces in its own row.
double time_ms(cudaStream_t st, const std::string& name, const std::function<void()>& fn, int reps = 15) {
  const Event start(Event::Timing::kOn), stop(Event::Timing::kOn);
  std::vector<double> times;
  try {
    fn();
    fn();
    for (int r = 0; r < reps; ++r) {
      CUDA_CHECK(cudaEventRecord(start.get(), st));
      fn();
      CUDA_CHECK(cudaEventRecord(stop.get(), st));
      CUDA_CHECK(cudaEventSynchronize(stop.get()));
      times.push_back(stop.ms_since(start));
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(name + ": " + e.what());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename U>
DeviceBuffer<U> filled(size_t n, cudaStream_t st) {
  DeviceBuffer<U> b(n);
  // Small non-zero values (0x3c3c is about 0.011 in bf16, 0x3c3c3c3c in fp32); speed does not depend on them.
  CUDA_CHECK(cudaMemsetAsync(b.data(), 0x3c, b.bytes(), st));
  return b;
}

// Prints the table (and the JSON object with `json`) of the rows' times.
void report(const std::vector<Row>& rows, const std::string& model_name, int B, int S, bool json) {
  double total = 0;
  for (const auto& r : rows) total += r.ms_per_call * r.calls_per_step;
  nlohmann::json out = {{"model", model_name}, {"batch", B}, {"seq", S}, {"dtype", "bf16"}, {"step_ms", total}};
  std::printf("%-36s %6s %10s %10s %6s\n", "kernel", "calls", "ms/call", "ms/step", "%");
  for (const auto& r : rows) {
    const double step = r.ms_per_call * r.calls_per_step;
    std::printf("%-36s %6d %10.4f %10.3f %6.1f\n", r.name.c_str(), r.calls_per_step, r.ms_per_call, step,
                100 * step / total);
    out["kernels"].push_back({{"name", r.name}, {"calls", r.calls_per_step}, {"ms_per_call", r.ms_per_call}});
  }
  std::printf("sum of kernel times per step: %.2f ms = %.0f tokens/s if nothing else ran\n", total,
              B * S / total * 1e3);
  if (json) std::printf("%s\n", out.dump().c_str());
}

// The model's decay groups on the device, as one rank at stage 0 passes them to AdamW: biases and
// norms undecayed.
class NoDecayTable {
 public:
  explicit NoDecayTable(const model::Model& spec)
      : ranges_(no_decay_ranges(ckpt::Layout(spec.table(), {}).fragments(0), decay_flags(spec))),
        device_(ranges_.size()) {
    CUDA_CHECK(cudaMemcpy(device_.data(), ranges_.data(), device_.bytes(), cudaMemcpyHostToDevice));
  }
  NoDecayRanges view() const { return {device_.data(), static_cast<int64_t>(ranges_.size())}; }

 private:
  std::vector<ElementRange> ranges_;
  DeviceBuffer<ElementRange> device_;
};

// The update and what surrounds it: AdamW over every parameter; outside the passes and the update,
// every step reads the fp32 gradients once for their norm (one rank, stages 0-1: all of them). Nothing
// clears them: the passes of a step's first micro-batch store them (the rows above, as a step of one
// micro-batch runs them). The buffers take 18 bytes a parameter; a model with more than
// kSliceElements parameters is timed a slice at a time, the first of `calls` equal slices counted
// `calls` times (the kernels stream memory: time is linear in the elements), so that a 7B model's
// step can be taken apart on an 80 GB GPU.
void update_rows(std::vector<Row>& rows, const model::Model& spec, double lr, cudaStream_t st) {
  constexpr int64_t kSliceElements = int64_t{1} << 30;
  const int64_t P = spec.table().total_elements();
  const int calls = static_cast<int>((P + kSliceElements - 1) / kSliceElements);
  const auto n = static_cast<size_t>((P + calls - 1) / calls);
  auto master = filled<float>(n, st), m = filled<float>(n, st), v = filled<float>(n, st), g = filled<float>(n, st);
  auto params = filled<T>(n, st);
  for (DeviceBuffer<float>* b : {&master, &m, &v, &g}) CUDA_CHECK(cudaMemsetAsync(b->data(), 0, b->bytes(), st));
  const AdamWCoefficients args =
      AdamWCoefficients::of({OptimizerKind::kAdamW, lr, 0.9, 0.95, 1e-8, 0.1, true, true, 1, 1.0});
  const NoDecayTable no_decay(spec);
  const auto add = [&](const std::string& name, const std::function<void()>& fn) {
    rows.push_back({name, calls, time_ms(st, name, fn)});
  };
  add("adamw (all parameters)", [&] {
    adamw(master.data(), m.data(), v.data(), g.data(), params.data(), static_cast<int64_t>(n), args, no_decay.view(),
          st);
  });
  DeviceBuffer<double> norm(kSumScratch);
  add("gradient norm (sum of squares)", [&] { sum_squares(norm.data(), g.data(), static_cast<int64_t>(n), st); });
}

std::vector<Row> gpt2_rows(const model::Model& spec, int B, int S, cudaStream_t st, cublasHandle_t cublas) {
  const model::gpt2::GptConfig& cfg = *model::gpt2::config_of(spec);
  const int C = cfg.n_embd, NH = cfg.n_head, V = cfg.vocab_size, L = cfg.n_layer, N = B * S;
  const size_t NC = size_t{1} * N * C;

  auto x = filled<T>(NC, st), y = filled<T>(NC, st), big = filled<T>(4 * NC, st), big2 = filled<T>(4 * NC, st);
  auto pre = filled<T>(4 * NC, st);
  auto qkv = filled<T>(3 * NC, st), dqkv = filled<T>(3 * NC, st);
  auto w = filled<T>(size_t{4} * C * C, st), bias = filled<T>(size_t{4} * C, st);
  auto gw = filled<float>(size_t{4} * C * C, st), gb = filled<float>(size_t{4} * C, st);
  auto mean = filled<float>(N, st), rstd = filled<float>(N, st);
  auto scratch = filled<float>(
      static_cast<size_t>(std::max(norm_scratch_floats(Norm::kLayer, C), bias_scratch_floats(4 * C))), st);
  auto lse = filled<float>(size_t{1} * N * NH, st), delta = filled<float>(size_t{1} * N * NH, st);
  const int ldv = padded_vocab(V);  // as the model computes its logits
  const int head_rows = head_block_rows(ldv, sizeof(T), static_cast<int>(N));
  auto logits = filled<T>(size_t{1} * head_rows * ldv, st), wte = filled<T>(size_t{1} * ldv * C, st);
  auto gwte = filled<float>(size_t{1} * V * C, st), losses = filled<float>(N, st);
  DeviceBuffer<int32_t> targets(N);
  CUDA_CHECK(cudaMemsetAsync(targets.data(), 0, targets.bytes(), st));

  Matmul matmul(st);
  // forward: out (N, oc) = in (N, ic) @ w + bias [+ residual], through the fused epilogues
  auto lt = [&](Epilogue epilogue, int oc, int ic, bool residual) {
    return [&, epilogue, oc, ic, residual] {
      matmul.run<T>(epilogue, false, false, N, oc, ic, big.data(), ic, w.data(), oc, big2.data(), oc, bias.data(),
                    epilogue == Epilogue::kBiasGelu ? pre.data() : nullptr, residual ? y.data() : nullptr);
    };
  };
  auto mm_dinp = [&](int oc, int ic) {
    return [&, oc, ic] {
      gemm<T, T>(cublas, false, true, N, ic, oc, 1.0f, big.data(), oc, w.data(), oc, 0.0f, big2.data(), ic);
    };
  };
  auto mm_dw = [&](int oc, int ic) {
    return [&, oc, ic] {
      gemm<T, float>(cublas, true, false, ic, oc, N, 1.0f, big.data(), ic, big2.data(), oc, 0.0f, gw.data(), oc);
    };
  };
  std::vector<Row> rows;
  auto add = [&](const std::string& name, int calls, const std::function<void()>& fn) {
    rows.push_back({name, calls, time_ms(st, name, fn)});
  };
  {
    // Tokens spread over the vocabulary as a multiplicative hash spreads them (runs of equal tokens short).
    std::vector<int32_t> tokens(static_cast<size_t>(N));
    for (int i = 0; i < N; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 2654435761u) % V);
    CUDA_CHECK(cudaMemcpy(targets.data(), tokens.data(), targets.bytes(), cudaMemcpyHostToDevice));
  }
  EncoderBackward encoder(N, V);
  auto gwpe = filled<float>(size_t{1} * S * C, st);
  add("wpe gradient cleared", 1, [&] { CUDA_CHECK(cudaMemsetAsync(gwpe.data(), 0, gwpe.bytes(), st)); });
  add("encoder_backward (sort, sums)", 1,
      [&] { encoder.run(gwte.data(), gwpe.data(), x.data(), targets.data(), B, S, C, st); });
  add("layernorm_forward", 2 * L + 1,
      [&] { layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), bias.data(), bias.data(), N, C, st); });
  add("layernorm_backward", 2 * L + 1, [&] {
    layernorm_backward(y.data(), gb.data(), gb.data() + C, x.data(), x.data(), bias.data(), mean.data(), rstd.data(), N,
                       C, scratch.data(), GradWrite::kStore, st);
  });
  add("linear qkv (+bias)", L, lt(Epilogue::kBias, 3 * C, C, false));
  add("linear attproj (+bias+residual)", L, lt(Epilogue::kBias, C, C, true));
  add("linear fc (+bias, gelu)", L, lt(Epilogue::kBiasGelu, 4 * C, C, false));
  add("linear fcproj (+bias+residual)", L, lt(Epilogue::kBias, C, 4 * C, true));
  add("linear fcproj dinp (*gelu')", L, [&] {
    matmul.run<T>(Epilogue::kDGelu, false, true, N, 4 * C, C, x.data(), C, w.data(), C, big2.data(), 4 * C, nullptr,
                  big.data());
  });
  add("gemm qkv dinp", L, mm_dinp(3 * C, C));
  add("gemm attproj dinp", L, mm_dinp(C, C));
  add("gemm fc dinp", L, mm_dinp(4 * C, C));
  add("gemm qkv dweight", L, mm_dw(3 * C, C));
  add("gemm attproj dweight", L, mm_dw(C, C));
  add("gemm fc dweight", L, mm_dw(4 * C, C));
  add("gemm fcproj dweight", L, mm_dw(C, 4 * C));
  add("bias_backward (3C)", L,
      [&] { bias_backward(gb.data(), qkv.data(), N, 3 * C, scratch.data(), GradWrite::kStore, st); });
  add("bias_backward (C)", 2 * L,
      [&] { bias_backward(gb.data(), x.data(), N, C, scratch.data(), GradWrite::kStore, st); });
  add("bias_backward (4C)", L,
      [&] { bias_backward(gb.data(), big.data(), N, 4 * C, scratch.data(), GradWrite::kStore, st); });
  add("attention_forward", L,
      [&] { model::gpt2::attention_forward(x.data(), lse.data(), qkv.data(), B, S, C, NH, st); });
  add("attention_backward", L, [&] {
    model::gpt2::attention_backward(dqkv.data(), delta.data(), y.data(), x.data(), qkv.data(), lse.data(), B, S, C, NH,
                                    st);
  });
  const int head_blocks = (N + head_rows - 1) / head_rows;
  add("head gemm logits", head_blocks, [&] {
    gemm<T, T>(cublas, false, true, head_rows, ldv, C, 1.0f, x.data(), C, wte.data(), C, 0.0f, logits.data(), ldv);
  });
  add("head softmax_cross_entropy", head_blocks,
      [&] { softmax_cross_entropy(logits.data(), ldv, losses.data(), targets.data(), head_rows, V, 1.0f, true, st); });
  add("head gemm dinp", head_blocks, [&] {
    gemm<T, T>(cublas, false, false, head_rows, C, ldv, 1.0f, logits.data(), ldv, wte.data(), C, 0.0f, y.data(), C);
  });
  add("head gemm dwte", head_blocks,
      [&] { head_weight_grad(cublas, gwte.data(), logits.data(), ldv, x.data(), V, C, head_rows, GradWrite::kStore); });
  update_rows(rows, spec, 6e-4, st);

  return rows;
}

// Llama's step: every kernel and product of GpuLlama's passes at their shapes, as they run at stages
// 0-2 (q|k|v and gate|up each one product, their weights back to back in the flat buffer). Rows with
// no calls (marked "alt") time a variant the model does not run here, for comparison: the separate
// products stage 3 runs (it gathers each weight on its own).
std::vector<Row> llama_rows(const model::Model& spec, int B, int S, cudaStream_t st, cublasHandle_t cublas) {
  namespace llama = model::llama;
  const llama::LlamaConfig& c = *llama::config_of(spec);
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, V = c.vocab_size, L = c.n_layer;
  const int NH = c.n_head, NKV = c.n_kv_head, QW = NH * D, KW = NKV * D, N = B * S;
  const size_t NH_ = size_t{1} * N * H;
  const size_t widest = static_cast<size_t>(std::max({2 * I, QW + 2 * KW, H}));
  auto x = filled<T>(NH_, st), y = filled<T>(NH_, st);
  auto a = filled<T>(size_t{1} * N * widest, st), b = filled<T>(size_t{1} * N * widest, st);
  auto out = filled<T>(size_t{1} * N * widest, st);
  auto w = filled<T>(widest * H, st);
  auto gw = filled<float>(widest * H, st), gnorm = filled<float>(H, st);
  auto rstd = filled<float>(N, st),
       scratch = filled<float>(static_cast<size_t>(norm_scratch_floats(Norm::kRms, H)), st);
  auto lse = filled<float>(size_t{1} * N * NH, st), delta = filled<float>(size_t{1} * N * NH, st);
  auto att = filled<T>(size_t{1} * N * QW, st), datt = filled<T>(size_t{1} * N * QW, st);
  const llama::RopeTables tables = llama::rope_tables(c, S);
  DeviceBuffer<float> cos(tables.cos.size()), sin(tables.sin.size());
  CUDA_CHECK(cudaMemcpy(cos.data(), tables.cos.data(), cos.bytes(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(sin.data(), tables.sin.data(), sin.bytes(), cudaMemcpyHostToDevice));
  const int ldv = padded_vocab(V);
  const int head_rows = head_block_rows(ldv, sizeof(T), static_cast<int>(N));
  auto logits = filled<T>(size_t{1} * head_rows * ldv, st), head = filled<T>(size_t{1} * ldv * H, st);
  auto head_copy = filled<T>(size_t{1} * ldv * H, st);
  auto ghead = filled<float>(size_t{1} * V * H, st), losses = filled<float>(N, st);
  DeviceBuffer<int32_t> tokens(N);
  {
    std::vector<int32_t> t(static_cast<size_t>(N));
    for (int i = 0; i < N; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 2654435761u) % V);
    CUDA_CHECK(cudaMemcpy(tokens.data(), t.data(), tokens.bytes(), cudaMemcpyHostToDevice));
  }

  Matmul matmul(st);
  // y (N, out) = x (N, in) W^T [+ residual], W (out, in) as nn.Linear holds it
  auto linear = [&](int o, int in, bool residual) {
    return [&, o, in, residual] {
      matmul.run<T>(Epilogue::kNone, false, true, N, o, in, a.data(), in, w.data(), in, out.data(), o, nullptr, nullptr,
                    residual ? y.data() : nullptr);
    };
  };
  // dx (N, in) = dy (N, out) W
  auto dinp = [&](int o, int in) {
    return
        [&, o, in] { gemm<T, T>(cublas, false, false, N, in, o, 1.0f, a.data(), o, w.data(), in, 0.0f, b.data(), in); };
  };
  // dW (out, in) = dy^T x
  auto dweight = [&](int o, int in) {
    return [&, o, in] {
      gemm<T, float>(cublas, true, false, o, in, N, 1.0f, a.data(), o, b.data(), in, 0.0f, gw.data(), in);
    };
  };
  std::vector<Row> rows;
  auto add = [&](const std::string& name, int calls, const std::function<void()>& fn) {
    rows.push_back({name, calls, time_ms(st, name, fn)});
  };
  // q|k|v packed in each row of `a` (its gradients in `b`), as one product writes them.
  const int QKV = QW + 2 * KW;
  const AttentionShape shape{B, S, NH, NKV, D, QKV, QKV};
  EncoderBackward embedding(N, V);
  add("embedding_forward", 1, [&] { llama::embedding_forward(x.data(), tokens.data(), head.data(), N, H, st); });
  if (!c.tie_word_embeddings) {
    add("embedding gradient cleared", 1, [&] { CUDA_CHECK(cudaMemsetAsync(ghead.data(), 0, ghead.bytes(), st)); });
  }
  add("embedding_backward (sort, sums)", 1,
      [&] { embedding.run(ghead.data(), static_cast<float*>(nullptr), x.data(), tokens.data(), B, S, H, st); });
  add("rmsnorm_forward", 2 * L + 1,
      [&] { rmsnorm_forward(y.data(), rstd.data(), x.data(), head.data(), N, H, 1e-5f, st); });
  add("rmsnorm_backward", 2 * L + 1, [&] {
    rmsnorm_backward(y.data(), gnorm.data(), x.data(), x.data(), head.data(), rstd.data(), N, H, scratch.data(),
                     GradWrite::kStore, st);
  });
  add("linear q|k|v", L, linear(QKV, H, false));
  add("(alt) linear q, k, v apart", 0, [&] {
    linear(QW, H, false)();
    linear(KW, H, false)();
    linear(KW, H, false)();
  });
  add("rope_forward q|k", L,
      [&] { llama::rope_forward(a.data(), QKV, cos.data(), sin.data(), B, S, NH + NKV, D, st); });
  add("attention_forward", L,
      [&] { attention_forward(att.data(), lse.data(), a.data(), a.data() + QW, a.data() + QW + KW, shape, st); });
  add("linear o (+residual)", L, linear(H, QW, true));
  add("linear gate|up", L, linear(2 * I, H, false));
  add("(alt) linear gate, up apart", 0, [&] {
    linear(I, H, false)();
    linear(I, H, false)();
  });
  add("swiglu_forward", L, [&] { llama::swiglu_forward(out.data(), a.data(), N, I, st); });
  add("linear down (+residual)", L, linear(H, I, true));
  const int head_blocks = (N + head_rows - 1) / head_rows;
  add("head weight copy (padded)", 1, [&] {
    CUDA_CHECK(cudaMemcpyAsync(head_copy.data(), head.data(), sizeof(T) * V * H, cudaMemcpyDeviceToDevice, st));
  });
  add("head gemm logits", head_blocks, [&] {
    gemm<T, T>(cublas, false, true, head_rows, ldv, H, 1.0f, x.data(), H, head.data(), H, 0.0f, logits.data(), ldv);
  });
  add("head softmax_cross_entropy", head_blocks,
      [&] { softmax_cross_entropy(logits.data(), ldv, losses.data(), tokens.data(), head_rows, V, 1.0f, true, st); });
  add("head gemm dinp", head_blocks, [&] {
    gemm<T, T>(cublas, false, false, head_rows, H, ldv, 1.0f, logits.data(), ldv, head.data(), H, 0.0f, y.data(), H);
  });
  add("head gemm dweight", head_blocks, [&] {
    head_weight_grad(cublas, ghead.data(), logits.data(), ldv, x.data(), V, H, head_rows, GradWrite::kStore);
  });
  add("gemm down dinp, dweight", L, [&] {
    dinp(H, I)();
    dweight(H, I)();
  });
  add("swiglu_backward", L, [&] { llama::swiglu_backward(b.data(), b.data() + I, 2 * I, a.data(), N, I, st); });
  add("gemm gate|up dinp, dweight", L, [&] {
    dinp(2 * I, H)();
    dweight(2 * I, H)();
  });
  add("(alt) gemm gate, up apart dinp, dweight", 0, [&] {
    for (int part = 0; part < 2; ++part) {
      dinp(I, H)();
      dweight(I, H)();
    }
  });
  add("gemm o dinp, dweight", L, [&] {
    dinp(H, QW)();
    dweight(H, QW)();
  });
  add("attention_backward", L, [&] {
    attention_backward(b.data(), b.data() + QW, b.data() + QW + KW, delta.data(), datt.data(), att.data(), a.data(),
                       a.data() + QW, a.data() + QW + KW, lse.data(), shape, st);
  });
  add("rope_backward q|k", L,
      [&] { llama::rope_backward(b.data(), QKV, cos.data(), sin.data(), B, S, NH + NKV, D, st); });
  add("gemm q|k|v dinp, dweight", L, [&] {
    dinp(QKV, H)();
    dweight(QKV, H)();
  });
  add("(alt) gemm q, k, v apart dinp, dweight", 0, [&] {
    for (const int rows_out : {QW, KW, KW}) {
      dinp(rows_out, H)();
      dweight(rows_out, H)();
    }
  });
  update_rows(rows, spec, 3e-4, st);
  return rows;
}

int run(int argc, char** argv) {
  std::string model_name = "gpt2";
  int B = 16, S = 1024;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc)
      model_name = argv[++i];
    else if (a == "--batch" && i + 1 < argc)
      B = std::stoi(argv[++i]);
    else if (a == "--seq" && i + 1 < argc)
      S = std::stoi(argv[++i]);
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(stderr, "usage: %s [--model NAME] [--batch B] [--seq S] [--json]\n", argv[0]);
      return 2;
    }
  }
  const std::shared_ptr<const model::Model> spec = model::resolve_model(model_name);
  Stream stream;
  cudaStream_t st = stream.get();
  cublasHandle_t cublas;
  CUBLAS_CHECK(cublasCreate(&cublas));
  CUBLAS_CHECK(cublasSetStream(cublas, st));
  std::vector<Row> rows;
  if (model::gpt2::config_of(*spec)) {
    rows = gpt2_rows(*spec, B, S, st, cublas);
  } else if (model::llama::config_of(*spec)) {
    rows = llama_rows(*spec, B, S, st, cublas);
  } else {
    std::fprintf(stderr, "--model %s: no CUDA kernels for its family\n", model_name.c_str());
    return 2;
  }
  report(rows, model_name, B, S, json);
  cublasDestroy(cublas);
  return 0;
}

}  // namespace
}  // namespace shardkit::trainer::cuda

int main(int argc, char** argv) {
  try {
    return shardkit::trainer::cuda::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardkit_gpu_kernels_bench: error: %s\n", e.what());
    return 1;
  }
}
