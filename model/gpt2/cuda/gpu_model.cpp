#include "model/gpt2/cuda/gpu_model.hpp"

#include <algorithm>
#include <chrono>

#include "base/clock.hpp"
#include "model/cuda/device_type.hpp"
#include "model/cuda/head_size.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/norms.hpp"
#include "model/gpt2/cuda/kernels.hpp"
#include "model/gpt2/model.hpp"

namespace shardkit::model::gpt2 {

// The shared layer kernels and buffers (model/cuda/), by their own names in this file.
using namespace cuda;

namespace {

// dweight += inp^T @ dout;  dbias += colsum(dout)   (inp (N, IC), dout (N, OC); kStore: =)
template <typename T>
void weight_grads(cublasHandle_t h, cudaStream_t st, float* scratch, float* dweight, float* dbias, const T* dout,
                  const T* inp, int N, int IC, int OC, GradWrite write) {
  gemm<T, float>(h, true, false, IC, OC, N, 1.0f, inp, IC, dout, OC, grad_beta(write), dweight, OC);
  bias_backward(dbias, dout, N, OC, scratch, write, st);
}

// dinp = dout @ weight^T;  dweight += inp^T @ dout;  dbias += colsum(dout)   (kStore: =)
template <typename T>
void matmul_backward(cublasHandle_t h, cudaStream_t st, float* scratch, T* dinp, float* dweight, float* dbias,
                     const T* dout, const T* inp, const T* weight, int N, int IC, int OC, GradWrite write) {
  gemm<T, T>(h, false, true, N, IC, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, IC);
  weight_grads(h, st, scratch, dweight, dbias, dout, inp, N, IC, OC, write);
}

}  // namespace

std::string cuda_unsupported(const GptConfig& config) {
  const int head_size = config.n_embd / config.n_head;
  if (!supported_head_size(head_size)) {
    return "head size n_embd / n_head = " + std::to_string(head_size) +
           ", but the CUDA attention kernels are built for " + kHeadSizes;
  }
  return norm_unsupported(Norm::kLayer, "n_embd", config.n_embd);
}

template <typename T>
GpuGpt2<T>::GpuGpt2(const GptConfig& config, const ActivationPlan& plan, cublasHandle_t cublas, cudaStream_t stream)
    : config_(config),
      B_(plan.batch),
      S_(plan.seq_len),
      checkpointing_(plan.checkpointing),
      cublas_(cublas),
      stream_(stream),
      matmul_(stream),
      encoder_backward_(plan.batch * plan.seq_len, config.vocab_size),
      outputs_(config.n_layer, static_cast<size_t>(plan.batch) * plan.seq_len * config.n_embd, plan.inputs_on_host,
               stream) {
  logits_ld_ = padded_vocab(config.vocab_size);
  head_rows_ = head_block_rows(logits_ld_, sizeof(T), B_ * S_);
  activation_buffers(config, plan,
                     [&](auto member, size_t count) { allocate_activation(this->*member, count, activation_bytes_); });
  CUDA_CHECK(cudaMemsetAsync(wte_padded_.data(), 0, wte_padded_.bytes(), stream_));
  activation_bytes_ += encoder_backward_.bytes() + outputs_.bytes().device;
  loss_sum_.resize(kSumScratch);
  loss_host_.resize(1);
}

template <typename T>
template <typename F>
void GpuGpt2<T>::activation_buffers(const GptConfig& config, const ActivationPlan& plan, F&& buffer) {
  const size_t N = static_cast<size_t>(plan.batch) * plan.seq_len, C = static_cast<size_t>(config.n_embd);
  // Layers of per-layer buffers: every layer's, or under checkpointing the one being recomputed.
  const size_t L = plan.checkpointing ? 1 : static_cast<size_t>(config.n_layer);
  const size_t NH = static_cast<size_t>(config.n_head);
  const int logits_ld = padded_vocab(config.vocab_size);
  buffer(&GpuGpt2::encoded_, N * C);
  buffer(&GpuGpt2::ln1_, L * N * C);
  buffer(&GpuGpt2::qkv_, L * N * 3 * C);
  buffer(&GpuGpt2::atty_, L * N * C);
  buffer(&GpuGpt2::res2_, L * N * C);
  buffer(&GpuGpt2::ln2_, L * N * C);
  buffer(&GpuGpt2::fch_, L * N * 4 * C);
  buffer(&GpuGpt2::fch_gelu_, L * N * 4 * C);
  buffer(&GpuGpt2::lnf_, N * C);
  buffer(&GpuGpt2::logits_, static_cast<size_t>(head_block_rows(logits_ld, sizeof(T), static_cast<int>(N))) *
                                static_cast<size_t>(logits_ld));
  buffer(&GpuGpt2::wte_padded_, static_cast<size_t>(logits_ld) * C);
  buffer(&GpuGpt2::ln1_mean_, L * N);
  buffer(&GpuGpt2::ln1_rstd_, L * N);
  buffer(&GpuGpt2::ln2_mean_, L * N);
  buffer(&GpuGpt2::ln2_rstd_, L * N);
  buffer(&GpuGpt2::lnf_mean_, N);
  buffer(&GpuGpt2::lnf_rstd_, N);
  buffer(&GpuGpt2::lse_, L * N * NH);
  buffer(&GpuGpt2::losses_, N);
  buffer(&GpuGpt2::dres_, N * C);
  buffer(&GpuGpt2::dbuf_c_, N * C);
  buffer(&GpuGpt2::dbuf_c2_, N * C);
  buffer(&GpuGpt2::dbuf_3c_, N * 3 * C);
  buffer(&GpuGpt2::dbuf_4c2_, N * 4 * C);
  buffer(&GpuGpt2::delta_, N * NH);
  // The reductions' partial sums (LayerNorm and bias gradients, one kernel at a time on the stream).
  buffer(&GpuGpt2::scratch_, static_cast<size_t>(std::max(norm_scratch_floats(Norm::kLayer, config.n_embd),
                                                          bias_scratch_floats(4 * config.n_embd))));
}

template <typename T>
ActivationBytes GpuGpt2<T>::planned_activation_bytes(const GptConfig& config, const ActivationPlan& plan) {
  int64_t total = 0;
  activation_buffers(config, plan, [&](auto member, size_t count) { total += buffer_bytes(member, count); });
  return planned_model_activations<T>(total, config.n_layer, config.n_embd, config.vocab_size, plan);
}

template <typename T>
void GpuGpt2<T>::forward_blocks(GpuParamStore<T>& p, const int32_t* inputs) {
  const int C = config_.n_embd, L = config_.n_layer;
  const int N = B_ * S_;
  p.acquire(0);
  encoder_forward(encoded_.data(), inputs, p.param(kWte), p.param(kWpe), B_, S_, C, stream_);
  p.release(0);
  const T* residual = encoded_.data();
  for (int l = 0; l < L; ++l) {
    p.acquire(1 + l);
    forward_block(p, l, residual, true);
    p.release(1 + l);
    residual = outputs_.written(l);
  }
  const int lnf = block_tensor(L, 0);
  p.acquire(L + 1);
  layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual, p.param(lnf), p.param(lnf + 1), N, C,
                    stream_);
  p.release(L + 1);
}

template <typename T>
void GpuGpt2<T>::forward_block(GpuParamStore<T>& p, int l, const T* input, bool with_output) {
  const int C = config_.n_embd, NH = config_.n_head;
  const int N = B_ * S_;
  auto w = [&](int k) { return p.param(block_tensor(l, k)); };
  const size_t lc = layer_slot(l) * static_cast<size_t>(N) * C, ln = layer_slot(l) * static_cast<size_t>(N);
  // Biases, the GELU and the residual additions run in the matrix products' epilogues.
  layernorm_forward(ln1_.data() + lc, ln1_mean_.data() + ln, ln1_rstd_.data() + ln, input, w(kLn1W), w(kLn1B), N, C,
                    stream_);
  matmul_.run<T>(Epilogue::kBias, false, false, N, 3 * C, C, ln1_.data() + lc, C, w(kQkvW), 3 * C, qkv_.data() + 3 * lc,
                 3 * C, w(kQkvB));
  attention_forward(atty_.data() + lc, lse_.data() + ln * NH, qkv_.data() + 3 * lc, B_, S_, C, NH, stream_);
  matmul_.run<T>(Epilogue::kBias, false, false, N, C, C, atty_.data() + lc, C, w(kAttProjW), C, res2_.data() + lc, C,
                 w(kAttProjB), nullptr, input);
  layernorm_forward(ln2_.data() + lc, ln2_mean_.data() + ln, ln2_rstd_.data() + ln, res2_.data() + lc, w(kLn2W),
                    w(kLn2B), N, C, stream_);
  matmul_.run<T>(Epilogue::kBiasGelu, false, false, N, 4 * C, C, ln2_.data() + lc, C, w(kFcW), 4 * C,
                 fch_gelu_.data() + 4 * lc, 4 * C, w(kFcB), fch_.data() + 4 * lc);
  if (!with_output) return;  // the backward pass reads fch_gelu, not the block's output
  matmul_.run<T>(Epilogue::kBias, false, false, N, C, 4 * C, fch_gelu_.data() + 4 * lc, 4 * C, w(kFcProjW), C,
                 outputs_.output(l), C, w(kFcProjB), nullptr, res2_.data() + lc);
}

template <typename T>
double GpuGpt2<T>::forward_backward(GpuParamStore<T>& p, const int32_t* inputs, const int32_t* targets,
                                    float grad_scale, model::PassTimes* times) {
  queue(p, inputs, targets, grad_scale, times);
  return finish(p, times);
}

template <typename T>
void GpuGpt2<T>::queue(GpuParamStore<T>& p, const int32_t* inputs, const int32_t* targets, float grad_scale,
                       model::PassTimes* times) {
  const auto start = Clock::now();
  forward_blocks(p, inputs);
  head(p, targets, grad_scale, true);
  if (times) times->forward_ms = ms_since(start);
  backward_start_ = Clock::now();
  backward_blocks(p, inputs);
  // The loss is needed on the host for the step's record; finish() waits for it.
  read_back(loss_host_.data(), loss_sum_.data(), 1, stream_);
}

template <typename T>
void GpuGpt2<T>::head(GpuParamStore<T>& p, const int32_t* targets, float grad_scale, bool backward) {
  const int N = B_ * S_, C = config_.n_embd, V = config_.vocab_size;
  // Group 0 is wte and wpe. Fresh, the first row block's product stores wte's gradient (every row:
  // the tied head), and wpe's rows beyond the sequence get none, so it is cleared for the encoder's
  // backward pass to add to.
  bool fresh = false;
  if (backward) {
    p.open_grads(0);
    fresh = p.grads_fresh(0);
    if (fresh) {
      CUDA_CHECK(cudaMemsetAsync(p.grad(kWpe), 0, sizeof(float) * config_.n_positions * C, stream_));
    }
  }
  p.acquire(0);
  // The padding rows of the copy stay zero, so are the padding logits, and so is what they add to dx.
  CUDA_CHECK(cudaMemcpyAsync(wte_padded_.data(), p.param(kWte), sizeof(T) * V * C, cudaMemcpyDeviceToDevice, stream_));
  const T* wte = wte_padded_.data();
  const int Vp = logits_ld_;
  const float dscale = grad_scale / static_cast<float>(N);
  for (int r0 = 0; r0 < N; r0 += head_rows_) {
    const int rows = std::min(head_rows_, N - r0);
    const T* x = lnf_.data() + static_cast<size_t>(r0) * C;
    gemm<T, T>(cublas_, false, true, rows, Vp, C, 1.0f, x, C, wte, C, 0.0f, logits_.data(), Vp);
    softmax_cross_entropy(logits_.data(), Vp, losses_.data() + r0, targets + r0, rows, V, dscale, backward, stream_);
    if (!backward) continue;
    gemm<T, T>(cublas_, false, false, rows, C, Vp, 1.0f, logits_.data(), Vp, wte, C, 0.0f,
               dbuf_c_.data() + static_cast<size_t>(r0) * C, C);
    head_weight_grad(cublas_, p.grad(kWte), logits_.data(), logits_ld_, x, V, C, rows,
                     r0 == 0 ? first_write(fresh) : GradWrite::kAdd);
  }
  p.release(0);
  sum_floats(loss_sum_.data(), losses_.data(), N, stream_);
}

template <typename T>
double GpuGpt2<T>::forward(GpuParamStore<T>& p, const int32_t* inputs, const int32_t* targets) {
  forward_blocks(p, inputs);
  head(p, targets, 0.0f, false);
  outputs_.join();
  read_back(loss_host_.data(), loss_sum_.data(), 1, stream_);
  p.synchronize(stream_);
  return loss_host_.data()[0] / (static_cast<double>(B_) * S_);
}

template <typename T>
double GpuGpt2<T>::finish(GpuParamStore<T>& p, model::PassTimes* times) {
  p.synchronize(stream_);
  if (times) times->backward_ms = ms_since(backward_start_);
  return loss_host_.data()[0] / (static_cast<double>(B_) * S_);
}

template <typename T>
void GpuGpt2<T>::backward_blocks(GpuParamStore<T>& p, const int32_t* inputs) {
  const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const int N = B_ * S_;
  const size_t NC = static_cast<size_t>(N) * C;
  const int lnf = block_tensor(L, 0);
  outputs_.start_backward();
  CUDA_CHECK(cudaMemsetAsync(dres_.data(), 0, NC * sizeof(T), stream_));
  p.acquire(L + 1);
  p.open_grads(L + 1);
  layernorm_backward(dres_.data(), p.grad(lnf), p.grad(lnf + 1), dbuf_c_.data(), outputs_.input(L - 1), p.param(lnf),
                     lnf_mean_.data(), lnf_rstd_.data(), N, C, scratch_.data(), first_write(p.grads_fresh(L + 1)),
                     stream_);
  p.close_grads(L + 1);
  p.release(L + 1);
  for (int l = L - 1; l >= 0; --l) {
    p.acquire(1 + l);
    const T* input = l == 0 ? encoded_.data() : outputs_.input(l - 1);
    if (checkpointing_) forward_block(p, l, input, false);
    p.open_grads(1 + l);
    const GradWrite gw = first_write(p.grads_fresh(1 + l));  // each tensor of a block has one writer
    auto w = [&](int k) { return p.param(block_tensor(l, k)); };
    auto g = [&](int k) { return p.grad(block_tensor(l, k)); };
    const size_t lc = layer_slot(l) * NC, ln = layer_slot(l) * N;
    T* dres = dres_.data();
    // d(fc output) = (dres @ fcproj^T) * gelu'(fc pre-activation), the GELU's backward in the epilogue.
    matmul_.run<T>(Epilogue::kDGelu, false, true, N, 4 * C, C, dres, C, w(kFcProjW), C, dbuf_4c2_.data(), 4 * C,
                   nullptr, fch_.data() + 4 * lc);
    weight_grads(cublas_, stream_, scratch_.data(), g(kFcProjW), g(kFcProjB), dres, fch_gelu_.data() + 4 * lc, N, 4 * C,
                 C, gw);
    matmul_backward(cublas_, stream_, scratch_.data(), dbuf_c_.data(), g(kFcW), g(kFcB), dbuf_4c2_.data(),
                    ln2_.data() + lc, w(kFcW), N, C, 4 * C, gw);
    layernorm_backward(dres, g(kLn2W), g(kLn2B), dbuf_c_.data(), res2_.data() + lc, w(kLn2W), ln2_mean_.data() + ln,
                       ln2_rstd_.data() + ln, N, C, scratch_.data(), gw, stream_);
    matmul_backward(cublas_, stream_, scratch_.data(), dbuf_c_.data(), g(kAttProjW), g(kAttProjB), dres,
                    atty_.data() + lc, w(kAttProjW), N, C, C, gw);
    attention_backward(dbuf_3c_.data(), delta_.data(), dbuf_c_.data(), atty_.data() + lc, qkv_.data() + 3 * lc,
                       lse_.data() + ln * NH, B_, S_, C, NH, stream_);
    matmul_backward(cublas_, stream_, scratch_.data(), dbuf_c2_.data(), g(kQkvW), g(kQkvB), dbuf_3c_.data(),
                    ln1_.data() + lc, w(kQkvW), N, C, 3 * C, gw);
    layernorm_backward(dres, g(kLn1W), g(kLn1B), dbuf_c2_.data(), input, w(kLn1W), ln1_mean_.data() + ln,
                       ln1_rstd_.data() + ln, N, C, scratch_.data(), gw, stream_);
    p.close_grads(1 + l);
    p.release(1 + l);
  }
  encoder_backward_.run(p.grad(kWte), p.grad(kWpe), dres_.data(), inputs, B_, S_, C, stream_);
  p.close_grads(0);
  outputs_.join();
}

template class GpuGpt2<float>;
template class GpuGpt2<__nv_bfloat16>;
template class GpuGpt2<__half>;

const GpuFamily& gpu_family() {
  static const GpuFamily family = describe_gpu_family<GpuGpt2, GptConfig>(config_of, cuda_unsupported);
  return family;
}

}  // namespace shardkit::model::gpt2
