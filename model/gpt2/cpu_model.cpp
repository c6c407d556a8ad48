#include "model/gpt2/cpu_model.hpp"

#include <algorithm>
#include <chrono>

#include "base/clock.hpp"
#include "base/error.hpp"
#include "base/text_format.hpp"
#include "model/cpu/host_memory.hpp"
#include "model/cpu/ops.hpp"
#include "model/gpt2/cpu_ops.hpp"

namespace shardkit::model::gpt2 {
namespace {}  // namespace

CpuGpt2::CpuGpt2(const GptConfig& config, const ActivationPlan& plan)
    : config_(config), max_batch_(plan.batch), max_seq_(plan.seq_len), checkpointing_(plan.checkpointing) {
  const int batch = plan.batch, seq_len = plan.seq_len;
  validate(config, "model " + config.name);
  if (batch < 1 || seq_len < 1 || seq_len > config.n_positions) {
    fail(ErrorKind::kInvalidInput, "batch " + std::to_string(batch) + " x sequence " + std::to_string(seq_len) +
                                       " does not fit the model (n_positions " + std::to_string(config.n_positions) +
                                       ")");
  }
  cpu::require_activation_memory(config.name, batch, seq_len, activation_bytes(config, plan));

  const size_t N = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
  const size_t C = static_cast<size_t>(config.n_embd);
  const size_t Ls = checkpointing_ ? 1 : static_cast<size_t>(config.n_layer);  // layers of buffers (L')
  // Each attention row's two statistics, from which the backward pass recomputes its probabilities.
  const auto att = static_cast<size_t>(cpu::attention_stats_floats(batch, config.n_head, seq_len));
  encoded_.resize(N * C);
  ln1_.resize(Ls * N * C);
  ln1_mean_.resize(Ls * N);
  ln1_rstd_.resize(Ls * N);
  qkv_.resize(Ls * N * 3 * C);
  att_.resize(Ls * att);
  attention_ws_.resize(static_cast<size_t>(cpu::attention_workspace_floats(attention_shape(config, batch, seq_len))));
  atty_.resize(Ls * N * C);
  res2_.resize(Ls * N * C);
  ln2_.resize(Ls * N * C);
  ln2_mean_.resize(Ls * N);
  ln2_rstd_.resize(Ls * N);
  fch_.resize(Ls * N * 4 * C);
  fch_gelu_.resize(Ls * N * 4 * C);
  res3_.resize(static_cast<size_t>(config.n_layer) * N * C);
  lnf_.resize(N * C);
  lnf_mean_.resize(N);
  lnf_rstd_.resize(N);
  logits_.resize(static_cast<size_t>(cpu::kHeadBlockRows) * static_cast<size_t>(config.vocab_size));
  dres_.resize(N * C);
  dbuf_c_.resize(N * C);
  dbuf_c2_.resize(N * C);
  dbuf_3c_.resize(N * 3 * C);
  dbuf_4c_.resize(N * 4 * C);
  dbuf_4c2_.resize(N * 4 * C);
}

int64_t CpuGpt2::activation_bytes() const {
  return static_cast<int64_t>(activation_bytes(config_, {max_batch_, max_seq_, checkpointing_}));
}

double CpuGpt2::activation_bytes(const GptConfig& config, const ActivationPlan& plan) noexcept {
  // The buffers the constructor sizes: per layer the block output res3 (N x C), and for every layer or
  // only one (checkpointing) 15 N x C (ln1, qkv 3, atty, res2, ln2, fch 4, fch_gelu 4), 4 N statistics
  // and the attention; outside the layers 16 N x C (encoded, lnf, dres, dbuf_c, dbuf_c2, dbuf_3c 3,
  // dbuf_4c 4, dbuf_4c2 4), 2 N statistics, a block of logits and the attention's workspace.
  const double n = static_cast<double>(plan.batch) * plan.seq_len;
  const double c = config.n_embd;
  const double attention = static_cast<double>(cpu::attention_stats_floats(plan.batch, config.n_head, plan.seq_len));
  const double per_layer = 15 * n * c + 4 * n + attention;
  const double layers = plan.checkpointing ? 1 : config.n_layer;
  const double floats =
      config.n_layer * n * c + layers * per_layer + 16 * n * c + 2 * n +
      static_cast<double>(cpu::kHeadBlockRows) * config.vocab_size +
      static_cast<double>(cpu::attention_workspace_floats(attention_shape(config, plan.batch, plan.seq_len)));
  return floats * sizeof(float);
}

const float* CpuGpt2::block_input(int l) const noexcept {
  const size_t rows = static_cast<size_t>(max_batch_) * static_cast<size_t>(max_seq_);
  return l == 0 ? encoded_.data() : res3_.data() + static_cast<size_t>(l - 1) * rows * config_.n_embd;
}

void CpuGpt2::forward_blocks(ParameterStore& p, const int32_t* inputs, int B, int T) {
  if (B < 1 || B > max_batch_ || T < 1 || T > max_seq_) {
    fail(ErrorKind::kInternal, "batch " + std::to_string(B) + "x" + std::to_string(T) + " exceeds the allocated " +
                                   std::to_string(max_batch_) + "x" + std::to_string(max_seq_));
  }
  const int C = config_.n_embd, L = config_.n_layer;
  const int N = B * T;

  p.acquire(0);
  ops::encoder_forward(encoded_.data(), inputs, p.param(kWte), p.param(kWpe), B, T, C);
  p.release(0);

  for (int l = 0; l < L; ++l) {
    p.acquire(1 + l);
    forward_block(p, l, B, T, true);
    p.release(1 + l);
  }

  const int lnf_group = L + 1;
  const int lnf_w = block_tensor(L, 0);
  p.acquire(lnf_group);
  ops::layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), block_input(L), p.param(lnf_w),
                         p.param(lnf_w + 1), N, C);
  p.release(lnf_group);
}

void CpuGpt2::forward_block(ParameterStore& p, int l, int B, int T, bool with_output) {
  const int C = config_.n_embd, NH = config_.n_head;
  const int N = B * T;
  const int64_t NC = int64_t{N} * C;
  const size_t rows = static_cast<size_t>(max_batch_) * static_cast<size_t>(max_seq_);
  const size_t slot = layer_slot(l);
  auto w = [&](int k) { return p.param(block_tensor(l, k)); };
  const size_t lc = slot * rows * C;
  const size_t ln = slot * rows;
  const float* residual = block_input(l);
  float* ln1 = ln1_.data() + lc;
  float* qkv = qkv_.data() + 3 * lc;
  float* att = att_.data() + slot * static_cast<size_t>(cpu::attention_stats_floats(max_batch_, NH, max_seq_));
  float* atty = atty_.data() + lc;
  float* res2 = res2_.data() + lc;
  float* ln2 = ln2_.data() + lc;
  float* fch = fch_.data() + 4 * lc;
  float* fch_gelu = fch_gelu_.data() + 4 * lc;
  // Forward scratch: the projection outputs before the residual add. Free in the backward pass too,
  // where a block's backward pass starts with it unused.
  float* tmp = dbuf_c_.data();

  ops::layernorm_forward(ln1, ln1_mean_.data() + ln, ln1_rstd_.data() + ln, residual, w(kLn1W), w(kLn1B), N, C);
  ops::matmul_forward(qkv, ln1, w(kQkvW), w(kQkvB), N, C, 3 * C);
  cpu::attention_forward(atty, att, qkv, qkv + C, qkv + 2 * C, attention_shape(config_, B, T), attention_ws_);
  ops::matmul_forward(tmp, atty, w(kAttProjW), w(kAttProjB), N, C, C);
  cpu::residual_forward(res2, residual, tmp, NC);
  ops::layernorm_forward(ln2, ln2_mean_.data() + ln, ln2_rstd_.data() + ln, res2, w(kLn2W), w(kLn2B), N, C);
  ops::matmul_forward(fch, ln2, w(kFcW), w(kFcB), N, C, 4 * C);
  ops::gelu_forward(fch_gelu, fch, 4 * NC);
  if (!with_output) return;  // the backward pass reads fch_gelu, not the block's output
  ops::matmul_forward(tmp, fch_gelu, w(kFcProjW), w(kFcProjB), N, 4 * C, C);
  cpu::residual_forward(res3_.data() + static_cast<size_t>(l) * rows * C, res2, tmp, NC);
}

double CpuGpt2::forward(ParameterStore& p, const int32_t* inputs, const int32_t* targets, int B, int T) {
  forward_blocks(p, inputs, B, T);
  const int N = B * T;
  p.acquire(0);
  const double loss = cpu::head_forward_backward(nullptr, nullptr, logits_.data(), lnf_.data(), p.param(kWte), targets,
                                                 N, config_.n_embd, config_.vocab_size, 0.0f, N);
  p.release(0);
  return loss / N;
}

double CpuGpt2::forward_backward(ParameterStore& p, const int32_t* inputs, const int32_t* targets, int B, int T,
                                 float grad_scale, PassTimes* times) {
  const auto start = Clock::now();
  forward_blocks(p, inputs, B, T);
  const int N = B * T;
  const int C = config_.n_embd;
  // The embeddings' gradients stay open for the whole backward pass: wte receives the output
  // projection's gradient first and the token embedding's last (the weights are tied).
  p.open_grads(0);
  p.acquire(0);
  const double loss = cpu::head_forward_backward(dbuf_c_.data(), p.grad(kWte), logits_.data(), lnf_.data(),
                                                 p.param(kWte), targets, N, C, config_.vocab_size, grad_scale, N);
  p.release(0);
  if (times) times->forward_ms = ms_since(start);
  const auto backward_start = Clock::now();
  backward_blocks(p, inputs, B, T);
  if (times) times->backward_ms = ms_since(backward_start);
  return loss / N;
}

void CpuGpt2::backward_blocks(ParameterStore& p, const int32_t* inputs, int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const int N = B * T;
  const int64_t NC = int64_t{N} * C;
  const size_t att_stride = static_cast<size_t>(cpu::attention_stats_floats(max_batch_, NH, max_seq_));
  const size_t rows = static_cast<size_t>(max_batch_ * max_seq_);

  // Final LayerNorm: dbuf_c_ holds d(lnf) from the output projection.
  const int lnf_group = L + 1;
  const int lnf_w = block_tensor(L, 0);
  std::fill(dres_.begin(), dres_.begin() + NC, 0.0f);
  p.acquire(lnf_group);
  p.open_grads(lnf_group);
  ops::layernorm_backward(dres_.data(), p.grad(lnf_w), p.grad(lnf_w + 1), dbuf_c_.data(), block_input(L),
                          p.param(lnf_w), lnf_mean_.data(), lnf_rstd_.data(), N, C);
  p.close_grads(lnf_group);
  p.release(lnf_group);

  for (int l = L - 1; l >= 0; --l) {
    p.acquire(1 + l);
    if (checkpointing_) forward_block(p, l, B, T, false);
    p.open_grads(1 + l);
    auto w = [&](int k) { return p.param(block_tensor(l, k)); };
    auto g = [&](int k) { return p.grad(block_tensor(l, k)); };
    const size_t lc = layer_slot(l) * rows * C;
    const size_t ln = layer_slot(l) * rows;
    float* dres = dres_.data();  // in: d(block output); out: d(block input)

    // res3 = res2 + fcproj(gelu(fc(ln2(res2))))
    ops::matmul_backward(dbuf_4c_.data(), g(kFcProjW), g(kFcProjB), dres, fch_gelu_.data() + 4 * lc, w(kFcProjW), N,
                         4 * C, C);
    ops::gelu_backward(dbuf_4c2_.data(), fch_.data() + 4 * lc, dbuf_4c_.data(), 4 * NC);
    ops::matmul_backward(dbuf_c_.data(), g(kFcW), g(kFcB), dbuf_4c2_.data(), ln2_.data() + lc, w(kFcW), N, C, 4 * C);
    ops::layernorm_backward(dres, g(kLn2W), g(kLn2B), dbuf_c_.data(), res2_.data() + lc, w(kLn2W),
                            ln2_mean_.data() + ln, ln2_rstd_.data() + ln, N, C);
    // res2 = input + attproj(attention(qkv(ln1(input))))
    ops::matmul_backward(dbuf_c_.data(), g(kAttProjW), g(kAttProjB), dres, atty_.data() + lc, w(kAttProjW), N, C, C);
    const float* qkv = qkv_.data() + 3 * lc;
    float* dqkv = dbuf_3c_.data();
    cpu::attention_backward(dqkv, dqkv + C, dqkv + 2 * C, dbuf_c_.data(), qkv, qkv + C, qkv + 2 * C,
                            att_.data() + layer_slot(l) * att_stride, attention_shape(config_, B, T), attention_ws_);
    ops::matmul_backward(dbuf_c2_.data(), g(kQkvW), g(kQkvB), dbuf_3c_.data(), ln1_.data() + lc, w(kQkvW), N, C, 3 * C);
    ops::layernorm_backward(dres, g(kLn1W), g(kLn1B), dbuf_c2_.data(), block_input(l), w(kLn1W), ln1_mean_.data() + ln,
                            ln1_rstd_.data() + ln, N, C);
    p.close_grads(1 + l);
    p.release(1 + l);
  }

  ops::encoder_backward(p.grad(kWte), p.grad(kWpe), dres_.data(), inputs, B, T, C);
  p.close_grads(0);
}

}  // namespace shardkit::model::gpt2
