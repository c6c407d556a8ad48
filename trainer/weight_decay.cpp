#include "trainer/weight_decay.hpp"

#include <algorithm>
#include <string>

#include "base/error.hpp"

namespace shardkit::trainer {

std::vector<bool> decay_flags(const model::Model& model) {
  std::vector<bool> flags(model.table().size());
  for (size_t t = 0; t < flags.size(); ++t) flags[t] = model.decays(static_cast<int>(t));
  return flags;
}

std::vector<ElementRange> no_decay_ranges(std::span<const ckpt::Fragment> plan, const std::vector<bool>& decays) {
  std::vector<ckpt::Fragment> sorted(plan.begin(), plan.end());
  std::ranges::sort(sorted, {}, &ckpt::Fragment::flat_offset);
  std::vector<ElementRange> ranges;
  bool extend = false;  // the previous fragment did not decay: this one may continue its range
  for (const ckpt::Fragment& f : sorted) {
    if (f.tensor < 0 || static_cast<size_t>(f.tensor) >= decays.size()) {
      fail(ErrorKind::kInternal, "weight decay: tensor " + std::to_string(f.tensor) + " has no decay flag (" +
                                     std::to_string(decays.size()) + " tensors)");
    }
    if (decays[static_cast<size_t>(f.tensor)]) {
      extend = false;
      continue;
    }
    if (extend) {
      ranges.back().end = f.flat_offset + f.length;
    } else {
      ranges.push_back({f.flat_offset, f.flat_offset + f.length});
    }
    extend = true;
  }
  return ranges;
}

}  // namespace shardkit::trainer
