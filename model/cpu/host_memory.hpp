// The activations of a CPU model checked against the machine's memory (base/host_memory.hpp) before
// they are allocated: the batch and sequence come from a config or a checkpoint.
#pragma once

#include <string>

#include "base/error.hpp"
#include "base/host_memory.hpp"
#include "base/text_format.hpp"

namespace shardkit::model::cpu {

// Error(kInvalidInput) when a CPU model of `model` for batch x seq_len tokens would need `bytes` of
// activations, more than the machine has.
inline void require_activation_memory(const std::string& model, int batch, int seq_len, double bytes) {
  if (bytes <= physical_memory_bytes()) return;
  fail(ErrorKind::kInvalidInput, "model " + model + ": a batch of " + std::to_string(batch) + " x " +
                                     std::to_string(seq_len) + " tokens needs " + format_bytes(bytes) +
                                     " of activations, more than this machine's " +
                                     format_bytes(physical_memory_bytes()) + " of memory");
}

}  // namespace shardkit::model::cpu
