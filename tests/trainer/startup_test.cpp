// Start-up at scale: initial weights do not depend on the number of threads that draw them, and a slow
// start-up phase is announced while it runs (a quick one says nothing).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "model/cpu/gemm.hpp"
#include "model/registry.hpp"
#include "trainer/init.hpp"
#include "trainer/slow_phase.hpp"

namespace shardkit {
namespace {

std::vector<float> initial(const model::Model& m, int tensor, int64_t offset, size_t n, int threads) {
  model::cpu::set_compute_threads(threads);
  std::vector<float> out(n);
  trainer::init_values(trainer::RandomInit(m, 99), tensor, offset, out);
  return out;
}

TEST(Startup, InitialWeightsAreTheSameBitsOnAnyNumberOfThreadsAndInAnyPieces) {
  const auto m = model::resolve_model("llama-tiny");
  for (size_t t = 0; t < m->table().size(); ++t) {
    const int tensor = static_cast<int>(t);
    const auto n = static_cast<size_t>(m->table()[t].numel());
    const std::vector<float> one = initial(*m, tensor, 0, n, 1);
    EXPECT_EQ(std::memcmp(one.data(), initial(*m, tensor, 0, n, 3).data(), n * sizeof(float)), 0) << t;
    // The second half drawn on its own, as a rank whose partition starts there draws it.
    const std::vector<float> half = initial(*m, tensor, static_cast<int64_t>(n / 2), n - n / 2, 2);
    EXPECT_EQ(std::memcmp(one.data() + n / 2, half.data(), half.size() * sizeof(float)), 0) << t;
  }
}

class Lines {
 public:
  trainer::SlowPhases::Log log() {
    return [this](const std::string& line) {
      const std::lock_guard lock(mutex_);
      lines_.push_back(line);
    };
  }
  std::vector<std::string> get() {
    const std::lock_guard lock(mutex_);
    return lines_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

TEST(Startup, ASlowPhaseIsAnnouncedWhileItRunsAndTimedWhenItEnds) {
  Lines lines;
  {
    trainer::SlowPhases phases(lines.log(), std::chrono::milliseconds(50));
    phases.run("quick", [] {});
    phases.run("initialising 7 parameters", [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
    EXPECT_THROW(phases.run("failing", [] { throw std::runtime_error("no"); }), std::runtime_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // a failed phase is never announced late
  }
  const std::vector<std::string> got = lines.get();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], "initialising 7 parameters ...");
  EXPECT_EQ(got[1].rfind("initialising 7 parameters done in 0.", 0), 0u) << got[1];
}

}  // namespace
}  // namespace shardkit
