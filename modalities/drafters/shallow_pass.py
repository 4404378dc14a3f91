"""Verification that reuses a self-draft's shallow pass (Kangaroo, S7).

A Kangaroo self-draft runs the target's own first ℓ layers for the pending token and for every drafted token but
the last (that one is drafted, never fed), at the very positions verification then scores them. Verification with
`ShallowPassTarget` takes those slots' keys and values in layers < ℓ from the draft's cache and their residual
stream after layer ℓ from the draft's forwards, runs layers < ℓ for the rest of the window only (the last drafted
token), and layers ℓ..L over the whole window:

    window   pending  d1  ...  d(k-1) | dk
    layers < ℓ   ◄── the draft's ──►  | computed here
    layers ℓ..L  ◄────── one call over the window ──────►

Where it is exact, and where it is not. The compiled decode step (`kernels.decode_step`) gives a slot the same bits
alone, in a window or in a batch (every product one fixed-order chain, attention over the row's slots in slot
order), so a slot the draft fed holds exactly what verification computes there, provided the draft's keys and
values over the prefix are exactly the target's. Both caches are written by the same compiled step from the same
tokens, so they are by induction, except where a forward took torch's path (more than `MAX_SLOTS` new slots at
once, e.g. a batch of long prompts): such rows (`PositionCache.compiled` false in either cache) are verified in
full, as are trees, targets that keep hidden states for another purpose, and any window whose tokens are not the
ones the draft's last proposal fed there. A ragged window's padding (rows that stopped drafting early) is
scored too, after the real slots, so it changes none of them; nobody reads or keeps it. The tests compare the logits of every reused
verification with a full one's bit for bit; a copy from a shifted slot must change them.

What it saves: on this CPU a layer over a few slots costs about what it costs over one (its weights are read once),
so the saving is small (docs/self_speculation.md); on hardware where a window's work scales with its slots it is
ℓ/L of the verified tokens' layer work, the paper's accounting.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.kernels import decode_step
from specgen.modalities.runtime import llama_runner


class ShallowPassTarget:
    """The target as the loop scores a Kangaroo self-draft's chains; everything but `score` (prefill, commit, the
    cache, features) is the wrapped engine's. `drafter` is the `KangarooDrafter` whose proposals it verifies."""

    def __init__(self, engine, drafter):
        self.engine, self.drafter = engine, drafter
        self.reused_slots = 0  # window slots whose layers < ℓ came from the draft
        self.scored_slots = 0

    def __getattr__(self, name):  # prefill, prefill_rows, commit, cache, model, vocab_size, ...
        return getattr(self.engine, name)

    def score(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
              tree_mask: torch.Tensor | None = None, valid: torch.Tensor | None = None,
              logits_to_keep: int = 0) -> torch.Tensor:
        chain = tree_mask is None and not logits_to_keep and not tokens.is_floating_point()
        reused = self.reusable(tokens, rows, valid) if chain else 0
        self.scored_slots += tokens.numel()
        if not reused:
            return self.engine.score(tokens, positions, rows, tree_mask, valid, logits_to_keep)
        self.reused_slots += reused * len(rows)
        return self._score(tokens, positions, rows, reused)

    def reusable(self, tokens: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor | None = None) -> int:
        """Leading window slots of every row whose layers < ℓ the draft's last proposal computed exactly as
        verification would (0: none, verify in full). `valid` [rows]: a ragged window's real slots; a row's padding
        after them is scored but never read or kept (causal: it changes no real slot), so only real slots count."""
        engine, shallow = self.engine, self.drafter.shallow
        runner, cache, draft_cache = engine.runner, engine.cache, self.drafter.engine.cache
        if (shallow is None or not isinstance(runner, llama_runner.LlamaRunner) or runner.keep_layers
                or runner.keep_hidden or engine.sliding_window is not None
                or not decode_step.usable(runner, engine.dtype, None, tokens.numel())):
            return 0
        starts = cache.lengths[rows]
        if not (torch.equal(rows, shallow.rows) and torch.equal(starts, shallow.starts)
                and bool(cache.compiled[rows].all()) and bool(draft_cache.compiled[rows].all())):
            return 0
        reused = min(shallow.hidden.shape[1], tokens.shape[1])
        for i, row in enumerate(rows.tolist()):  # the draft holds these very tokens at these slots
            start, held = int(starts[i]), self.drafter.cached[row]
            real = reused if valid is None else min(reused, int(valid[i]))
            if int(draft_cache.lengths[row]) != len(held) or held[start:start + real] != tokens[i, :real].tolist():
                return 0
        return reused

    @torch.no_grad()
    def _score(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, reused: int) -> torch.Tensor:
        engine, runner, exit_layer = self.engine, self.engine.runner, self.drafter.exit_layer
        cache, draft_cache = engine.cache, self.drafter.engine.cache
        engine.forward_calls += 1
        cache.begin(rows, tokens.shape[1])
        decode_step.ensure_storage(runner, cache, runner.embed.new_empty(0))
        starts = cache.lengths[rows]
        first = int(rows[0])
        if cache.common_start is not None and bool((rows == torch.arange(first, first + len(rows))).all()):
            at = (slice(first, first + len(rows)), slice(None),  # one request: plain slices
                  slice(cache.common_start, cache.common_start + reused))
        else:
            at = (rows[:, None], slice(None), starts[:, None] + torch.arange(reused))  # [rows, reused] slots
        for layer in range(exit_layer):  # the same slots of the same rows
            self._copy(cache.keys[layer], draft_cache.keys[layer], at)
            self._copy(cache.values[layer], draft_cache.values[layer], at)
        hidden = self.drafter.shallow.hidden[:, :reused]  # [rows, reused, d] the stream after layer ℓ
        if reused < tokens.shape[1]:  # the rest of the window through layers < ℓ, after the reused slots
            rest = decode_step.decode(runner, F.embedding(tokens[:, reused:], runner.embed), positions[:, reused:],
                                      cache, starts=starts + reused, layers=range(0, exit_layer))
            hidden = torch.cat([hidden, rest], 1)
        hidden = decode_step.decode(runner, hidden, positions, cache, layers=range(exit_layer, len(runner.layers)))
        return runner.output(hidden)

    @staticmethod
    def _copy(storage: torch.Tensor, draft_storage: torch.Tensor, at: tuple) -> None:
        storage[at] = draft_storage[at]

    def run_summary(self) -> dict:
        return {"shallow_reused_slots": self.reused_slots, "verified_slots": self.scored_slots}
