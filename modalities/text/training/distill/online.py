"""Online speculative decoding: update the draft from its own mistakes while serving.

OSD (Liu et al., ICML 2024, arXiv 2310.07177) keeps a buffer of the positions where the draft was wrong,
with the target's distributions there, and every I requests distils the target into the draft on that
buffer (forward KL, i.e. soft cross-entropy). Per request we keep the full sequence (prompt + generated)
and the positions of the tokens the *target* emitted: the recovered token at a rejection and the bonus
token after a fully accepted chain. The update recomputes both models' logits over the right-padded
buffer, takes ONE AdamW step of the divergence at those positions, and clears the buffer.

Off-by-one: the loss goes on the logits that *predict* a target-emitted token, i.e. at index t - 1 for a
token at sequence index t. The official OSD code puts it at t itself (the logits that predict the token
*after* the emitted one), which trains the draft on the wrong context. `positions="all"` (every generated
token) is the ablation.

The draft serves in eval mode between updates; a new drafter is built per request, so an in-place update
is seen from the next request on (never in the middle of one).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from collections.abc import Iterable

import torch

from specgen.errors import InvalidRequest
from specgen.modalities.text.training.distill.divergences import (DIVERGENCES, draft_buckets, teacher_top_k,
                                                                  token_divergence)
from specgen.samplers.types import StepEvent, TokenSource

POSITIONS = ("wrong", "all")
TARGET_EMITTED = (TokenSource.RECOVERED, TokenSource.BONUS)


@dataclass(frozen=True)
class Record:
    """One finished request in the buffer."""

    ids: list[int]  # prompt + generated token ids
    positions: list[int]  # indices of the logits that predict the trained tokens (token index - 1)


def training_positions(prompt_len: int, sources: Iterable[int], positions: str = "wrong") -> list[int]:
    """Indices (into prompt + generated) of the logits to train: the ones predicting each target-emitted
    generated token ("wrong") or every generated token ("all"). Generated token j sits at prompt_len + j
    and is predicted by the logits at prompt_len + j - 1."""
    return [prompt_len + j - 1 for j, source in enumerate(sources)
            if positions == "all" or source in TARGET_EMITTED]


class OnlineDistiller:
    """Buffers served requests and updates `draft_model` in place every `interval` requests (or earlier, when
    the buffered sequences reach `max_buffer_tokens`)."""

    def __init__(self, draft_model, target_model, *, interval: int = 8, lr: float = 1e-3, positions: str = "wrong",
                 divergence: str = "fkl", max_buffer_tokens: int = 32768, weight_decay: float = 0.0):
        if not isinstance(interval, int) or interval < 1:
            raise InvalidRequest(f"interval must be an integer >= 1, got {interval!r}")
        if not (isinstance(lr, (int, float)) and 0 < lr < 1):
            raise InvalidRequest(f"lr must be in (0, 1), got {lr!r}")
        if positions not in POSITIONS:
            raise InvalidRequest(f"positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
        if divergence not in DIVERGENCES:
            raise InvalidRequest(f"divergence must be one of {', '.join(DIVERGENCES)}, got {divergence!r}")
        if not isinstance(max_buffer_tokens, int) or max_buffer_tokens < 1:
            raise InvalidRequest(f"max_buffer_tokens must be an integer >= 1, got {max_buffer_tokens!r}")
        if draft_model.config.vocab_size != target_model.config.vocab_size:
            raise InvalidRequest("online distillation needs the draft and the target to share one vocabulary")
        self.draft, self.target = draft_model, target_model
        self.interval, self.positions, self.divergence = interval, positions, divergence
        self.max_buffer_tokens = max_buffer_tokens
        self.optimizer = torch.optim.AdamW([p for p in draft_model.parameters() if p.requires_grad], lr=lr,
                                           weight_decay=weight_decay)
        self.buffer: list[Record] = []
        self.requests = self.updates = 0
        self.loss: float | None = None
        self.update_s = 0.0  # time spent in updates, all told

    @property
    def buffered_positions(self) -> int:
        return sum(len(r.positions) for r in self.buffer)

    @property
    def buffered_tokens(self) -> int:
        return sum(len(r.ids) for r in self.buffer)

    def observe(self, prompt_ids, events: Iterable[StepEvent]) -> bool:
        """Record one finished request (a single row); returns True when this call ran an update."""
        prompt = [int(t) for t in (prompt_ids.tolist() if torch.is_tensor(prompt_ids) else prompt_ids)]
        generated, sources = [], []
        for event in events:
            if event.row != 0:
                raise InvalidRequest("OnlineDistiller.observe takes one request of one row (num_samples=1)")
            generated += event.tokens
            sources += event.sources
        if not prompt:
            raise InvalidRequest("observe needs the prompt ids")
        self.buffer.append(Record(prompt + generated, training_positions(len(prompt), sources, self.positions)))
        self.requests += 1
        if self.requests % self.interval == 0 or self.buffered_tokens >= self.max_buffer_tokens:
            return self.update()
        return False

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The buffer right-padded: ids, mask [rows, width]; and the (row, column) of every trained logit [n]."""
        width = max(len(r.ids) for r in self.buffer)
        ids = torch.zeros(len(self.buffer), width, dtype=torch.long)
        mask = torch.zeros(len(self.buffer), width, dtype=torch.long)
        rows, cols = [], []
        for i, record in enumerate(self.buffer):
            ids[i, :len(record.ids)] = torch.tensor(record.ids)
            mask[i, :len(record.ids)] = 1
            rows += [i] * len(record.positions)
            cols += record.positions
        return ids, mask, torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)

    def _logits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """target_logits (no grad), draft_logits (with grad): [n, vocab] at the buffered positions."""
        ids, mask, rows, cols = self._batch()
        with torch.no_grad():
            target_logits = self.target(input_ids=ids, attention_mask=mask).logits[rows, cols]  # [n, vocab]
        draft_logits = self.draft(input_ids=ids, attention_mask=mask).logits[rows, cols]  # [n, vocab]
        return target_logits, draft_logits

    def buffer_loss(self) -> torch.Tensor:
        """Mean divergence(target || draft) over the buffered positions (differentiable in the draft)."""
        target_logits, draft_logits = self._logits()
        teacher = teacher_top_k(target_logits, target_logits.shape[-1])  # k = vocab: the exact divergence
        return token_divergence(self.divergence, teacher.buckets(), draft_buckets(draft_logits, teacher)).mean()

    @torch.no_grad()
    def agreement(self) -> float | None:
        """Mean teacher-forced Σ min(target, draft) (the acceptance rate at temperature 1) on the buffer."""
        if not self.buffered_positions:
            return None
        target_logits, draft_logits = self._logits()
        target_probs, draft_probs = target_logits.float().softmax(-1), draft_logits.float().softmax(-1)
        return float(torch.minimum(target_probs, draft_probs).sum(-1).mean())

    def update(self) -> bool:
        """One optimizer step over the buffer, then clear it. Returns False (no step) when nothing is buffered."""
        started = time.perf_counter()
        try:
            if not self.buffered_positions:
                return False
            self.draft.train()
            try:
                loss = self.buffer_loss()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
            finally:
                self.optimizer.zero_grad(set_to_none=True)
                self.draft.eval()
            self.loss = float(loss.detach())
            self.updates += 1
            return True
        finally:
            self.buffer.clear()
            self.update_s += time.perf_counter() - started


def request_stats(events: list[StepEvent]) -> dict:
    """accepted, drafted, rejections (steps ending in a recovered token), alpha_hat, tau (tokens per step),
    generated (tokens committed) and output_sha256 (of the committed tokens, to compare outputs across arms)."""
    import hashlib

    accepted = sum(e.num_accepted for e in events)
    rejections = sum(TokenSource.RECOVERED in e.sources for e in events)
    tokens = [t for e in events for t in e.tokens]
    tested = accepted + rejections
    return {"accepted": accepted, "drafted": sum(e.num_drafted for e in events), "rejections": rejections,
            "alpha_hat": accepted / tested if tested else None, "tau": len(tokens) / len(events) if events else 0.0,
            "generated": len(tokens), "output_sha256": hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]}


def run_stream(generator, prompts: Iterable[str], *, online: OnlineDistiller | None, max_new_tokens: int,
               num_draft_tokens: int, temperature: float = 0.0, desc: str = "stream") -> list[dict]:
    """Serve `prompts` one by one with method "draft" and the generator's current draft; with `online`, the
    generator feeds every finished request to it (which updates generator.draft_model in place). One dict per
    request."""
    from tqdm import tqdm

    if online is not None and online.draft is not generator.draft_model:
        raise InvalidRequest("the OnlineDistiller must update the generator's own draft model")
    prompts = list(prompts)
    results = []
    previous, generator.online = generator.online, online
    try:
        for prompt in tqdm(prompts, desc=desc, file=sys.stderr, unit="req", dynamic_ncols=True):
            updates = online.updates if online is not None else 0
            events = list(generator.stream(prompt, method="draft", max_new_tokens=max_new_tokens,
                                           temperature=temperature, num_draft_tokens=num_draft_tokens))
            item = request_stats(events)
            item["updated"] = online is not None and online.updates > updates
            results.append(item)
    finally:
        generator.online = previous
    return results
