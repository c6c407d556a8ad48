// The CPU models' output projection fused with the cross-entropy (model/cpu/ops.hpp,
// head_forward_backward) against a direct double-precision evaluation: the summed loss, d(input) and
// d(weight), with row counts across its blocks of rows and vocabularies off its vector lanes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "model/cpu/ops.hpp"
#include "tests/support/numeric_checks.hpp"

namespace shardkit::model::cpu {
namespace {

struct Case {
  int N, C, V;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "N " << c.N << ", C " << c.C << ", V " << c.V;
}

class CpuHead : public ::testing::TestWithParam<Case> {};

TEST_P(CpuHead, FollowsTheDefinitionInDoublePrecision) {
  const Case c = GetParam();
  const std::vector<float> x = testing::normal_values(static_cast<size_t>(c.N) * c.C, 1.0f, 3);
  const std::vector<float> w =
      testing::normal_values(static_cast<size_t>(c.V) * c.C, 0.5f, 4);  // logits of a few units
  std::vector<int32_t> targets(static_cast<size_t>(c.N));
  for (int r = 0; r < c.N; ++r) targets[r] = (r * 7919) % c.V;
  constexpr float kGradScale = 2.0f;
  const int64_t n_total = 2 * c.N;  // as if another rank held as many rows

  const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
  const double grad_scale = kGradScale;
  double loss = 0.0;
  std::vector<double> dx(x.size()), dw(w.size());
  for (int r = 0; r < c.N; ++r) {
    std::vector<double> logit(static_cast<size_t>(c.V));
    for (int v = 0; v < c.V; ++v) {
      for (int i = 0; i < c.C; ++i) logit[v] += xd[r * c.C + i] * wd[v * c.C + i];
    }
    const double max = *std::max_element(logit.begin(), logit.end());
    double sum = 0.0;
    for (double l : logit) sum += std::exp(l - max);
    loss += max + std::log(sum) - logit[targets[r]];
    for (int v = 0; v < c.V; ++v) {
      const double g =
          (std::exp(logit[v] - max) / sum - (v == targets[r] ? 1.0 : 0.0)) * grad_scale / static_cast<double>(n_total);
      for (int i = 0; i < c.C; ++i) {
        dx[r * c.C + i] += g * wd[v * c.C + i];
        dw[v * c.C + i] += g * xd[r * c.C + i];
      }
    }
  }

  std::vector<float> logits(static_cast<size_t>(kHeadBlockRows) * c.V), got_dx(x.size()), got_dw(w.size(), 0.0f);
  const double got = head_forward_backward(got_dx.data(), got_dw.data(), logits.data(), x.data(), w.data(),
                                           targets.data(), c.N, c.C, c.V, kGradScale, n_total);
  EXPECT_NEAR(got, loss, 1e-6 * loss);
  EXPECT_LT(testing::relative_error(got_dx, dx), 1e-5);
  EXPECT_LT(testing::relative_error(got_dw, dw), 1e-5);
  // Without the gradient (evaluation): the same loss.
  const double scored = head_forward_backward(nullptr, nullptr, logits.data(), x.data(), w.data(), targets.data(), c.N,
                                              c.C, c.V, kGradScale, n_total);
  EXPECT_EQ(scored, got);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuHead,
                         ::testing::Values(Case{1, 8, 3},       // a vocabulary below one lane group
                                           Case{5, 16, 37},     // one partial block of rows
                                           Case{70, 12, 1003},  // a block and a partial one; V off the lanes
                                           Case{64, 24, 256}),  // whole blocks and lanes
                         [](const ::testing::TestParamInfo<Case>& shape) {
                           return "N" + std::to_string(shape.param.N) + "_C" + std::to_string(shape.param.C) + "_V" +
                                  std::to_string(shape.param.V);
                         });

}  // namespace
}  // namespace shardkit::model::cpu
