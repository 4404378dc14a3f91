"""Any transformers causal LM as a `TargetModel` (and as the engine of model drafters), shared by the text,
image and speech modalities.

The KV cache is ours: per layer one [batch, kv_heads, slots, head_dim] tensor, indexed by position, with a
length per row; it grows by doubling up to the model's capacity (Gemma 3 allows 32,768 positions: allocating
them all up front would take 1.2 GB for a 100-token request). Scoring writes the new keys/values at slots length..length+n-1 of each row
and attends through an explicit 4-D mask (cached prefix + the slot's ancestors; sliding-window layers also
drop keys that are `sliding_window` or more positions back). `commit` compacts the kept slots and advances
the lengths; rolling back is just not advancing. Correctness therefore never depends on
`DynamicCache.crop` (Gemma 3's sliding-window layers refuse to crop past their window) and rows of a batch
can accept different numbers of tokens.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache

from specgen.errors import InvalidRequest
from specgen.kernels import decode_step
from specgen.modalities.runtime import gemma_runner as gemma_runner, llama_runner


def cache_slots(needed: int, capacity: int) -> int:
    """Slots a layer's storage holds for `needed` positions: the next power of two (at least 64), at most the
    model's capacity (what the memory model of `modalities/memory.py` counts)."""
    return min(capacity, max(64, 1 << (needed - 1).bit_length()))


class PositionCache(Cache):
    """Position-indexed KV storage with per-row lengths. `rows` selects the batch rows of the current forward."""

    def __init__(self, batch_size: int, capacity: int):
        super().__init__(layers=[])
        self.rows_total, self.capacity = batch_size, capacity
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.lengths = torch.zeros(batch_size, dtype=torch.long)
        self.rows = torch.arange(batch_size)
        self.window = 0  # slots written by the current forward
        self.width = 0  # key columns the current forward attends (cached + window)
        self.all_rows, self.common_start = True, 0
        # per row: every slot it holds was written by the compiled decode step (`kernels.decode_step`), whose bits
        # do not depend on the window or batch a slot was scored in (a self-draft's shallow pass is reused only then)
        self.compiled = torch.ones(batch_size, dtype=torch.bool)

    def begin(self, rows: torch.Tensor, window: int) -> int:
        """Prepare a forward over `rows` writing `window` slots per row; returns the key length it attends."""
        shortest, longest = (int(x) for x in self.lengths[rows].aminmax())
        if longest + window > self.capacity:
            raise InvalidRequest(f"the context would exceed the model's maximum length of {self.capacity} tokens")
        self.rows, self.window = rows, window
        self.all_rows = self._all_rows()
        self.width = longest + window
        # every row at the same length (always so for one row): plain slices instead of indexed writes
        self.common_start = longest if shortest == longest else None
        return self.width

    def _all_rows(self) -> bool:
        return len(self.rows) == self.rows_total and bool((self.rows == torch.arange(self.rows_total)).all())

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states: [rows, kv_heads, window, head_dim]
        self.reserve(layer_idx, key_states, value_states)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self.all_rows and self.common_start is not None:
            start, end = self.common_start, self.common_start + key_states.shape[2]
            keys[:, :, start:end] = key_states
            values[:, :, start:end] = value_states
            return keys[:, :, :end], values[:, :, :end]
        slots = self.lengths[self.rows][:, None] + torch.arange(key_states.shape[2])  # [rows, window]
        rows = self.rows[:, None]
        keys[rows, :, slots] = key_states.transpose(1, 2)  # advanced indices first: [rows, window, heads, dim]
        values[rows, :, slots] = value_states.transpose(1, 2)
        width = int(self.lengths[self.rows].max()) + key_states.shape[2]
        if self.all_rows:
            return keys[:, :, :width], values[:, :, :width]
        return keys[self.rows, :, :width], values[self.rows, :, :width]

    def reserve(self, layer_idx: int, key_like: torch.Tensor, value_like: torch.Tensor) -> None:
        """Layer `layer_idx`'s storage exists and holds the current forward's `width` slots (shapes and dtype
        from key_like / value_like: [*, kv_heads, *, head_dim])."""
        if layer_idx not in self.keys or self.keys[layer_idx].shape[2] < self.width:
            self._grow(layer_idx, key_like, value_like, self.width)

    def _grow(self, layer_idx: int, key_states, value_states, needed: int) -> None:
        slots = cache_slots(needed, self.capacity)
        shape = (self.rows_total, key_states.shape[1], slots, key_states.shape[-1])
        keys, values = key_states.new_zeros(shape), value_states.new_zeros(shape[:3] + value_states.shape[-1:])
        if layer_idx in self.keys:
            kept = self.keys[layer_idx].shape[2]
            keys[:, :, :kept], values[:, :, :kept] = self.keys[layer_idx], self.values[layer_idx]
        self.keys[layer_idx], self.values[layer_idx] = keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.lengths.max())

    def commit(self, kept: torch.Tensor) -> None:
        """kept: [rows, window] bool over the slots of the last forward; move them to the front in order."""
        counts = kept.sum(-1)
        # kept slots form a prefix of every row (chains, and a draft feeding its own tokens): nothing moves
        is_prefix = bool((kept[:, 1:] <= kept[:, :-1]).all())
        if not is_prefix:  # tree acceptance: gather the accepted path, kept slot indices first in slot order
            order = torch.argsort((~kept).int(), dim=-1, stable=True)
            base = self.lengths[self.rows][:, None]
            src, dst = base + order, base + torch.arange(kept.shape[1])
            valid = torch.arange(kept.shape[1]) < counts[:, None]
            rows = self.rows[:, None].expand_as(src)[valid]
            src, dst = src[valid], dst[valid]
            for storage in (*self.keys.values(), *self.values.values()):
                storage[rows, :, dst] = storage[rows, :, src]
        self.lengths[self.rows] += counts


class TransformersTarget:
    """A `TargetModel` over a transformers causal LM with a `PositionCache`.

    Set `model.config._attn_implementation` as you like ("sdpa" or "eager"); the mask is always explicit."""

    def __init__(self, model, capacity: int | None = None, fast: bool = True, int8_head: bool = False,
                 matmul_dtype: torch.dtype | None = None, decode_kernel: bool = False):
        # eval() walks every module: a few ms per request for a model that is already in eval mode
        self.model = model.eval() if model.training else model
        # Llama and Gemma 3 checkpoints run through a compact forward of ours (same weights, same arithmetic;
        # `int8_head`: a Llama output layer as int8 rows, for drafts; `matmul_dtype`: a Llama's linear layers
        # in that dtype, see `llama_runner.LlamaRunner`)
        self.runner = None
        if matmul_dtype is not None and not (fast and llama_runner.supports(model)):
            raise InvalidRequest(f"linear layers in {matmul_dtype} need a Llama-architecture model")
        if fast and llama_runner.supports(model):
            self.runner = llama_runner.LlamaRunner(model, int8_head=int8_head, matmul_dtype=matmul_dtype)
            # `decode_kernel` runs every forward of a float32 model through `kernels.decode_step` (see LlamaRunner):
            # drafts set it; a target may (bitwise row-invariant, faster at one row, slower for wide windows)
            self.runner.decode_kernel = decode_kernel
        elif fast and gemma_runner.supports(model):
            self.runner = gemma_runner.GemmaRunner(model)
        config = model.config
        self.vocab_size = config.vocab_size
        self.capacity = capacity or getattr(config, "max_position_embeddings", 2048)
        layer_types = getattr(config, "layer_types", None) or []
        self.sliding_window = getattr(config, "sliding_window", None) if "sliding_attention" in layer_types else None
        self.layer_types = sorted(set(layer_types))
        self.cache: PositionCache | None = None
        self.forward_calls = 0
        # the final-normed hidden state of every cached token, position-indexed like the KV cache (`keep_features`)
        self.features: torch.Tensor | None = None  # [batch, room, d]
        self._keep_features = False
        self.layer_features: dict[int, torch.Tensor | None] = {}  # exit layer -> [batch, room, d]

    def keep_features(self) -> None:
        """Keep the final-normed hidden state of every token the cache holds, at no extra forward: a prefill and
        every commit store the features of the slots they keep, so `features[row, :cache.lengths[row]]` are always
        the committed tokens' (but the pending one's), rolled back with the cache (an EAGLE head reads them)."""
        if self.runner is None:
            raise InvalidRequest("keeping features needs a Llama or Gemma 3 model (our runner computes them)")
        self.runner.keep_hidden = self._keep_features = True

    def keep_layer_features(self, layers) -> None:
        """Also keep, for each exit layer l of `layers`, the residual stream after the target's first l layers of
        every cached token (`layer_features[l]` [batch, room, d], rolled back like `features`): what an early exit
        at l would have read, at no extra forward (DEL's shadow tokens). Llama runner."""
        if not isinstance(self.runner, llama_runner.LlamaRunner):
            raise InvalidRequest("keeping intermediate layers' features needs a Llama-architecture target")
        self.runner.keep_layers = tuple(sorted(set(self.runner.keep_layers) | set(layers)))
        self.layer_features = {layer: self.layer_features.get(layer) for layer in self.runner.keep_layers}

    def _store_features(self, rows: torch.Tensor, kept: torch.Tensor) -> None:
        """Write the last forward's hidden states of the `kept` slots [rows, n] after each row's cached tokens, into
        every store kept (the final-normed features and each exit layer's)."""
        starts = self.cache.lengths[rows]
        counts = kept.sum(-1)
        need = int((starts + counts).max())
        order = torch.argsort((~kept).int(), dim=-1, stable=True)  # kept slot indices first, in slot order
        valid = torch.arange(kept.shape[1]) < counts[:, None]
        to = (rows[:, None].expand_as(order)[valid], (starts[:, None] + torch.arange(kept.shape[1]))[valid])
        source = (torch.arange(len(rows))[:, None].expand_as(order)[valid], order[valid])
        if self._keep_features:
            self.features = self._stored(self.features, self.runner.last_hidden, need, to, source)
        for layer in self.layer_features:
            self.layer_features[layer] = self._stored(self.layer_features[layer], self.runner.layer_hidden[layer],
                                                      need, to, source)

    def _stored(self, store: torch.Tensor | None, hidden: torch.Tensor, need: int, to: tuple,
                source: tuple) -> torch.Tensor:
        """`store` [batch, room, d], grown to hold `need` slots per row, with `hidden[source]` written at `to`."""
        if store is None or store.shape[0] < self.cache.rows_total or store.shape[1] < need:
            room = max(need, 64, 2 * (0 if store is None else store.shape[1]))
            grown = hidden.new_zeros(self.cache.rows_total, min(room, self.capacity), hidden.shape[-1])
            if store is not None:
                grown[:store.shape[0], :store.shape[1]] = store
            store = grown
        store[to] = hidden[source]
        return store

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def prefill(self, prompts: Sequence[torch.Tensor]) -> None:
        """Cache every prompt token but the last (the pending token) of every row."""
        self.cache = PositionCache(len(prompts), self.capacity)
        self.prefill_rows(prompts, torch.arange(len(prompts)))

    def prefill_rows(self, prompts: Sequence[torch.Tensor], rows: torch.Tensor) -> None:
        """Give batch rows `rows` new contexts (a finished request's row taking the next one): their caches are
        emptied and hold every prompt token but the last; the other rows are untouched."""
        if self.cache is None:
            raise InvalidRequest("prefill the batch before giving rows new contexts")
        lengths = [len(p) - 1 for p in prompts]
        if max(lengths) + 1 > self.capacity:
            raise InvalidRequest(f"a prompt of {max(lengths) + 1} tokens exceeds the model's maximum length of "
                                 f"{self.capacity} tokens")
        self.cache.lengths[rows] = 0
        self.cache.compiled[rows] = True
        if max(lengths) == 0:
            return
        width = max(lengths)
        tokens = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            tokens[row, :lengths[row]] = torch.as_tensor(prompt[:-1])
        positions = torch.arange(width).expand(len(prompts), width)
        valid = positions < torch.tensor(lengths)[:, None]
        # padded slots attend only to themselves; their keys are never kept
        mask = torch.ones(width, width, dtype=torch.bool).tril() & valid[:, None, :]
        mask |= torch.eye(width, dtype=torch.bool)
        self._forward(tokens, positions, rows, mask, logits_to_keep=1)
        if self._keep_features or self.layer_features:
            self._store_features(rows, valid)
        self.cache.commit(valid)

    def score(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
              tree_mask: torch.Tensor | None = None, valid: torch.Tensor | None = None,
              logits_to_keep: int = 0) -> torch.Tensor:
        """Logits of every slot ([rows, n, vocab]), or of the last `logits_to_keep` slots only (a cache fill whose
        logits nobody reads skips most of the output layer)."""
        return self._forward(tokens, positions, rows, tree_mask, logits_to_keep, valid=valid)  # None: causal

    def commit(self, kept: torch.Tensor, rows: torch.Tensor) -> None:
        self.cache.rows = rows
        if self._keep_features or self.layer_features:
            self._store_features(rows, kept)
        self.cache.commit(kept)

    def _attends_causally(self) -> bool:
        """Whether the runner, given no mask, attends a window causally after the rows' cache: the per-query
        attention of a Llama runner with bfloat16 linears."""
        return isinstance(self.runner, llama_runner.LlamaRunner) and self.runner.matmul_dtype is not None

    @torch.no_grad()  # not inference_mode: the cache tensors are updated in place later
    def _forward(self, tokens, positions, rows, window_mask, logits_to_keep=0, valid=None):
        """tokens/positions: [rows, n]; window_mask: [rows, n, n] bool (slot attends to slot), None for a causal
        window; valid: [rows] real slots of a ragged causal window (the compiled step skips the padding). Float
        `tokens` [rows, n, d] are input vectors (an EAGLE head's fused inputs, PPD's prompt tokens): the result is then
        the final-normed hidden states, not logits (our Llama and Gemma 3 runners)."""
        self.forward_calls += 1
        n = tokens.shape[1]
        width = self.cache.begin(rows, n)
        if tokens.is_floating_point():
            if not hasattr(self.runner, "forward_hidden"):
                raise InvalidRequest("scoring input vectors needs a Llama or Gemma 3 model (our runners)")
            run = lambda mask, **window: self.runner.forward_hidden(tokens, positions, self.cache, mask, **window)  # noqa: E731
        elif self.runner is not None:
            run = lambda mask, **window: self.runner.forward(  # noqa: E731
                tokens, positions, self.cache, mask, logits_to_keep, **window)
        if (self.runner is not None and self.sliding_window is None
                and decode_step.usable(self.runner, self.dtype, None, tokens.shape[0] * n)):
            packed = {"valid": valid} if valid is not None and not tokens.is_floating_point() else {}
            # the compiled step reads each row's length and the mask itself
            return run(None, window_mask=window_mask, **packed)
        self.cache.compiled[rows] = False
        plain = n == 1 or window_mask is None  # every slot sees its row's cache and the window's earlier slots
        if (self.runner is not None and plain and (self.sliding_window is None or width <= self.sliding_window)
                and self.cache.common_start is not None and (n == 1 or self._attends_causally())):
            # no mask needed: every row has the same length and there is one new token per row, or the runner's
            # attention masks a window itself
            return run(None)
        lengths = self.cache.lengths[rows]  # [rows]
        cols = torch.arange(width)
        cached = cols[None, None, :] < lengths[:, None, None]  # [rows, 1, width]
        new_col = cols[None, :] - lengths[:, None]  # [rows, width]: which new slot a column holds
        in_window = (new_col >= 0) & (new_col < n)
        if window_mask is None:
            window_mask = torch.ones(n, n, dtype=torch.bool).tril().expand(len(rows), n, n)
        visible = window_mask.gather(2, new_col.clamp(0, n - 1)[:, None, :].expand(-1, n, -1))  # [rows, n, width]
        visible = cached | (visible & in_window[:, None, :])
        key_positions = torch.where(in_window, positions.gather(1, new_col.clamp(0, n - 1)), cols[None, :])
        masks = {"full_attention": visible}
        if self.sliding_window is not None:
            recent = positions[:, :, None] - key_positions[:, None, :] < self.sliding_window
            masks["sliding_attention"] = visible & recent
        dtype = self.dtype
        additive = {name: torch.zeros(m.shape, dtype=dtype).masked_fill(~m, torch.finfo(dtype).min)[:, None]
                    for name, m in masks.items()}  # [rows, 1, n, width]
        attention_mask = additive if self.layer_types else additive["full_attention"]
        if self.runner is not None:
            return run(attention_mask)
        return self.model(input_ids=tokens, position_ids=positions, attention_mask=attention_mask, cache=self.cache,
                          use_cache=True, logits_to_keep=logits_to_keep).logits


def measure_window_s(target, prompt_ids: torch.Tensor, window: int = 1, repeats: int = 3) -> float:
    """Median time of one forward over `window` slots (the pending prompt token and window - 1 placeholder
    drafts) right after prefilling `prompt_ids`: T_ar for window 1, T_window(L) for the cost models. `target` is
    any TargetModel (a guided one scores both rows)."""
    return measure_batch_window_s(target, [prompt_ids], window, repeats)


def measure_batch_window_s(target, prompts: Sequence, window: int = 1, repeats: int = 3) -> float:
    """`measure_window_s` for a batch: every prompt of `prompts` a row, each scoring `window` slots."""
    import time

    rows = [torch.as_tensor(p, dtype=torch.long).flatten() for p in prompts]
    tokens = torch.stack([torch.cat([ids[-1:], ids[-1:].expand(window - 1)]) for ids in rows])
    positions = torch.stack([len(ids) - 1 + torch.arange(window) for ids in rows])
    target.prefill(rows)  # once: scoring commits nothing, so each repeat sees the same cache
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        target.score(tokens, positions, torch.arange(len(rows)))
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]
