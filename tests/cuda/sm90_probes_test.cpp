// The sm_90 kernels' building blocks (tests/cuda/sm90_probes.hpp) against the host: the copy engine's
// tile in its swizzled layout bit for bit, and both warpgroup products to fp32 rounding. Skipped (with
// a message) on any device but compute capability 9.0, and without a GPU.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/cuda/cuda_common.hpp"
#include "tests/cuda/device_values.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "tests/cuda/sm90_probes.hpp"

namespace shardkit::testing {
namespace {

using model::cuda::DeviceBuffer;
using Bf16 = __nv_bfloat16;

const uint16_t* bits_of(const DeviceBuffer<Bf16>& d) {
  return reinterpret_cast<const uint16_t*>(d.data());
}

TEST(Sm90Probes, TileArrivesThroughTheCopyEngineInTheSwizzledLayout) {
  REQUIRE_SM90();
  // Two batches of 100 rows of 4 chunks (256 columns) with 64 more elements a row (a packed layout):
  // every element a different value.
  const int64_t batches = 2, rows = 100, chunks = 4, ld = chunks * 64 + 64;
  std::vector<uint16_t> src(static_cast<size_t>(batches * rows * ld));
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 7 % 65521 + 1);
  auto d_src = upload(src);
  struct Case {
    int box_rows, hs, first_chunk, row, batch;
  };
  for (const Case c : {Case{64, 128, 2, 64, 1}, Case{128, 64, 1, 0, 0}, Case{64, 128, 0, 8, 0}}) {
    const std::string what = "box " + std::to_string(c.box_rows) + " x " + std::to_string(c.hs) + " at chunk " +
                             std::to_string(c.first_chunk) + ", row " + std::to_string(c.row) + ", batch " +
                             std::to_string(c.batch);
    DeviceBuffer<uint16_t> out(static_cast<size_t>(c.box_rows) * c.hs);
    sm90_probes::tma_round_trip(out.data(), d_src.data(), chunks, rows, batches, ld, c.box_rows, c.hs, c.first_chunk,
                                c.row, c.batch);
    finish_within(30, "the copy engine probe, " + what);
    const auto got = download(out);
    for (int r = 0; r < c.box_rows; ++r) {
      for (int col = 0; col < c.hs; ++col) {
        const int64_t row = c.row + r;
        const uint16_t want = row < rows ? src[c.batch * rows * ld + row * ld + c.first_chunk * 64 + col] : 0;
        ASSERT_EQ(got[static_cast<size_t>(r) * c.hs + col], want) << what << ": row " << r << ", column " << col;
      }
    }
  }
}

// a (rows x cols) * b^T (b: n x cols) in double.
std::vector<float> product_abt(const std::vector<float>& a, const std::vector<float>& b, int rows, int n, int cols) {
  std::vector<float> out(static_cast<size_t>(rows) * n);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int k = 0; k < cols; ++k) sum += double{a[size_t{1} * i * cols + k]} * double{b[size_t{1} * j * cols + k]};
      out[size_t{1} * i * n + j] = static_cast<float>(sum);
    }
  }
  return out;
}

TEST(Sm90Probes, ProductOfTwoSharedTilesMatchesTheHost) {
  REQUIRE_SM90();
  for (const int n : {64, 128}) {
    for (const int hs : {64, 128}) {
      std::vector<Bf16> a, b;
      std::vector<float> af, bf;
      random_values<Bf16>(size_t{64} * hs, 1.0f, 31, a, af);
      random_values<Bf16>(size_t{1} * n * hs, 1.0f, 32, b, bf);
      auto da = upload(a), db = upload(b);
      DeviceBuffer<float> out(size_t{64} * n);
      sm90_probes::product_abt(out.data(), bits_of(da), bits_of(db), n, hs);
      finish_within(30, "the shared-tile product probe");
      EXPECT_LT(relative_error(download(out), product_abt(af, bf, 64, n, hs)), 1e-5) << "n " << n << ", hs " << hs;
    }
  }
}

TEST(Sm90Probes, ProductFromRegisterFragmentsMatchesTheHost) {
  REQUIRE_SM90();
  for (const int k : {64, 128}) {
    for (const int hs : {64, 128}) {
      std::vector<Bf16> p16, b;
      std::vector<float> p, bf;
      random_values<Bf16>(size_t{64} * k, 1.0f, 33, p16, p);  // p already representable in bf16
      random_values<Bf16>(size_t{1} * k * hs, 1.0f, 34, b, bf);
      // b^T (hs x k), so that the host's product_abt computes p * b.
      std::vector<float> bt(bf.size());
      for (int r = 0; r < k; ++r) {
        for (int c = 0; c < hs; ++c) bt[size_t{1} * c * k + r] = bf[size_t{1} * r * hs + c];
      }
      auto dp = upload(p);
      auto db = upload(b);
      DeviceBuffer<float> out(size_t{64} * hs);
      sm90_probes::product_pb(out.data(), dp.data(), bits_of(db), k, hs);
      finish_within(30, "the register-fragment product probe");
      EXPECT_LT(relative_error(download(out), product_abt(p, bt, 64, hs, k)), 1e-5) << "k " << k << ", hs " << hs;
    }
  }
}

}  // namespace
}  // namespace shardkit::testing
