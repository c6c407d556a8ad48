#include "ckpt/diff.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace shardkit::ckpt {

double DiffReport::max_abs_diff() const noexcept {
  double m = 0;
  for (const StateDiff& d : entries) m = std::max(m, d.max_abs_diff);
  return m;
}

bool DiffReport::within(double tolerance) const noexcept {
  return only_in_a.empty() && only_in_b.empty() && shape_mismatch.empty() && max_abs_diff() <= tolerance;
}

DiffReport diff_checkpoints(CheckpointReader& a, CheckpointReader& b, const ProgressFn& progress, int64_t piece_elems) {
  DiffReport report;
  const TensorTable& ta = a.tensors();
  const TensorTable& tb = b.tensors();
  for (const TensorInfo& t : ta) {
    if (tb.find(t.name) < 0) report.only_in_a.push_back(t.name);
  }
  for (const TensorInfo& t : tb) {
    if (ta.find(t.name) < 0) report.only_in_b.push_back(t.name);
  }
  std::vector<std::pair<int, int>> states;  // (index in a, index in b)
  for (size_t s = 0; s < a.manifest().states.size(); ++s) {
    const int other = b.find_state(a.manifest().states[s]);
    if (other < 0) {
      report.only_in_a.push_back("state:" + a.manifest().states[s]);
    } else {
      states.emplace_back(static_cast<int>(s), other);
    }
  }
  for (const std::string& s : b.manifest().states) {
    if (a.find_state(s) < 0) report.only_in_b.push_back("state:" + s);
  }

  int64_t total = 0;
  for (const TensorInfo& t : ta) {
    const int j = tb.find(t.name);
    if (j >= 0 && tb[static_cast<size_t>(j)].shape == t.shape) total += t.numel() * static_cast<int64_t>(states.size());
  }
  // Progress counts the bytes read from both checkpoints.
  total *= 2 * static_cast<int64_t>(sizeof(float));
  int64_t done = 0;
  std::vector<float> xa, xb;
  for (size_t i = 0; i < ta.size(); ++i) {
    const TensorInfo& t = ta[i];
    const int j = tb.find(t.name);
    if (j < 0) continue;
    if (tb[static_cast<size_t>(j)].shape != t.shape) {
      report.shape_mismatch.push_back(t.name);
      continue;
    }
    const int64_t n = t.numel();
    for (const auto& [sa, sb] : states) {
      StateDiff d{t.name, a.manifest().states[static_cast<size_t>(sa)], n, 0.0, 0};
      for (int64_t off = 0; off < n; off += piece_elems) {
        const int64_t len = std::min(piece_elems, n - off);
        xa.resize(static_cast<size_t>(len));
        xb.resize(static_cast<size_t>(len));
        a.read(static_cast<int>(i), sa, off, xa);
        b.read(j, sb, off, xb);
        for (size_t k = 0; k < xa.size(); ++k) {
          if (std::memcmp(&xa[k], &xb[k], sizeof(float)) == 0) continue;
          ++d.differing;
          const bool na = std::isnan(xa[k]), nb = std::isnan(xb[k]);
          const double diff = (na || nb) ? (na && nb ? 0.0 : std::numeric_limits<double>::infinity())
                                         : std::fabs(static_cast<double>(xa[k]) - static_cast<double>(xb[k]));
          d.max_abs_diff = std::max(d.max_abs_diff, diff);
        }
        done += 2 * len * static_cast<int64_t>(sizeof(float));
        if (progress) progress(done, total);
      }
      report.entries.push_back(std::move(d));
    }
  }
  return report;
}

}  // namespace shardkit::ckpt
