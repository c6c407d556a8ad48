// The embeddings' backward pass without atomics, so that it gives the same bits on every run (the
// determinism contract: a resumed run reproduces the uninterrupted one). dwpe[s] sums dout over the
// batch in batch order. For dwte, the step's tokens are sorted (a stable radix sort, so equal tokens
// keep their positions' order), and one block owns each distinct token's row, adding its positions'
// rows of dout in position order -- no two threads ever add into the same element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/cuda/cuda_common.hpp"

namespace shardkit::model::cuda {

class EncoderBackward {
 public:
  // For steps of `tokens` token positions over a vocabulary of `vocab_size`.
  EncoderBackward(int tokens, int vocab_size);

  // dwte (V, C) += rows of dout (N, C) by token; dwpe (S, C) += dout summed over the batch, unless
  // dwpe is null (a model without learned positions).
  template <typename T>
  void run(float* dwte, float* dwpe, const T* dout, const int32_t* inputs, int B, int S, int C, cudaStream_t st);

  int64_t bytes() const noexcept;
  // What bytes() is for an instance of this shape, before making one.
  static int64_t bytes_for(int tokens, int vocab_size);

 private:
  int tokens_;
  int key_bits_;  // the radix sort looks at the low key_bits_ bits of a token: enough for the vocabulary
  DeviceBuffer<int32_t> positions_;  // 0, 1, ..., tokens - 1
  DeviceBuffer<int32_t> sorted_tokens_, sorted_positions_;
  DeviceBuffer<std::byte> sort_scratch_;
};

}  // namespace shardkit::model::cuda
