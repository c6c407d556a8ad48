#include <cub/device/device_radix_sort.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <numeric>
#include <vector>

#include "model/cuda/encoder_backward.hpp"

namespace shardkit::model::cuda {
namespace {

// Block i owns sorted position i if it starts a run of equal tokens (every other block returns at
// once): dwte[token] += dout at the run's positions. A frequent token's run is long (hundreds of
// positions in real text), so the block's warps share it: warp w adds rows w, w + 8, ... of the run for
// 256 channels at a time (a lane 8 adjacent ones), then the 8 warps' sums are added in warp order.
constexpr int kWteWarps = 8;
constexpr int kWteChannels = 256;  // per pass: 32 lanes x 8
template <typename T>
__global__ void __launch_bounds__(kWteWarps * 32)
    wte_grad_kernel(float* dwte, const T* dout, const int32_t* tokens, const int32_t* positions, int N, int C) {
  __shared__ float sums[kWteWarps][kWteChannels];
  const int i = blockIdx.x;
  const int token = tokens[i];
  if (i > 0 && tokens[i - 1] == token) return;  // the same for the whole block
  int end = i + 1;
  while (end < N && tokens[end] == token) ++end;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* row = dwte + int64_t{token} * C;
  for (int c0 = 0; c0 < C; c0 += kWteChannels) {
    const int c = c0 + lane * 8;
    float acc[8] = {};
    for (int j = i + warp; j < end; j += kWteWarps) {
      const T* src = dout + int64_t{positions[j]} * C + c;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (c + k < C) acc[k] += static_cast<float>(src[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sums[warp][lane * 8 + k] = acc[k];
    __syncthreads();
    if (c0 + static_cast<int>(threadIdx.x) < C) {
      float total = 0.0f;
      for (int w = 0; w < kWteWarps; ++w) total += sums[w][threadIdx.x];
      row[c0 + threadIdx.x] += total;
    }
    __syncthreads();  // sums is rewritten by the next pass
  }
}

// dwpe[s, c] += dout[b, s, c] summed over b in order, a thread per (s, c).
template <typename T>
__global__ void wpe_grad_kernel(float* dwpe, const T* dout, int B, int S, int C) {
  const int64_t total = int64_t{S} * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int b = 0; b < B; ++b) sum += static_cast<float>(dout[b * total + i]);
    dwpe[i] += sum;
  }
}

}  // namespace

namespace {

// The low bits of a token id the radix sort looks at: enough for the vocabulary.
int key_bits_for(int vocab_size) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < vocab_size) ++bits;
  return bits;
}

// The radix sort's scratch for `tokens` keys (a size query: no device work).
size_t sort_scratch_bytes(int tokens, int key_bits) {
  size_t scratch = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, scratch, static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), tokens, 0, key_bits));
  return std::max<size_t>(scratch, 1);
}

}  // namespace

EncoderBackward::EncoderBackward(int tokens, int vocab_size)
    : tokens_(tokens),
      key_bits_(key_bits_for(vocab_size)),
      positions_(tokens),
      sorted_tokens_(tokens),
      sorted_positions_(tokens),
      sort_scratch_(sort_scratch_bytes(tokens, key_bits_)) {
  std::vector<int32_t> iota(static_cast<size_t>(tokens));
  std::iota(iota.begin(), iota.end(), 0);
  CUDA_CHECK(cudaMemcpy(positions_.data(), iota.data(), positions_.bytes(), cudaMemcpyHostToDevice));
}

int64_t EncoderBackward::bytes_for(int tokens, int vocab_size) {
  return static_cast<int64_t>(3 * sizeof(int32_t) * static_cast<size_t>(tokens) +
                              sort_scratch_bytes(tokens, key_bits_for(vocab_size)));
}

int64_t EncoderBackward::bytes() const noexcept {
  return static_cast<int64_t>(positions_.bytes() + sorted_tokens_.bytes() + sorted_positions_.bytes() +
                              sort_scratch_.bytes());
}

template <typename T>
void EncoderBackward::run(float* dwte, float* dwpe, const T* dout, const int32_t* inputs, int B, int S, int C,
                          cudaStream_t st) {
  const int N = B * S;
  if (N != tokens_) fail(ErrorKind::kInternal, "EncoderBackward sized for another number of tokens");
  if (N == 0) return;
  size_t scratch = sort_scratch_.bytes();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_scratch_.data(), scratch, inputs, sorted_tokens_.data(),
                                             positions_.data(), sorted_positions_.data(), N, 0, key_bits_, st));
  wte_grad_kernel<<<N, kWteWarps * 32, 0, st>>>(dwte, dout, sorted_tokens_.data(), sorted_positions_.data(), N, C);
  CUDA_CHECK(cudaGetLastError());
  if (!dwpe) return;
  const int64_t total = int64_t{S} * C;
  const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
  wpe_grad_kernel<<<blocks, 256, 0, st>>>(dwpe, dout, B, S, C);
  CUDA_CHECK(cudaGetLastError());
}

template void EncoderBackward::run<float>(float*, float*, const float*, const int32_t*, int, int, int, cudaStream_t);
template void EncoderBackward::run<__nv_bfloat16>(float*, float*, const __nv_bfloat16*, const int32_t*, int, int, int,
                                                  cudaStream_t);
template void EncoderBackward::run<__half>(float*, float*, const __half*, const int32_t*, int, int, int, cudaStream_t);

}  // namespace shardkit::model::cuda
