#include "model/llama/cuda/gpu_model.hpp"

#include <algorithm>
#include <array>
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

// Products that share their input x (N, IN) and write side by side into the rows of one output
// (N, sum of outs): q|k|v, gate|up. Their weights W_k (outs[k], IN), stacked, are one matrix where the
// store keeps them back to back (GpuParamStore::params_back_to_back: stages 0-2), and then one product
// does the work of all: one wide product reads x once and keeps the tensor cores busier than K narrow
// ones (k and v are an eighth of q's width with grouped-query heads); likewise their gradients
// (stages 0-1).
template <size_t K>
int total(const std::array<int, K>& outs) {
  int sum = 0;
  for (int o : outs) sum += o;
  return sum;
}

// The first of K stacked matrices, after checking that the store's word holds for these pointers.
template <typename P, size_t K>
P* stacked(const std::array<P*, K>& parts, const std::array<int, K>& outs, int in) {
  for (size_t i = 1; i < K; ++i) {
    if (parts[i] != parts[i - 1] + static_cast<size_t>(outs[i - 1]) * static_cast<size_t>(in)) {
      fail(ErrorKind::kInternal, "the parameter store called tensors back to back that are not");
    }
  }
  return parts[0];
}

// y (N, sum outs; row stride ldy) = x (N, IN) [W_0; W_1; ...]^T, as nn.Linear's y = x W^T.
template <typename T, size_t K>
void stacked_linear(Matmul& matmul, T* y, int ldy, const T* x, const std::array<const T*, K>& w,
                    const std::array<int, K>& outs, bool one_matrix, int N, int IN) {
  if (one_matrix) {
    matmul.run<T>(Epilogue::kNone, false, true, N, total(outs), IN, x, IN, stacked(w, outs, IN), IN, y, ldy);
    return;
  }
  int column = 0;
  for (size_t k = 0; k < K; ++k) {
    matmul.run<T>(Epilogue::kNone, false, true, N, outs[k], IN, x, IN, w[k], IN, y + column, ldy);
    column += outs[k];
  }
}

// Which of a stacked product's operands are one matrix: its weights, its weights' gradients.
struct OneMatrix {
  bool params, grads;
};

// The backward pass of stacked_linear (K = 1: one bias-free nn.Linear), dy (N, sum outs; row stride
// ldy): dx (N, IN; row stride ldx) = dy [W_0; W_1; ...], added to dx when accumulate (beta 1: the sum
// of the products feeding one input, as the CPU model adds them); dW_k += (kStore: =) dy_k^T x in fp32.
template <typename T, size_t K>
void linear_backward(cublasHandle_t h, T* dx, int ldx, const std::array<float*, K>& dw, const T* dy, int ldy,
                     const T* x, const std::array<const T*, K>& w, const std::array<int, K>& outs, OneMatrix one, int N,
                     int IN, bool accumulate, GradWrite write) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (one.params) {
    gemm<T, T>(h, false, false, N, IN, total(outs), 1.0f, dy, ldy, stacked(w, outs, IN), IN, beta, dx, ldx);
  } else {
    int column = 0;
    for (size_t k = 0; k < K; ++k) {
      gemm<T, T>(h, false, false, N, IN, outs[k], 1.0f, dy + column, ldy, w[k], IN, k == 0 ? beta : 1.0f, dx, ldx);
      column += outs[k];
    }
  }
  if (one.grads) {
    gemm<T, float>(h, true, false, total(outs), IN, N, 1.0f, dy, ldy, x, IN, grad_beta(write), stacked(dw, outs, IN),
                   IN);
    return;
  }
  int column = 0;
  for (size_t k = 0; k < K; ++k) {
    gemm<T, float>(h, true, false, outs[k], IN, N, 1.0f, dy + column, ldy, x, IN, grad_beta(write), dw[k], IN);
    column += outs[k];
  }
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
  buffer(&GpuLlama::qkv_, L * N * (QW + 2 * KW));
  buffer(&GpuLlama::atty_, L * N * QW);
  buffer(&GpuLlama::res2_, L * N * H);
  buffer(&GpuLlama::xn2_, L * N * H);
  buffer(&GpuLlama::gate_up_, L * N * 2 * I);
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
  buffer(&GpuLlama::dqkv_, N * (QW + 2 * KW));
  buffer(&GpuLlama::dgate_up_, N * 2 * I);
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
  const int QKV = QW + 2 * KW;
  const AttentionShape shape{B_, S_, c.n_head, c.n_kv_head, D, QKV, QKV};
  auto w = [&](int k) { return p.param(layer_tensor(l, k)); };
  const size_t at = layer_slot(l) * static_cast<size_t>(N);
  T* xn1 = xn1_.data() + at * H;
  T* qkv = qkv_.data() + at * QKV;
  T* atty = atty_.data() + at * QW;
  T* res2 = res2_.data() + at * H;
  T* xn2 = xn2_.data() + at * H;
  T* gate_up = gate_up_.data() + at * 2 * I;
  T* act = act_.data() + at * I;

  // nn.Linear's y = x W^T (W [out, in]); the residual additions run in the products' epilogues.
  rmsnorm_forward(xn1, rstd1_.data() + at, x, w(kInputNorm), N, H, eps, stream_);
  const int first = layer_tensor(l, 0);
  stacked_linear<T, 3>(matmul_, qkv, QKV, xn1, {w(kQ), w(kK), w(kV)}, {QW, KW, KW},
                       p.params_back_to_back(first + kQ, first + kV + 1), N, H);
  rope_forward(qkv, QKV, cos_.data(), sin_.data(), B_, S_, c.n_head + c.n_kv_head, D, stream_);  // q's and k's heads
  attention_forward(atty, lse_.data() + at * c.n_head, qkv, qkv + QW, qkv + QW + KW, shape, stream_);
  matmul_.run<T>(Epilogue::kNone, false, true, N, H, QW, atty, QW, w(kO), QW, res2, H, nullptr, nullptr, x);
  rmsnorm_forward(xn2, rstd2_.data() + at, res2, w(kPostNorm), N, H, eps, stream_);
  stacked_linear<T, 2>(matmul_, gate_up, 2 * I, xn2, {w(kGate), w(kUp)}, {I, I},
                       p.params_back_to_back(first + kGate, first + kUp + 1), N, H);
  swiglu_forward(act, gate_up, N, I, stream_);
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
  // Fresh, the first row block's product stores the head's gradient (all of it; tied, the embedding's
  // backward pass adds to it).
  const bool fresh = backward && p.grads_fresh(group);
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
    head_weight_grad(cublas_, p.grad(w), logits_.data(), logits_ld_, x, V, H, rows,
                     r0 == 0 ? first_write(fresh) : GradWrite::kAdd);
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
  const int QKV = QW + 2 * KW;
  const AttentionShape shape{B_, S_, c.n_head, c.n_kv_head, D, QKV, QKV};
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
                   N, H, scratch_.data(), first_write(p.grads_fresh(final_group_)), stream_);
  p.close_grads(final_group_);
  p.release(final_group_);

  for (int l = c.n_layer - 1; l >= 0; --l) {
    p.acquire(1 + l);
    const T* x = l == 0 ? encoded_.data() : outputs_.input(l - 1);
    if (checkpointing_) forward_layer(p, l, x, false);
    p.open_grads(1 + l);
    const GradWrite gw = first_write(p.grads_fresh(1 + l));  // each tensor of a layer has one writer
    auto w = [&](int k) { return p.param(layer_tensor(l, k)); };
    auto g = [&](int k) { return p.grad(layer_tensor(l, k)); };
    const size_t at = layer_slot(l) * static_cast<size_t>(N);
    T* dres = dres_.data();  // in: d(layer output); out: d(layer input)
    const T* xn1 = xn1_.data() + at * H;
    const T* xn2 = xn2_.data() + at * H;

    // res3 = res2 + down(silu(gate(xn2)) * up(xn2)), xn2 = norm(res2). d(act) lands in dgate_up's
    // up half, which the SwiGLU's backward pass then overwrites with d(up) element by element.
    const int first = layer_tensor(l, 0);
    auto one_matrix = [&](int from, int to) {
      return OneMatrix{p.params_back_to_back(first + from, first + to + 1),
                       p.grads_back_to_back(first + from, first + to + 1)};
    };
    constexpr OneMatrix kOne{true, true};  // a single tensor
    T* dgate_up = dgate_up_.data();
    linear_backward<T, 1>(cublas_, dgate_up + I, 2 * I, {g(kDown)}, dres, H, act_.data() + at * I, {w(kDown)}, {H},
                          kOne, N, I, false, gw);
    swiglu_backward(dgate_up, dgate_up + I, 2 * I, gate_up_.data() + at * 2 * I, N, I, stream_);
    linear_backward<T, 2>(cublas_, dxn_.data(), H, {g(kGate), g(kUp)}, dgate_up, 2 * I, xn2, {w(kGate), w(kUp)}, {I, I},
                          one_matrix(kGate, kUp), N, H, false, gw);
    rmsnorm_backward(dres, g(kPostNorm), dxn_.data(), res2_.data() + at * H, w(kPostNorm), rstd2_.data() + at, N, H,
                     scratch_.data(), gw, stream_);
    // res2 = input + o(attention(rope(q(xn1)), rope(k(xn1)), v(xn1))), xn1 = norm(input)
    linear_backward<T, 1>(cublas_, datty_.data(), QW, {g(kO)}, dres, H, atty_.data() + at * QW, {w(kO)}, {H}, kOne, N,
                          QW, false, gw);
    const T* qkv = qkv_.data() + at * QKV;
    T* dqkv = dqkv_.data();
    attention_backward(dqkv, dqkv + QW, dqkv + QW + KW, delta_.data(), datty_.data(), atty_.data() + at * QW, qkv,
                       qkv + QW, qkv + QW + KW, lse_.data() + at * c.n_head, shape, stream_);
    rope_backward(dqkv, QKV, cos_.data(), sin_.data(), B_, S_, c.n_head + c.n_kv_head, D, stream_);
    linear_backward<T, 3>(cublas_, dxn_.data(), H, {g(kQ), g(kK), g(kV)}, dqkv, QKV, xn1, {w(kQ), w(kK), w(kV)},
                          {QW, KW, KW}, one_matrix(kQ, kV), N, H, false, gw);
    rmsnorm_backward(dres, g(kInputNorm), dxn_.data(), x, w(kInputNorm), rstd1_.data() + at, N, H, scratch_.data(), gw,
                     stream_);
    p.close_grads(1 + l);
    p.release(1 + l);
  }

  if (!c.tie_word_embeddings) {
    // Untied, the embedding's gradient has no other writer: fresh, it is cleared for the rows no
    // token of the micro-batch used.
    p.open_grads(0);
    if (p.grads_fresh(0)) CUDA_CHECK(cudaMemsetAsync(p.grad(0), 0, sizeof(float) * c.vocab_size * H, stream_));
  }
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
