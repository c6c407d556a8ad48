// `shardkit eval`: the mean next-token cross-entropy of a checkpoint's weights over token windows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

namespace shardkit::trainer {

struct EvalResult {
  double loss = 0;     // mean cross-entropy per token
  int64_t tokens = 0;  // tokens scored
  int64_t windows = 0;
};

// Windows k = 0 .. windows-1 of T tokens (seq_len, or the model's longest sequence when 0): inputs tokens[kT, kT+T),
// targets tokens[kT+1, kT+T+1). windows = 0 means every full window, at most 64. One process. `progress`, if set, is
// called after each batch of windows with (tokens scored, tokens to score).
EvalResult evaluate(const std::filesystem::path& checkpoint, const std::filesystem::path& data, int64_t windows,
                    int seq_len, int threads, const std::function<void(int64_t done, int64_t total)>& progress = {});

}  // namespace shardkit::trainer
