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
#include <tuple>
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
                   GradWrite::kAdd, nullptr);
  EXPECT_LT(relative_error(download_floats(out_d), out), kTolerance<T>) << "out " << what;
  EXPECT_LT(relative_error(download_floats(rstd_d), rstd), 1e-4) << "rstd " << what;
  EXPECT_LT(relative_error(download_floats(dx_d), dx), kTolerance<T>) << "dx " << what;
  EXPECT_LT(relative_error(download_floats(dw_d), dw), 1e-4) << "dweight " << what;  // fp32 sums of the same terms

  // The weight gradient's sums run in a fixed order: again from the same start, the same bits.
  const std::vector<float> first = download(dw_d);
  auto dw_again = upload(dw0.f), dx_again = upload(dx0.t);
  rmsnorm_backward(dx_again.data(), dw_again.data(), dout_d.data(), x_d.data(), w_d.data(), rstd_d.data(), N, H,
                   scratch.data(), GradWrite::kAdd, nullptr);
  EXPECT_EQ(download(dw_again), first) << "dweight twice " << what;

  // Stored over what the buffer held (NaN): the bits of the same sums added to zero.
  DeviceBuffer<float> dw_zero(H), dw_stored(H);
  CUDA_CHECK(cudaMemset(dw_zero.data(), 0, dw_zero.bytes()));
  CUDA_CHECK(cudaMemset(dw_stored.data(), 0xff, dw_stored.bytes()));
  rmsnorm_backward(dx_again.data(), dw_zero.data(), dout_d.data(), x_d.data(), w_d.data(), rstd_d.data(), N, H,
                   scratch.data(), GradWrite::kAdd, nullptr);
  rmsnorm_backward(dx_again.data(), dw_stored.data(), dout_d.data(), x_d.data(), w_d.data(), rstd_d.data(), N, H,
                   scratch.data(), GradWrite::kStore, nullptr);
  EXPECT_EQ(download(dw_stored), download(dw_zero)) << "dweight stored " << what;
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

// The rows hold `extra` more heads than are turned (as a row of packed q|k|v holds v): those stay
// as they were, bit for bit.
template <typename T>
void check_rope(int B, int S, int heads, int extra, int D) {
  const std::string what = "heads=" + std::to_string(heads) + "+" + std::to_string(extra) + " D=" + std::to_string(D);
  LlamaConfig c;
  c.head_dim = D;
  c.rope_theta = 500000;
  c.rope_scaling = {32, 1, 4, 8192};  // llama3 scaling: every band of the table
  const RopeTables tables = rope_tables(c, S);
  const size_t rows = size_t{1} * B * S, ld = size_t{1} * (heads + extra) * D, turned = size_t{1} * heads * D;
  const auto x = random_values<T>(rows * ld, 0.0f, 1.0f, 6);
  std::vector<float> fwd(rows * turned), bwd;
  for (size_t r = 0; r < rows; ++r) std::copy_n(x.f.begin() + r * ld, turned, fwd.begin() + r * turned);
  bwd = fwd;
  ops::rope_forward(fwd.data(), tables.cos.data(), tables.sin.data(), B, S, heads, D);
  ops::rope_backward(bwd.data(), tables.cos.data(), tables.sin.data(), B, S, heads, D);
  auto cos_d = upload(tables.cos), sin_d = upload(tables.sin);
  auto fwd_d = upload(x.t), bwd_d = upload(x.t);
  rope_forward(fwd_d.data(), ld, cos_d.data(), sin_d.data(), B, S, heads, D, nullptr);
  rope_backward(bwd_d.data(), ld, cos_d.data(), sin_d.data(), B, S, heads, D, nullptr);
  for (const auto& [got_d, want, name] :
       {std::tuple{&fwd_d, &fwd, "forward "}, std::tuple{&bwd_d, &bwd, "backward "}}) {
    const std::vector<T> got = download(*got_d);
    std::vector<float> turned_got(rows * turned);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < turned; ++i) turned_got[r * turned + i] = from(got[r * ld + i]);
      for (size_t i = turned; i < ld; ++i) {
        ASSERT_EQ(from(got[r * ld + i]), x.f[r * ld + i]) << name << what << ": row " << r << " channel " << i;
      }
    }
    EXPECT_LT(relative_error(turned_got, *want), kTolerance<T>) << name << what;
  }
}

TEST(LlamaCudaKernels, RopeMatchesTheCpu) {
  REQUIRE_GPUS(1);
  // Rows of the turned heads alone, and rows of packed q|k|v (q's and k's heads turned, v's not).
  for (const auto& [heads, extra, D] :
       std::vector<std::tuple<int, int, int>>{{4, 0, 32}, {2, 0, 64}, {3, 0, 128}, {6, 2, 64}, {3, 1, 128}}) {
    check_rope<float>(2, 37, heads, extra, D);
    check_rope<__nv_bfloat16>(2, 37, heads, extra, D);
  }
}

// gate and up as the halves of each row of one (N, 2I) buffer, the backward pass in place over
// d(act) in the up half, as the model runs them.
template <typename T>
void check_swiglu(int N, int I) {
  const std::string what = "N=" + std::to_string(N) + " I=" + std::to_string(I);
  const size_t n = size_t{1} * N * I;
  const auto gate = random_values<T>(n, 0.0f, 3.0f, 7), up = random_values<T>(n, 0.0f, 1.0f, 8);
  const auto dout = random_values<T>(n, 0.0f, 1.0f, 9);
  std::vector<float> out(n), dgate(n), dup(n);
  ops::swiglu_forward(out.data(), gate.f.data(), up.f.data(), static_cast<int64_t>(n));
  ops::swiglu_backward(dgate.data(), dup.data(), dout.f.data(), gate.f.data(), up.f.data(), static_cast<int64_t>(n));
  std::vector<T> gate_up(2 * n), dgate_up(2 * n);
  for (size_t r = 0; r < static_cast<size_t>(N); ++r) {
    std::copy_n(gate.t.begin() + r * I, I, gate_up.begin() + r * 2 * I);
    std::copy_n(up.t.begin() + r * I, I, gate_up.begin() + r * 2 * I + I);
    std::copy_n(dout.t.begin() + r * I, I, dgate_up.begin() + r * 2 * I + I);
  }
  auto gate_up_d = upload(gate_up), dgate_up_d = upload(dgate_up);
  DeviceBuffer<T> out_d(n);
  swiglu_forward(out_d.data(), gate_up_d.data(), N, I, nullptr);
  swiglu_backward(dgate_up_d.data(), dgate_up_d.data() + I, 2 * I, gate_up_d.data(), N, I, nullptr);
  const std::vector<float> both = download_floats(dgate_up_d);
  std::vector<float> dgate_got(n), dup_got(n);
  for (size_t r = 0; r < static_cast<size_t>(N); ++r) {
    std::copy_n(both.begin() + r * 2 * I, I, dgate_got.begin() + r * I);
    std::copy_n(both.begin() + r * 2 * I + I, I, dup_got.begin() + r * I);
  }
  EXPECT_LT(relative_error(download_floats(out_d), out), kTolerance<T>) << "out " << what;
  EXPECT_LT(relative_error(dgate_got, dgate), kTolerance<T>) << "dgate " << what;
  EXPECT_LT(relative_error(dup_got, dup), kTolerance<T>) << "dup " << what;
}

TEST(LlamaCudaKernels, SwigluMatchesTheCpu) {
  REQUIRE_GPUS(1);
  // A width of whole 16-byte packs, and an odd one (one element a thread).
  for (const auto& [N, I] : std::vector<std::pair<int, int>>{{37, 1024}, {29, 3451}}) {
    check_swiglu<float>(N, I);
    check_swiglu<__nv_bfloat16>(N, I);
  }
}

struct AttentionCase {
  int B, S, NH, NKV, HS;
};

// q, k, v in buffers of their own, or packed side by side in each row of one buffer (Llama's layout:
// q|k|v, one product's output), against model/cpu's grouped-query attention.
template <typename T>
void check_attention(const AttentionCase& c, bool packed) {
  const std::string what = "B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " NH=" + std::to_string(c.NH) +
                           " NKV=" + std::to_string(c.NKV) + " HS=" + std::to_string(c.HS) +
                           (packed ? " packed" : " separate");
  const int N = c.B * c.S, QW = c.NH * c.HS, KW = c.NKV * c.HS;
  const auto q = random_values<T>(size_t{1} * N * QW, 0.0f, 1.0f, 11);
  const auto k = random_values<T>(size_t{1} * N * KW, 0.0f, 1.0f, 12);
  const auto v = random_values<T>(size_t{1} * N * KW, 0.0f, 1.0f, 13);
  const auto dout = random_values<T>(size_t{1} * N * QW, 0.0f, 1.0f, 14);

  const cpu::AttentionShape cpu_shape{c.B, c.S, c.NH, c.NKV, c.HS, QW, KW};
  std::vector<float> out(q.f.size()), stats(static_cast<size_t>(cpu::attention_stats_floats(c.B, c.NH, c.S))),
      dq(q.f.size()), dk(k.f.size()), dv(v.f.size()),
      workspace(static_cast<size_t>(cpu::attention_workspace_floats(cpu_shape)));
  cpu::attention_forward(out.data(), stats.data(), q.f.data(), k.f.data(), v.f.data(), cpu_shape, workspace);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.f.data(), q.f.data(), k.f.data(), v.f.data(),
                          stats.data(), cpu_shape, workspace);

  // Packed: rows of QW + 2 KW elements, q at 0, k at QW, v at QW + KW (and dq, dk, dv likewise).
  const int64_t ld_q = packed ? QW + 2 * KW : QW, ld_kv = packed ? QW + 2 * KW : KW;
  const AttentionShape shape{c.B, c.S, c.NH, c.NKV, c.HS, ld_q, ld_kv};
  const size_t qkv_size = size_t{1} * N * (QW + 2 * KW);
  std::vector<T> qkv(packed ? qkv_size : 0);
  for (size_t r = 0; packed && r < static_cast<size_t>(N); ++r) {
    std::copy_n(q.t.begin() + r * QW, QW, qkv.begin() + r * ld_q);
    std::copy_n(k.t.begin() + r * KW, KW, qkv.begin() + r * ld_q + QW);
    std::copy_n(v.t.begin() + r * KW, KW, qkv.begin() + r * ld_q + QW + KW);
  }
  auto qkv_d = upload(packed ? qkv : q.t), k_d = upload(k.t), v_d = upload(v.t), dout_d = upload(dout.t);
  DeviceBuffer<T> out_d(q.t.size()), dqkv_d(packed ? qkv_size : q.t.size()), dk_d(k.t.size()), dv_d(v.t.size());
  const T* q_p = qkv_d.data();
  const T* k_p = packed ? qkv_d.data() + QW : k_d.data();
  const T* v_p = packed ? qkv_d.data() + QW + KW : v_d.data();
  T* dq_p = dqkv_d.data();
  T* dk_p = packed ? dqkv_d.data() + QW : dk_d.data();
  T* dv_p = packed ? dqkv_d.data() + QW + KW : dv_d.data();
  DeviceBuffer<float> lse(size_t{1} * N * c.NH), delta(size_t{1} * N * c.NH);
  cuda::attention_forward(out_d.data(), lse.data(), q_p, k_p, v_p, shape, nullptr);
  // The backward pass from the GPU's own output (the CPU's, rounded, would do as well).
  cuda::attention_backward(dq_p, dk_p, dv_p, delta.data(), dout_d.data(), out_d.data(), q_p, k_p, v_p, lse.data(),
                           shape, nullptr);
  // Each gradient's rows, wherever they sit.
  auto rows_of = [&](int64_t offset, int64_t ld, int width) {
    const std::vector<float> all = download_floats(dqkv_d);
    std::vector<float> got(size_t{1} * N * width);
    for (size_t r = 0; r < static_cast<size_t>(N); ++r)
      std::copy_n(all.begin() + offset + r * ld, width, got.begin() + r * width);
    return got;
  };
  const std::vector<float> dq_got = rows_of(0, ld_q, QW);
  const std::vector<float> dk_got = packed ? rows_of(QW, ld_kv, KW) : download_floats(dk_d);
  const std::vector<float> dv_got = packed ? rows_of(QW + KW, ld_kv, KW) : download_floats(dv_d);
  // In bf16 the probabilities are rounded before each product, and the backward pass starts from the
  // rounded output: the gradients get a little more room.
  const double tol = kTolerance<T>, grad_tol = std::is_same_v<T, float> ? 1e-4 : 3e-2;
  EXPECT_LT(relative_error(download_floats(out_d), out), tol) << "out " << what;
  EXPECT_LT(relative_error(dq_got, dq), grad_tol) << "dq " << what;
  EXPECT_LT(relative_error(dk_got, dk), grad_tol) << "dk " << what;
  EXPECT_LT(relative_error(dv_got, dv), grad_tol) << "dv " << what;

  // dk and dv sum a group's heads in the kernel, in head order: the same bits every time.
  const auto dqkv_bits = download(dqkv_d), dk_bits = download(dk_d), dv_bits = download(dv_d);
  cuda::attention_backward(dq_p, dk_p, dv_p, delta.data(), dout_d.data(), out_d.data(), q_p, k_p, v_p, lse.data(),
                           shape, nullptr);
  EXPECT_EQ(download(dqkv_d), dqkv_bits) << "dq|dk|dv twice " << what;
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
  for (const auto& c : kCases) {
    for (const bool packed : {false, true}) check_attention<float>(c, packed);
  }
}

TEST(LlamaCudaKernels, GroupedQueryAttentionBf16MatchesTheCpu) {
  REQUIRE_GPUS(1);
  for (const auto& c : kCases) {
    for (const bool packed : {false, true}) check_attention<__nv_bfloat16>(c, packed);
  }
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
