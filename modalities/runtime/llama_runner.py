"""A compact forward pass for Llama-architecture checkpoints (gpt-fast style), over the model's own weights.

transformers' module stack costs several milliseconds per forward in Python overhead (decorators, kwargs,
output capturing), which dominates for small drafts and targets on CPU. This runner does the same arithmetic
in a few fused matmuls per layer (q/k/v and gate/up concatenated), writes keys and values straight into the
`PositionCache`, and uses the model's rotary embedding module, so rope variants stay exact. Tests check it
against the transformers forward in float64.
"""

from __future__ import annotations

import time
import weakref

import torch
import torch.nn.functional as F

from specgen import settings
from specgen.kernels import cpu_build, decode_step, query_attention

SUPPORTED = ("llama",)


def supports(model) -> bool:
    config = model.config
    return (getattr(config, "model_type", None) in SUPPORTED and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False) and getattr(config, "hidden_act", "silu") == "silu")


class LlamaRunner:
    """`int8_head`: the output layer as int8 rows (`int8_linear`), a copy made here: a draft's head over a large
    vocabulary is most of its per-token cost at one row (memory-bound), and a quarter of the bytes is read."""

    def __init__(self, model, int8_head: bool = False, matmul_dtype: torch.dtype | None = None):
        config, body = model.config, model.model
        if cpu_build.on_cpu(model):  # a machine without the kernels compiles both at once
            cpu_build.build_side_by_side(decode_step.load, query_attention.load)
        # `matmul_dtype` (bfloat16): the linear layers' weights and inputs in that dtype, their outputs and
        # everything else (norms, rope, attention, residuals) in the model's own
        self.matmul_dtype = matmul_dtype
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed, self.rotary = body.embed_tokens.weight, body.rotary_emb
        self.final_norm = (body.norm.weight, body.norm.variance_epsilon)
        self.lm_head, weights = _prepared_weights(model, matmul_dtype)
        self.head = None
        if int8_head:
            from specgen.modalities.runtime.int8_linear import Int8Linear

            self.head = Int8Linear.from_linear(model.lm_head)
        self.keep_hidden, self.last_hidden = False, None
        # `keep_layers`: after each forward, `layer_hidden[l]` holds the residual stream after the first l layers
        # [rows, n, d] (the hidden states an early exit at l reads)
        self.keep_layers: tuple[int, ...] = ()
        self.layer_hidden: dict[int, torch.Tensor] = {}
        # float32 forwards as one compiled call (`kernels.decode_step`): every token's arithmetic is the same
        # alone, in a window or in a tree, and equals the torch ops up to float32 rounding; drafts opt in (a
        # draft's law is what its forward computed, so exactness never depends on its bits)
        self.decode_kernel = False
        self.layers = []
        for layer, prepared in zip(body.layers, weights):
            self.layers.append({
                "norm_in": (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                "norm_post": (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                "scaling": layer.self_attn.scaling,
                **prepared,  # qkv, out, gate_up, down
            })

    @torch.no_grad()
    def forward(self, tokens, positions, cache, attention_mask, logits_to_keep: int = 0,
                window_mask: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
        """tokens, positions: [rows, n]; attention_mask: additive [rows, 1, n, width] (torch path); window_mask:
        [rows, n, n] bool (the compiled path, None: causal); valid: [rows] real slots of a ragged causal window
        (the compiled path skips the rest; their logits are zero). Returns logits. With `keep_hidden` set, the
        final-normed hidden states of every slot are kept in `last_hidden` (the features an EAGLE-style draft
        head reads)."""
        if valid is not None and window_mask is None and not logits_to_keep and decode_step.usable(
                self, self.embed.dtype, attention_mask, tokens.shape[0] * tokens.shape[1]):
            keep = torch.arange(tokens.shape[1]) < valid[:, None]  # [rows, n]
            if not bool(keep.all()):
                return self._forward_packed(tokens, positions, cache, keep)
        hidden = self.forward_hidden(F.embedding(tokens, self.embed), positions, cache, attention_mask,
                                     window_mask=window_mask)
        if self.keep_hidden:
            self.last_hidden = hidden
        return self.output(hidden[:, -logits_to_keep:] if logits_to_keep else hidden, attention_mask)

    def output(self, hidden: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """Logits of final-normed states [rows, n, d] as `forward` computes them (an early exit's full-depth rows get
        plain decoding's bits): the int8 head, the compiled step's tiled products, or torch's."""
        if self.head is not None:
            return self.head(hidden)
        if decode_step.usable(self, hidden.dtype, attention_mask, hidden.shape[0] * hidden.shape[1]):
            return decode_step.linear_rows(hidden, self.lm_head)
        return self._linear(hidden, self.lm_head)

    def _forward_packed(self, tokens, positions, cache, keep: torch.Tensor) -> torch.Tensor:
        """A ragged window's real slots only, each as a one-slot row of the compiled step: slot j of a row is
        written at the row's length + j and attends to that row's cache up to itself, which by then holds the
        window's earlier slots (a layer writes every slot's keys before any slot attends). Each slot therefore
        sees the keys, in the order, it sees in the padded window, and gets the same bits; padding costs nothing."""
        rows = cache.rows[:, None].expand_as(keep)[keep]  # [slots]
        starts = (cache.lengths[cache.rows][:, None] + torch.arange(keep.shape[1]))[keep]
        hidden = decode_step.decode(self, F.embedding(tokens[keep][:, None], self.embed), positions[keep][:, None],
                                    cache, rows=rows, starts=starts)[:, 0]  # [slots, d]
        if self.keep_hidden:
            self.last_hidden = hidden.new_zeros(*keep.shape, hidden.shape[-1]).index_put_((keep,), hidden)
        for layer in self.keep_layers:  # [slots, 1, d] -> [rows, n, d]
            kept = self.layer_hidden[layer][:, 0]
            self.layer_hidden[layer] = kept.new_zeros(*keep.shape, kept.shape[-1]).index_put_((keep,), kept)
        logits = self.head(hidden) if self.head is not None else decode_step.linear_rows(hidden, self.lm_head)
        return logits.new_zeros(*keep.shape, logits.shape[-1]).index_put_((keep,), logits)

    @torch.no_grad()
    def forward_hidden(self, hidden, positions, cache, attention_mask, kernel: bool = True,
                       window_mask: torch.Tensor | None = None, layers: range | None = None) -> torch.Tensor:
        """The layers and the final norm over input vectors `hidden` [rows, n, d]; returns [rows, n, d].
        `kernel=False` keeps the torch ops where `decode_kernel` would use the compiled step. `layers`: only these
        (`hidden` the stream before the first), the final norm only where they end at the last layer."""
        layers = range(len(self.layers)) if layers is None else layers
        if kernel and decode_step.usable(self, hidden.dtype, attention_mask, hidden.shape[0] * hidden.shape[1]):
            return decode_step.decode(self, hidden, positions, cache, window_mask, layers=layers)
        rows, n = hidden.shape[:2]
        cos, sin = self.rotary(hidden, positions)  # [rows, n, head_dim]
        cos, sin = cos[:, :, None], sin[:, :, None]  # over the heads of q and k together
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        # with bfloat16 linears, attention one query at a time (`kernels.query_attention`): rounding to bfloat16
        # would turn SDPA's window-dependent last bits into different tokens
        per_query = self.matmul_dtype is not None
        seen = attention_mask[:, 0] == 0 if per_query and attention_mask is not None else None  # [rows, n, width]
        for index in layers:
            layer = self.layers[index]
            x = _rms_norm(hidden, *layer["norm_in"])
            qk, v = self._linear(x, layer["qkv"]).split([q_size + kv_size, kv_size], dim=-1)
            qk = qk.view(rows, n, self.heads + self.kv_heads, self.head_dim)
            qk = qk * cos + rotate_half(qk) * sin  # rope on q and k in one pass: fewer ops per layer
            q = qk[:, :, :self.heads].transpose(1, 2)  # (B, nh, n, hd)
            k = qk[:, :, self.heads:].transpose(1, 2)
            v = v.view(rows, n, self.kv_heads, self.head_dim).transpose(1, 2)
            keys, values = cache.update(k, v, index)  # (B, nkv, width, hd)
            if per_query:
                attended = query_attention.attend(q, keys, values, seen, layer["scaling"])  # [B, n, nh * hd]
            else:
                attended = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=attention_mask, scale=layer["scaling"],
                    enable_gqa=self.heads != self.kv_heads).transpose(1, 2).reshape(rows, n, q_size)
            # the residual adds widen a bfloat16 output exactly (float32 + bfloat16 computes in float32)
            hidden = hidden + self._linear(attended, layer["out"], widen=False)
            x = _rms_norm(hidden, *layer["norm_post"])
            gate, up = self._linear(x, layer["gate_up"]).chunk(2, dim=-1)
            hidden = hidden + self._linear(F.silu(gate) * up, layer["down"], widen=False)
            if index + 1 in self.keep_layers:
                self.layer_hidden[index + 1] = hidden
        return _rms_norm(hidden, *self.final_norm) if layers.stop == len(self.layers) else hidden

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, widen: bool = True) -> torch.Tensor:
        if self.matmul_dtype is None:
            return F.linear(x, weight)
        out = F.linear(x.to(self.matmul_dtype), weight)
        return out.to(x.dtype) if widen else out


# model -> (stamp, prepared weights): a request builds a runner, and fusing and casting the weights each time cost
# 6-17 ms for the code target here; the stamp (each parameter's storage and in-place version counter) notices any
# update, e.g. a draft trained while serving
_PREPARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_INT8_HEADS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> (weight stamp, Int8Linear)


def _prepared_weights(model, matmul_dtype: torch.dtype | None):
    """(lm_head, [per layer {qkv, out, gate_up, down}]): q/k/v and gate/up fused, in `matmul_dtype` if given."""
    stamp = (matmul_dtype, tuple((p.data_ptr(), p._version) for p in model.parameters()))
    cached = _PREPARED.get(model)
    if cached is not None and cached[0] == stamp:
        return cached[1]

    def prepare(weight: torch.Tensor) -> torch.Tensor:
        return weight.detach().to(matmul_dtype) if matmul_dtype is not None else weight.detach()

    layers = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append({"qkv": prepare(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])),
                       "out": prepare(attn.o_proj.weight),
                       "gate_up": prepare(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                       "down": prepare(mlp.down_proj.weight)})
    prepared = (prepare(model.lm_head.weight), layers)
    _PREPARED[model] = (stamp, prepared)
    return prepared


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


_FAST_MATMUL: dict[tuple, torch.dtype | None] = {}  # per process: the linear weights' shapes -> the choice


def fast_matmul_dtype(model, rows: int = 32) -> torch.dtype | None:
    """bfloat16 where this machine multiplies the model's linear layers in it batch-invariantly (a row's result
    is bit for bit the same whatever rows come with it) and at `rows` rows at least 1.3x faster than in float32,
    and the per-query attention kernel builds; else None (float32 stays). The runner then attends one query at a
    time, so every op is per token and a window's verification scores a token exactly as a plain step does. Only
    float32 Llama models qualify; `SPECGEN_MATMUL=float32` turns it off. Checked once per process and shape set.

    On CPUs with AVX-512 BF16 oneDNN's bfloat16 kernels give the same bits for any row count (float32 MKL does
    not below 8 rows), and a 32-row window's matmuls run about 3x faster (docs/image.md)."""
    if (settings.get("SPECGEN_MATMUL").lower() in ("float32", "fp32", "off")
            or not supports(model) or next(model.parameters()).dtype != torch.float32
            or not query_attention.available()):  # the per-query loop without the kernel costs more than it saves
        return None
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    key = tuple(sorted({tuple(w.shape) for w in weights}))
    if key not in _FAST_MATMUL:
        fast = bf16_batch_invariant(key, rows) and _bf16_faster(key, rows)
        _FAST_MATMUL[key] = torch.bfloat16 if fast else None
    return _FAST_MATMUL[key]


def bf16_batch_invariant(shapes, rows: int = 32) -> bool:
    """Whether bfloat16 `F.linear` over weights of these (out, in) shapes gives every row the same bits alone,
    in small batches, in a window of `rows` rows at any offset and among 16 x `rows` rows (many samples' windows
    in one forward: kernels may change blocking with the row count)."""
    generator = torch.Generator().manual_seed(0)
    for out_features, in_features in shapes:
        weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
        x = torch.randn(16 * rows + 3, in_features, generator=generator).bfloat16()
        full = F.linear(x, weight)
        for start, count in ((0, 1), (0, 2), (1, 3), (0, 5), (3, 8), (0, 16), (2, 17), (0, rows), (5, rows + 1),
                             (0, 16 * rows)):
            if not torch.equal(F.linear(x[start:start + count], weight), full[start:start + count]):
                return False
    return True


def _bf16_faster(shapes, rows: int) -> bool:
    generator = torch.Generator().manual_seed(0)
    out_features, in_features = max(shapes, key=lambda s: s[0] * s[1])
    weight = torch.randn(out_features, in_features, generator=generator)
    x = torch.randn(rows, in_features, generator=generator)
    weight16, x16 = weight.bfloat16(), x.bfloat16()

    def best_of(run, repeats: int = 20) -> float:
        run()
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            run()
            times.append(time.perf_counter() - began)
        return min(times)

    return best_of(lambda: F.linear(x16, weight16)) * 1.3 <= best_of(lambda: F.linear(x, weight))
