"""Llama as Hugging Face's LlamaForCausalLM computes it (RMSNorm, rotary position embeddings with the
optional llama3 rescaling, grouped-query causal attention, SwiGLU MLP, no biases), in plain PyTorch
over a dict of tensors named as shardkit's (and Hugging Face's) state dict. The configuration is
shardkit's JSON form of a Llama model, whose fields are LlamaConfig's. The reference of the Llama
golden numerics test: written from the model's definition, not from shardkit's C++.

Everything after the inverse frequencies runs in the parameters' dtype (float64 in the test), so the
reference is the exact computation. Hugging Face computes the rotary angles, RMSNorm and the attention
softmax in fp32 even in a float64 model, which moves its results by about 1e-6 relative: a tenth of
the test's tolerance, and not a property of the model that an fp32 implementation should copy."""
import math

import torch
import torch.nn.functional as F


def rope_inv_freq(cfg):
    """The rotary embedding's head_dim / 2 inverse frequencies theta^(-2i/D), computed in float32 as
    Hugging Face does (an fp32 implementation starts from these rounded values, and the exact
    computation should too), then rescaled band-wise when rope_scaling is llama3's."""
    D = cfg["head_dim"]
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    s = cfg["rope_scaling"]
    if s is None:
        return inv
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    orig = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    # Wavelengths shorter than orig / high are kept, those longer than orig / low stretched by
    # `factor`, and those between interpolated between the two.
    smooth = (orig / wavelen - low) / (high - low)
    between = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(wavelen < orig / high, inv, torch.where(wavelen > orig / low, inv / factor, between))


def rope_cos_sin(cfg, T, dtype):
    """cos and sin [T, head_dim] of positions 0..T-1 times the fp32 frequencies, computed in `dtype`;
    channels i and i + head_dim/2 share frequency i."""
    angles = torch.arange(T, dtype=dtype)[:, None] * rope_inv_freq(cfg).to(dtype)[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, cos, sin):
    """Channel i and channel i + D/2 form one rotating pair: x*cos + rotate_half(x)*sin with
    rotate_half(x) = cat(-x2, x1)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def llama_logits(p, inputs, cfg):
    """Logits [B, T, V] of B independent sequences (positions 0..T-1 each)."""
    L, NH, NKV, D = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    B, T = inputs.shape
    embed = p["model.embed_tokens.weight"]
    cos, sin = rope_cos_sin(cfg, T, embed.dtype)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = embed[inputs]
    for i in range(L):
        h = f"model.layers.{i}."
        a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q = (a @ p[h + "self_attn.q_proj.weight"].T).view(B, T, NH, D).transpose(1, 2)
        k = (a @ p[h + "self_attn.k_proj.weight"].T).view(B, T, NKV, D).transpose(1, 2)
        v = (a @ p[h + "self_attn.v_proj.weight"].T).view(B, T, NKV, D).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        # Grouped-query attention: query head j reads key/value head j // (NH / NKV).
        k, v = (t.repeat_interleave(NH // NKV, dim=1) for t in (k, v))
        att = (q @ k.transpose(-2, -1)) * D**-0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * D)
        x = x + y @ p[h + "self_attn.o_proj.weight"].T
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        m = F.silu(m @ p[h + "mlp.gate_proj.weight"].T) * (m @ p[h + "mlp.up_proj.weight"].T)
        x = x + m @ p[h + "mlp.down_proj.weight"].T
    x = rms_norm(x, p["model.norm.weight"], eps)
    return x @ p["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"].T


def llama_loss(p, inputs, targets, cfg):
    """Mean next-token cross-entropy over every position of every sequence."""
    logits = llama_logits(p, inputs, cfg)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def shapes(cfg):
    """The tensor table: LlamaForCausalLM's state-dict names, nn.Linear weights [out, in]."""
    H, I, V, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = {"model.embed_tokens.weight": (V, H)}
    for i in range(cfg["num_hidden_layers"]):
        h = f"model.layers.{i}."
        out.update({h + "self_attn.q_proj.weight": (NH * D, H), h + "self_attn.k_proj.weight": (NKV * D, H),
                    h + "self_attn.v_proj.weight": (NKV * D, H), h + "self_attn.o_proj.weight": (H, NH * D),
                    h + "mlp.gate_proj.weight": (I, H), h + "mlp.up_proj.weight": (I, H),
                    h + "mlp.down_proj.weight": (H, I), h + "input_layernorm.weight": (H,),
                    h + "post_attention_layernorm.weight": (H,)})
    out["model.norm.weight"] = (H,)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (V, H)
    return out
