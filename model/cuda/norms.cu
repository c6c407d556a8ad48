#include <algorithm>
#include <string>

#include "model/cuda/cuda_common.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/launch.cuh"
#include "model/cuda/norms.hpp"
#include "model/cuda/vec.cuh"

namespace shardkit::model::cuda {
namespace {

constexpr float kLayerNormEps = 1e-5f;
// Shared memory the backward pass may take, within the 227 KiB an H100/H200 block may use.
constexpr size_t kMaxSharedBytes = size_t{200} << 10;
constexpr size_t kDefaultSharedBytes = size_t{48} << 10;
constexpr int kForwardRows = 8;  // forward: a warp per row, 8 rows a block

// Floats of weight-gradient sums per channel: LayerNorm's weight and bias, RMSNorm's weight.
constexpr int sums_per_channel(Norm norm) {
  return norm == Norm::kLayer ? 2 : 1;
}
size_t max_channels(Norm norm) {
  return kMaxSharedBytes / (sums_per_channel(norm) * sizeof(float));
}
const char* name(Norm norm) {
  return norm == Norm::kLayer ? "LayerNorm" : "RMSNorm";
}

// Forward: a warp per row, W adjacent elements a lane per access (16 bytes where the row allows); the
// passes after the first find the row in L1. RMSNorm is LayerNorm without the mean and the bias.
template <typename T, int W, Norm kNorm>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                    int N, int C, float eps) {
  const int row = blockIdx.x * kForwardRows + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = inp + int64_t{row} * C;
  float m = 0.0f;
  if constexpr (kNorm == Norm::kLayer) {
    float sum = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
      const Vec<T, W> xv = load_vec<W>(x + c);
      for (int i = 0; i < W; ++i) sum += to_float(xv.v[i]);
    }
    m = warp_sum(sum) / C;
  }
  float var = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    const Vec<T, W> xv = load_vec<W>(x + c);
    for (int i = 0; i < W; ++i) {
      const float d = to_float(xv.v[i]) - m;
      var += d * d;
    }
  }
  const float s = rsqrtf(warp_sum(var) / C + eps);
  T* o = out + int64_t{row} * C;
  for (int c = lane * W; c < C; c += 32 * W) {
    const Vec<T, W> xv = load_vec<W>(x + c), wv = load_vec<W>(weight + c);
    Vec<T, W> bv{};
    if constexpr (kNorm == Norm::kLayer) bv = load_vec<W>(bias + c);
    Vec<T, W> ov;
    for (int i = 0; i < W; ++i) {
      const float y = (to_float(xv.v[i]) - m) * s * to_float(wv.v[i]);
      ov.v[i] = from_float<T>(kNorm == Norm::kLayer ? y + to_float(bv.v[i]) : y);
    }
    store_vec(o + c, ov);
  }
  if (lane == 0) {
    if constexpr (kNorm == Norm::kLayer) mean[row] = m;
    rstd[row] = s;
  }
}

// Backward: a warp per row of the block's R rows (the second pass over a row finds it in cache), dinp
// += the row's gradient: with norm = (x - m) s and dnorm = w dy, dx = s (dnorm - mean(dnorm) - norm
// mean(dnorm norm)), RMSNorm without the mean(dnorm) term. The weight (and bias) gradient terms of the
// warp's rows add up in the warp's own slice of shared memory, where each lane owns the channels it
// reads, so no float is shared; the block adds its warps' slices in warp order into its partial row
// (weight partials [blocks][C], then bias partials [blocks][C]), and add_column_sums adds the blocks'
// rows in a fixed order. Every input is read from memory once and the sums are deterministic.
template <typename T, int W, Norm kNorm>
__global__ void norm_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* weight,
                                     const float* mean, const float* rstd, int N, int C, int R) {
  constexpr int kSums = sums_per_channel(kNorm);
  extern __shared__ float4 sums4[];  // [warps][kSums][C]
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  float* sums = reinterpret_cast<float*>(sums4);
  float* dw_sum = sums + threadIdx.x / 32 * kSums * C;
  float* db_sum = dw_sum + C;  // LayerNorm only
  for (int c = lane * W; c < C; c += 32 * W) {
    for (int i = 0; i < kSums * W; ++i) dw_sum[i / W * C + c + i % W] = 0.0f;
  }
  const int begin = blockIdx.x * R, end = min(N, begin + R);
  for (int row = begin + threadIdx.x / 32; row < end; row += warps) {
    const T* x = inp + int64_t{row} * C;
    const T* d = dout + int64_t{row} * C;
    const float m = kNorm == Norm::kLayer ? mean[row] : 0.0f, s = rstd[row];
    float sum_dnorm = 0.0f, sum_dnorm_norm = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
      const Vec<T, W> xv = load_vec<W>(x + c), dv = load_vec<W>(d + c), wv = load_vec<W>(weight + c);
      for (int i = 0; i < W; ++i) {
        const float dnorm = to_float(wv.v[i]) * to_float(dv.v[i]);
        sum_dnorm += dnorm;
        sum_dnorm_norm += dnorm * (to_float(xv.v[i]) - m) * s;
      }
    }
    const float mean_dnorm = kNorm == Norm::kLayer ? warp_sum(sum_dnorm) / C : 0.0f;
    const float mean_dnorm_norm = warp_sum(sum_dnorm_norm) / C;
    T* di = dinp + int64_t{row} * C;
    for (int c = lane * W; c < C; c += 32 * W) {
      const Vec<T, W> xv = load_vec<W>(x + c), dv = load_vec<W>(d + c), wv = load_vec<W>(weight + c);
      Vec<T, W> out = load_vec<W>(di + c);
      float dw[W], db[W];
      for (int i = 0; i < W; ++i) {
        const float norm = (to_float(xv.v[i]) - m) * s, dy = to_float(dv.v[i]);
        const float g = (to_float(wv.v[i]) * dy - mean_dnorm - norm * mean_dnorm_norm) * s;
        out.v[i] = from_float<T>(to_float(out.v[i]) + g);
        dw[i] = norm * dy;
        db[i] = dy;
      }
      store_vec(di + c, out);
      if constexpr (W % 4 == 0) {
        // 16-byte shared-memory accesses: a lane's 4-float groups fall in distinct banks of a phase.
        for (int i = 0; i < W; i += 4) {
          float4& w4 = *reinterpret_cast<float4*>(dw_sum + c + i);
          w4 = make_float4(w4.x + dw[i], w4.y + dw[i + 1], w4.z + dw[i + 2], w4.w + dw[i + 3]);
          if constexpr (kNorm == Norm::kLayer) {
            float4& b4 = *reinterpret_cast<float4*>(db_sum + c + i);
            b4 = make_float4(b4.x + db[i], b4.y + db[i + 1], b4.z + db[i + 2], b4.w + db[i + 3]);
          }
        }
      } else {
        for (int i = 0; i < W; ++i) {
          dw_sum[c + i] += dw[i];
          if constexpr (kNorm == Norm::kLayer) db_sum[c + i] += db[i];
        }
      }
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < kSums * C; j += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += sums[w * kSums * C + j];
    partial[(int64_t{j / C} * gridDim.x + blockIdx.x) * C + j % C] = total;
  }
}

void require_supported(Norm norm, int C) {
  const std::string why = norm_unsupported(norm, "channels", C);
  if (!why.empty()) fail(ErrorKind::kInvalidInput, why);
}

template <typename T, Norm kNorm>
void norm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                  float eps, cudaStream_t st) {
  require_supported(kNorm, C);
  if (N == 0) return;
  with_pack_width<T>(
      C,
      [&](auto width) {
        norm_forward_kernel<T, decltype(width)::value, kNorm>
            <<<(N + kForwardRows - 1) / kForwardRows, kForwardRows * 32, 0, st>>>(out, mean, rstd, inp, weight, bias, N,
                                                                                  C, eps);
      },
      out, inp, weight, bias);
  check_launch();
}

template <typename T, Norm kNorm>
void norm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                   const float* mean, const float* rstd, int N, int C, float* scratch, GradWrite write,
                   cudaStream_t st) {
  require_supported(kNorm, C);
  if (N == 0) {  // no rows: zero stored, or nothing added
    add_column_sums(dweight, scratch, 0, C, write, st);
    if (kNorm == Norm::kLayer) add_column_sums(dbias, scratch, 0, C, write, st);
    return;
  }
  const int rows = (N + kNormBlocks - 1) / kNormBlocks;
  const int blocks = (N + rows - 1) / rows;
  // Up to 8 warps, as many as 48 KiB of shared memory hold sums for; wider rows get fewer warps, the
  // widest one warp with the shared memory limit raised for it.
  const size_t warp_bytes = sizeof(float) * sums_per_channel(kNorm) * static_cast<size_t>(C);
  const int warps = static_cast<int>(std::clamp<size_t>(kDefaultSharedBytes / warp_bytes, 1, 8));
  const size_t bytes = warps * warp_bytes;
  with_pack_width<T>(
      C,
      [&](auto width) {
        const auto kernel = norm_backward_kernel<T, decltype(width)::value, kNorm>;
        if (bytes > kDefaultSharedBytes) {
          CUDA_CHECK(
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
        }
        kernel<<<blocks, warps * 32, bytes, st>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows);
      },
      dinp, dout, inp, weight);
  check_launch();
  add_column_sums(dweight, scratch, blocks, C, write, st);
  if (kNorm == Norm::kLayer) add_column_sums(dbias, scratch + int64_t{blocks} * C, blocks, C, write, st);
}

}  // namespace

std::string norm_unsupported(Norm norm, const std::string& field, int channels) {
  if (channels < 1 || static_cast<size_t>(channels) > max_channels(norm)) {
    return field + " " + std::to_string(channels) + " is outside the 1 to " + std::to_string(max_channels(norm)) +
           " channels the CUDA " + name(norm) + " backward pass supports";
  }
  return "";
}

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       cudaStream_t st) {
  norm_forward<T, Norm::kLayer>(out, mean, rstd, inp, weight, bias, N, C, kLayerNormEps, st);
}

template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, float* scratch, GradWrite write,
                        cudaStream_t st) {
  norm_backward<T, Norm::kLayer>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, scratch, write, st);
}

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* weight, int N, int C, float eps, cudaStream_t st) {
  norm_forward<T, Norm::kRms>(out, nullptr, rstd, x, weight, nullptr, N, C, eps, st);
}

template <typename T>
void rmsnorm_backward(T* dx, float* dweight, const T* dout, const T* x, const T* weight, const float* rstd, int N,
                      int C, float* scratch, GradWrite write, cudaStream_t st) {
  norm_backward<T, Norm::kRms>(dx, dweight, nullptr, dout, x, weight, nullptr, rstd, N, C, scratch, write, st);
}

#define SHARDKIT_INSTANTIATE(T)                                                                                     \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int, int, cudaStream_t);     \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*, const float*, const float*, \
                                      int, int, float*, GradWrite, cudaStream_t);                                   \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int, int, float, cudaStream_t);                  \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int, int, float*,       \
                                    GradWrite, cudaStream_t);
SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)
#undef SHARDKIT_INSTANTIATE

}  // namespace shardkit::model::cuda
