"""A compact forward pass for Llama-architecture checkpoints (gpt-fast style), over the model's own weights.

transformers' module stack costs several milliseconds per forward in Python overhead (decorators, kwargs,
output capturing), which dominates for small drafts and targets on CPU. This runner does the same arithmetic
in a few fused matmuls per layer (q/k/v and gate/up concatenated), writes keys and values straight into the
`PositionCache`, and uses the model's rotary embedding module, so rope variants stay exact. Tests check it
against the transformers forward in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED = ("llama",)


def supports(model) -> bool:
    config = model.config
    return (getattr(config, "model_type", None) in SUPPORTED and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False) and getattr(config, "hidden_act", "silu") == "silu")


class LlamaRunner:
    """`int8_head`: the output layer as int8 rows (`int8_linear`), a copy made here: a draft's head over a large
    vocabulary is most of its per-token cost at one row (memory-bound), and a quarter of the bytes is read."""

    def __init__(self, model, int8_head: bool = False):
        config, body = model.config, model.model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed, self.rotary = body.embed_tokens.weight, body.rotary_emb
        self.final_norm = (body.norm.weight, body.norm.variance_epsilon)
        self.lm_head = model.lm_head.weight
        self.head = None
        if int8_head:
            from specgen.modalities.int8_linear import Int8Linear

            self.head = Int8Linear.from_linear(model.lm_head)
        self.keep_hidden, self.last_hidden = False, None
        self.layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append({
                "norm_in": (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                "qkv": torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
                "out": attn.o_proj.weight,
                "norm_post": (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                "down": mlp.down_proj.weight,
                "scaling": attn.scaling,
            })

    @torch.no_grad()
    def forward(self, tokens, positions, cache, attention_mask, logits_to_keep: int = 0) -> torch.Tensor:
        """tokens, positions: [rows, n]; attention_mask: additive [rows, 1, n, width]. Returns logits.
        With `keep_hidden` set, the final-normed hidden states of every slot are kept in `last_hidden` (the
        features an EAGLE-style draft head reads)."""
        hidden = self.forward_hidden(F.embedding(tokens, self.embed), positions, cache, attention_mask)
        if self.keep_hidden:
            self.last_hidden = hidden
        kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        return self.head(kept) if self.head is not None else F.linear(kept, self.lm_head)

    @torch.no_grad()
    def forward_hidden(self, hidden, positions, cache, attention_mask) -> torch.Tensor:
        """The layers and the final norm over input vectors `hidden` [rows, n, d]; returns [rows, n, d]."""
        rows, n = hidden.shape[:2]
        cos, sin = self.rotary(hidden, positions)  # [rows, n, head_dim]
        cos, sin = cos[:, :, None], sin[:, :, None]  # over the heads of q and k together
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for index, layer in enumerate(self.layers):
            x = _rms_norm(hidden, *layer["norm_in"])
            qk, v = F.linear(x, layer["qkv"]).split([q_size + kv_size, kv_size], dim=-1)
            qk = qk.view(rows, n, self.heads + self.kv_heads, self.head_dim)
            qk = qk * cos + rotate_half(qk) * sin  # rope on q and k in one pass: fewer ops per layer
            q = qk[:, :, :self.heads].transpose(1, 2)  # (B, nh, n, hd)
            k = qk[:, :, self.heads:].transpose(1, 2)
            v = v.view(rows, n, self.kv_heads, self.head_dim).transpose(1, 2)
            keys, values = cache.update(k, v, index)  # (B, nkv, width, hd)
            attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=attention_mask,
                                                      scale=layer["scaling"], enable_gqa=self.heads != self.kv_heads)
            hidden = hidden + F.linear(attended.transpose(1, 2).reshape(rows, n, q_size), layer["out"])
            x = _rms_norm(hidden, *layer["norm_post"])
            gate, up = F.linear(x, layer["gate_up"]).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer["down"])
        return _rms_norm(hidden, *self.final_norm)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # as transformers' LlamaRMSNorm: statistics in float32 (float64 inputs too), weight applied in the input
    # dtype; in float32 that is one fused op
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
