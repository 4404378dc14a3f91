"""A float32 Llama forward of new slots per row in one compiled call: a text target's every forward, a draft's step.

A draft model (or an EAGLE-style head) decodes one token per row per forward, and at that size a forward is
almost all per-op overhead: about 45 small torch calls per layer, ~0.3 ms for one layer of width 256 on one
CPU thread. This kernel runs the whole stack for n new slots per row (RMSNorm, fused q/k/v, rotary, the KV
writes at each row's next slots, attention over the row's cache and the window slots it sees: causal, or a
tree's ancestors, the output projection, SwiGLU, residuals, final norm) in plain loops over the same weights,
with no torch call in between, and the output layer the same way (`linear_rows`).

The matrix products are tiled: up to 4 rows against 4 weight rows per pass with AVX-512, 2 against 2 with AVX2
only (its 16 registers hold no more accumulators), each weight tile read from memory once per forward while
every row group passes over it, the tile 8 ahead prefetched. Every (row, output) pair is one 16-lane FMA chain in
a fixed order with a fixed lane reduction, whatever else is in the call and whichever build runs it, so a token
gets the same bits alone, in a window, in a tree or in a batch. That is what a target needs (its verified window
must score each token as plain decoding does), and the tiling keeps wide windows cheap: on the shipped code target
(1 thread, benchmarks/decode-step-latest.md, an AVX2 machine) one slot takes 4.5 ms against 6.7 with torch and
13 slots 9.8 ms against 14.7 (on an AVX-512 machine 4.8 and 8.8 ms); long prefills run at about half MKL's
speed. Attention scores eight keys at a time and runs head by head over all of a forward's tokens, so a row's
window slots reuse that head's cached keys. Against the torch path
(`LlamaRunner.forward_hidden(kernel=False)`, its twin in the tests) results agree to float32 rounding. Text
targets (`TextGenerator.target`) and drafts opt in (`LlamaRunner.decode_kernel`); the image and video targets
keep their own serving. Forwards of more than MAX_SLOTS new slots stay on the torch path. Float32 and CPU only;
its source, csrc/decode_step.cpp, builds on first use beside the other CPU kernels (same compiler requirements),
and where it cannot build the runner keeps the torch path (`SPECGEN_DECODE_KERNEL=off` turns it off). `rms_norm` exposes the step's row-wise
norm on its own (the served Gemma's 109 norms per forward).
"""

from __future__ import annotations

import functools

import torch

from specgen.kernels import cpu_build


@functools.cache
def load():
    """The compiled module, or None where it cannot be built (the runner keeps its torch path)."""
    return cpu_build.build("specgen_decode_step_", ("decode_step.cpp",),
                           ["decode_layers", "linear_rows", "rms_norm_rows", "classify_rows", "copy_states"],
                           "SPECGEN_DECODE_KERNEL", "decoding", "using torch ops")


def available() -> bool:
    return load() is not None


# Past this many new slots in one forward the torch path takes it: the kernel keeps every token's attended slots
# in a list (quadratic memory in the slots). The shipped code and speech models' contexts (1,024) fit under it.
MAX_SLOTS = 1024


def usable(runner, dtype: torch.dtype, attention_mask, slots: int = 1) -> bool:
    """Whether `decode` can run this forward of `slots` new slots (rows x window): a CPU float32 runner that opted
    in, no additive mask (the kernel takes the window's own bool mask, or none for a causal window), at most
    MAX_SLOTS slots, and a rotary embedding with fixed frequencies (not the dynamic kinds, which rescale with the
    sequence length)."""
    if not (getattr(runner, "decode_kernel", False) and attention_mask is None and runner.matmul_dtype is None
            and dtype == torch.float32 and slots <= MAX_SLOTS):
        return False
    if getattr(runner, "_decode_fits", None) is None:  # the model's side, checked once per runner
        runner._decode_fits = (runner.embed.device.type == "cpu" and _static_rope(runner.rotary)
                               and runner.head_dim <= 512 and available())
    return runner._decode_fits


def _static_rope(rotary) -> bool:
    kind = str(getattr(rotary, "rope_type", "default"))
    return hasattr(rotary, "inv_freq") and "dynamic" not in kind and kind != "longrope"


def decode(runner, hidden: torch.Tensor, positions: torch.Tensor, cache, window_mask: torch.Tensor | None = None,
           rows: torch.Tensor | None = None, starts: torch.Tensor | None = None,
           layers: range | None = None) -> torch.Tensor:
    """hidden [rows, n, d] input vectors, positions [rows, n]; writes each layer's keys and values at the row's
    slots `cache.lengths[row]` onwards (as `PositionCache.update` would) and returns the final-normed
    [rows, n, d]. Slot j attends to the row's cache and to window slots 0..j, or to those `window_mask`
    [rows, n, n] (bool) marks (a tree's ancestors). `rows` and `starts` [rows] override the cache rows
    (`cache.rows`) and their first new slots (their lengths): a packed ragged window (`LlamaRunner`). `layers`:
    only these layers (an early exit's, `modalities/text/early_exit.py`), `hidden` the stream before the first;
    the final norm only where the range ends at the last layer."""
    weights, final_norm, eps, scales, inv_freq, rope_scaling = _arguments(runner)
    layers = range(len(runner.layers)) if layers is None else layers
    if layers.start == 0:  # a forward's first call reserves every layer's storage (an early exit's later ones reuse it)
        ensure_storage(runner, cache, hidden)
    rows = cache.rows if rows is None else rows
    starts = cache.lengths[rows] if starts is None else starts
    mask = _NO_MASK if window_mask is None else window_mask.to(torch.bool).contiguous()
    # the runner's `keep_layers` cut the stack into segments, one call each, the residual stream after each kept
    # (every layer's arithmetic is the same in any segment, so the output is the same bits as one call's)
    kept = getattr(runner, "keep_layers", ())
    cuts = [layers.start, *(layer for layer in kept if layers.start < layer < layers.stop), layers.stop]
    hidden = hidden.contiguous()
    for first, last in zip(cuts, cuts[1:]):
        final = last == len(runner.layers)
        hidden = load().decode_layers(
            hidden, positions.contiguous(), inv_freq, rope_scaling, weights[6 * first:6 * last],
            final_norm if final else _NO_NORM, [cache.keys[i] for i in range(first, last)],
            [cache.values[i] for i in range(first, last)], rows.contiguous(), starts.contiguous(), mask,
            runner.heads, runner.kv_heads, runner.head_dim, eps[2 * first:2 * last] + [eps[-1]], scales[first:last])
        if not final and last in kept:
            runner.layer_hidden[last] = hidden
    return hidden


_NO_MASK = torch.empty(0, dtype=torch.bool)
_NO_NORM = torch.empty(0)  # no final norm: `decode_layers` returns the residual stream


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """scale * x / sqrt(mean(x^2) + eps) over the last dimension, each row in one compiled call and a fixed order
    (row-invariant): one call instead of torch's half-dozen small ops on CPU. float32 x and scale."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return load().rms_norm_rows(flat, scale, eps).reshape(x.shape)


def linear_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ weight[out, in].T with every row's sums in the kernel's fixed order (row-invariant)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return load().linear_rows(flat, weight.contiguous()).reshape(*x.shape[:-1], weight.shape[0])


def copy_states(runner, hidden: torch.Tensor, positions: torch.Tensor, cache, layers: range) -> None:
    """State copying for an early exit: `layers`' keys and values of the forward's slots (at each row's length, as
    `decode` writes them) computed from the same hidden [rows, n, d], in one compiled call. Its torch twin:
    `modalities/text/early_exit.EarlyExitTarget._copy_states` with the kernel off."""
    weights, _, eps, _, inv_freq, rope_scaling = _arguments(runner)
    picked = [w for index in layers for w in (weights[6 * index], weights[6 * index + 1])]
    load().copy_states(hidden.contiguous(), positions.contiguous(), inv_freq, rope_scaling, picked,
                       [cache.keys[i] for i in layers], [cache.values[i] for i in layers], cache.rows.contiguous(),
                       cache.lengths[cache.rows].contiguous(), runner.heads, runner.kv_heads, runner.head_dim,
                       [eps[2 * index] for index in layers])


def classify_rows(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """[R, k] softmax(w2 gelu(w1 rmsnorm(x) + b1) + b2) for x [R, d] (the norm unscaled, GELU exact) in one compiled
    call: an early-exit controller after every layer, where torch's seven small ops cost ~75 µs a call on one CPU
    thread. Its torch twin: `modalities/text/early_exit.ExitModules.action_logits(...).softmax(-1)`."""
    return load().classify_rows(x.contiguous(), w1, b1, w2, b2, eps)


def _arguments(runner) -> tuple:
    """The runner's weights as the kernel reads them (6 per layer, contiguous float32), made once per runner."""
    if getattr(runner, "_decode_arguments", None) is None:
        weights, eps, scales = [], [], []
        for layer in runner.layers:
            weights += [w.contiguous() for w in (layer["norm_in"][0], layer["qkv"], layer["out"],
                                                 layer["norm_post"][0], layer["gate_up"], layer["down"])]
            eps += [float(layer["norm_in"][1]), float(layer["norm_post"][1])]
            scales.append(float(layer["scaling"]))
        eps.append(float(runner.final_norm[1]))
        inv_freq = runner.rotary.inv_freq.float().contiguous()
        runner._decode_arguments = (weights, runner.final_norm[0].contiguous(), eps, scales, inv_freq,
                                    float(runner.rotary.attention_scaling))
    return runner._decode_arguments


def ensure_storage(runner, cache, hidden: torch.Tensor) -> None:
    """Every layer's cache tensors exist and hold the forward's slots (what `PositionCache.update` reserves)."""
    like = hidden.new_empty(1, runner.kv_heads, 1, runner.head_dim)
    for index in range(len(runner.layers)):
        cache.reserve(index, like, like)
