// How fast the CPU optimizers update (what ZeRO-Offload's step and CPU ranks run): AdamW or Lion over
// one view of N elements on all of the process's OpenMP threads, the updated weights rounded to bf16
// in the same pass or not, best and median of the rounds. Prints one line, or with --json one JSON
// object. bench/cpu_optimizer_vs_reference.py runs it beside PyTorch's and DeepSpeed's CPU AdamW.
// Usage: shardkit_cpu_optimizer_bench [--optimizer adamw|lion] [--elements N] [--narrow bf16|fp32]
// [--rounds R] [--json]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/tensor_table.hpp"
#include "trainer/adamw.hpp"
#include "trainer/lion.hpp"

namespace shardkit::trainer {
namespace {

struct Options {
  std::string optimizer = "adamw";
  int64_t elements = int64_t{1} << 26;
  bool narrow = true;
  int rounds = 6;
  bool json = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--optimizer" && has_value) {
      o.optimizer = argv[++i];
    } else if (a == "--elements" && has_value) {
      o.elements = std::stoll(argv[++i]);
    } else if (a == "--narrow" && has_value) {
      o.narrow = std::string(argv[++i]) == "bf16";
    } else if (a == "--rounds" && has_value) {
      o.rounds = std::stoi(argv[++i]);
    } else if (a == "--json") {
      o.json = true;
    } else {
      throw std::invalid_argument(
          "usage: " + std::string(argv[0]) +
          " [--optimizer adamw|lion] [--elements N] [--narrow bf16|fp32] [--rounds R] [--json]");
    }
  }
  if (o.optimizer != "adamw" && o.optimizer != "lion") throw std::invalid_argument("--optimizer: adamw or lion");
  if (o.elements < 1 || o.rounds < 1) throw std::invalid_argument("--elements and --rounds: at least 1");
  return o;
}

// Values in the ranges training sees, written on all threads (the pages' first touch spreads them as
// the update's static schedule reads them).
void fill(std::vector<float>& x, float scale, float offset) {
  const auto n = static_cast<int64_t>(x.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = scale * static_cast<float>(i % 1009) + offset;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const auto n = static_cast<size_t>(o.elements);
  const bool adamw = o.optimizer == "adamw";
  std::vector<float> w(n), m(n), v(adamw ? n : 0), g(n);
  std::vector<uint16_t> narrowed(o.narrow ? n : 0);
  fill(w, 0.01f, -5.0f);
  fill(m, 1e-5f, -5e-3f);
  if (adamw) fill(v, 1e-8f, 0.0f);
  fill(g, 1e-3f, -0.5f);
  OptimizerStep step;
  step.lr = 1e-4;
  step.beta2 = 0.95;
  step.weight_decay = 0.1;
  const ckpt::DType narrow = o.narrow ? ckpt::DType::kBF16 : ckpt::DType::kF32;
  std::vector<double> seconds;
  for (int r = 0; r < o.rounds + 1; ++r) {  // the first round warms up, untimed
    step.step = r + 1;
    const auto t0 = std::chrono::steady_clock::now();
    if (adamw) {
      cpu_adamw(w, m, v, g, AdamWCoefficients::of(step), {}, narrow, narrowed.data());
    } else {
      cpu_lion(w, m, g, LionCoefficients::of(step), {}, narrow, narrowed.data());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) seconds.push_back(s);
  }
  std::ranges::sort(seconds);
  const double best = seconds.front(), median = seconds[seconds.size() / 2];
  // Bytes an element moves: each fp32 array read, the weights and states written back, the rounded copy.
  const int arrays_read = adamw ? 4 : 3, arrays_written = adamw ? 3 : 2;
  const double bytes = 4.0 * (arrays_read + arrays_written) + (o.narrow ? 2.0 : 0.0);
  const nlohmann::json result = {{"optimizer", o.optimizer},
                                 {"elements", o.elements},
                                 {"narrow", o.narrow ? "bf16" : "fp32"},
                                 {"threads", omp_get_max_threads()},
                                 {"best_ms", best * 1e3},
                                 {"median_ms", median * 1e3},
                                 {"elements_per_s", static_cast<double>(o.elements) / best},
                                 {"bytes_per_element", bytes},
                                 {"gb_per_s", bytes * static_cast<double>(o.elements) / best / 1e9}};
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
  } else {
    std::printf("%s, %lld elements, %s copy, %d threads: best %.2f ms, median %.2f ms, %.2f G elements/s, %.1f GB/s\n",
                o.optimizer.c_str(), static_cast<long long>(o.elements), o.narrow ? "bf16" : "no",
                omp_get_max_threads(), best * 1e3, median * 1e3, static_cast<double>(o.elements) / best / 1e9,
                bytes * static_cast<double>(o.elements) / best / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace shardkit::trainer

int main(int argc, char** argv) {
  try {
    return shardkit::trainer::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
