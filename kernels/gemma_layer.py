"""The served Gemma's layer glue in two compiled calls per layer: all of a layer but its cache writes and attention.

A served Gemma 3 270M forward is about 30 ms of int8 matrix products (bound by memory: 268 MB of weights per
forward) and, before this kernel, 4-7 ms of small torch calls between them: per layer two or three norms, the
q/k/v split, the q and k norms, rotary, the residual adds and the gating, some 40 calls of a few microseconds each,
18 times. Two calls of ours replace them (the cache writes and the per-query attention stay where they are):

- `attention_in`: the input norm, the fused q/k/v product, the q and k norms and rotary, with q, k and v written
  in the [rows, heads, n, head_dim] layout the cache and the attention kernel read;
- `attention_out_mlp`: the output projection and its norm, the residual add, the norm before the MLP, the fused
  gate/up product, tanh-GELU gating (torch's own kernel, called from C++), the down projection, its norm and
  the second residual add.

The arithmetic is the torch path's, bit for bit (`GemmaRunner`'s loop without this kernel is its twin in the
tests): the norms are the compiled row norm (csrc/row_norm.h), the products `int8_rows`' kernel
(csrc/int8_rows.cpp and csrc/gemma_glue.cpp compile into one extension), rotary is x * cos + x.roll(half) * sin
with the sign folded into sin and no fused multiply-add
(contraction is switched off for it), and the residual adds are plain float adds. Every step works token by token,
so a token's result never depends on the other tokens in the call: the served model stays row-invariant, which is
what keeps speculative verification exact. Builds on first use like the other CPU kernels
(`SPECGEN_GEMMA_GLUE=off` turns it off; it also needs the int8 kernel)."""

from __future__ import annotations

import functools

import torch

from specgen.kernels import cpu_build, int8_rows



@functools.cache
def load():
    """The compiled module, or None where it cannot be built (the runner keeps its torch calls)."""
    return cpu_build.build("specgen_gemma_layer_", ("int8_rows.cpp", "gemma_glue.cpp"),
                           ["attention_in", "attention_out_mlp"], "SPECGEN_GEMMA_GLUE", "Gemma layer",
                           "using torch calls between the int8 products")


def available() -> bool:
    """Whether the two calls can run here: this kernel and the int8 kernel whose products it computes both built."""
    return int8_rows.available() and load() is not None


def attention_in(hidden: torch.Tensor, layer: dict, cos: torch.Tensor, sin: torch.Tensor, heads: int,
                 kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [rows, n, d] float32; cos, sin [rows, n, head_dim] (sin with its first half negated) -> q
    [rows, heads, n, head_dim], k and v [rows, kv_heads, n, head_dim]."""
    (norm_in, eps), (q_scale, q_eps), (k_scale, k_eps) = layer["norm_in"], layer["q_norm"], layer["k_norm"]
    qkv = layer["qkv"]
    return tuple(load().attention_in(hidden, norm_in, eps, qkv.qweight, qkv.scales, q_scale, q_eps, k_scale, k_eps,
                                     cos.contiguous(), sin.contiguous(), heads, kv_heads))


def attention_out_mlp(hidden: torch.Tensor, attended: torch.Tensor, layer: dict) -> torch.Tensor:
    """hidden [rows, n, d], attended [rows, n, heads * head_dim] -> the layer's output hidden state."""
    out, gate_up, down = layer["out"], layer["gate_up"], layer["down"]
    norms = [layer[name] for name in ("norm_post_attn", "norm_pre_mlp", "norm_post_mlp")]
    return load().attention_out_mlp(hidden, attended, out.qweight, out.scales, norms[0][0], norms[1][0], gate_up.qweight,
                                    gate_up.scales, down.qweight, down.scales, norms[2][0],
                                    [float(eps) for _, eps in norms])
