#include "base/thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace shardkit::ckpt {
namespace {

TEST(ThreadPool, RunsEveryIndexOnceAcrossRepeatedLoops) {
  ThreadPool pool(3);
  ASSERT_EQ(pool.concurrency(), 4);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> hits(257);
    std::atomic<int> bad_worker{0};
    pool.parallel_for(hits.size(), [&](size_t i, int worker) {
      if (worker < 0 || worker >= pool.concurrency()) ++bad_worker;
      ++hits[i];
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    ASSERT_EQ(bad_worker.load(), 0);
  }
}

TEST(ThreadPool, RethrowsTheFirstExceptionAndStaysUsable) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](size_t i, int) {
                                   if (i == 17) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  std::atomic<int> count{0};
  pool.parallel_for(10, [&](size_t, int) { ++count; });
  EXPECT_EQ(count.load(), 10);
}

TEST(ThreadPool, ZeroWorkersRunsOnTheCaller) {
  ThreadPool pool(0);
  int sum = 0;
  pool.parallel_for(5, [&](size_t i, int worker) {
    EXPECT_EQ(worker, 0);
    sum += static_cast<int>(i);
  });
  EXPECT_EQ(sum, 10);
}

}  // namespace
}  // namespace shardkit::ckpt
