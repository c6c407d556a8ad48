#include "model/llama/cuda/gpu_model.hpp"

#include <algorithm>
#include <chrono>

#include "base/clock.hpp"
#include "model/cuda/device_type.hpp"
#include "model/cuda/head_size.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/norms.hpp"
#include "model/llama/cuda/kernels.hpp"
#include "model/llama/model.hpp"

namespace shardkit::model::llama {

// The shared layer kernels and buffers (model/cuda/), by their own names in this file.
using namespace cuda;

namespace {

// The backward pass of a bias-free nn.Linear y (N, OUT) = x (N, IN) W^T with W (OUT, IN):
// dx = dy W, added to dx when accumulate (beta 1: the sum of the products feeding one input, as the
// CPU model adds them); dW += dy^T x in fp32.
template <typename T>
void linear_backward(cublasHandle_t h, T* dx, float* dweight, const T* dy, const T* x, const T* weight, int N, int IN,
                     int OUT, bool accumulate) {
  gemm<T, T>(h, false, false, N, IN, OUT, 1.0f, dy, OUT, weight, IN, accumulate ? 1.0f : 0.0f, dx, IN);
  gemm<T, float>(h, true, false, OUT, IN, N, 1.0f, dy, OUT, x, IN, 1.0f, dweight, IN);
}

}  // namespace

std::string cuda_unsupported(const LlamaConfig& c) {
  if (!supported_head_size(c.head_dim)) {
    return "head_dim " + std::to_string(c.head_dim) + ", but the CUDA attention kernels are built for " + kHeadSizes;
  }
  return norm_unsupported(Norm::kRms, "hidden_size", c.hidden_size);
}

template <typename T>
GpuLlama<T>::GpuLlama(const LlamaConfig& config, const ActivationPlan& plan, cublasHandle_t cublas, cudaStream_t stream)
    : config_(config),
      B_(plan.batch),
      S_(plan.seq_len),
      checkpointing_(plan.checkpointing),
      final_group_(config.n_layer + 1),
      cublas_(cublas),
      stream_(stream),
      matmul_(stream),
      embedding_backward_(plan.batch * plan.seq_len, config.vocab_size),
      outputs_(config.n_layer, static_cast<size_t>(plan.batch) * plan.seq_len * config.hidden_size, plan.inputs_on_host,
               stream) {
  const int batch = plan.batch, seq_len = plan.seq_len;
  validate(config, "model " + config.name);
  if (batch < 1 || seq_len < 1 || seq_len > config.max_position_embeddings) {
    fail(ErrorKind::kInvalidInput, "batch " + std::to_string(batch) + " x sequence " + std::to_string(seq_len) +
                                       " does not fit the model (max_position_embeddings " +
                                       std::to_string(config.max_position_embeddings) + ")");
  }
  logits_ld_ = padded_vocab(config.vocab_size);
  head_rows_ = head_block_rows(logits_ld_, sizeof(T), batch * seq_len);
  activation_buffers(config, plan,
                     [&](auto member, size_t count) { allocate_activation(this->*member, count, activation_bytes_); });
  const RopeTables rope = rope_tables(config, seq_len);
  if (rope.cos.size() != cos_.size() || rope.sin.size() != sin_.size()) {
    fail(ErrorKind::kInternal, "the rotation tables' size is not the one allocated for them");
  }
  CUDA_CHECK(cudaMemcpy(cos_.data(), rope.cos.data(), cos_.bytes(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(sin_.data(), rope.sin.data(), sin_.bytes(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemsetAsync(head_padded_.data(), 0, head_padded_.bytes(), stream_));
  activation_bytes_ += embedding_backward_.bytes() + outputs_.bytes().device;
  loss_sum_.resize(kSumScratch);
  loss_host_.resize(1);
}

template <typename T>
template <typename F>
void GpuLlama<T>::activation_buffers(const LlamaConfig& config, const ActivationPlan& plan, F&& buffer) {
  const int seq_len = plan.seq_len;
  const size_t N = static_cast<size_t>(plan.batch) * static_cast<size_t>(seq_len);
  // Layers of per-layer buffers: every layer's, or under checkpointing the one being recomputed.
  const size_t L = plan.checkpointing ? 1 : static_cast<size_t>(config.n_layer);
  const size_t H = static_cast<size_t>(config.hidden_size);
  const size_t I = static_cast<size_t>(config.intermediate_size), NH = static_cast<size_t>(config.n_head);
  const size_t QW = NH * static_cast<size_t>(config.head_dim);
  const size_t KW = static_cast<size_t>(config.n_kv_head) * static_cast<size_t>(config.head_dim);
  const int logits_ld = padded_vocab(config.vocab_size);
  const size_t rope = static_cast<size_t>(seq_len) * static_cast<size_t>(config.head_dim / 2);  // (S, D/2)
  buffer(&GpuLlama::cos_, rope);
  buffer(&GpuLlama::sin_, rope);
  buffer(&GpuLlama::encoded_, N * H);
  buffer(&GpuLlama::xn1_, L * N * H);
  buffer(&GpuLlama::q_, L * N * QW);
  buffer(&GpuLlama::k_, L * N * KW);
  buffer(&GpuLlama::v_, L * N * KW);
  buffer(&GpuLlama::atty_, L * N * QW);
  buffer(&GpuLlama::res2_, L * N * H);
  buffer(&GpuLlama::xn2_, L * N * H);
  buffer(&GpuLlama::gate_, L * N * I);
  buffer(&GpuLlama::up_, L * N * I);
  buffer(&GpuLlama::act_, L * N * I);
  buffer(&GpuLlama::xnf_, N * H);
  buffer(&GpuLlama::logits_, static_cast<size_t>(head_block_rows(logits_ld, sizeof(T), static_cast<int>(N))) *
                                 static_cast<size_t>(logits_ld));
  buffer(&GpuLlama::head_padded_, static_cast<size_t>(logits_ld) * H);
  buffer(&GpuLlama::rstd1_, L * N);
  buffer(&GpuLlama::rstd2_, L * N);
  buffer(&GpuLlama::rstdf_, N);
  buffer(&GpuLlama::lse_, L * N * NH);
  buffer(&GpuLlama::losses_, N);
  buffer(&GpuLlama::dres_, N * H);
  buffer(&GpuLlama::dxn_, N * H);
  buffer(&GpuLlama::datty_, N * QW);
  buffer(&GpuLlama::dq_, N * QW);
  buffer(&GpuLlama::dk_, N * KW);
  buffer(&GpuLlama::dv_, N * KW);
  buffer(&GpuLlama::dgate_, N * I);
  buffer(&GpuLlama::dup_, N * I);
  buffer(&GpuLlama::delta_, N * NH);
  buffer(&GpuLlama::scratch_, static_cast<size_t>(norm_scratch_floats(Norm::kRms, config.hidden_size)));
}

template <typename T>
ActivationBytes GpuLlama<T>::planned_activation_bytes(const LlamaConfig& config, const ActivationPlan& plan) {
  int64_t total = 0;
  activation_buffers(config, plan, [&](auto member, size_t count) { total += buffer_bytes(member, count); });
  return planned_model_activations<T>(total, config.n_layer, config.hidden_size, config.vocab_size, plan);
}

template <typename T>
void GpuLlama<T>::forward_layers(GpuParamStore<T>& p, const int32_t* inputs) {
  const LlamaConfig& c = config_;
  const int N = B_ * S_, H = c.hidden_size;

  p.acquire(0);
  embedding_forward(encoded_.data(), inputs, p.param(0), N, H, stream_);
  p.release(0);

  const T* x = encoded_.data();
  for (int l = 0; l < c.n_layer; ++l) {
    p.acquire(1 + l);
    forward_layer(p, l, x, true);
    p.release(1 + l);
    x = outputs_.written(l);
  }

  p.acquire(final_group_);
  rmsnorm_forward(xnf_.data(), rstdf_.data(), x, p.param(final_norm_tensor(c)), N, H,
                  static_cast<float>(c.rms_norm_eps), stream_);
  // The untied head belongs to this group and stays acquired for head(); a tied one is group 0's.
  if (c.tie_word_embeddings) p.release(final_group_);
}

template <typename T>
void GpuLlama<T>::forward_layer(GpuParamStore<T>& p, int l, const T* x, bool with_output) {
  const LlamaConfig& c = config_;
  const int N = B_ * S_, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int QW = c.n_head * D, KW = c.n_kv_head * D;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const AttentionShape shape{B_, S_, c.n_head, c.n_kv_head, D, QW, KW};
  auto w = [&](int k) { return p.param(layer_tensor(l, k)); };
  const size_t at = layer_slot(l) * static_cast<size_t>(N);
  T* xn1 = xn1_.data() + at * H;
  T* q = q_.data() + at * QW;
  T* k = k_.data() + at * KW;
  T* v = v_.data() + at * KW;
  T* atty = atty_.data() + at * QW;
  T* res2 = res2_.data() + at * H;
  T* xn2 = xn2_.data() + at * H;
  T* gate = gate_.data() + at * I;
  T* up = up_.data() + at * I;
  T* act = act_.data() + at * I;

  // nn.Linear's y = x W^T (W [out, in]); the residual additions run in the products' epilogues.
  rmsnorm_forward(xn1, rstd1_.data() + at, x, w(kInputNorm), N, H, eps, stream_);
  matmul_.run<T>(Epilogue::kNone, false, true, N, QW, H, xn1, H, w(kQ), H, q, QW);
  matmul_.run<T>(Epilogue::kNone, false, true, N, KW, H, xn1, H, w(kK), H, k, KW);
  matmul_.run<T>(Epilogue::kNone, false, true, N, KW, H, xn1, H, w(kV), H, v, KW);
  rope_forward(q, cos_.data(), sin_.data(), B_, S_, c.n_head, D, stream_);
  rope_forward(k, cos_.data(), sin_.data(), B_, S_, c.n_kv_head, D, stream_);
  attention_forward(atty, lse_.data() + at * c.n_head, q, k, v, shape, stream_);
  matmul_.run<T>(Epilogue::kNone, false, true, N, H, QW, atty, QW, w(kO), QW, res2, H, nullptr, nullptr, x);
  rmsnorm_forward(xn2, rstd2_.data() + at, res2, w(kPostNorm), N, H, eps, stream_);
  matmul_.run<T>(Epilogue::kNone, false, true, N, I, H, xn2, H, w(kGate), H, gate, I);
  matmul_.run<T>(Epilogue::kNone, false, true, N, I, H, xn2, H, w(kUp), H, up, I);
  swiglu_forward(act, gate, up, int64_t{N} * I, stream_);
  if (!with_output) return;  // the backward pass reads act, not the layer's output
  matmul_.run<T>(Epilogue::kNone, false, true, N, H, I, act, I, w(kDown), I, outputs_.output(l), H, nullptr, nullptr,
                 res2);
}

template <typename T>
void GpuLlama<T>::head(GpuParamStore<T>& p, const int32_t* targets, float grad_scale, bool backward) {
  const LlamaConfig& c = config_;
  const int N = B_ * S_, H = c.hidden_size, V = c.vocab_size, Vp = logits_ld_;
  const int w = head_tensor(c);
  const int group = c.tie_word_embeddings ? 0 : final_group_;
  if (c.tie_word_embeddings) p.acquire(0);
  if (backward) p.open_grads(group);
  // The output projection fused with the cross-entropy and its gradient, in blocks of rows. The
  // padding rows of the copy stay zero, so are the padding logits, and so is what they add to dx.
  CUDA_CHECK(cudaMemcpyAsync(head_padded_.data(), p.param(w), sizeof(T) * V * H, cudaMemcpyDeviceToDevice, stream_));
  const T* weight = head_padded_.data();
  const float dscale = grad_scale / static_cast<float>(N);
  for (int r0 = 0; r0 < N; r0 += head_rows_) {
    const int rows = std::min(head_rows_, N - r0);
    const T* x = xnf_.data() + static_cast<size_t>(r0) * H;
    gemm<T, T>(cublas_, false, true, rows, Vp, H, 1.0f, x, H, weight, H, 0.0f, logits_.data(), Vp);
    softmax_cross_entropy(logits_.data(), Vp, losses_.data() + r0, targets + r0, rows, V, dscale, backward, stream_);
    if (!backward) continue;
    gemm<T, T>(cublas_, false, false, rows, H, Vp, 1.0f, logits_.data(), Vp, weight, H, 0.0f,
               dxn_.data() + static_cast<size_t>(r0) * H, H);
    head_weight_grad(cublas_, p.grad(w), logits_.data(), logits_ld_, x, V, H, rows);
  }
  // An untied head stays acquired, its gradients open, for the final norm's backward pass; with a
  // tied head the embedding's gradients stay open for the whole backward pass.
  if (c.tie_word_embeddings) p.release(group);
  sum_floats(loss_sum_.data(), losses_.data(), N, stream_);
}

template <typename T>
double GpuLlama<T>::forward(GpuParamStore<T>& p, const int32_t* inputs, const int32_t* targets) {
  forward_layers(p, inputs);
  head(p, targets, 0.0f, false);
  outputs_.join();
  if (!config_.tie_word_embeddings) p.release(final_group_);  // no backward pass to keep it for
  read_back(loss_host_.data(), loss_sum_.data(), 1, stream_);
  p.synchronize(stream_);
  return loss_host_.data()[0] / (static_cast<double>(B_) * S_);
}

template <typename T>
double GpuLlama<T>::forward_backward(GpuParamStore<T>& p, const int32_t* inputs, const int32_t* targets,
                                     float grad_scale, PassTimes* times) {
  queue(p, inputs, targets, grad_scale, times);
  return finish(p, times);
}

template <typename T>
void GpuLlama<T>::queue(GpuParamStore<T>& p, const int32_t* inputs, const int32_t* targets, float grad_scale,
                        PassTimes* times) {
  const auto start = Clock::now();
  forward_layers(p, inputs);
  head(p, targets, grad_scale, true);
  if (times) times->forward_ms = ms_since(start);
  backward_start_ = Clock::now();
  backward_layers(p, inputs);
  // The loss is needed on the host for the step's record; finish() waits for it.
  read_back(loss_host_.data(), loss_sum_.data(), 1, stream_);
}

template <typename T>
double GpuLlama<T>::finish(GpuParamStore<T>& p, PassTimes* times) {
  p.synchronize(stream_);
  if (times) times->backward_ms = ms_since(backward_start_);
  return loss_host_.data()[0] / (static_cast<double>(B_) * S_);
}

template <typename T>
void GpuLlama<T>::backward_layers(GpuParamStore<T>& p, const int32_t* inputs) {
  const LlamaConfig& c = config_;
  const int N = B_ * S_, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int QW = c.n_head * D, KW = c.n_kv_head * D;
  const AttentionShape shape{B_, S_, c.n_head, c.n_kv_head, D, QW, KW};
  const size_t NH = static_cast<size_t>(N) * H;
  outputs_.start_backward();

  // Final norm: dxn_ holds d(xnf) from the head.
  CUDA_CHECK(cudaMemsetAsync(dres_.data(), 0, NH * sizeof(T), stream_));
  const int norm = final_norm_tensor(c);
  if (c.tie_word_embeddings) {
    p.acquire(final_group_);
    p.open_grads(final_group_);
  }
  rmsnorm_backward(dres_.data(), p.grad(norm), dxn_.data(), outputs_.input(c.n_layer - 1), p.param(norm), rstdf_.data(),
                   N, H, scratch_.data(), stream_);
  p.close_grads(final_group_);
  p.release(final_group_);

  for (int l = c.n_layer - 1; l >= 0; --l) {
    p.acquire(1 + l);
    const T* x = l == 0 ? encoded_.data() : outputs_.input(l - 1);
    if (checkpointing_) forward_layer(p, l, x, false);
    p.open_grads(1 + l);
    auto w = [&](int k) { return p.param(layer_tensor(l, k)); };
    auto g = [&](int k) { return p.grad(layer_tensor(l, k)); };
    const size_t at = layer_slot(l) * static_cast<size_t>(N);
    T* dres = dres_.data();  // in: d(layer output); out: d(layer input)
    const T* xn1 = xn1_.data() + at * H;
    const T* xn2 = xn2_.data() + at * H;

    // res3 = res2 + down(silu(gate(xn2)) * up(xn2)), xn2 = norm(res2). d(act) lands in dgate_, which
    // the SwiGLU's backward pass then overwrites with d(gate) element by element.
    linear_backward(cublas_, dgate_.data(), g(kDown), dres, act_.data() + at * I, w(kDown), N, I, H, false);
    swiglu_backward(dgate_.data(), dup_.data(), dgate_.data(), gate_.data() + at * I, up_.data() + at * I,
                    int64_t{N} * I, stream_);
    linear_backward(cublas_, dxn_.data(), g(kGate), dgate_.data(), xn2, w(kGate), N, H, I, false);
    linear_backward(cublas_, dxn_.data(), g(kUp), dup_.data(), xn2, w(kUp), N, H, I, true);
    rmsnorm_backward(dres, g(kPostNorm), dxn_.data(), res2_.data() + at * H, w(kPostNorm), rstd2_.data() + at, N, H,
                     scratch_.data(), stream_);
    // res2 = input + o(attention(rope(q(xn1)), rope(k(xn1)), v(xn1))), xn1 = norm(input)
    linear_backward(cublas_, datty_.data(), g(kO), dres, atty_.data() + at * QW, w(kO), N, QW, H, false);
    attention_backward(dq_.data(), dk_.data(), dv_.data(), delta_.data(), datty_.data(), atty_.data() + at * QW,
                       q_.data() + at * QW, k_.data() + at * KW, v_.data() + at * KW, lse_.data() + at * c.n_head,
                       shape, stream_);
    rope_backward(dq_.data(), cos_.data(), sin_.data(), B_, S_, c.n_head, D, stream_);
    rope_backward(dk_.data(), cos_.data(), sin_.data(), B_, S_, c.n_kv_head, D, stream_);
    linear_backward(cublas_, dxn_.data(), g(kQ), dq_.data(), xn1, w(kQ), N, H, QW, false);
    linear_backward(cublas_, dxn_.data(), g(kK), dk_.data(), xn1, w(kK), N, H, KW, true);
    linear_backward(cublas_, dxn_.data(), g(kV), dv_.data(), xn1, w(kV), N, H, KW, true);
    rmsnorm_backward(dres, g(kInputNorm), dxn_.data(), x, w(kInputNorm), rstd1_.data() + at, N, H, scratch_.data(),
                     stream_);
    p.close_grads(1 + l);
    p.release(1 + l);
  }

  if (!c.tie_word_embeddings) p.open_grads(0);
  embedding_backward_.run(p.grad(0), static_cast<float*>(nullptr), dres_.data(), inputs, B_, S_, H, stream_);
  p.close_grads(0);
  outputs_.join();
}

template class GpuLlama<float>;
template class GpuLlama<__nv_bfloat16>;
template class GpuLlama<__half>;

const GpuFamily& gpu_family() {
  static const GpuFamily family = describe_gpu_family<GpuLlama, LlamaConfig>(config_of, cuda_unsupported);
  return family;
}

}  // namespace shardkit::model::llama
