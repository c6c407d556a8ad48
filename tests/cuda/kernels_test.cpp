// The 16-bit kernels against the fp32 ones on the same (rounded) inputs: tensor-core attention forward
// and backward at every supported head size, sequence lengths that are and are not multiples of the
// tiles, and LayerNorm's backward pass; the fused matrix-product epilogues against the separate
// kernels. Skipped (with a message) without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ckpt/dtype_convert.hpp"
#include "model/cuda/cuda_common.hpp"
#include "model/cuda/gpu_model.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/matmul.hpp"
#include "model/cuda/norms.hpp"
#include "model/gpt2/cuda/kernels.hpp"
#include "tests/cuda/device_values.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "trainer/cuda/optimizer_kernels.hpp"

namespace shardkit::trainer::cuda {
namespace {

using namespace model::cuda;
using namespace shardkit::testing;

struct AttentionCase {
  int B, S, NH, HS;
};

// Runs attention forward and backward in T and in fp32 on identical inputs; compares out, lse and
// dqkv (the q, k and v parts separately, so an error in one kernel is not hidden by the others).
template <typename T>
void check_attention(const AttentionCase& c) {
  const int C = c.NH * c.HS, N = c.B * c.S;
  const std::string what = "B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " NH=" + std::to_string(c.NH) +
                           " HS=" + std::to_string(c.HS);
  std::vector<T> qkv_t, dout_t;
  std::vector<float> qkv_f, dout_f;
  random_values<T>(size_t{3} * N * C, 1.0f, 1, qkv_t, qkv_f);  // scores of order sqrt(HS) / sqrt(HS): peaky enough
  random_values<T>(size_t{1} * N * C, 1.0f, 2, dout_t, dout_f);
  const size_t stats = size_t{1} * c.B * c.NH * c.S;

  auto qkv16 = upload(qkv_t), dout16 = upload(dout_t);
  DeviceBuffer<T> out16(size_t{1} * N * C), dqkv16(size_t{3} * N * C);
  DeviceBuffer<float> lse16(stats), delta16(stats);
  model::gpt2::attention_forward<T>(out16.data(), lse16.data(), qkv16.data(), c.B, c.S, C, c.NH, nullptr);
  model::gpt2::attention_backward<T>(dqkv16.data(), delta16.data(), dout16.data(), out16.data(), qkv16.data(),
                                     lse16.data(), c.B, c.S, C, c.NH, nullptr);

  auto qkv32 = upload(qkv_f), dout32 = upload(dout_f);
  DeviceBuffer<float> out32(size_t{1} * N * C), dqkv32(size_t{3} * N * C), lse32(stats), delta32(stats);
  model::gpt2::attention_forward<float>(out32.data(), lse32.data(), qkv32.data(), c.B, c.S, C, c.NH, nullptr);
  model::gpt2::attention_backward<float>(dqkv32.data(), delta32.data(), dout32.data(), out32.data(), qkv32.data(),
                                         lse32.data(), c.B, c.S, C, c.NH, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());

  EXPECT_LT(relative_error(widen(download(out16)), download(out32)), 1e-2) << "out " << what;
  EXPECT_LT(relative_error(download(lse16), download(lse32)), 1e-3) << "lse " << what;
  const auto got = widen(download(dqkv16)), want = download(dqkv32);
  for (int part = 0; part < 3; ++part) {
    std::vector<float> g, w;
    for (int n = 0; n < N; ++n) {
      const size_t row = size_t{3} * C * n + size_t{1} * part * C;
      g.insert(g.end(), got.begin() + row, got.begin() + row + C);
      w.insert(w.end(), want.begin() + row, want.begin() + row + C);
    }
    EXPECT_LT(relative_error(g, w), 2e-2) << "d"
                                          << "qkv"[part] << " " << what;
  }
}

const AttentionCase kCases[] = {
    {2, 64, 4, 32},    // gpt2-tiny
    {2, 100, 3, 64},   // S not a multiple of the tiles
    {1, 1024, 2, 64},  // GPT-2's sequence
    {1, 200, 2, 128},  // the largest head size, different tile sizes
    {3, 17, 1, 32},    // shorter than one tile
};

TEST(CudaKernels, Bf16AttentionMatchesFp32) {
  REQUIRE_GPUS(1);
  for (const auto& c : kCases) check_attention<__nv_bfloat16>(c);
}

TEST(CudaKernels, Fp16AttentionMatchesFp32) {
  REQUIRE_GPUS(1);
  for (const auto& c : kCases) check_attention<__half>(c);
}

TEST(CudaKernels, CausalMaskHoldsInTheTensorCorePath) {
  REQUIRE_GPUS(1);
  // Changing the last key/value row must leave every output row but the last untouched.
  const AttentionCase c{1, 130, 2, 64};
  const int C = c.NH * c.HS, N = c.S;
  std::vector<__nv_bfloat16> qkv;
  std::vector<float> unused;
  random_values<__nv_bfloat16>(size_t{3} * N * C, 1.0f, 7, qkv, unused);
  auto run = [&](const std::vector<__nv_bfloat16>& input) {
    auto d = upload(input);
    DeviceBuffer<__nv_bfloat16> out(size_t{1} * N * C);
    DeviceBuffer<float> lse(size_t{1} * c.NH * c.S);
    model::gpt2::attention_forward<__nv_bfloat16>(out.data(), lse.data(), d.data(), c.B, c.S, C, c.NH, nullptr);
    return widen(download(out));
  };
  const auto before = run(qkv);
  for (int i = C; i < 3 * C; ++i) qkv[size_t{3} * C * (N - 1) + i] = to<__nv_bfloat16>(5.0f);
  const auto after = run(qkv);
  for (size_t i = 0; i < size_t{1} * (N - 1) * C; ++i) ASSERT_EQ(before[i], after[i]) << "element " << i;
  EXPECT_NE(std::vector<float>(before.end() - C, before.end()), std::vector<float>(after.end() - C, after.end()));
}

// The loss and its gradient in place against double on the host, for vocabularies shorter than one
// pass of a block over 16-byte vectors, ragged ones (not a multiple of the vector), Llama 2's, GPT-2's
// and one past 65,536 (many passes): the padding past V untouched, the loss-only pass leaving the
// logits alone, two runs the same bits. Both kernels run: the row in shared memory (bf16 up to GPT-2's
// vocabulary, fp32 to 4,099 on an H100) and the two passes over global memory (the rest).
template <typename T>
void check_cross_entropy(int V, double grad_tolerance) {
  const int rows = 5;
  const int64_t ld = (V + 15) / 16 * 16;
  std::vector<T> x_t;
  std::vector<float> x_f;
  random_values<T>(static_cast<size_t>(rows * ld), 3.0f, 31, x_t, x_f);
  std::mt19937 rng(32);
  std::vector<int32_t> targets(rows);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  targets[0] = V - 1;  // the row's last logit, in the ragged tail where V is not a multiple of the vector
  const float dscale = 1.0f / rows;
  std::vector<float> want_loss(rows), want_grad(x_f.size());
  for (int r = 0; r < rows; ++r) {
    const float* x = x_f.data() + r * ld;
    double m = -1e300, sum = 0;
    for (int v = 0; v < V; ++v) m = std::max(m, double{x[v]});
    for (int v = 0; v < V; ++v) sum += std::exp(double{x[v]} - m);
    const double lse = m + std::log(sum);
    want_loss[static_cast<size_t>(r)] = static_cast<float>(lse - double{x[targets[static_cast<size_t>(r)]]});
    for (int64_t v = 0; v < ld; ++v) {  // the padding past V keeps its values
      const double onehot = v == targets[static_cast<size_t>(r)] ? 1.0 : 0.0;
      want_grad[static_cast<size_t>(r * ld + v)] =
          v < V ? static_cast<float>((std::exp(double{x[v]} - lse) - onehot) * double{dscale}) : x[v];
    }
  }
  auto run = [&](bool backward) {
    auto logits = upload(x_t);
    auto dtargets = upload(targets);
    DeviceBuffer<float> losses(rows);
    softmax_cross_entropy<T>(logits.data(), ld, losses.data(), dtargets.data(), rows, V, dscale, backward, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return std::pair{download(losses), download(logits)};
  };
  const std::string what = "V=" + std::to_string(V);
  const auto [loss, grad] = run(true);
  EXPECT_LT(relative_error(loss, want_loss), 1e-5) << what;
  EXPECT_LT(relative_error(widen(grad), want_grad), grad_tolerance) << what;
  for (int r = 0; r < rows; ++r) {
    for (int64_t v = V; v < ld; ++v) {
      const size_t i = static_cast<size_t>(r * ld + v);
      ASSERT_EQ(from(grad[i]), x_f[i]) << what << ": padding at row " << r << " column " << v;
    }
  }
  const auto [loss_only, untouched] = run(false);
  EXPECT_EQ(loss_only, loss) << what;
  EXPECT_EQ(widen(untouched), x_f) << what << ": the loss-only pass wrote the logits";
  EXPECT_EQ(widen(run(true).second), widen(grad)) << what << ": not deterministic";
}

TEST(CudaKernels, SoftmaxCrossEntropyMatchesDouble) {
  REQUIRE_GPUS(1);
  for (const int V : {37, 4099, 32000, 50257, 70001}) {
    check_cross_entropy<float>(V, 1e-4);
    check_cross_entropy<__nv_bfloat16>(V, 1e-2);
  }
}

// LayerNorm's backward pass in double on the host: dinp, dweight, dbias.
void layernorm_backward_reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& d,
                                  int N, int C, std::vector<float>& dinp, std::vector<float>& dw,
                                  std::vector<float>& db) {
  std::vector<double> gw(C), gb(C);
  dinp.assign(x.size(), 0.0f);
  auto at = [](const std::vector<float>& v, size_t i) { return static_cast<double>(v[i]); };
  for (int n = 0; n < N; ++n) {
    const size_t row = size_t{1} * n * C;
    double mean = 0, var = 0;
    for (int c = 0; c < C; ++c) mean += at(x, row + c);
    mean /= C;
    for (int c = 0; c < C; ++c) var += (at(x, row + c) - mean) * (at(x, row + c) - mean);
    const double rstd = 1.0 / std::sqrt(var / C + 1e-5);
    double mean_dnorm = 0, mean_dnorm_norm = 0;
    for (int c = 0; c < C; ++c) {
      const double norm = (at(x, row + c) - mean) * rstd, dnorm = at(w, c) * at(d, row + c);
      mean_dnorm += dnorm / C;
      mean_dnorm_norm += dnorm * norm / C;
      gw[c] += norm * at(d, row + c);
      gb[c] += at(d, row + c);
    }
    for (int c = 0; c < C; ++c) {
      const double norm = (at(x, row + c) - mean) * rstd;
      dinp[row + c] = static_cast<float>((at(w, c) * at(d, row + c) - mean_dnorm - norm * mean_dnorm_norm) * rstd);
    }
  }
  dw.assign(gw.begin(), gw.end());
  db.assign(gb.begin(), gb.end());
}

TEST(CudaKernels, LayerNormBackwardMatchesDoubleAndBf16MatchesFp32) {
  REQUIRE_GPUS(1);
  // Widths that take the 16-byte path, and ones that do not (100: fp32 only; 13: neither).
  for (const auto& [N, C] :
       {std::pair{1000, 768}, std::pair{37, 128}, std::pair{4096, 1600}, std::pair{64, 100}, std::pair{5, 13}}) {
    std::vector<__nv_bfloat16> x_t, w_t, b_t, d_t;
    std::vector<float> x_f, w_f, b_f, d_f;
    random_values<__nv_bfloat16>(size_t{1} * N * C, 1.0f, 3, x_t, x_f);
    random_values<__nv_bfloat16>(C, 1.0f, 4, w_t, w_f);
    random_values<__nv_bfloat16>(C, 1.0f, 5, b_t, b_f);
    random_values<__nv_bfloat16>(size_t{1} * N * C, 1.0f, 6, d_t, d_f);
    auto run = [&](auto x, auto w, auto b, auto d) {
      using U = typename decltype(x)::value_type;
      auto dx = upload(x), dw = upload(w), db = upload(b), dd = upload(d);
      DeviceBuffer<U> out(x.size()), dinp(x.size());
      DeviceBuffer<float> mean(N), rstd(N), gw(C), gb(C),
          scratch(static_cast<size_t>(norm_scratch_floats(Norm::kLayer, C)));
      CUDA_CHECK(cudaMemset(dinp.data(), 0, dinp.bytes()));
      // The weight and bias gradients stored over what the buffers held (NaN).
      CUDA_CHECK(cudaMemset(gw.data(), 0xff, gw.bytes()));
      CUDA_CHECK(cudaMemset(gb.data(), 0xff, gb.bytes()));
      layernorm_forward<U>(out.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), N, C, nullptr);
      layernorm_backward<U>(dinp.data(), gw.data(), gb.data(), dd.data(), dx.data(), dw.data(), mean.data(),
                            rstd.data(), N, C, scratch.data(), GradWrite::kStore, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      return std::tuple{widen(download(out)), widen(download(dinp)), download(gw), download(gb)};
    };
    const auto [out16, dinp16, gw16, gb16] = run(x_t, w_t, b_t, d_t);
    const auto [out32, dinp32, gw32, gb32] = run(x_f, w_f, b_f, d_f);
    const std::string what = "N=" + std::to_string(N) + " C=" + std::to_string(C);
    EXPECT_LT(relative_error(out16, out32), 1e-2) << what;
    EXPECT_LT(relative_error(dinp16, dinp32), 1e-2) << what;
    EXPECT_LT(relative_error(gw16, gw32), 1e-3) << what;  // fp32 sums of the same bf16 products
    EXPECT_LT(relative_error(gb16, gb32), 1e-5) << what;
    std::vector<float> dinp_ref, gw_ref, gb_ref;
    layernorm_backward_reference(x_f, w_f, d_f, N, C, dinp_ref, gw_ref, gb_ref);
    EXPECT_LT(relative_error(dinp32, dinp_ref), 1e-5) << what << " fp32 vs double";
    EXPECT_LT(relative_error(gw32, gw_ref), 1e-5) << what << " fp32 vs double";
    EXPECT_LT(relative_error(gb32, gb_ref), 1e-5) << what << " fp32 vs double";
  }
}

// Bias gradients (column sums) against double on the host, added to what dbias held (0.5) and stored
// over it (NaN), for widths that take the 16-byte path and odd ones that do not, and no rows at all;
// two runs give the same bits (no atomics).
TEST(CudaKernels, BiasBackwardMatchesDoubleAndIsDeterministic) {
  REQUIRE_GPUS(1);
  for (const auto& [N, OC] :
       {std::pair{16384, 3072}, std::pair{1000, 768}, std::pair{333, 77}, std::pair{5, 9}, std::pair{0, 40}}) {
    std::vector<__nv_bfloat16> d_t;
    std::vector<float> d_f;
    random_values<__nv_bfloat16>(size_t{1} * N * OC, 1.0f, 21, d_t, d_f);
    std::vector<double> sums(static_cast<size_t>(OC), 0.0);
    for (int n = 0; n < N; ++n) {
      for (int c = 0; c < OC; ++c) {
        sums[static_cast<size_t>(c)] += static_cast<double>(d_f[size_t{1} * n * OC + static_cast<size_t>(c)]);
      }
    }
    for (const GradWrite write : {GradWrite::kAdd, GradWrite::kStore}) {
      const bool add = write == GradWrite::kAdd;
      auto run = [&](const auto& d) {
        auto dd = upload(d);
        DeviceBuffer<float> db(static_cast<size_t>(OC)), scratch(static_cast<size_t>(bias_scratch_floats(OC)));
        const std::vector<float> initial(static_cast<size_t>(OC), add ? 0.5f : std::nanf(""));
        CUDA_CHECK(cudaMemcpy(db.data(), initial.data(), db.bytes(), cudaMemcpyHostToDevice));
        bias_backward(db.data(), dd.data(), N, OC, scratch.data(), write, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        return download(db);
      };
      const std::string what = "N=" + std::to_string(N) + " OC=" + std::to_string(OC) + (add ? " added" : " stored");
      const std::vector<float> got16 = run(d_t), got32 = run(d_f);
      EXPECT_EQ(got16, run(d_t)) << what << ": bf16 not deterministic";
      EXPECT_EQ(got32, run(d_f)) << what << ": fp32 not deterministic";
      std::vector<float> want(static_cast<size_t>(OC));
      for (size_t c = 0; c < want.size(); ++c) want[c] = static_cast<float>(sums[c] + (add ? 0.5 : 0.0));
      EXPECT_LT(relative_error(got32, want), 1e-5) << what << " fp32 vs double";
      EXPECT_LT(relative_error(got16, want), 1e-5) << what << " bf16 inputs, fp32 sums";
    }
  }
}

// The deterministic sums (the gradient norm, the loss) against double on the host: lengths below one
// pack, between the packs and the whole grid, and past it; a view starting one float in (not 16-byte
// aligned, the element path); each twice, to the bit.
TEST(CudaKernels, SumsMatchDoubleAndGiveTheSameBitsTwice) {
  REQUIRE_GPUS(1);
  std::vector<float> x, unused;
  random_values<float>(size_t{3} << 20, 1.0f, 31, x, unused);
  const auto device = upload(x);
  DeviceBuffer<double> out(kSumScratch);
  auto run = [&](void (*sum)(double*, const float*, int64_t, cudaStream_t), int64_t offset, int64_t n) {
    sum(out.data(), device.data() + offset, n, nullptr);
    double got = 0;
    CUDA_CHECK(cudaMemcpy(&got, out.data(), sizeof got, cudaMemcpyDeviceToHost));
    return got;
  };
  for (const int64_t offset : {0, 1}) {
    for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{1000}, int64_t{262147}, int64_t{3 << 20} - 1}) {
      double squares = 0, plain = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[static_cast<size_t>(offset + i)];
        squares += v * v;
        plain += v;
      }
      const std::string what = "offset " + std::to_string(offset) + ", " + std::to_string(n) + " floats";
      const double got_squares = run(sum_squares, offset, n), got_plain = run(sum_floats, offset, n);
      EXPECT_NEAR(got_squares, squares, 1e-12 * squares) << what;
      EXPECT_NEAR(got_plain, plain, 1e-9 * (1 + std::abs(squares))) << what;
      EXPECT_EQ(run(sum_squares, offset, n), got_squares) << what << ": not deterministic";
      EXPECT_EQ(run(sum_floats, offset, n), got_plain) << what << ": not deterministic";
    }
  }
}

// AdamW's weight decay by parameter group in one launch: a view cut by a no-decay table in ~200
// places (ranges of one element, ranges at the ends). Every element as the CPU update computes it (the
// same formula; the GPU may fuse a multiply-add the CPU rounds twice, hence the tolerance -- far below
// the 5 % a wrong decay would make), an update in two chunks (NoDecayRanges::at) bit for bit the
// update of the whole view, and with zero gradients the undecayed elements unchanged to the bit.
TEST(CudaKernels, AdamWSkipsWeightDecayOnTheNoDecayRanges) {
  REQUIRE_GPUS(1);
  const int64_t n = (int64_t{1} << 20) + 37;
  std::mt19937 rng(31);
  std::vector<ElementRange> skip = {{0, 3}};
  for (int64_t at = 1000; at < n - 10000; at += 5000) {
    const int64_t begin = at + static_cast<int64_t>(rng() % 1000), length = 1 + static_cast<int64_t>(rng() % 3000);
    skip.push_back({begin, begin + length});
  }
  skip.push_back({n - 1, n});
  const auto table = upload(skip);
  const NoDecayRanges on_device{table.data(), static_cast<int64_t>(skip.size())};
  const NoDecayRanges on_host{skip.data(), static_cast<int64_t>(skip.size())};
  OptimizerStep step;
  step.lr = 0.1;
  step.weight_decay = 0.5;
  step.step = 2;
  const AdamWCoefficients c = AdamWCoefficients::of(step);

  std::vector<float> w, m, v, g, unused;
  random_values<float>(static_cast<size_t>(n), 1.0f, 41, w, unused);
  random_values<float>(static_cast<size_t>(n), 0.1f, 42, m, unused);
  random_values<float>(static_cast<size_t>(n), 0.1f, 43, v, unused);
  random_values<float>(static_cast<size_t>(n), 1.0f, 44, g, unused);
  for (float& x : v) x = x * x;
  // On the GPU from the host values, whole (split = 0) or in two chunks; returns (w, m, v, params).
  auto gpu = [&](const std::vector<float>& m0, const std::vector<float>& v0, const std::vector<float>& g0,
                 int64_t split) {
    auto dw = upload(w), dm = upload(m0), dv = upload(v0), dg = upload(g0);
    DeviceBuffer<float> params(static_cast<size_t>(n));
    const std::pair<int64_t, int64_t> chunks[] = {{0, split}, {split, n}};
    for (const auto& [lo, hi] : chunks) {
      adamw<float>(dw.data() + lo, dm.data() + lo, dv.data() + lo, dg.data() + lo, params.data() + lo, hi - lo, c,
                   on_device.at(lo), nullptr);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return std::array<std::vector<float>, 4>{download(dw), download(dm), download(dv), download(params)};
  };
  auto skipped = [&](int64_t i) {
    return std::ranges::any_of(skip, [&](const ElementRange& r) { return r.begin <= i && i < r.end; });
  };

  const auto whole = gpu(m, v, g, 0);
  std::vector<float> cw = w, cm = m, cv = v;
  cpu_adamw(cw, cm, cv, g, c, on_host);
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    ASSERT_NEAR(whole[0][k], cw[k], 1e-6 * (1 + std::abs(double{cw[k]})))
        << "weight " << i << " skipped " << skipped(i);
    ASSERT_NEAR(whole[1][k], cm[k], 1e-6 * (1 + std::abs(double{cm[k]}))) << "exp_avg " << i;
    ASSERT_NEAR(whole[2][k], cv[k], 1e-6 * (1 + std::abs(double{cv[k]}))) << "exp_avg_sq " << i;
  }
  EXPECT_EQ(whole[3], whole[0]) << "params in fp32 are the master weights";
  const auto chunked = gpu(m, v, g, 300001);  // inside a range or not, the answer is the same
  EXPECT_EQ(chunked[0], whole[0]);
  EXPECT_EQ(chunked[1], whole[1]);
  EXPECT_EQ(chunked[2], whole[2]);

  const std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
  const auto still = gpu(zeros, zeros, zeros, 0);
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    if (skipped(i)) {
      ASSERT_EQ(still[0][k], w[k]) << "undecayed weight " << i;
    } else {
      ASSERT_FLOAT_EQ(still[0][k], w[k] - c.decay * w[k]) << "decayed weight " << i;
    }
  }
}

// Lion through the GPU's optimizer dispatch as the CPU update computes it, on a view cut by a no-decay
// table: the sign of each element's direction the CPU's (a wrong one moves it by 2 lr), chunks bit for
// bit the whole, bf16 weights the master weights rounded, and an element with no gradient and no
// moment left where it is.
TEST(CudaKernels, LionThroughTheDispatchMatchesTheCpuUpdate) {
  REQUIRE_GPUS(1);
  const int64_t n = (int64_t{1} << 20) + 37;
  const std::vector<ElementRange> skip = {{0, 3}, {5000, 90000}, {n - 1, n}};
  const auto table = upload(skip);
  const NoDecayRanges on_device{table.data(), static_cast<int64_t>(skip.size())};
  OptimizerStep step;
  step.kind = OptimizerKind::kLion;
  step.lr = 1e-3;
  step.beta1 = 0.9;
  step.beta2 = 0.99;
  step.weight_decay = 0.5;
  step.grad_multiplier = 0.25;

  std::vector<float> w, m, g, unused;
  random_values<float>(static_cast<size_t>(n), 1.0f, 51, w, unused);
  random_values<float>(static_cast<size_t>(n), 0.1f, 52, m, unused);
  random_values<float>(static_cast<size_t>(n), 1.0f, 53, g, unused);
  g[6000] = 0.0f;  // in a no-decay range
  m[6000] = 0.0f;
  auto gpu = [&](int64_t split) {
    auto dw = upload(w), dm = upload(m), dg = upload(g);
    DeviceBuffer<__nv_bfloat16> params(static_cast<size_t>(n));
    const std::pair<int64_t, int64_t> chunks[] = {{0, split}, {split, n}};
    for (const auto& [lo, hi] : chunks) {
      float* states[] = {dw.data() + lo, dm.data() + lo};
      optimizer_update<__nv_bfloat16>(step, states, dg.data() + lo, params.data() + lo, hi - lo, on_device.at(lo),
                                      nullptr);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return std::make_tuple(download(dw), download(dm), download(params));
  };
  const auto [gw, gm, gp] = gpu(0);
  std::vector<float> cw = w, cm = m;
  cpu_lion(cw, cm, g, LionCoefficients::of(step), {skip.data(), static_cast<int64_t>(skip.size())});
  for (size_t i = 0; i < cw.size(); ++i) {
    ASSERT_NEAR(gw[i], cw[i], 1e-6 * (1 + std::abs(double{cw[i]}))) << "weight " << i;
    ASSERT_NEAR(gm[i], cm[i], 1e-6 * (1 + std::abs(double{cm[i]}))) << "exp_avg " << i;
    ASSERT_EQ(ckpt::fp32_to_bf16(gw[i]), reinterpret_cast<const uint16_t&>(gp[i])) << "bf16 weight " << i;
  }
  EXPECT_EQ(gw[6000], w[6000]) << "no gradient, no moment, no decay: not moved";
  const auto [chunked, chunked_m, chunked_p] = gpu(300001);
  EXPECT_EQ(chunked, gw);
  EXPECT_EQ(chunked_m, gm);
}

// Each fused epilogue against a plain product followed by the separate kernels, in fp32 (where a GELU
// other than the tanh approximation would show) and in bf16; odd sizes exercise the unaligned paths.
template <typename T>
void check_epilogues(double tolerance) {
  const int m = 300, n = 136, k = 200;
  std::vector<T> a_t, b_t, bias_t, res_t, dout_t;
  std::vector<float> unused;
  random_values<T>(size_t{1} * m * k, 1.0f, 11, a_t, unused);
  random_values<T>(size_t{1} * k * n, 1.0f / std::sqrt(float(k)), 12, b_t, unused);
  random_values<T>(n, 1.0f, 13, bias_t, unused);
  random_values<T>(size_t{1} * m * n, 1.0f, 14, res_t, unused);
  auto a = upload(a_t), b = upload(b_t), bias = upload(bias_t), res = upload(res_t);
  const size_t mn = size_t{1} * m * n;
  cublasHandle_t cublas;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  Matmul matmul(nullptr);
  auto plain = [&](bool trans_b) {  // a (m x k) @ op(b), b stored k x n (or n x k transposed)
    DeviceBuffer<T> out(mn);
    gemm<T, T>(cublas, false, trans_b, m, n, k, 1.0f, a.data(), k, b.data(), trans_b ? k : n, 0.0f, out.data(), n);
    return out;
  };
  // bias (+ residual)
  DeviceBuffer<T> fused(mn), pre(mn), want_pre(mn);
  matmul.run<T>(Epilogue::kBias, false, false, m, n, k, a.data(), k, b.data(), n, fused.data(), n, bias.data(), nullptr,
                res.data());
  auto want = plain(false);
  bias_forward(want.data(), bias.data(), m, n, nullptr);
  add_inplace(want.data(), res.data(), static_cast<int64_t>(mn), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(relative_error(widen(download(fused)), widen(download(want))), tolerance) << "bias + residual";
  // bias, then GELU; the pre-activation kept
  matmul.run<T>(Epilogue::kBiasGelu, false, false, m, n, k, a.data(), k, b.data(), n, fused.data(), n, bias.data(),
                pre.data());
  want_pre = plain(false);
  bias_forward(want_pre.data(), bias.data(), m, n, nullptr);
  gelu_forward(want.data(), want_pre.data(), static_cast<int64_t>(mn), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(relative_error(widen(download(pre)), widen(download(want_pre))), tolerance) << "pre-activation";
  EXPECT_LT(relative_error(widen(download(fused)), widen(download(want))), tolerance) << "gelu";
  // GELU's gradient on a transposed product: d = (a @ b^T) * gelu'(pre), b read as n x k
  matmul.run<T>(Epilogue::kDGelu, false, true, m, n, k, a.data(), k, b.data(), k, fused.data(), n, nullptr,
                want_pre.data());
  want = plain(true);
  gelu_backward(want.data(), want_pre.data(), want.data(), static_cast<int64_t>(mn), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(relative_error(widen(download(fused)), widen(download(want))), tolerance) << "gelu backward";
  cublasDestroy(cublas);
}

TEST(CudaKernels, FusedEpiloguesMatchSeparateKernelsFp32) {
  REQUIRE_GPUS(1);
  check_epilogues<float>(2e-5);
}

TEST(CudaKernels, FusedEpiloguesMatchSeparateKernelsBf16) {
  REQUIRE_GPUS(1);
  check_epilogues<__nv_bfloat16>(1e-2);
}

}  // namespace
}  // namespace shardkit::trainer::cuda
