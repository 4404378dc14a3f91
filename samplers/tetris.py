"""TETRIS (Wu et al., arXiv 2502.15197): which drafted tokens a batch verifies under a capacity. The pipeline
wraps a chain drafter in `TetrisDrafter` when a request sets `verify_capacity` (modalities/pipeline.py)."""

from __future__ import annotations

import torch

from specgen.errors import InvalidRequest
from specgen.samplers.types import Verdict



def tetris_select(accept_estimates: torch.Tensor, capacity: int, num_drafted: torch.Tensor | None = None,
                  slot_cost: float = 0.0) -> torch.Tensor:
    """TETRIS (Wu et al., arXiv 2502.15197): given per-token acceptance estimates [batch, k] of each row's drafted
    chain and a budget of `capacity` verified drafted tokens for the whole batch, keep the `capacity` prefixes'
    tokens with the largest cumulative estimates P_ij = prod_{t <= j} a_it. P is non-increasing along a row, so the
    choice is a prefix per row; a max-heap over the rows' next tokens takes O(capacity log batch). Ties go to the
    lower row. Returns the number of drafted tokens kept per row [batch] (expected accepted tokens maximised under
    independence).

    `slot_cost` > 0 makes the budget a cap rather than a quota: a verification step is taken to cost
    1 + slot_cost per scored slot (every row's pending token plus the kept drafts, in units of the step's fixed
    cost), and of the heap's picks only the first m, m maximising expected committed tokens per cost
    (batch + sum of the first m P) / (1 + slot_cost (batch + m)), are kept: a token whose acceptance is too
    unlikely to pay for its slot is not verified (on a CPU a slot's cost is a sizeable share of a step's)."""
    import heapq

    batch, k = accept_estimates.shape
    limit = torch.full((batch,), k, dtype=torch.long) if num_drafted is None else num_drafted.clone()
    cumulative = accept_estimates.double().clamp(0, 1).cumprod(-1).tolist()
    picks: list[tuple[int, float]] = []  # (row, P) in the order the heap gives them: P non-increasing
    taken = [0] * batch
    heap = [(-cumulative[b][0], b) for b in range(batch) if int(limit[b]) > 0]
    heapq.heapify(heap)
    for _ in range(max(capacity, 0)):
        if not heap:
            break
        negative, b = heapq.heappop(heap)
        picks.append((b, -negative))
        taken[b] += 1
        if taken[b] < int(limit[b]):
            heapq.heappush(heap, (-cumulative[b][taken[b]], b))
    keep = len(picks)
    if slot_cost > 0:
        best, committed = batch / (1 + slot_cost * batch), float(batch)
        keep = 0
        for m, (_, estimate) in enumerate(picks, 1):
            committed += estimate
            rate = committed / (1 + slot_cost * (batch + m))
            if rate > best:
                best, keep = rate, m
    kept = [0] * batch
    for b, _ in picks[:keep]:
        kept[b] += 1
    return torch.tensor(kept, dtype=torch.long)


class TetrisDrafter:
    """Wraps a chain drafter: every row drafts up to the loop's budget, then TETRIS keeps, across the active rows,
    the `capacity` drafted tokens with the largest cumulative acceptance estimates; rows become ragged.

    Estimates (each known before the token it ranks is drawn, so verification stays exact):
    - "confidence": the draft's confidence at slot j, max_x q_j(x) of its temperature-1 law (the drafter's
      `confidence` when it reports one: at temperature 0 the drafted law is one-hot and every slot would tie);
    - "history": the row's own acceptance so far, a per-token rate estimated from its past verdicts (accepted
      tokens over tested ones, decayed so it follows the text), the same at every slot of the row. It needs no
      draft law, so it ranks point-mass drafts (prompt lookup) too: rows copying a repeated passage get the
      budget, rows where lookup keeps failing get little.
    Using the drafted token's own probability q_j(x_j) (estimate="drafted_token", the paper's proxy) lets a
    token's draw decide whether it is verified, which biases the output (a negative control in the tests)."""

    ESTIMATES = ("confidence", "history", "drafted_token")

    def __init__(self, inner, capacity: int, estimate: str = "confidence", decay: float = 0.8, prior: float = 0.5,
                 slot_cost: float = 0.0):
        if capacity < 0:
            raise InvalidRequest(f"capacity must be >= 0, got {capacity}")
        if slot_cost < 0 or not 0 <= decay < 1 or not 0 < prior <= 1:
            raise InvalidRequest(f"TETRIS needs slot_cost >= 0, 0 <= decay < 1 and 0 < prior <= 1, got "
                                 f"{slot_cost}, {decay} and {prior}")
        if estimate not in self.ESTIMATES:
            raise InvalidRequest(f"unknown TETRIS estimate {estimate!r}; choose from {', '.join(self.ESTIMATES)}")
        self.inner, self.capacity, self.estimate = inner, capacity, estimate
        self.decay, self.prior, self.slot_cost = decay, prior, slot_cost
        # sample id -> [decayed accepted, decayed tested]: keyed by request, not batch row, so a row that takes a
        # new request (a served queue) starts from the batch's rate
        self._tested: dict[int, list[float]] = {}
        self._samples: list[int] = []

    def propose(self, ctx, budget: int):
        from specgen.samplers.types import Draft

        draft = self.inner.propose(ctx, budget)
        self._samples = ctx.sample_ids.tolist()
        # finished requests leave the batch's rate
        self._tested = {sample: self._tested[sample] for sample in self._samples if sample in self._tested}
        if draft.length == 0:
            return draft
        if self.estimate == "history":
            pooled = self._pooled_rate()
            rates = torch.tensor([self.acceptance_rate(sample, pooled) for sample in self._samples],
                                 dtype=torch.double)
            estimates = rates[:, None].expand(-1, draft.length)
        elif draft.draft_probs is None:
            return draft
        elif self.estimate == "confidence":  # the drafter's temperature-1 confidence where it reports one
            reported = getattr(self.inner, "confidence", None)
            usable = reported is not None and reported.shape == draft.tokens.shape
            estimates = reported if usable else draft.draft_probs.max(-1).values
        else:
            index = draft.tokens if draft.vocab_ids is None else _draft_index(draft)
            estimates = draft.draft_probs.gather(-1, index[..., None]).squeeze(-1)
        kept = tetris_select(estimates, self.capacity, draft.drafted(), self.slot_cost)
        return Draft(draft.tokens, draft.draft_probs, kept, draft.vocab_ids)

    def acceptance_rate(self, sample: int, pooled: float | None = None) -> float:
        """A request's per-token acceptance estimate: its decayed accepted over decayed tested tokens, shrunk
        towards the whole batch's rate `pooled` (weight of one tested token; computed when not given)."""
        accepted, tested = self._tested.get(sample, (0.0, 0.0))
        pooled = self._pooled_rate() if pooled is None else pooled
        return (accepted + pooled) / (tested + 1.0)

    def _pooled_rate(self) -> float:
        """The whole batch's decayed acceptance rate, from `prior` before anything was tested."""
        accepted, tested = (sum(column) for column in zip((0.0, 0.0), *self._tested.values()))
        return (accepted + self.prior) / (tested + 1.0)

    def observe(self, verdict: Verdict) -> None:
        # A chain verdict tests tokens up to the first rejection: n accepted, plus the rejected one when n < drafted.
        # A row left unverified keeps decaying towards the batch's rate, so it is tried again after a while.
        for sample, accepted, drafted in zip(self._samples, verdict.num_accepted.tolist(),
                                             verdict.num_drafted.tolist()):
            tested = accepted + (1 if accepted < drafted else 0)
            total = self._tested.setdefault(sample, [0.0, 0.0])
            total[0] = self.decay * total[0] + accepted
            total[1] = self.decay * total[1] + tested
        self._samples = []  # a step the loop drafts nothing for (no propose) must not count for these samples
        self.inner.observe(verdict)


def _draft_index(draft) -> torch.Tensor:
    """Draft-vocabulary index of each drafted target id (for drafts over a reduced vocabulary)."""
    lookup = torch.full((int(draft.vocab_ids.max()) + 1,), 0, dtype=torch.long)
    lookup[draft.vocab_ids] = torch.arange(len(draft.vocab_ids))
    return lookup[draft.tokens]
