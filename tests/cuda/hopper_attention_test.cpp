// The sm_90 attention kernels (model/cuda/hopper_attention.hpp) against the fp32 kernels on the same
// rounded inputs, forward and backward: separate and packed q, k, v, grouped-query heads, sequences
// shorter than a tile and not a multiple of it, both 16-bit types; the causal mask bit for bit, and the
// same bits on every run. Skipped (with a message) on any device but compute capability 9.0, and
// without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "model/cuda/attention_kernels.hpp"
#include "model/cuda/cuda_common.hpp"
#include "model/cuda/hopper_attention.hpp"
#include "model/cuda/kernels.hpp"
#include "tests/cuda/device_values.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit::model::cuda {
namespace {

using namespace shardkit::testing;

struct Case {
  int B, S, NH, NKV, HS;
  bool packed;  // q, k, v side by side in one row (GPT-2's qkv) rather than three buffers
  std::string name() const {
    return "B=" + std::to_string(B) + " S=" + std::to_string(S) + " NH=" + std::to_string(NH) +
           " NKV=" + std::to_string(NKV) + " HS=" + std::to_string(HS) + (packed ? " packed" : " separate");
  }
};

// Inputs of a case in T and as the floats they round to, laid out as the case says; the three
// operands' offsets and row strides.
template <typename T>
struct Inputs {
  std::vector<T> t;
  std::vector<float> f;
  size_t q_at, k_at, v_at;
  AttentionShape shape;
};

template <typename T>
Inputs<T> make_inputs(const Case& c, uint32_t seed) {
  Inputs<T> in;
  const int64_t N = int64_t{c.B} * c.S, QW = int64_t{c.NH} * c.HS, KW = int64_t{c.NKV} * c.HS;
  random_values<T>(static_cast<size_t>(N * (QW + 2 * KW)), 1.0f, seed, in.t, in.f);
  if (c.packed) {
    in.q_at = 0;
    in.k_at = static_cast<size_t>(QW);
    in.v_at = static_cast<size_t>(QW + KW);
    in.shape = AttentionShape{c.B, c.S, c.NH, c.NKV, c.HS, QW + 2 * KW, QW + 2 * KW};
  } else {
    in.q_at = 0;
    in.k_at = static_cast<size_t>(N * QW);
    in.v_at = static_cast<size_t>(N * (QW + KW));
    in.shape = AttentionShape{c.B, c.S, c.NH, c.NKV, c.HS, QW, KW};
  }
  return in;
}

// The forward pass's output and lse; the backward pass's gradients of q, k and v (each read out of the
// gradient buffer, which has the inputs' layout) for the output gradient `dout`.
struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

// Rows of one operand (width columns from offset `at`, rows `ld` apart) of a buffer of N rows.
std::vector<float> operand_rows(const std::vector<float>& buffer, size_t at, int64_t ld, int64_t N, int64_t width) {
  std::vector<float> rows;
  for (int64_t n = 0; n < N; ++n) {
    const auto first = buffer.begin() + static_cast<std::ptrdiff_t>(at + n * ld);
    rows.insert(rows.end(), first, first + width);
  }
  return rows;
}

// Forward and backward through `forward` and `backward` (the sm_90 kernels or the fp32 ones).
template <typename T, typename Forward, typename Backward>
Result run(const Inputs<T>& in, const std::vector<T>& dout_host, Forward&& forward, Backward&& backward) {
  const auto& a = in.shape;
  const int64_t N = int64_t{a.B} * a.S, QW = int64_t{a.NH} * a.HS, KW = int64_t{a.NKV} * a.HS;
  auto d = upload(in.t);
  auto dout = upload(dout_host);
  DeviceBuffer<T> out(static_cast<size_t>(N * QW)), grads(in.t.size());
  DeviceBuffer<float> lse(static_cast<size_t>(N * a.NH)), delta(static_cast<size_t>(N * a.NH));
  const T *q = d.data() + in.q_at, *k = d.data() + in.k_at, *v = d.data() + in.v_at;
  forward(out.data(), lse.data(), q, k, v, a);
  backward(grads.data() + in.q_at, grads.data() + in.k_at, grads.data() + in.v_at, delta.data(), dout.data(),
           out.data(), q, k, v, lse.data(), a);
  finish_within(60, "attention forward and backward");
  const auto g = widen(download(grads));
  const int64_t ld_q = a.ld_q, ld_kv = a.ld_kv;
  return {widen(download(out)), download(lse), operand_rows(g, in.q_at, ld_q, N, QW),
          operand_rows(g, in.k_at, ld_kv, N, KW), operand_rows(g, in.v_at, ld_kv, N, KW)};
}

// (The kernels refuse, by throwing, a call hopper_attention_supports would answer no.)
template <typename T>
Result run_hopper(const Inputs<T>& in, const std::vector<T>& dout) {
  return run(
      in, dout, [](auto... args) { hopper_attention_forward<T>(args..., nullptr); },
      [](auto... args) { hopper_attention_backward<T>(args..., nullptr); });
}

Result run_fp32(const Inputs<float>& in, const std::vector<float>& dout) {
  return run(
      in, dout, [](auto... args) { attention_forward<float>(args..., nullptr); },
      [](auto... args) { attention_backward<float>(args..., nullptr); });
}

template <typename T>
std::vector<T> output_gradient(const Inputs<T>& in, std::vector<float>& as_float) {
  std::vector<T> dout;
  random_values<T>(size_t{1} * in.shape.B * in.shape.S * in.shape.NH * in.shape.HS, 1.0f, 22, dout, as_float);
  return dout;
}

const Case kCases[] = {
    {2, 100, 4, 4, 64, true},     // GPT-2's packed qkv, S not a multiple of the tiles
    {1, 1024, 2, 2, 64, true},    // GPT-2's sequence
    {2, 300, 8, 2, 128, false},   // grouped-query (4 heads a group), the largest head size
    {1, 2048, 4, 4, 128, false},  // llama-2-7b's sequence: many tiles, both pipeline stages reused
    {3, 17, 2, 1, 128, false},    // shorter than one tile, one kv head
    {1, 640, 3, 1, 64, true},     // packed with one kv head (rows 3 heads + 2 wide)
    {2, 333, 8, 2, 64, false},    // tinyllama's grouping at head size 64, S not a multiple of the tiles
};

// The tolerances of kernels_test.cpp's mma.sync kernels against fp32: 16-bit outputs, probabilities
// rounded before each product, and a backward pass from the rounded output.
template <typename T>
void check_against_fp32() {
  for (const auto& c : kCases) {
    const auto in = make_inputs<T>(c, 21);
    std::vector<float> dout_f;
    const auto dout = output_gradient(in, dout_f);
    const Inputs<float> in32{in.f, in.f, in.q_at, in.k_at, in.v_at, in.shape};
    const Result got = run_hopper(in, dout), want = run_fp32(in32, dout_f);
    EXPECT_LT(relative_error(got.out, want.out), 1e-2) << "out " << c.name();
    EXPECT_LT(relative_error(got.lse, want.lse), 1e-3) << "lse " << c.name();
    EXPECT_LT(relative_error(got.dq, want.dq), 2e-2) << "dq " << c.name();
    EXPECT_LT(relative_error(got.dk, want.dk), 2e-2) << "dk " << c.name();
    EXPECT_LT(relative_error(got.dv, want.dv), 2e-2) << "dv " << c.name();
  }
}

TEST(HopperAttention, Bf16MatchesFp32) {
  REQUIRE_SM90();
  check_against_fp32<__nv_bfloat16>();
}

TEST(HopperAttention, Fp16MatchesFp32) {
  REQUIRE_SM90();
  check_against_fp32<__half>();
}

TEST(HopperAttention, CausalMaskHoldsBitForBitAndRunsRepeat) {
  REQUIRE_SM90();
  // Changing the last key and value rows must leave every output row but the last untouched, and a
  // second run must give the same bits, gradients included (grouped heads summed in a fixed order).
  const Case c{1, 130, 4, 2, 128, true};
  auto in = make_inputs<__nv_bfloat16>(c, 5);
  std::vector<float> unused;
  const auto dout = output_gradient(in, unused);
  const Result before = run_hopper(in, dout), again = run_hopper(in, dout);
  EXPECT_EQ(again.out, before.out) << "a second run";
  EXPECT_EQ(again.dq, before.dq) << "a second run";
  EXPECT_EQ(again.dk, before.dk) << "a second run";
  EXPECT_EQ(again.dv, before.dv) << "a second run";
  const int64_t row = in.shape.ld_q * (c.S - 1);
  for (int i = 0; i < 2 * c.NKV * c.HS; ++i) in.t[static_cast<size_t>(row) + in.k_at + i] = to<__nv_bfloat16>(5.0f);
  const Result after = run_hopper(in, dout);
  const size_t C = size_t{1} * c.NH * c.HS;
  for (size_t i = 0; i < (c.S - 1) * C; ++i) ASSERT_EQ(before.out[i], after.out[i]) << "element " << i;
  EXPECT_NE(std::vector<float>(before.out.end() - C, before.out.end()),
            std::vector<float>(after.out.end() - C, after.out.end()));
}

// Needs no sm_90 device: the shapes the kernel does not take are answered before any device query.
TEST(HopperAttention, ShapesItDoesNotTakeAreNotOffered) {
  alignas(16) static const __nv_bfloat16 buffer[64] = {};
  const AttentionShape head32{1, 8, 2, 2, 32, 64, 64};
  EXPECT_FALSE(hopper_attention_supports(head32, buffer, buffer, buffer));
  const AttentionShape odd_stride{1, 8, 1, 1, 64, 68, 68};  // 136-byte rows: not a multiple of 16
  EXPECT_FALSE(hopper_attention_supports(odd_stride, buffer, buffer, buffer));
  const AttentionShape fine{1, 8, 1, 1, 64, 64, 64};
  EXPECT_FALSE(hopper_attention_supports(fine, buffer + 1, buffer, buffer)) << "a q base off 16 bytes";
}

// Needs no GPU: the setting's words, and a refusal that names the variable.
TEST(HopperAttention, SettingIsReadByNameAndOtherWordsAreRefused) {
  EXPECT_EQ(parse_attention_kernels("mma"), AttentionKernels::kMma);
  EXPECT_EQ(parse_attention_kernels("sm90"), AttentionKernels::kSm90);
  EXPECT_EQ(parse_attention_kernels("auto"), AttentionKernels::kAuto);
  try {
    parse_attention_kernels("flash");
    FAIL() << "flash was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("SHARDKIT_ATTENTION=flash: expected mma, sm90 or auto"), std::string::npos)
        << e.what();
  }
  // mma never asks the device; sm90 refuses a head size the kernels do not have, by name.
  alignas(16) static const __nv_bfloat16 buffer[64] = {};
  const AttentionShape head32{1, 8, 2, 2, 32, 64, 64};
  EXPECT_FALSE(use_hopper_attention(AttentionKernels::kMma, head32, buffer, buffer, buffer, nullptr));
  EXPECT_FALSE(use_hopper_attention(AttentionKernels::kAuto, head32, buffer, buffer, buffer, nullptr));
  try {
    use_hopper_attention(AttentionKernels::kSm90, head32, buffer, buffer, buffer, nullptr);
    FAIL() << "head size 32 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SHARDKIT_ATTENTION=sm90"), std::string::npos) << e.what();
  }
}

// Needs no GPU: unset (or empty), the setting is auto, so Hopper GPUs get their own kernels without
// being asked; set, it is the word given.
TEST(HopperAttention, TheSettingDefaultsToAuto) {
  const char* text = std::getenv(kAttentionVariable);
  const bool unset = text == nullptr || *text == '\0';
  EXPECT_EQ(attention_kernels(), unset ? AttentionKernels::kAuto : parse_attention_kernels(text));
}

}  // namespace
}  // namespace shardkit::model::cuda
