#include "model/llama/cpu_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "base/clock.hpp"
#include "base/error.hpp"
#include "base/text_format.hpp"
#include "model/cpu/host_memory.hpp"
#include "model/cpu/ops.hpp"
#include "model/llama/cpu_ops.hpp"

namespace shardkit::model::llama {
namespace {}  // namespace

CpuLlama::CpuLlama(const LlamaConfig& config, const ActivationPlan& plan)
    : config_(config), max_batch_(plan.batch), max_seq_(plan.seq_len), checkpointing_(plan.checkpointing) {
  const int batch = plan.batch, seq_len = plan.seq_len;
  validate(config, "model " + config.name);
  if (batch < 1 || seq_len < 1 || seq_len > config.max_position_embeddings) {
    fail(ErrorKind::kInvalidInput, "batch " + std::to_string(batch) + " x sequence " + std::to_string(seq_len) +
                                       " does not fit the model (max_position_embeddings " +
                                       std::to_string(config.max_position_embeddings) + ")");
  }
  cpu::require_activation_memory(config.name, batch, seq_len, activation_bytes(config, plan));
  final_group_ = config.n_layer + 1;

  RopeTables rope = rope_tables(config, seq_len);
  cos_ = std::move(rope.cos);
  sin_ = std::move(rope.sin);

  const size_t N = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
  const size_t L = checkpointing_ ? 1 : static_cast<size_t>(config.n_layer);  // layers of buffers (L')
  const size_t H = static_cast<size_t>(config.hidden_size);
  const size_t QW = static_cast<size_t>(config.n_head) * static_cast<size_t>(config.head_dim);
  const size_t KW = static_cast<size_t>(config.n_kv_head) * static_cast<size_t>(config.head_dim);
  const size_t I = static_cast<size_t>(config.intermediate_size);
  // Each attention row's two statistics, from which the backward pass recomputes its probabilities.
  const auto att = static_cast<size_t>(cpu::attention_stats_floats(batch, config.n_head, seq_len));
  encoded_.resize(N * H);
  xn1_.resize(L * N * H);
  rstd1_.resize(L * N);
  q_.resize(L * N * QW);
  k_.resize(L * N * KW);
  v_.resize(L * N * KW);
  att_.resize(L * att);
  attention_ws_.resize(static_cast<size_t>(cpu::attention_workspace_floats(attention_shape(config, batch, seq_len))));
  atty_.resize(L * N * QW);
  res2_.resize(L * N * H);
  xn2_.resize(L * N * H);
  rstd2_.resize(L * N);
  gate_.resize(L * N * I);
  up_.resize(L * N * I);
  act_.resize(L * N * I);
  res3_.resize(static_cast<size_t>(config.n_layer) * N * H);
  xnf_.resize(N * H);
  rstdf_.resize(N);
  logits_.resize(static_cast<size_t>(cpu::kHeadBlockRows) * static_cast<size_t>(config.vocab_size));
  dres_.resize(N * H);
  dxn_.resize(N * H);
  dtmp_.resize(N * H);
  dq_.resize(N * QW);
  datty_.resize(N * QW);
  dk_.resize(N * KW);
  dv_.resize(N * KW);
  dact_.resize(N * I);
  dgate_.resize(N * I);
  dup_.resize(N * I);
}

int64_t CpuLlama::activation_bytes() const {
  return static_cast<int64_t>(activation_bytes(config_, {max_batch_, max_seq_, checkpointing_}));
}

double CpuLlama::activation_bytes(const LlamaConfig& c, const ActivationPlan& plan) noexcept {
  // The buffers the constructor sizes: per layer the output res3 (N x H), and for every layer or only
  // one (checkpointing) 3 N x H (xn1, res2, xn2), 2 N x NH*D (q, atty), 2 N x NKV*D, 3 N x I,
  // 2 N statistics and the attention; outside the layers 5 N x H (encoded, xnf, dres, dxn, dtmp),
  // 2 N x NH*D, 2 N x NKV*D, 3 N x I, N statistics, the rotation tables, a block of logits and the
  // attention's workspace.
  const double n = static_cast<double>(plan.batch) * plan.seq_len;
  const double h = c.hidden_size, i = c.intermediate_size;
  const double qw = static_cast<double>(c.n_head) * c.head_dim, kw = static_cast<double>(c.n_kv_head) * c.head_dim;
  const double attention = static_cast<double>(cpu::attention_stats_floats(plan.batch, c.n_head, plan.seq_len));
  const double per_layer = n * (3 * h + 2 * qw + 2 * kw + 3 * i + 2) + attention;
  const double layers = plan.checkpointing ? 1 : c.n_layer;
  const double outside =
      n * (5 * h + 2 * qw + 2 * kw + 3 * i + 1) + static_cast<double>(plan.seq_len) * c.head_dim +
      static_cast<double>(cpu::kHeadBlockRows) * c.vocab_size +
      static_cast<double>(cpu::attention_workspace_floats(attention_shape(c, plan.batch, plan.seq_len)));
  return (c.n_layer * n * h + layers * per_layer + outside) * sizeof(float);
}

const float* CpuLlama::layer_input(int l) const noexcept {
  const size_t rows = static_cast<size_t>(max_batch_) * static_cast<size_t>(max_seq_);
  return l == 0 ? encoded_.data() : res3_.data() + static_cast<size_t>(l - 1) * rows * config_.hidden_size;
}

void CpuLlama::forward_layers(ParameterStore& p, const int32_t* inputs, int B, int T) {
  if (B < 1 || B > max_batch_ || T < 1 || T > max_seq_) {
    fail(ErrorKind::kInternal, "batch " + std::to_string(B) + "x" + std::to_string(T) + " exceeds the allocated " +
                                   std::to_string(max_batch_) + "x" + std::to_string(max_seq_));
  }
  const LlamaConfig& c = config_;
  const int N = B * T, H = c.hidden_size;

  p.acquire(0);
  ops::embedding_forward(encoded_.data(), inputs, p.param(0), N, H);
  p.release(0);

  for (int l = 0; l < c.n_layer; ++l) {
    p.acquire(1 + l);
    forward_layer(p, l, B, T, true);
    p.release(1 + l);
  }

  p.acquire(final_group_);
  ops::rmsnorm_forward(xnf_.data(), rstdf_.data(), layer_input(c.n_layer), p.param(final_norm_tensor(c)), N, H,
                       static_cast<float>(c.rms_norm_eps));
  // The untied head belongs to this group and stays acquired for head(); a tied one is group 0's.
  if (c.tie_word_embeddings) p.release(final_group_);
}

void CpuLlama::forward_layer(ParameterStore& p, int l, int B, int T, bool with_output) {
  const LlamaConfig& c = config_;
  const int N = B * T, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int QW = c.n_head * D, KW = c.n_kv_head * D;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const size_t rows = static_cast<size_t>(max_batch_) * static_cast<size_t>(max_seq_);
  const size_t att_stride = static_cast<size_t>(cpu::attention_stats_floats(max_batch_, c.n_head, max_seq_));
  auto w = [&](int k) { return p.param(layer_tensor(l, k)); };
  const size_t at = layer_slot(l) * rows;
  const float* x = layer_input(l);
  float* xn1 = xn1_.data() + at * H;
  float* q = q_.data() + at * QW;
  float* k = k_.data() + at * KW;
  float* v = v_.data() + at * KW;
  float* atty = atty_.data() + at * QW;
  float* res2 = res2_.data() + at * H;
  float* xn2 = xn2_.data() + at * H;
  float* gate = gate_.data() + at * I;
  float* up = up_.data() + at * I;
  float* act = act_.data() + at * I;
  float* tmp = dtmp_.data();  // forward scratch: the projections before the residual add (unused backward)

  ops::rmsnorm_forward(xn1, rstd1_.data() + at, x, w(kInputNorm), N, H, eps);
  ops::linear_forward(q, xn1, w(kQ), N, H, QW);
  ops::linear_forward(k, xn1, w(kK), N, H, KW);
  ops::linear_forward(v, xn1, w(kV), N, H, KW);
  ops::rope_forward(q, cos_.data(), sin_.data(), B, T, c.n_head, D);
  ops::rope_forward(k, cos_.data(), sin_.data(), B, T, c.n_kv_head, D);
  cpu::attention_forward(atty, att_.data() + layer_slot(l) * att_stride, q, k, v, attention_shape(c, B, T),
                         attention_ws_);
  ops::linear_forward(tmp, atty, w(kO), N, QW, H);
  cpu::residual_forward(res2, x, tmp, int64_t{N} * H);
  ops::rmsnorm_forward(xn2, rstd2_.data() + at, res2, w(kPostNorm), N, H, eps);
  ops::linear_forward(gate, xn2, w(kGate), N, H, I);
  ops::linear_forward(up, xn2, w(kUp), N, H, I);
  ops::swiglu_forward(act, gate, up, int64_t{N} * I);
  if (!with_output) return;  // the backward pass reads act, not the layer's output
  ops::linear_forward(tmp, act, w(kDown), N, I, H);
  cpu::residual_forward(res3_.data() + static_cast<size_t>(l) * rows * H, res2, tmp, int64_t{N} * H);
}

double CpuLlama::head(ParameterStore& p, const int32_t* targets, int N, float grad_scale, bool train) {
  const LlamaConfig& c = config_;
  const int w = head_tensor(c);
  const int group = c.tie_word_embeddings ? 0 : final_group_;
  if (c.tie_word_embeddings) p.acquire(0);
  if (train) p.open_grads(group);
  const double loss =
      cpu::head_forward_backward(train ? dxn_.data() : nullptr, train ? p.grad(w) : nullptr, logits_.data(),
                                 xnf_.data(), p.param(w), targets, N, c.hidden_size, c.vocab_size, grad_scale, N);
  // An untied head stays acquired, its gradients open, for the final norm's backward pass.
  if (c.tie_word_embeddings || !train) p.release(group);
  return loss;
}

double CpuLlama::forward(ParameterStore& p, const int32_t* inputs, const int32_t* targets, int B, int T) {
  forward_layers(p, inputs, B, T);
  return head(p, targets, B * T, 0.0f, false) / (B * T);
}

double CpuLlama::forward_backward(ParameterStore& p, const int32_t* inputs, const int32_t* targets, int B, int T,
                                  float grad_scale, PassTimes* times) {
  const auto start = Clock::now();
  forward_layers(p, inputs, B, T);
  // With a tied head the embedding's gradients stay open for the whole backward pass: it receives the
  // head's gradient first and the embedding's last.
  const double loss = head(p, targets, B * T, grad_scale, true);
  if (times) times->forward_ms = ms_since(start);
  const auto backward_start = Clock::now();
  backward_layers(p, inputs, B, T);
  if (times) times->backward_ms = ms_since(backward_start);
  return loss / (B * T);
}

void CpuLlama::backward_layers(ParameterStore& p, const int32_t* inputs, int B, int T) {
  const LlamaConfig& c = config_;
  const int N = B * T, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int QW = c.n_head * D, KW = c.n_kv_head * D;
  const int64_t NH = int64_t{N} * H;
  const size_t rows = static_cast<size_t>(max_batch_) * static_cast<size_t>(max_seq_);
  const size_t att_stride = static_cast<size_t>(cpu::attention_stats_floats(max_batch_, c.n_head, max_seq_));

  // Final norm: dxn_ holds d(xnf) from the head.
  std::fill(dres_.begin(), dres_.begin() + NH, 0.0f);
  const int norm = final_norm_tensor(c);
  if (c.tie_word_embeddings) {
    p.acquire(final_group_);
    p.open_grads(final_group_);
  }
  ops::rmsnorm_backward(dres_.data(), p.grad(norm), dxn_.data(), layer_input(c.n_layer), p.param(norm), rstdf_.data(),
                        N, H);
  p.close_grads(final_group_);
  p.release(final_group_);

  for (int l = c.n_layer - 1; l >= 0; --l) {
    p.acquire(1 + l);
    if (checkpointing_) forward_layer(p, l, B, T, false);
    p.open_grads(1 + l);
    auto w = [&](int k) { return p.param(layer_tensor(l, k)); };
    auto g = [&](int k) { return p.grad(layer_tensor(l, k)); };
    const size_t at = layer_slot(l) * rows;
    float* dres = dres_.data();  // in: d(layer output); out: d(layer input)

    // res3 = res2 + down(silu(gate(xn2)) * up(xn2)), xn2 = norm(res2)
    ops::linear_backward(dact_.data(), g(kDown), dres, act_.data() + at * I, w(kDown), N, I, H, false);
    ops::swiglu_backward(dgate_.data(), dup_.data(), dact_.data(), gate_.data() + at * I, up_.data() + at * I,
                         int64_t{N} * I);
    ops::linear_backward(dxn_.data(), g(kGate), dgate_.data(), xn2_.data() + at * H, w(kGate), N, H, I, false);
    ops::linear_backward(dxn_.data(), g(kUp), dup_.data(), xn2_.data() + at * H, w(kUp), N, H, I, true);
    ops::rmsnorm_backward(dres, g(kPostNorm), dxn_.data(), res2_.data() + at * H, w(kPostNorm), rstd2_.data() + at, N,
                          H);
    // res2 = input + o(attention(rope(q(xn1)), rope(k(xn1)), v(xn1))), xn1 = norm(input)
    ops::linear_backward(datty_.data(), g(kO), dres, atty_.data() + at * QW, w(kO), N, QW, H, false);
    cpu::attention_backward(dq_.data(), dk_.data(), dv_.data(), datty_.data(), q_.data() + at * QW, k_.data() + at * KW,
                            v_.data() + at * KW, att_.data() + layer_slot(l) * att_stride, attention_shape(c, B, T),
                            attention_ws_);
    ops::rope_backward(dq_.data(), cos_.data(), sin_.data(), B, T, c.n_head, D);
    ops::rope_backward(dk_.data(), cos_.data(), sin_.data(), B, T, c.n_kv_head, D);
    const float* xn1 = xn1_.data() + at * H;
    ops::linear_backward(dxn_.data(), g(kQ), dq_.data(), xn1, w(kQ), N, H, QW, false);
    ops::linear_backward(dxn_.data(), g(kK), dk_.data(), xn1, w(kK), N, H, KW, true);
    ops::linear_backward(dxn_.data(), g(kV), dv_.data(), xn1, w(kV), N, H, KW, true);
    ops::rmsnorm_backward(dres, g(kInputNorm), dxn_.data(), layer_input(l), w(kInputNorm), rstd1_.data() + at, N, H);
    p.close_grads(1 + l);
    p.release(1 + l);
  }

  if (!c.tie_word_embeddings) p.open_grads(0);
  ops::embedding_backward(p.grad(0), dres_.data(), inputs, N, H);
  p.close_grads(0);
}

}  // namespace shardkit::model::llama
