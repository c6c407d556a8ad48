// The Llama family's CUDA kernels against the fp32 CPU kernels of model/llama/cpu_ops.hpp and
// model/cpu/ops.hpp on the same (rounded) inputs: RMSNorm, the rotary embedding, SwiGLU and
// grouped-query attention, forward and backward, in fp32 (to rounding) and bf16 (to its precision);
// the sums without atomics give the same bits twice. The shape check runs without a GPU; the rest is
// skipped (with a message) without one.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "model/cpu/ops.hpp"
#include "model/cuda/cuda_common.hpp"
#include "model/cuda/gpu_family.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/norms.hpp"
#include "model/llama/config.hpp"
#include "model/llama/cpu_ops.hpp"
#include "model/llama/cuda/gpu_model.hpp"
#include "model/llama/cuda/kernels.hpp"
#include "model/llama/model.hpp"
#include "model/registry.hpp"
#include "tests/cuda/device_values.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit::model::llama {
namespace {

using namespace cuda;
using namespace shardkit::testing;

// Random values rounded to T, as T (for the GPU) and as the floats they are (for the CPU).
template <typename T>
struct Values {
  std::vector<T> t;
  std::vector<float> f;
};
template <typename T>
Values<T> random_values(size_t n, float mean, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  Values<T> v;
  for (size_t i = 0; i < n; ++i) {
    v.t.push_back(to<T>(dist(rng)));
    v.f.push_back(from(v.t.back()));
  }
  return v;
}

// The device buffer's values as floats.
template <typename U>
std::vector<float> download_floats(const DeviceBuffer<U>& d) {
  return widen(download(d));
}

// fp32 follows the CPU to rounding; bf16 outputs carry about 3 significant digits.
template <typename T>
constexpr double kTolerance = std::is_same_v<T, float> ? 1e-4 : 2e-2;

template <typename T>
void check_rmsnorm(int N, int H) {
  const std::string what = "N=" + std::to_string(N) + " H=" + std::to_string(H);
  const auto x = random_values<T>(size_t{1} * N * H, 0.5f, 2.0f, 1);
  const auto w = random_values<T>(H, 1.0f, 0.2f, 2);
  const auto dout = random_values<T>(size_t{1} * N * H, 0.0f, 1.0f, 3);
  const auto dx0 = random_values<T>(size_t{1} * N * H, 0.0f, 1.0f, 4);  // rmsnorm_backward adds to dx
  const auto dw0 = random_values<float>(H, 0.0f, 1.0f, 5);
  const float eps = 1e-5f;

  std::vector<float> out(x.f.size()), rstd(N), dx = dx0.f, dw = dw0.f;
  ops::rmsnorm_forward(out.data(), rstd.data(), x.f.data(), w.f.data(), N, H, eps);
  ops::rmsnorm_backward(dx.data(), dw.data(), dout.f.data(), x.f.data(), w.f.data(), rstd.data(), N, H);

  auto x_d = upload(x.t), w_d = upload(w.t), dout_d = upload(dout.t), dx_d = upload(dx0.t), dw_d = upload(dw0.f);
  DeviceBuffer<T> out_d(x.t.size());
  DeviceBuffer<float> rstd_d(N), scratch(static_cast<size_t>(norm_scratch_floats(Norm::kRms, H)));
  rmsnorm_forward(out_d.data(), rstd_d.data(), x_d.data(), w_d.data(), N, H, eps, nullptr);
  // The backward pass from the GPU's own rstd (compared with the CPU's below).
  rmsnorm_backward(dx_d.data(), dw_d.data(), dout_d.data(), x_d.data(), w_d.data(), rstd_d.data(), N, H, scratch.data(),
                   nullptr);
  EXPECT_LT(relative_error(download_floats(out_d), out), kTolerance<T>) << "out " << what;
  EXPECT_LT(relative_error(download_floats(rstd_d), rstd), 1e-4) << "rstd " << what;
  EXPECT_LT(relative_error(download_floats(dx_d), dx), kTolerance<T>) << "dx " << what;
  EXPECT_LT(relative_error(download_floats(dw_d), dw), 1e-4) << "dweight " << what;  // fp32 sums of the same terms

  // The weight gradient's sums run in a fixed order: again from the same start, the same bits.
  const std::vector<float> first = download(dw_d);
  auto dw_again = upload(dw0.f), dx_again = upload(dx0.t);
  rmsnorm_backward(dx_again.data(), dw_again.data(), dout_d.data(), x_d.data(), w_d.data(), rstd_d.data(), N, H,
                   scratch.data(), nullptr);
  EXPECT_EQ(download(dw_again), first) << "dweight twice " << what;
}

TEST(LlamaCudaKernels, RmsNormMatchesTheCpu) {
  REQUIRE_GPUS(1);
  // Rows fewer and more than the backward pass's blocks; widths under a warp, odd, and past 12288
  // (one warp a block, the shared memory limit raised).
  for (const auto& [N, H] : std::vector<std::pair<int, int>>{{7, 20}, {1000, 128}, {2048, 576}, {96, 13000}}) {
    check_rmsnorm<float>(N, H);
    check_rmsnorm<__nv_bfloat16>(N, H);
  }
}

template <typename T>
void check_rope(int B, int S, int heads, int D) {
  const std::string what = "heads=" + std::to_string(heads) + " D=" + std::to_string(D);
  LlamaConfig c;
  c.head_dim = D;
  c.rope_theta = 500000;
  c.rope_scaling = {32, 1, 4, 8192};  // llama3 scaling: every band of the table
  const RopeTables tables = rope_tables(c, S);
  const auto x = random_values<T>(size_t{1} * B * S * heads * D, 0.0f, 1.0f, 6);
  std::vector<float> fwd = x.f, bwd = x.f;
  ops::rope_forward(fwd.data(), tables.cos.data(), tables.sin.data(), B, S, heads, D);
  ops::rope_backward(bwd.data(), tables.cos.data(), tables.sin.data(), B, S, heads, D);
  auto cos_d = upload(tables.cos), sin_d = upload(tables.sin);
  auto fwd_d = upload(x.t), bwd_d = upload(x.t);
  rope_forward(fwd_d.data(), cos_d.data(), sin_d.data(), B, S, heads, D, nullptr);
  rope_backward(bwd_d.data(), cos_d.data(), sin_d.data(), B, S, heads, D, nullptr);
  EXPECT_LT(relative_error(download_floats(fwd_d), fwd), kTolerance<T>) << "forward " << what;
  EXPECT_LT(relative_error(download_floats(bwd_d), bwd), kTolerance<T>) << "backward " << what;
}

TEST(LlamaCudaKernels, RopeMatchesTheCpu) {
  REQUIRE_GPUS(1);
  for (const auto& [heads, D] : std::vector<std::pair<int, int>>{{4, 32}, {2, 64}, {3, 128}}) {
    check_rope<float>(2, 37, heads, D);
    check_rope<__nv_bfloat16>(2, 37, heads, D);
  }
}

template <typename T>
void check_swiglu(int64_t n) {
  const auto gate = random_values<T>(n, 0.0f, 3.0f, 7), up = random_values<T>(n, 0.0f, 1.0f, 8);
  const auto dout = random_values<T>(n, 0.0f, 1.0f, 9);
  std::vector<float> out(n), dgate(n), dup(n);
  ops::swiglu_forward(out.data(), gate.f.data(), up.f.data(), n);
  ops::swiglu_backward(dgate.data(), dup.data(), dout.f.data(), gate.f.data(), up.f.data(), n);
  auto gate_d = upload(gate.t), up_d = upload(up.t), dout_d = upload(dout.t);
  DeviceBuffer<T> out_d(n), dup_d(n);
  swiglu_forward(out_d.data(), gate_d.data(), up_d.data(), n, nullptr);
  // d(gate) over d(out) in place, as the model runs it.
  swiglu_backward(dout_d.data(), dup_d.data(), dout_d.data(), gate_d.data(), up_d.data(), n, nullptr);
  EXPECT_LT(relative_error(download_floats(out_d), out), kTolerance<T>) << "out";
  EXPECT_LT(relative_error(download_floats(dout_d), dgate), kTolerance<T>) << "dgate";
  EXPECT_LT(relative_error(download_floats(dup_d), dup), kTolerance<T>) << "dup";
}

TEST(LlamaCudaKernels, SwigluMatchesTheCpu) {
  REQUIRE_GPUS(1);
  check_swiglu<float>(100003);
  check_swiglu<__nv_bfloat16>(100003);
}

struct AttentionCase {
  int B, S, NH, NKV, HS;
};

// Separate q, k, v buffers (Llama's layout), against model/cpu's grouped-query attention.
template <typename T>
void check_attention(const AttentionCase& c) {
  const std::string what = "B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " NH=" + std::to_string(c.NH) +
                           " NKV=" + std::to_string(c.NKV) + " HS=" + std::to_string(c.HS);
  const int N = c.B * c.S, QW = c.NH * c.HS, KW = c.NKV * c.HS;
  const auto q = random_values<T>(size_t{1} * N * QW, 0.0f, 1.0f, 11);
  const auto k = random_values<T>(size_t{1} * N * KW, 0.0f, 1.0f, 12);
  const auto v = random_values<T>(size_t{1} * N * KW, 0.0f, 1.0f, 13);
  const auto dout = random_values<T>(size_t{1} * N * QW, 0.0f, 1.0f, 14);

  const cpu::AttentionShape cpu_shape{c.B, c.S, c.NH, c.NKV, c.HS, QW, KW};
  std::vector<float> out(q.f.size()), att(size_t{1} * c.B * c.NH * c.S * c.S), dq(q.f.size()), dk(k.f.size()),
      dv(v.f.size());
  cpu::attention_forward(out.data(), att.data(), q.f.data(), k.f.data(), v.f.data(), cpu_shape);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.f.data(), q.f.data(), k.f.data(), v.f.data(),
                          att.data(), cpu_shape);

  const AttentionShape shape{c.B, c.S, c.NH, c.NKV, c.HS, QW, KW};
  auto q_d = upload(q.t), k_d = upload(k.t), v_d = upload(v.t), dout_d = upload(dout.t);
  DeviceBuffer<T> out_d(q.t.size()), dq_d(q.t.size()), dk_d(k.t.size()), dv_d(v.t.size());
  DeviceBuffer<float> lse(size_t{1} * N * c.NH), delta(size_t{1} * N * c.NH);
  cuda::attention_forward(out_d.data(), lse.data(), q_d.data(), k_d.data(), v_d.data(), shape, nullptr);
  // The backward pass from the GPU's own output (the CPU's, rounded, would do as well).
  cuda::attention_backward(dq_d.data(), dk_d.data(), dv_d.data(), delta.data(), dout_d.data(), out_d.data(), q_d.data(),
                           k_d.data(), v_d.data(), lse.data(), shape, nullptr);
  // In bf16 the probabilities are rounded before each product, and the backward pass starts from the
  // rounded output: the gradients get a little more room.
  const double tol = kTolerance<T>, grad_tol = std::is_same_v<T, float> ? 1e-4 : 3e-2;
  EXPECT_LT(relative_error(download_floats(out_d), out), tol) << "out " << what;
  EXPECT_LT(relative_error(download_floats(dq_d), dq), grad_tol) << "dq " << what;
  EXPECT_LT(relative_error(download_floats(dk_d), dk), grad_tol) << "dk " << what;
  EXPECT_LT(relative_error(download_floats(dv_d), dv), grad_tol) << "dv " << what;

  // dk and dv sum a group's heads in the kernel, in head order: the same bits every time.
  const auto dk_bits = download(dk_d), dv_bits = download(dv_d);
  cuda::attention_backward(dq_d.data(), dk_d.data(), dv_d.data(), delta.data(), dout_d.data(), out_d.data(), q_d.data(),
                           k_d.data(), v_d.data(), lse.data(), shape, nullptr);
  EXPECT_EQ(download(dk_d), dk_bits) << "dk twice " << what;
  EXPECT_EQ(download(dv_d), dv_bits) << "dv twice " << what;
}

const AttentionCase kCases[] = {
    {2, 64, 4, 2, 32},    // llama-tiny
    {2, 100, 8, 2, 64},   // S not a multiple of the tiles, 4 heads a group
    {1, 300, 9, 3, 64},   // smollm-135m's heads
    {1, 200, 4, 1, 128},  // one kv head for all, the largest head size
    {3, 17, 2, 2, 32},    // multi-head, shorter than one tile
};

TEST(LlamaCudaKernels, GroupedQueryAttentionFp32MatchesTheCpu) {
  REQUIRE_GPUS(1);
  for (const auto& c : kCases) check_attention<float>(c);
}

TEST(LlamaCudaKernels, GroupedQueryAttentionBf16MatchesTheCpu) {
  REQUIRE_GPUS(1);
  for (const auto& c : kCases) check_attention<__nv_bfloat16>(c);
}

// Needs no GPU: the shape check runs before any device work.
TEST(LlamaCuda, UnsupportedShapesAreRefusedByName) {
  const auto tiny_model = model::resolve_model("llama-tiny");
  const LlamaConfig* tiny = config_of(*tiny_model);
  ASSERT_NE(tiny, nullptr);
  EXPECT_EQ(cuda_unsupported(*tiny), "");
  for (const char* preset : {"smollm-135m", "tinyllama-1.1b", "llama-3.2-1b", "llama-2-7b"}) {
    EXPECT_EQ(cuda_unsupported(*config_of(*model::resolve_model(preset))), "") << preset;
  }
  LlamaConfig odd = *tiny;
  odd.head_dim = 16;
  EXPECT_NE(cuda_unsupported(odd).find("head_dim 16"), std::string::npos) << cuda_unsupported(odd);
  LlamaConfig wide = *tiny;
  wide.hidden_size = 1 << 16;  // a warp's fp32 sums of a row would not fit in shared memory
  EXPECT_NE(cuda_unsupported(wide).find("RMSNorm"), std::string::npos) << cuda_unsupported(wide);
  odd.name = "odd-llama";
  try {
    cuda::make_gpu_model<float>(*make_model(odd), {.batch = 1, .seq_len = 8}, nullptr, nullptr);
    ADD_FAILURE() << "head_dim 16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model odd-llama: head_dim 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardkit::model::llama
