"""A compact, batch-invariant forward pass for Gemma 3 text checkpoints (the default text target).

Same arithmetic as transformers' Gemma 3 (scaled embeddings, (1 + w) RMSNorms before and after attention and
MLP, q/k norms, local and global rotary bases, sliding-window layers, tanh-GELU gating) in a few fused calls
per layer (on a CPU with the int8 kernel, two compiled calls around the cache write and attention:
`kernels.gemma_layer`), with one difference that matters for exactness: attention runs one query at a time over exactly
the keys that query sees, gathered in position order. A drafted token scored in a window of 8 then goes
through the very same kernels, with the very same shapes, as the same token scored alone by plain decoding,
so with row-invariant linear layers (`int8_linear.Int8Linear`) its logits are bitwise identical and
speculative decoding reproduces plain decoding of the served model token for token. A batched attention
kernel would tile the window's queries together and change the summation order with the window size. In
float32 every query of a forward goes through one call of a compiled kernel with that same per-query arithmetic
(`kernels.query_attention`); elsewhere, or where it cannot build, one `scaled_dot_product_attention` per query.
`forward_hidden` runs a range of layers over input vectors (a self-draft's or an early exit's cut of the target, or
input vectors scored by `TransformersTarget.score`); chained ranges give one forward's bits.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from specgen.kernels import cpu_build, decode_step, gemma_layer, int8_rows, query_attention
from specgen.modalities.runtime.int8_linear import Int8Linear

SUPPORTED = ("gemma3_text",)


def supports(model) -> bool:
    config = model.config
    return (getattr(config, "model_type", None) in SUPPORTED and not getattr(config, "attention_bias", False)
            and getattr(config, "hidden_activation", None) == "gelu_pytorch_tanh"
            and getattr(config, "attn_logit_softcapping", None) is None)


def _fused(layers):
    """One callable computing `layers` side by side (rows are independent, so results are unchanged)."""
    if all(isinstance(layer, Int8Linear) for layer in layers):
        return Int8Linear.concat(layers)
    weight = torch.cat([layer.weight for layer in layers]).detach()
    return lambda x: F.linear(x, weight)


# model -> (stamp, per layer (fused q/k/v, fused gate/up)): a request builds a runner, and fusing Gemma 3 270M's int8
# rows anew each time copied about 65 MB (a peak of resident memory per request, benchmarks/memory/budget-latest.md)
# and cost time; the stamp (every parameter's and buffer's storage and version) notices an update of the weights
_FUSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _fused_layers(model) -> list[tuple]:
    stamp = tuple((t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers()))
    cached = _FUSED.get(model)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    fused = [(_fused([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
              _fused([layer.mlp.gate_proj, layer.mlp.up_proj])) for layer in model.model.layers]
    _FUSED[model] = (stamp, fused)
    return fused


class GemmaRunner:
    def __init__(self, model):
        config, body = model.config, model.model
        if cpu_build.on_cpu(model):  # a machine without the kernels compiles all four at once
            cpu_build.build_side_by_side(int8_rows.load, gemma_layer.load, query_attention.load,
                                         decode_step.load)
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.embed, self.rotary, self.lm_head = body.embed_tokens, body.rotary_emb, model.lm_head
        self.final_norm = _norm(body.norm)
        self.softcap = config.final_logit_softcapping
        self.keep_hidden, self.last_hidden = False, None
        self._glue = None  # whether `kernels.gemma_layer` serves the layers: decided on first use (tests set it)
        self.layers = []
        for layer_type, layer, (qkv, gate_up) in zip(config.layer_types, body.layers, _fused_layers(model)):
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append({
                "type": layer_type,
                "norm_in": _norm(layer.input_layernorm),
                "qkv": qkv,
                "q_norm": _norm(attn.q_norm), "k_norm": _norm(attn.k_norm),
                "out": attn.o_proj, "scaling": attn.scaling,
                "norm_post_attn": _norm(layer.post_attention_layernorm),
                "norm_pre_mlp": _norm(layer.pre_feedforward_layernorm),
                "gate_up": gate_up, "down": mlp.down_proj,
                "norm_post_mlp": _norm(layer.post_feedforward_layernorm),
            })

    def uses_glue(self) -> bool:
        """Whether the layers run through `kernels.gemma_layer`: every linear layer an `Int8Linear` the int8 kernel
        serves (inputs a multiple of 8 wide) and the kernel built. Decided once."""
        if self._glue is None:
            linears = [layer[name] for layer in self.layers for name in ("qkv", "out", "gate_up", "down")]
            self._glue = (all(isinstance(linear, Int8Linear) and linear.in_features % 8 == 0 for linear in linears)
                          and gemma_layer.available())
        return self._glue

    @torch.no_grad()
    def forward(self, tokens, positions, cache, attention_mask, logits_to_keep: int = 0) -> torch.Tensor:
        """tokens, positions: [rows, n]; attention_mask: None (every cached key and every earlier window slot is
        visible) or {layer type: additive [rows, 1, n, width]}. Returns logits [rows, n or logits_to_keep, V].
        Prompts go through the same one-query-at-a-time attention (about 1 ms per prompt token here): a token's
        logits then do not depend on whether its context was prefilled or decoded, or on the other rows."""
        hidden = self.forward_hidden(self.embed(tokens), positions, cache, attention_mask)  # [rows, n, d]
        if self.keep_hidden:
            self.last_hidden = hidden
        return self.output(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)

    @torch.no_grad()
    def forward_hidden(self, hidden, positions, cache, attention_mask, layers: range | None = None) -> torch.Tensor:
        """The layers and the final norm over input vectors `hidden` [rows, n, d] (the scaled embeddings, for the
        first layer); returns [rows, n, d]. `layers`: only these (`hidden` the stream before the first), the final
        norm only where they end at the last layer: chained ranges give one call's bits (each layer's arithmetic is
        its own, whatever else the call runs)."""
        layers = range(len(self.layers)) if layers is None else layers
        rows, n = hidden.shape[:2]
        # per layer type, the keys each query sees: None (the prefix rule) or a [rows, n, width] bool mask
        visible = {kind: None if attention_mask is None else attention_mask[kind][:, 0] == 0
                   for kind in {layer["type"] for layer in self.layers}}
        # cos, sin: [rows, n, head_dim]; rotate_half(x) * sin == x.roll(half) * (sin with its first half negated)
        # bit for bit (negation is exact), which takes one torch op where rotate_half takes four
        rotary = {kind: _rolled_sin(*self.rotary(hidden, positions, kind)) for kind in visible}
        q_size, kv_size, half = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim // 2
        glue = hidden.dtype == torch.float32 and hidden.device.type == "cpu" and self.uses_glue()
        if glue:
            hidden = hidden.contiguous()
        for index in layers:
            layer = self.layers[index]
            cos, sin = rotary[layer["type"]]
            if glue:  # the same arithmetic in one compiled call (kernels.gemma_layer)
                q, k, v = gemma_layer.attention_in(hidden, layer, cos, sin, self.heads, self.kv_heads)
            else:
                x = _rms_norm(hidden, *layer["norm_in"])
                q, k, v = layer["qkv"](x).split([q_size, kv_size, kv_size], dim=-1)
                q = _rms_norm(q.view(rows, n, self.heads, self.head_dim), *layer["q_norm"]).transpose(1, 2)
                k = _rms_norm(k.view(rows, n, self.kv_heads, self.head_dim), *layer["k_norm"]).transpose(1, 2)
                v = v.view(rows, n, self.kv_heads, self.head_dim).transpose(1, 2)  # [rows, kv_heads, n, head_dim]
                q, k = (t * cos[:, None] + t.roll(half, -1) * sin[:, None] for t in (q, k))
            keys, values = cache.update(k, v, index)  # [rows, kv_heads, width, head_dim]
            attended = query_attention.attend(q, keys, values, visible[layer["type"]], layer["scaling"])
            if glue:
                hidden = gemma_layer.attention_out_mlp(hidden, attended, layer)
                continue
            hidden = hidden + _rms_norm(layer["out"](attended), *layer["norm_post_attn"])
            x = _rms_norm(hidden, *layer["norm_pre_mlp"])
            gate, up = layer["gate_up"](x).chunk(2, dim=-1)
            mixed = F.gelu(gate, approximate="tanh") * up
            hidden = hidden + _rms_norm(layer["down"](mixed), *layer["norm_post_mlp"])
        return _rms_norm(hidden, *self.final_norm) if layers.stop == len(self.layers) else hidden

    def output(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of final-normed states [rows, n, d]: the output layer, soft-capped where the model caps them."""
        logits = self.lm_head(hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _rolled_sin(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = sin.shape[-1] // 2
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _norm(module) -> tuple[torch.Tensor, float]:
    """A Gemma3RMSNorm as (its float32 (1 + w) scale, eps), computed once."""
    return (1.0 + module.weight.detach().float()), module.eps


def _rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    # as transformers' Gemma3RMSNorm: statistics and the (1 + w) scale in float32, then back to x's dtype; row by
    # row, so a row's result never depends on the other rows. On a float32 CPU tensor one compiled call of ours
    # (`decode_step.rms_norm`, about 6 us) replaces torch's half-dozen small ops (about 15 us), 109 times a forward
    if x.dtype == torch.float32 and x.device.type == "cpu" and decode_step.available():
        return decode_step.rms_norm(x, scale, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), scale, eps).type_as(x)
