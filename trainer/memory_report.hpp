// What a rank holds persistently, for the start-up report and the memory plan that precedes it.
#pragma once

#include <cstdint>
#include <string>

#include "base/text_format.hpp"

namespace shardkit::trainer {

struct MemoryReport {
  int64_t parameters = 0;
  int64_t host_parameters = 0;  // the same, where offloaded to host memory (GPU ranks, stage 3)
  int64_t gradients = 0;
  int64_t optimizer_states = 0;       // the optimizer's states: fp32 master weights and its moments
  int64_t host_optimizer_states = 0;  // the same, where offloaded to host memory (GPU ranks)
  int64_t nvme_parameters = 0;        // stage 3's partition, where swapped to NVMe (the swap file's size)
  int64_t nvme_optimizer_states = 0;  // the optimizer states, where swapped to NVMe (the swap file's size)
  int64_t snapshot_staging = 0;       // device memory that stages checkpoint snapshots (GPU ranks)
};

// "parameters X, gradients Y, optimizer states Z, activations A[, snapshot staging S]", offloaded
// states named by where they are.
inline std::string describe_memory(const MemoryReport& m, int64_t activations) {
  const auto bytes = [](int64_t b) { return format_bytes(static_cast<double>(b)); };
  const auto held = [&](int64_t device, int64_t host, int64_t nvme) {
    return nvme > 0 ? bytes(nvme) + " (on NVMe)" : host > 0 ? bytes(host) + " (in host memory)" : bytes(device);
  };
  return "parameters " + held(m.parameters, m.host_parameters, m.nvme_parameters) + ", gradients " +
         bytes(m.gradients) + ", optimizer states " +
         held(m.optimizer_states, m.host_optimizer_states, m.nvme_optimizer_states) + ", activations " +
         bytes(activations) + (m.snapshot_staging > 0 ? ", snapshot staging " + bytes(m.snapshot_staging) : "");
}

}  // namespace shardkit::trainer
