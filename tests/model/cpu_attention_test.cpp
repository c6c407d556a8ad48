// The CPU models' causal attention (model/cpu/ops.hpp) against a direct double-precision evaluation of
// its definition: the output, the statistics and all three gradients, at shapes that cross the
// kernels' row blocks (sequences shorter than a block, a block and one row, several blocks with a
// partial last), head sizes that are not a multiple of the dot product's lanes, grouped-query heads,
// and the packed q|k|v rows GPT-2 uses. Also: the backward pass leaves the rest of a packed gradient
// buffer alone, and the same inputs give the same bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "model/cpu/ops.hpp"
#include "tests/support/numeric_checks.hpp"

namespace shardkit::model::cpu {
namespace {

struct Case {
  int B, T, NH, NKV, D;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "B " << c.B << ", T " << c.T << ", heads " << c.NH << ", kv heads " << c.NKV << ", D " << c.D;
}

// q, k and v rows packed as GPT-2 and Llama's CPU models pack them: [q heads | k heads | v heads].
struct Packed {
  Case c;
  int64_t width() const { return static_cast<int64_t>(c.NH + 2 * c.NKV) * c.D; }
  int64_t rows() const { return static_cast<int64_t>(c.B) * c.T; }
  int64_t q_at(int b, int t, int h) const { return (static_cast<int64_t>(b) * c.T + t) * width() + h * c.D; }
  int64_t k_at(int b, int t, int g) const { return q_at(b, t, 0) + (c.NH + g) * c.D; }
  int64_t v_at(int b, int t, int g) const { return q_at(b, t, 0) + (c.NH + c.NKV + g) * c.D; }
  AttentionShape shape() const { return {c.B, c.T, c.NH, c.NKV, c.D, width(), width()}; }
};

struct Reference {
  std::vector<double> out, dqkv;
};

// softmax_u<=t(q_t . k_u / sqrt(D)) v_u and its gradients for d(out), in double.
Reference reference(const Packed& p, const std::vector<float>& qkv_f, const std::vector<float>& dout_f) {
  const Case c = p.c;
  const std::vector<double> qkv(qkv_f.begin(), qkv_f.end()), dout(dout_f.begin(), dout_f.end());
  const int group = c.NH / c.NKV;
  const int64_t OW = static_cast<int64_t>(c.NH) * c.D;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  Reference r{std::vector<double>(static_cast<size_t>(p.rows() * OW)),
              std::vector<double>(static_cast<size_t>(p.rows() * p.width()))};
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.NH; ++h) {
      const int g = h / group;
      for (int t = 0; t < c.T; ++t) {
        std::vector<double> prob(static_cast<size_t>(t) + 1);
        double max = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double s = 0.0;
          for (int i = 0; i < c.D; ++i) s += qkv[p.q_at(b, t, h) + i] * qkv[p.k_at(b, u, g) + i];
          prob[u] = s * scale;
          max = std::max(max, prob[u]);
        }
        double sum = 0.0;
        for (double& x : prob) sum += x = std::exp(x - max);
        for (double& x : prob) x /= sum;
        const int64_t o_at = (static_cast<int64_t>(b) * c.T + t) * OW + h * c.D;
        std::vector<double> dprob(prob.size());
        double dot_sum = 0.0;
        for (int u = 0; u <= t; ++u) {
          for (int i = 0; i < c.D; ++i) {
            r.out[o_at + i] += prob[u] * qkv[p.v_at(b, u, g) + i];
            dprob[u] += dout[o_at + i] * qkv[p.v_at(b, u, g) + i];
            r.dqkv[p.v_at(b, u, g) + i] += prob[u] * dout[o_at + i];
          }
          dot_sum += dprob[u] * prob[u];
        }
        for (int u = 0; u <= t; ++u) {
          const double ds = prob[u] * (dprob[u] - dot_sum) * scale;
          for (int i = 0; i < c.D; ++i) {
            r.dqkv[p.q_at(b, t, h) + i] += ds * qkv[p.k_at(b, u, g) + i];
            r.dqkv[p.k_at(b, u, g) + i] += ds * qkv[p.q_at(b, t, h) + i];
          }
        }
      }
    }
  }
  return r;
}

// A workspace for `threads` threads (0: every thread) at `shape`, filled with NaN: what was in it before
// must not matter.
std::vector<float> workspace(const AttentionShape& shape, int threads = 0) {
  const int all = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  const int64_t floats = attention_workspace_floats(shape);
  omp_set_num_threads(all);
  return std::vector<float>(static_cast<size_t>(floats), std::nanf(""));
}

class CpuAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CpuAttention, FollowsTheDefinitionInDoublePrecision) {
  const Packed p{GetParam()};
  const Case c = p.c;
  const int64_t OW = static_cast<int64_t>(c.NH) * c.D;
  // Spread 2 gives scores of several units, so the softmax is far from uniform.
  const std::vector<float> qkv = testing::normal_values(static_cast<size_t>(p.rows() * p.width()), 2.0f, 7);
  const std::vector<float> dout = testing::normal_values(static_cast<size_t>(p.rows() * OW), 1.0f, 8);
  const Reference ref = reference(p, qkv, dout);
  std::vector<float> ws = workspace(p.shape());

  std::vector<float> out(static_cast<size_t>(p.rows() * OW)), stats(attention_stats_floats(c.B, c.NH, c.T));
  attention_forward(out.data(), stats.data(), qkv.data(), qkv.data() + c.NH * c.D, qkv.data() + (c.NH + c.NKV) * c.D,
                    p.shape(), ws);
  EXPECT_LT(testing::relative_error(out, ref.out), 1e-5);

  // A sentinel in every element: the q|k|v columns must all be written, nothing else is there to touch.
  constexpr float kSentinel = 12345.0f;
  std::vector<float> dqkv(qkv.size(), kSentinel);
  attention_backward(dqkv.data(), dqkv.data() + c.NH * c.D, dqkv.data() + (c.NH + c.NKV) * c.D, dout.data(), qkv.data(),
                     qkv.data() + c.NH * c.D, qkv.data() + (c.NH + c.NKV) * c.D, stats.data(), p.shape(), ws);
  EXPECT_EQ(std::count(dqkv.begin(), dqkv.end(), kSentinel), 0);
  EXPECT_LT(testing::relative_error(dqkv, ref.dqkv), 1e-5);

  // Again, into a buffer of other contents, on one thread: the same bits (nothing accumulates into
  // stale values, no order depends on the threads).
  std::vector<float> again(qkv.size(), -1.0f);
  ws = workspace(p.shape(), 1);
  attention_backward(again.data(), again.data() + c.NH * c.D, again.data() + (c.NH + c.NKV) * c.D, dout.data(),
                     qkv.data(), qkv.data() + c.NH * c.D, qkv.data() + (c.NH + c.NKV) * c.D, stats.data(), p.shape(),
                     ws);
  EXPECT_EQ(again, dqkv);

  // And in a workspace sized for more sequences and tokens, as a model holds one for its largest batch.
  AttentionShape larger = p.shape();
  larger.B += 1;
  larger.T += 3;
  ws = workspace(larger);
  std::fill(again.begin(), again.end(), -1.0f);
  attention_backward(again.data(), again.data() + c.NH * c.D, again.data() + (c.NH + c.NKV) * c.D, dout.data(),
                     qkv.data(), qkv.data() + c.NH * c.D, qkv.data() + (c.NH + c.NKV) * c.D, stats.data(), p.shape(),
                     ws);
  EXPECT_EQ(again, dqkv);
}

// A workspace sized for multi-head attention lacks the grouped heads' partials: an internal error, not
// a write past its end (the sanitizer build would see one).
TEST(CpuAttention, AWorkspaceWithoutRoomForTheGroupedHeadsIsRefused) {
  const Packed p{{2, 64, 4, 1, 16}};
  const Case c = p.c;
  const std::vector<float> qkv = testing::normal_values(static_cast<size_t>(p.rows() * p.width()), 1.0f, 3);
  const std::vector<float> dout = testing::normal_values(static_cast<size_t>(p.rows() * c.NH * c.D), 1.0f, 4);
  std::vector<float> stats(attention_stats_floats(c.B, c.NH, c.T)), dqkv(qkv.size());
  AttentionShape multi_head = p.shape();
  multi_head.NKV = multi_head.NH;
  std::vector<float> ws = workspace(multi_head, 1);
  EXPECT_THROW(attention_backward(dqkv.data(), dqkv.data() + c.NH * c.D, dqkv.data() + (c.NH + c.NKV) * c.D,
                                  dout.data(), qkv.data(), qkv.data() + c.NH * c.D, qkv.data() + (c.NH + c.NKV) * c.D,
                                  stats.data(), p.shape(), ws),
               Error);
}

// The statistics hold each row's largest scaled score and 1 / its sum of exponentials.
TEST(CpuAttention, StatisticsAreEachRowsMaximumAndInverseSum) {
  const Packed p{{1, 70, 2, 2, 16}};
  const Case c = p.c;
  const std::vector<float> qkv = testing::normal_values(static_cast<size_t>(p.rows() * p.width()), 1.5f, 9);
  std::vector<float> out(static_cast<size_t>(p.rows() * c.NH * c.D)), stats(attention_stats_floats(c.B, c.NH, c.T));
  std::vector<float> ws = workspace(p.shape());
  attention_forward(out.data(), stats.data(), qkv.data(), qkv.data() + c.NH * c.D, qkv.data() + (c.NH + c.NKV) * c.D,
                    p.shape(), ws);
  for (int h = 0; h < c.NH; ++h) {
    for (int t = 0; t < c.T; ++t) {
      std::vector<double> s(static_cast<size_t>(t) + 1);
      for (int u = 0; u <= t; ++u) {
        for (int i = 0; i < c.D; ++i)
          s[u] += static_cast<double>(qkv[p.q_at(0, t, h) + i]) * static_cast<double>(qkv[p.k_at(0, u, h) + i]);
        s[u] /= std::sqrt(static_cast<double>(c.D));
      }
      const double max = *std::max_element(s.begin(), s.end());
      double sum = 0.0;
      for (double x : s) sum += std::exp(x - max);
      const float* st = stats.data() + attention_stats_floats(h, 1, c.T) + kAttentionStatsPerRow * t;
      EXPECT_NEAR(st[0], max, 1e-5 * std::max(1.0, std::abs(max))) << "head " << h << " row " << t;
      EXPECT_NEAR(st[1], 1.0 / sum, 1e-5 / sum) << "head " << h << " row " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuAttention,
                         ::testing::Values(Case{1, 1, 1, 1, 8},      // one token
                                           Case{2, 5, 4, 4, 20},     // shorter than a block; D off the lanes
                                           Case{1, 65, 4, 2, 16},    // a block and one row; grouped heads
                                           Case{2, 130, 6, 2, 24},   // two blocks and a partial one
                                           Case{1, 200, 2, 1, 64},   // one kv head for all
                                           Case{1, 128, 3, 3, 33}),  // whole blocks; an odd head size
                         [](const ::testing::TestParamInfo<Case>& shape) {
                           const Case c = shape.param;
                           return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.NH) +
                                  "_KV" + std::to_string(c.NKV) + "_D" + std::to_string(c.D);
                         });

}  // namespace
}  // namespace shardkit::model::cpu
