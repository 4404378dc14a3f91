"""Speculative Jacobi decoding (SJD, Teng et al. 2024) and its coupled variants (MC-SJD, So et al. 2025) as one
Drafter on the shared loop: the target drafts for itself, so no draft model is needed.

Each step scores [pending, d_1 .. d_k] in one forward pass and the chain rule verifies the window exactly as it
verifies a draft model's chain (accept d_i w.p. min(1, target/draft), recover at the first rejection). Then
every uncommitted slot gets a new draft from *this* step's target law at that slot, and that law is stored as
the new draft's law. Storing the old law instead is the quiet failure mode (biased; a test shows it). How the
new draft relates to the old one is the coupling:

  independent (SJD)   a fresh sample; on flat (visual) distributions the window rarely settles
  maximal (MC-SJD)    keep the old draft w.p. min(1, target/old law), else draw the residual: the verification's
                      modified rejection sampling run over the whole window without a break
  gumbel (GS-SJD)     argmax(log target + g) with Gumbel noise g fixed per absolute position

Every coupling keeps each new draft distributed as the current target law, which is all exactness needs.
Empty slots (the window's new tail) are filled by `init`: "random" (uniform over the allowed tokens, law
uniform) or "left" (a copy of the previous token, law one-hot; uniform where the previous token may not be
drafted, e.g. the prompt's last token). Rows are ragged and never synchronised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen import kernels
from specgen.errors import InvalidRequest
from specgen.samplers.noise import Purpose, counter_exponential, counter_uniform
from specgen.samplers.types import DecodeContext, Draft, Verdict

COUPLINGS = ("independent", "maximal", "gumbel")
INITS = ("random", "left")


@dataclass(frozen=True)
class _Window:
    """One row's uncommitted drafts: token i sits at absolute position `position + i` and was drawn from
    `laws[i]`."""

    position: int
    tokens: torch.Tensor  # [m] int64
    laws: torch.Tensor  # [m, vocab]


class JacobiDrafter:
    """Drafts the next window from the target's own previous step (see the module docstring).

    `allowed` ([vocab] bool) limits random initialisation, e.g. to image codes. The noise of every draw is keyed
    by (seed, sample, absolute position, purpose) and, except for the Gumbel noise, by the step's start position,
    so draws at one position in different steps are independent."""

    def __init__(self, vocab_size: int, coupling: str = "maximal", init: str = "random",
                 allowed: torch.Tensor | None = None):
        if coupling not in COUPLINGS:
            raise InvalidRequest(f"unknown Jacobi coupling {coupling!r}; choose from: {', '.join(COUPLINGS)}")
        if init not in INITS:
            raise InvalidRequest(f"unknown Jacobi initialisation {init!r}; choose from: {', '.join(INITS)}")
        allowed = torch.ones(vocab_size, dtype=torch.bool) if allowed is None else allowed.bool()
        if allowed.shape != (vocab_size,) or not bool(allowed.any()):
            raise InvalidRequest("allowed must be a [vocab] mask with at least one allowed token")
        self.vocab_size, self.coupling, self.init = vocab_size, coupling, init
        self.init_law = allowed.double() / allowed.sum()  # [vocab]
        # sample id -> its uncommitted drafts (by request, not batch row: a row of a served queue takes new ones)
        self.windows: dict[int, _Window] = {}
        self.changed: list[int] = []  # per step: kept drafts whose token changed (how unsettled the window is)
        self._last: tuple | None = None

    def run_summary(self) -> dict:
        """The mean number of kept drafts a step changed (a settled window changes few)."""
        return {"changed_per_step": sum(self.changed) / len(self.changed) if self.changed else 0.0}

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        samples, starts = ctx.sample_ids.tolist(), ctx.next_positions
        tokens = torch.zeros(len(samples), budget, dtype=torch.long)
        laws = torch.zeros(len(samples), budget, self.vocab_size, dtype=torch.float64)
        filled = torch.zeros(len(samples), dtype=torch.long)
        for i, sample in enumerate(samples):
            window = self.windows.get(sample)
            if window is not None and window.position == int(starts[i]):  # else stale: start afresh
                m = min(budget, len(window.tokens))
                tokens[i, :m], laws[i, :m], filled[i] = window.tokens[:m], window.laws[:m].double(), m
        empty = torch.arange(budget) >= filled[:, None]  # [rows, budget] slots the window has no draft for
        if bool(empty.any()):
            token, law = self._initial(ctx, starts, budget, tokens, filled)
            tokens = torch.where(empty, token, tokens)
            laws = torch.where(empty[..., None], law, laws)
        self._last = (samples, starts, ctx.sample_ids, ctx.seed, tokens, laws)
        return Draft(tokens, laws)

    def _initial(self, ctx: DecodeContext, starts, budget: int, tokens, filled):
        """Initial drafts and their laws for every slot [rows, budget] (only the empty ones are used)."""
        slots = torch.arange(budget)
        uniform = counter_uniform(ctx.seed, ctx.sample_ids[:, None], starts[:, None] + slots, Purpose.JACOBI_INIT,
                                  starts[:, None])
        law = self.init_law.expand(len(filled), budget, -1)
        token = kernels.sample_categorical(self.init_law, uniform)  # "random": uniform draws (one CDF for all slots)
        if self.init == "left":
            # Each empty slot copies the one before it, so they all repeat the token before the first empty slot;
            # where that token may not be drafted (e.g. the prompt's last token) the first empty slot is drawn
            # uniformly instead and the rest copy it.
            pending = torch.tensor([int(t[-1]) for t in ctx.tokens])
            before = torch.where(filled > 0, tokens.gather(1, (filled - 1).clamp(min=0)[:, None]).squeeze(1), pending)
            ok = (before >= 0) & (before < self.vocab_size)
            ok &= self.init_law[before.clamp(0, self.vocab_size - 1)] > 0
            first = filled.clamp(max=budget - 1)
            copied = torch.where(ok, before, token.gather(1, first[:, None]).squeeze(1))  # [rows]
            one_hot = torch.zeros(len(filled), self.vocab_size, dtype=law.dtype).scatter_(-1, copied[:, None], 1.0)
            drawn_first = (~ok)[:, None] & (slots == first[:, None])  # keeps its uniform law
            token = torch.where(drawn_first, token, copied[:, None].expand(-1, budget))
            law = torch.where(drawn_first[..., None], law, one_hot[:, None, :].expand(-1, budget, -1))
        return token, law

    def observe(self, verdict: Verdict) -> None:
        if verdict.target_probs is None:
            raise InvalidRequest("Jacobi decoding needs the verdict's target_probs (set by verify_step)")
        if self._last is None:  # nothing was drafted this step (the end of every row is one token away)
            return
        (samples, starts, sample_ids, seed, tokens, laws), self._last = self._last, None
        target_probs = verdict.target_probs.double()  # [rows, k + 1, vocab]
        k = target_probs.shape[1] - 1
        tokens, laws = tokens[:, :k], laws[:, :k]  # the loop may have shortened the window
        positions = starts[:, None] + torch.arange(k + 1)  # [rows, k + 1] absolute position of each slot
        drafted, accepted = verdict.num_drafted, verdict.num_accepted
        redrafts = self._redraft(target_probs, tokens, laws, drafted, positions, sample_ids, seed, starts)
        changed = 0
        for i, sample in enumerate(samples):
            first, last = int(accepted[i]) + 1, int(drafted[i])  # keep slots after the committed ones
            if first > last:  # every draft accepted: the bonus token closed the window
                self.windows.pop(sample, None)
                continue
            self.windows[sample] = _Window(int(positions[i, first]), redrafts[i, first:last + 1].clone(),
                                        target_probs[i, first:last + 1].clone())
            changed += int((redrafts[i, first:last] != tokens[i, first:last]).sum())
        self.changed.append(changed)

    def _redraft(self, target_probs, tokens, laws, drafted, positions, sample_ids, seed, starts) -> torch.Tensor:
        """[rows, k + 1] a new draft for every slot, distributed as target_probs there."""
        if self.coupling == "gumbel":
            vocab = torch.arange(self.vocab_size)
            exponential = counter_exponential(seed, sample_ids[:, None, None], positions[..., None],
                                              Purpose.JACOBI_GUMBEL, vocab)  # [rows, k + 1, vocab]
            return kernels.gumbel_argmax(target_probs, exponential)
        draw = counter_uniform(seed, sample_ids[:, None], positions, Purpose.JACOBI_DRAFT, starts[:, None])
        if self.coupling == "independent" or tokens.shape[1] == 0:
            return kernels.sample_categorical(target_probs, draw)  # [rows, k + 1]
        keep = counter_uniform(seed, sample_ids[:, None], positions[:, :-1], Purpose.JACOBI_COUPLE, starts[:, None])
        coupled, _ = kernels.coupled_resample(tokens, laws, target_probs[:, :-1], keep, draw[:, :-1])
        # fresh draws only where no draft is coupled: the last slot, and the slots a shorter row did not draft
        last = kernels.sample_categorical(target_probs[:, -1:], draw[:, -1:])
        had_draft = torch.arange(tokens.shape[1]) < drafted[:, None]
        if not bool(had_draft.all()):
            coupled = torch.where(had_draft, coupled, kernels.sample_categorical(target_probs[:, :-1], draw[:, :-1]))
        return torch.cat([coupled, last], 1)
