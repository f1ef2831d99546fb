"""Independent PyTorch forward passes of the architectures Tandem serves, written from the
families' published definitions (Hugging Face transformers' modeling_<family>.py and the model
papers), computing in float64 from the checkpoint's own tensors and config.json. Shares no code
with the C++ engine. Each model maps token ids [T] to logits [T, vocab] with causal attention
over the whole sequence (no KV cache: every call recomputes from scratch)."""
import math

import torch

F64 = torch.float64


def rms_norm(x, weight, eps):
    # LlamaRMSNorm / Qwen3RMSNorm: x * rsqrt(mean(x^2) + eps) * weight, over the last dim.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_inv_freq(cfg, head_dim):
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=F64) / head_dim))
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":  # modeling_rope_utils._compute_llama3_parameters
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        return torch.where(medium, smoothed, scaled)
    raise NotImplementedError(f"rope_scaling {kind}")


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    # x [T, heads, head_dim]; cos/sin [T, head_dim] (the frequencies repeated twice).
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def causal_attention(q, k, v, window=0):
    # q [T, H, D], k/v [T, KV, D]; grouped-query: each KV head serves H/KV query heads. With a
    # sliding window, query i sees keys j with i - window < j <= i (Mistral, Phi-3).
    t, h, d = q.shape
    group = h // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    if window:
        mask |= torch.tril(torch.ones(t, t, dtype=torch.bool), diagonal=-window)
    scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hts,shd->thd", probs, v).reshape(t, h * d)


class DecoderOnly:
    """LlamaForCausalLM and the families that keep its block: pre-norm decoder layers of GQA
    attention with rotary embeddings and a SwiGLU MLP. Qwen2 adds q/k/v biases; Qwen3 adds a
    per-head RMSNorm of q and k (weights [head_dim]) before the rotation."""

    def __init__(self, cfg, tensors):
        self.cfg = cfg
        self.w = {k: torch.from_numpy(v) for k, v in tensors.items()}
        self.arch = cfg["architectures"][0]
        self.h = cfg["num_attention_heads"]
        self.kv = cfg.get("num_key_value_heads", self.h)
        self.d = cfg.get("head_dim") or cfg["hidden_size"] // self.h
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.window = cfg.get("sliding_window") or 0
        if (self.arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM") and
                not cfg.get("use_sliding_window")):
            self.window = 0

    def rope(self, t):
        inv = rope_inv_freq(self.cfg, self.d)
        freqs = torch.outer(torch.arange(t, dtype=F64), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def linear(self, x, name, bias=False):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    def attention(self, x, p, cos, sin):
        t = x.shape[0]
        # Qwen2Attention / Qwen2MoeAttention: q/k/v biases (qkv_bias, default true), o_proj none.
        bias = (self.arch == "Qwen2ForCausalLM" or
                (self.arch == "Qwen2MoeForCausalLM" and self.cfg.get("qkv_bias", True)))
        q = self.linear(x, p + "q_proj", bias).view(t, self.h, self.d)
        k = self.linear(x, p + "k_proj", bias).view(t, self.kv, self.d)
        v = self.linear(x, p + "v_proj", bias).view(t, self.kv, self.d)
        if self.arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            q = rms_norm(q, self.w[p + "q_norm.weight"], self.eps)
            k = rms_norm(k, self.w[p + "k_norm.weight"], self.eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.linear(causal_attention(q, k, v, self.window), p + "o_proj")

    def mlp(self, x, p):
        gate = self.linear(x, p + "gate_proj")
        return self.linear(torch.nn.functional.silu(gate) * self.linear(x, p + "up_proj"),
                           p + "down_proj")

    def logits(self, ids):
        w = self.w
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        cos, sin = self.rope(len(ids))
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = x + self.attention(rms_norm(x, w[p + "input_layernorm.weight"], self.eps),
                                   p + "self_attn.", cos, sin)
            x = x + self.mlp(rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps),
                             p + "mlp.")
        x = rms_norm(x, w["model.norm.weight"], self.eps)
        head = w["model.embed_tokens.weight"] if self.cfg.get("tie_word_embeddings") \
            else w["lm_head.weight"]
        return x @ head.T


class Phi3(DecoderOnly):
    """Phi3ForCausalLM (modeling_phi3.py): the Llama block with fused projections, qkv_proj
    [q + 2 kv, hidden] holding q, k and v rows in that order and gate_up_proj [2 ffn, hidden]
    holding the gate's rows then up's; LongRoPE ("su" / "longrope") rotary scaling. Phi-4-mini:
    partial_rotary_factor rotates only the first int(head_dim * factor) dims of each head
    (rotate_half within them, the frequencies and LongRoPE factors sized for them), the rest pass
    through unchanged."""

    def __init__(self, cfg, tensors):
        super().__init__(cfg, tensors)
        self.rot = int(self.d * cfg.get("partial_rotary_factor", 1.0))

    def rotate(self, x, cos, sin):
        r = self.rot
        return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)

    def rope(self, t):
        scaling = self.cfg.get("rope_scaling") or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("longrope", "su"):
            inv = rope_inv_freq(self.cfg, self.rot)
            freqs = torch.outer(torch.arange(t, dtype=F64), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos(), emb.sin()
        # modeling_rope_utils._compute_longrope_parameters: inv_freq = 1 / (ext * base^(2i/d)),
        # cos and sin scaled by the attention factor. transformers takes ext = long_factor for a
        # whole forward once the sequence is longer than original_max_position_embeddings; here,
        # as in Tandem (whose KV cache keeps earlier positions), per position: positions from
        # original_max_position_embeddings on rotate with long_factor.
        original = self.cfg["original_max_position_embeddings"]
        factor = self.cfg["max_position_embeddings"] / original
        attention = scaling.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else \
                math.sqrt(1 + math.log(factor) / math.log(original))
        base = self.cfg.get("rope_theta", 10000.0) ** (
            torch.arange(0, self.rot, 2, dtype=F64) / self.rot)
        pos = torch.arange(t, dtype=F64)
        short = torch.outer(pos, 1.0 / (torch.tensor(scaling["short_factor"], dtype=F64) * base))
        long = torch.outer(pos, 1.0 / (torch.tensor(scaling["long_factor"], dtype=F64) * base))
        freqs = torch.where((pos >= original)[:, None], long, short)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * attention, emb.sin() * attention

    def attention(self, x, p, cos, sin):
        t = x.shape[0]
        qd, kvd = self.h * self.d, self.kv * self.d
        qkv = self.linear(x, p + "qkv_proj")
        q = qkv[:, :qd].reshape(t, self.h, self.d)
        k = qkv[:, qd:qd + kvd].reshape(t, self.kv, self.d)
        v = qkv[:, qd + kvd:].reshape(t, self.kv, self.d)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        return self.linear(causal_attention(q, k, v, self.window), p + "o_proj")

    def mlp(self, x, p):
        gate, up = self.linear(x, p + "gate_up_proj").chunk(2, dim=-1)
        return self.linear(up * torch.nn.functional.silu(gate), p + "down_proj")


def gemma_rms_norm(x, weight, eps):
    # Gemma3RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + weight).
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight)


def gelu_tanh(x):
    # gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class Gemma3(DecoderOnly):
    """Gemma3ForCausalLM (modeling_gemma3.py, text): embeddings times sqrt(hidden); Gemma3RMSNorm
    (x / rms(x) * (1 + w)) before and after attention and before and after the MLP, and per head
    on q and k; attention scores scaled by query_pre_attn_scalar^-1/2; GeGLU MLP (tanh GELU);
    sliding-window layers (layer_types) rotating with rope_local_base_freq, global ones with
    rope_theta and rope_scaling; optional final logit soft-capping."""

    def __init__(self, cfg, tensors):
        super().__init__(cfg, tensors)
        self.sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
        self.window = cfg["sliding_window"]
        self.scale = cfg.get("query_pre_attn_scalar", 256) ** -0.5

    def rope_tables(self, t):
        local_cfg = dict(self.cfg, rope_theta=self.cfg.get("rope_local_base_freq", 10000.0),
                         rope_scaling=None)
        tables = []
        for cfg in (self.cfg, local_cfg):
            inv = rope_inv_freq(cfg, self.d)
            freqs = torch.outer(torch.arange(t, dtype=F64), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            tables.append((emb.cos(), emb.sin()))
        return tables

    def layer_attention(self, x, p, cos, sin, sliding):
        t = x.shape[0]
        q = self.linear(x, p + "q_proj").view(t, self.h, self.d)
        k = self.linear(x, p + "k_proj").view(t, self.kv, self.d)
        v = self.linear(x, p + "v_proj").view(t, self.kv, self.d)
        q = gemma_rms_norm(q, self.w[p + "q_norm.weight"], self.eps)
        k = gemma_rms_norm(k, self.w[p + "k_norm.weight"], self.eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # causal_attention scales by head_dim^-1/2; Gemma's scale is query_pre_attn_scalar^-1/2.
        q = q * (self.scale * math.sqrt(self.d))
        return self.linear(causal_attention(q, k, v, self.window if sliding else 0),
                           p + "o_proj")

    def logits(self, ids):
        w, eps = self.w, self.eps
        x = w["model.embed_tokens.weight"][torch.tensor(ids)] * math.sqrt(self.cfg["hidden_size"])
        (gcos, gsin), (lcos, lsin) = self.rope_tables(len(ids))
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            cos, sin = (lcos, lsin) if self.sliding[i] else (gcos, gsin)
            a = self.layer_attention(gemma_rms_norm(x, w[p + "input_layernorm.weight"], eps),
                                     p + "self_attn.", cos, sin, self.sliding[i])
            x = x + gemma_rms_norm(a, w[p + "post_attention_layernorm.weight"], eps)
            h = gemma_rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
            m = self.linear(gelu_tanh(self.linear(h, p + "mlp.gate_proj")) *
                            self.linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
            x = x + gemma_rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps)
        x = gemma_rms_norm(x, w["model.norm.weight"], eps)
        logits = x @ w["model.embed_tokens.weight"].T
        cap = self.cfg.get("final_logit_softcapping")
        return cap * torch.tanh(logits / cap) if cap else logits


class Gemma2(DecoderOnly):
    """Gemma2ForCausalLM (modeling_gemma2.py): embeddings times sqrt(hidden); Gemma2RMSNorm
    (x / rms(x) * (1 + w)) before and after attention and before and after the MLP; no q/k
    norms; one RoPE base (rope_theta) for every layer; attention scores q.k times
    query_pre_attn_scalar^-1/2, soft-capped to cap * tanh(s / cap) (attn_logit_softcapping)
    before the causal mask and the softmax; sliding-window layers (layer_types, by default the
    even ones: `not layer_idx % 2`) see keys j with i - sliding_window < j <= i; GeGLU MLP
    (tanh GELU); final logits soft-capped by final_logit_softcapping."""

    def __init__(self, cfg, tensors):
        super().__init__(cfg, tensors)
        n = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        self.sliding = [t == "sliding_attention" for t in types]
        self.window = cfg.get("sliding_window", 4096)
        self.scaling = cfg.get("query_pre_attn_scalar", 256) ** -0.5
        self.attn_cap = cfg.get("attn_logit_softcapping", 50.0)
        self.final_cap = cfg.get("final_logit_softcapping", 30.0)

    def attention(self, q, k, v, sliding):
        t = q.shape[0]
        group = self.h // self.kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) * self.scaling
        if self.attn_cap:
            scores = torch.tanh(scores / self.attn_cap) * self.attn_cap
        i = torch.arange(t)[:, None]
        j = torch.arange(t)[None, :]
        hidden = j > i
        if sliding:
            hidden = hidden | (j <= i - self.window)
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.einsum("hts,shd->thd", probs, v).reshape(t, self.h * self.d)

    def logits(self, ids):
        w, eps, t = self.w, self.eps, len(ids)
        x = w["model.embed_tokens.weight"][torch.tensor(ids)] * math.sqrt(self.cfg["hidden_size"])
        inv = rope_inv_freq(self.cfg, self.d)
        freqs = torch.outer(torch.arange(t, dtype=F64), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = gemma_rms_norm(x, w[p + "input_layernorm.weight"], eps)
            q = self.linear(h, p + "self_attn.q_proj").view(t, self.h, self.d)
            k = self.linear(h, p + "self_attn.k_proj").view(t, self.kv, self.d)
            v = self.linear(h, p + "self_attn.v_proj").view(t, self.kv, self.d)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            a = self.linear(self.attention(q, k, v, self.sliding[i]), p + "self_attn.o_proj")
            x = x + gemma_rms_norm(a, w[p + "post_attention_layernorm.weight"], eps)
            h = gemma_rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
            m = self.linear(gelu_tanh(self.linear(h, p + "mlp.gate_proj")) *
                            self.linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
            x = x + gemma_rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps)
        x = gemma_rms_norm(x, w["model.norm.weight"], eps)
        logits = x @ w["model.embed_tokens.weight"].T
        cap = self.final_cap
        return cap * torch.tanh(logits / cap) if cap else logits


class MixtureOfExperts(DecoderOnly):
    """MixtralForCausalLM (modeling_mixtral.py: MixtralSparseMoeBlock, experts w1 = gate,
    w3 = up, w2 = down), Qwen3MoeForCausalLM (modeling_qwen3_moe.py: Qwen3 attention,
    Qwen3MoeSparseMoeBlock) and Qwen2MoeForCausalLM (modeling_qwen2_moe.py: Qwen2 attention,
    Qwen2MoeSparseMoeBlock): router logits, softmax over all experts, the top
    num_experts_per_tok, renormalised (Mixtral always; the Qwen families when norm_topk_prob),
    each token's output the weighted sum of its experts' SwiGLU outputs. Qwen2-MoE then adds a
    shared expert (a SwiGLU MLP of shared_expert_intermediate_size every token runs) scaled by
    sigmoid(shared_expert_gate(x)), a [1, hidden] linear map of the same input."""

    def mlp(self, x, p):
        mixtral = self.arch == "MixtralForCausalLM"
        prefix = p[:-len("mlp.")] + "block_sparse_moe." if mixtral else p
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        experts = self.cfg["num_local_experts" if mixtral else "num_experts"]
        k = self.cfg["num_experts_per_tok"]
        probs = torch.softmax(x @ self.w[prefix + "gate.weight"].T, dim=-1)
        top, idx = torch.topk(probs, k, dim=-1)
        if mixtral or self.cfg.get("norm_topk_prob", False):
            top = top / top.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(experts):
            rows, slot = torch.where(idx == e)
            if rows.numel() == 0:
                continue
            ep = f"{prefix}experts.{e}."
            xe = x[rows]
            y = self.linear(torch.nn.functional.silu(self.linear(xe, ep + names[0])) *
                            self.linear(xe, ep + names[1]), ep + names[2])
            out.index_add_(0, rows, y * top[rows, slot, None])
        if self.arch == "Qwen2MoeForCausalLM":
            shared = self.mlp_of(x, prefix + "shared_expert.")
            out = out + torch.sigmoid(self.linear(x, prefix + "shared_expert_gate")) * shared
        return out

    def mlp_of(self, x, p):
        return DecoderOnly.mlp(self, x, p)


ARCHITECTURES = {
    "MixtralForCausalLM": MixtureOfExperts,
    "Qwen3MoeForCausalLM": MixtureOfExperts,
    "Qwen2MoeForCausalLM": MixtureOfExperts,
    "Gemma3ForCausalLM": Gemma3,
    "Gemma2ForCausalLM": Gemma2,
    "Phi3ForCausalLM": Phi3,
    "LlamaForCausalLM": DecoderOnly,
    "MistralForCausalLM": DecoderOnly,
    "Qwen2ForCausalLM": DecoderOnly,
    "Qwen3ForCausalLM": DecoderOnly,
}


def load(model_dir):
    import json
    import os

    from safetensors_np import load_tensors
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    return ARCHITECTURES[cfg["architectures"][0]](cfg, load_tensors(model_dir))


def greedy(model, ids, new_tokens):
    ids = list(ids)
    out = []
    for _ in range(new_tokens):
        nxt = int(torch.argmax(model.logits(ids)[-1]))
        out.append(nxt)
        ids.append(nxt)
    return out
