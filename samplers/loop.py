"""The draft-verify loop, driven by any TargetModel, Drafter and AcceptanceRule.

One step: the drafter proposes (a chain or a tree) -> the target scores [pending, drafted...] in one forward
pass -> the rule accepts a prefix and emits one recovered or bonus token -> the target keeps the accepted slots
-> one StepEvent per row. Rows are ragged: each accepts its own count and keeps its own length; no row is ever
synchronised to the batch minimum (that is biased). Plain decoding is the same loop with nothing drafted.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch

from specgen.errors import InvalidRequest
from specgen.samplers.noise import chain_noise, tree_noise
from specgen.samplers.processing import Processing, prefix_routes
from specgen.samplers.protocols import AcceptanceRule, Drafter, LengthPolicy, TargetModel
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.stats import SpecStats
from specgen.samplers.types import AcceptanceNoise, DecodeContext, Draft, DraftTree, StepEvent, Verdict


def speculative_generate(target: TargetModel, drafter: Drafter | None, rule: AcceptanceRule,
                         prompts: Sequence[torch.Tensor], *, processing: Processing, max_new_tokens: int,
                         policy: LengthPolicy | None = None, seed: int = 0, sample_ids: Sequence[int] | None = None,
                         stop_tokens: Sequence[int] = (), stats: SpecStats | None = None,
                         queue: Iterable[tuple[int, torch.Tensor]] | None = None,
                         cancelled: Callable[[int], bool] | None = None) -> Iterator[StepEvent]:
    """`queue`: more requests as (sample id, prompt), served by continuous batching: a row that finishes takes
    the next one (the target re-prefills that row; the model, tree and n-gram drafters re-sync from each row's
    context), so the batch stays full until the queue runs dry. Events name the request by `sample`; `row` is the
    batch row that served it. Randomness is keyed by (seed, sample id, position), so a request's law does not
    depend on its row or on the requests around it. The queue is asked again whenever a row is free, so an
    iterator that is empty now (`next` raises StopIteration) may hand out more later. A queued request may carry
    its own length limit, (sample id, prompt, max_new_tokens), which then replaces `max_new_tokens` for its row.
    `cancelled(sample id)`, asked before every step, withdraws a request: its row stops at once, with no
    finished event, and is free for the queue (a row whose sample is cancelled from the start is a free row)."""
    context = _validate(prompts, max_new_tokens)
    _freeze_once(getattr(target, "model", None))
    sample_ids = torch.as_tensor(list(range(len(context))) if sample_ids is None else sample_ids,
                                 dtype=torch.long).clone()  # refilled rows take new ids
    queue = iter(queue) if queue is not None else None
    if queue is not None and not hasattr(target, "prefill_rows"):
        raise InvalidRequest(f"{type(target).__name__} cannot serve a request queue (it has no prefill_rows)")
    policy = policy or FixedLength(5 if drafter is not None else 0)
    stats = stats if stats is not None else SpecStats()
    generated, active, stop = [0] * len(context), list(range(len(context))), set(stop_tokens)
    limit = [max_new_tokens] * len(context)  # per row: a queued request may bring its own
    target.prefill(context)
    step = 0
    while True:
        if cancelled is not None:
            active = [r for r in active if not cancelled(int(sample_ids[r]))]
        if queue is not None and len(active) < len(context):
            active = sorted(active + _refill(target, queue, context, generated, limit, sample_ids, active,
                                             max_new_tokens))
        if not active:
            break
        rows = torch.tensor(active)
        ctx = DecodeContext([context[r] for r in active], rows, sample_ids[rows], seed)
        budget = min(policy.next_length(), max(limit[r] - generated[r] for r in active) - 1)
        started = time.perf_counter()
        proposal = drafter.propose(ctx, budget) if drafter is not None and budget > 0 else Draft.empty(len(active))
        proposal = _cap_rows(proposal, [limit[r] - generated[r] - 1 for r in active])
        drafted = time.perf_counter()
        verdict, window = verify_step(target, rule, proposal, processing, ctx)
        verified = time.perf_counter()
        if drafter is not None:
            drafter.observe(verdict)
            policy.observe(verdict)
        committed_now = 0
        for i, (row, tokens, sources) in enumerate(zip(active, verdict.tokens.tolist(), verdict.source.tolist())):
            tokens, sources, finished = _truncate(tokens, sources, limit[row] - generated[row], stop)
            context[row] = torch.cat([context[row], torch.tensor(tokens, dtype=torch.long)])
            generated[row] += len(tokens)
            committed_now += len(tokens)
            # rules exact in groups tag each committed token with the group it was emitted in
            extra = {} if verdict.groups is None else {"groups": verdict.groups[i, :len(tokens)].tolist()}
            yield StepEvent(step, row, int(sample_ids[row]), tuple(tokens), tuple(sources),
                            int(verdict.num_drafted[i]), int(verdict.num_accepted[i]),
                            drafted - started, verified - drafted, finished, extra)
        stats.update(verdict, committed_now, drafted - started, verified - drafted, window,
                     proposal if isinstance(proposal, DraftTree) else None)
        active = [r for r in active if generated[r] < limit[r] and not (stop and int(context[r][-1]) in stop)]
        step += 1


def verify_step(target: TargetModel, rule: AcceptanceRule, proposal: Draft | DraftTree, processing: Processing,
                ctx: DecodeContext) -> tuple[Verdict, int]:
    """Score the proposal in one target forward pass, accept, and keep the accepted slots' KV.
    Returns the verdict and the window size (slots scored per row)."""
    pending = torch.tensor([int(t[-1]) for t in ctx.tokens])  # [rows] last committed token, not yet cached
    random = getattr(rule, "uses_noise", True)  # greedy matching needs no randomness
    valid = None
    start = ctx.next_positions - 1  # [rows] its position
    if isinstance(proposal, DraftTree):
        if bool((proposal.tokens[:, 0] != pending).any()):
            raise InvalidRequest("a DraftTree's root must be the row's last committed token")
        tokens, positions = proposal.tokens, start[:, None] + proposal.depths
        mask = None if proposal.is_chain else proposal.ancestor_mask  # a chain: the causal mask
        drafted_tokens = tokens[:, 1:]
        noise = tree_noise(ctx.seed, ctx.sample_ids, start, proposal.depths, proposal.sibling_rank) if random else None
    else:
        drafted = torch.arange(proposal.length) < proposal.drafted()[:, None]  # ragged rows may pad with -1
        drafted_tokens = proposal.tokens[drafted]
        tokens = torch.cat([pending[:, None], torch.where(drafted, proposal.tokens, pending[:, None])], 1)
        mask = None  # tokens: [rows, k + 1]
        valid = proposal.drafted() + 1 if bool((~drafted).any()) else None  # ragged rows: padding may be skipped
        positions = start[:, None] + torch.arange(tokens.shape[1])
        noise = chain_noise(ctx.seed, ctx.sample_ids, start, proposal.length) if random else None
    if tokens.shape[0] != len(ctx.tokens):
        raise InvalidRequest(f"the drafter proposed for {tokens.shape[0]} rows, expected {len(ctx.tokens)}")
    # only drafted tokens are checked: the pending token is committed and may be a prompt token of any id
    if drafted_tokens.numel() and (int(drafted_tokens.min()) < 0 or int(drafted_tokens.max()) >= target.vocab_size):
        raise InvalidRequest(f"a drafted token id is outside the target vocabulary [0, {target.vocab_size})")
    routes = None
    if processing.constraint is not None:  # slot i follows the context and tokens[:, 1:i + 1]
        if mask is not None:
            raise InvalidRequest("a prefix constraint needs chain drafts, not trees")
        routes = prefix_routes(processing.constraint, ctx.tokens, tokens[:, 1:].tolist())
    scores = target.score(tokens, positions, ctx.rows, mask, valid)
    cond, uncond = scores if isinstance(scores, tuple) else (scores, None)
    target_probs = processing(cond, positions + 1, uncond, routes)  # slot i is the law of the token at position i + 1
    if random:  # the token emitted at slot (or node) i lands at positions[:, i] + 1: more noise is keyed there
        noise = AcceptanceNoise(*noise, seed=ctx.seed, sample_ids=ctx.sample_ids, positions=positions + 1)
    verdict = rule(proposal, target_probs, noise)
    verdict = dataclasses.replace(verdict, target_probs=target_probs)
    if isinstance(proposal, DraftTree):
        kept = proposal.kept_slots(verdict.accepted_path)
    else:
        kept = torch.arange(tokens.shape[1]) < (verdict.num_accepted + 1)[:, None]  # pending + accepted
    target.commit(kept, ctx.rows)
    return verdict, tokens.shape[1]


@dataclass(frozen=True)
class GenerationResult:
    tokens: list[list[int]]  # new tokens per row
    stats: dict
    events: list[StepEvent]


def generate(target: TargetModel, drafter: Drafter | None, rule: AcceptanceRule, prompts: Sequence[torch.Tensor], *,
             method: str = "speculative", lossless: bool | None = None, stats: SpecStats | None = None,
             ar_step_s: float | Callable[[], float] | None = None, **options) -> GenerationResult:
    """Run `speculative_generate` to the end and collect tokens, events and the stats summary. `lossless` defaults
    to the rule's; `ar_step_s` may be a function, called after the run (a plain step timed before it would warm
    the run's caches)."""
    if options.get("queue") is not None:
        raise InvalidRequest("generate() collects tokens per row; iterate speculative_generate to serve a queue")
    stats = stats if stats is not None else SpecStats()
    started = time.perf_counter()
    events = list(speculative_generate(target, drafter, rule, prompts, stats=stats, **options))
    wall_s = time.perf_counter() - started
    tokens: list[list[int]] = [[] for _ in prompts]
    for event in events:
        tokens[event.row].extend(event.tokens)
    if callable(ar_step_s):
        ar_step_s = ar_step_s()
    summary = stats.summary(method=method, lossless=bool(rule.lossless if lossless is None else lossless),
                            wall_s=wall_s, ar_step_s=ar_step_s)
    return GenerationResult(tokens, summary, events)


def _validate(prompts: Sequence[torch.Tensor], max_new_tokens: int) -> list[torch.Tensor]:
    if max_new_tokens < 1:
        raise InvalidRequest(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(prompts) == 0:
        raise InvalidRequest("no prompts given")
    context = [torch.as_tensor(p, dtype=torch.long).flatten() for p in prompts]
    if any(len(c) == 0 for c in context):
        raise InvalidRequest("every prompt needs at least one token (e.g. a BOS token)")
    return context


def _refill(target: TargetModel, queue: Iterator, context: list[torch.Tensor], generated: list[int],
            limit: list[int], sample_ids: torch.Tensor, active: list[int], max_new_tokens: int) -> list[int]:
    """Give free batch rows the queue's next requests (in place); returns the rows that took one."""
    rows, prompts = [], []
    for row in sorted(set(range(len(context))) - set(active)):
        request = next(queue, None)
        if request is None:
            break
        sample_id, prompt, *own_limit = request
        limit[row] = int(own_limit[0]) if own_limit else max_new_tokens
        prompt = _validate([prompt], limit[row])[0]
        context[row], generated[row], sample_ids[row] = prompt, 0, int(sample_id)
        rows.append(row)
        prompts.append(prompt)
    if rows:
        target.prefill_rows(prompts, torch.tensor(rows))
    return rows


_FROZEN: "weakref.WeakSet" = weakref.WeakSet()


def _freeze_once(model) -> None:
    """The first time a model decodes, move what exists (the model, its modules, the tokenizer) out of the cyclic
    garbage collector's sight (gc.freeze). A step allocates many small objects (n-gram indexes, stats), and each
    full collection they trigger would otherwise walk every object of the loaded models: 4 ms of a 20 ms batch
    step (docs/trees.md). Once per model, not per request: whatever is frozen is never collected as a cycle (it is
    still freed by reference counting), so freezing every request would keep each request's cyclic garbage."""
    if not isinstance(model, torch.nn.Module) or model in _FROZEN:  # a target with no loaded model: nothing to do
        return
    _FROZEN.add(model)
    gc.freeze()


def _cap_rows(proposal: Draft | DraftTree, room: list[int]) -> Draft | DraftTree:
    """A row drafts no deeper than it can still commit minus one, so a sample's tokens do not depend on the other
    rows of its batch (a drafted slot is decided differently from a bonus slot). A tree keeps its shape and gets a
    per-row depth limit; a chain gets per-row drafted counts."""
    if isinstance(proposal, DraftTree):
        limit = torch.tensor(room).clamp(min=0)
        if bool((proposal.depths.max(-1).values <= limit).all()):
            return proposal
        return dataclasses.replace(proposal, depth_limit=limit)
    if proposal.length == 0:
        return proposal
    drafted = torch.minimum(proposal.drafted(), torch.tensor(room).clamp(min=0))
    width = int(drafted.max())  # no row drafts past this: do not score padding
    if width == proposal.length and torch.equal(drafted, proposal.drafted()):
        return proposal
    probs = None if proposal.draft_probs is None else proposal.draft_probs[:, :width]
    return Draft(proposal.tokens[:, :width], probs, drafted, proposal.vocab_ids)


def _truncate(tokens: list[int], sources: list[int], remaining: int, stop: set[int]):
    """Drop padding, cut at the length budget and after the first stop token. A prefix of an exactly
    distributed sequence is exactly distributed, so cutting keeps the method lossless."""
    n = min(sum(1 for s in sources if s >= 0), remaining)
    tokens, sources = tokens[:n], sources[:n]
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[:i + 1], sources[:i + 1], True
    return tokens, sources, n >= remaining
