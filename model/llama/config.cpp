#include "model/llama/config.hpp"

#include <cmath>
#include <numbers>

#include "base/error.hpp"

namespace shardkit::model::llama {

void validate(const LlamaConfig& c, const std::string& where) {
  auto bad = [&](const std::string& what) { fail(ErrorKind::kInvalidInput, where + ": " + what); };
  if (c.n_layer < 1 || c.hidden_size < 1 || c.intermediate_size < 1 || c.n_head < 1 || c.n_kv_head < 1 ||
      c.head_dim < 1 || c.vocab_size < 1 || c.max_position_embeddings < 1) {
    bad("num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim, "
        "vocab_size and max_position_embeddings must all be positive");
  }
  if (c.n_head % c.n_kv_head != 0) {
    bad("num_attention_heads " + std::to_string(c.n_head) + " is not a multiple of num_key_value_heads " +
        std::to_string(c.n_kv_head));
  }
  if (c.head_dim % 2 != 0) bad("head_dim " + std::to_string(c.head_dim) + " is odd (rotary embeddings pair channels)");
  if (c.n_layer > 1024 || c.hidden_size > 65536 || c.intermediate_size > (1 << 20) || c.n_head > 1024 ||
      c.head_dim > 1024 || c.vocab_size > (1 << 24) || c.max_position_embeddings > (1 << 22)) {
    bad("model dimensions are implausibly large");
  }
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1)) bad("rms_norm_eps must lie in (0, 1)");
  if (!(c.rope_theta > 1 && std::isfinite(c.rope_theta))) bad("rope_theta must be a finite number above 1");
  const Llama3Scaling& s = c.rope_scaling;
  if (s.factor != 0) {
    if (!(s.factor >= 1 && std::isfinite(s.factor)) || !(s.low_freq_factor > 0) ||
        !(s.high_freq_factor > s.low_freq_factor) || !std::isfinite(s.high_freq_factor) ||
        s.original_max_position_embeddings < 1) {
      bad("rope_scaling (llama3) needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a positive "
          "original_max_position_embeddings");
    }
  }
}

ckpt::TensorTable tensor_table(const LlamaConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  std::vector<ckpt::TensorInfo> t;
  t.reserve(static_cast<size_t>(3 + kTensorsPerLayer * c.n_layer));
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    t.push_back({std::move(name), std::move(shape), ckpt::DType::kF32});
  };
  add("model.embed_tokens.weight", {c.vocab_size, H});
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "self_attn.q_proj.weight", {c.n_head * D, H});
    add(p + "self_attn.k_proj.weight", {c.n_kv_head * D, H});
    add(p + "self_attn.v_proj.weight", {c.n_kv_head * D, H});
    add(p + "self_attn.o_proj.weight", {H, c.n_head * D});
    add(p + "mlp.gate_proj.weight", {I, H});
    add(p + "mlp.up_proj.weight", {I, H});
    add(p + "mlp.down_proj.weight", {H, I});
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
  }
  add("model.norm.weight", {H});
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, H});
  return ckpt::TensorTable(std::move(t));
}

std::vector<float> rope_inv_freq(const LlamaConfig& c) {
  // fp32 throughout, as Hugging Face computes them, so that the angles agree to the last bit where
  // the platform's powf does.
  const int half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const auto theta = static_cast<float>(c.rope_theta);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(theta, exponent);
  }
  const Llama3Scaling& s = c.rope_scaling;
  if (s.factor == 0) return inv;
  const auto factor = static_cast<float>(s.factor);
  const auto low = static_cast<float>(s.low_freq_factor);
  const auto high = static_cast<float>(s.high_freq_factor);
  const auto old_context = static_cast<float>(s.original_max_position_embeddings);
  const float low_freq_wavelen = old_context / low;
  const float high_freq_wavelen = old_context / high;
  for (float& f : inv) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
    if (wavelen < high_freq_wavelen) continue;  // high frequencies: kept
    if (wavelen > low_freq_wavelen) {
      f = f / factor;  // low frequencies: stretched to the longer context
      continue;
    }
    // Between the bands, interpolated; the operations in Hugging Face's order, for the same rounding.
    const float smooth = (old_context / wavelen - low) / (high - low);
    f = (1.0f - smooth) * f / factor + smooth * f;
  }
  return inv;
}

RopeTables rope_tables(const LlamaConfig& config, int seq_len) {
  const std::vector<float> inv_freq = rope_inv_freq(config);
  const size_t half = inv_freq.size();
  RopeTables r;
  r.cos.resize(static_cast<size_t>(seq_len) * half);
  r.sin.resize(r.cos.size());
  for (int t = 0; t < seq_len; ++t) {
    for (size_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq[i];
      r.cos[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      r.sin[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return r;
}

}  // namespace shardkit::model::llama
