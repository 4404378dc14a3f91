"""A draft model (any transformers causal LM) as a `Drafter`, optionally over a reduced vocabulary.

The drafter keeps its own position-indexed cache and remembers which tokens it holds per row. Each proposal
rolls back to the longest common prefix with the committed context (discarding rejected drafts), feeds the
committed tokens it has not cached with its first forward, then samples `budget` tokens one forward at a time
under its own `Processing`, reporting the law each token was drawn from. With prompt lookup (`draft-lookup`),
slots lookup fills need no forward, and a proposal lookup fills throughout runs none. Randomness is
counter-based, keyed by (seed, sample, position, DRAFT), so a row's draft does not depend on the batch it runs in.
"""

from __future__ import annotations

import torch

from specgen.errors import InvalidRequest, VocabularyMismatch
from specgen.kernels import sample_categorical
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.samplers.length_policies import ChainStops
from specgen.samplers.noise import draft_uniforms
from specgen.samplers.processing import Processing, prefix_routes
from specgen.samplers.types import DecodeContext, Draft, Verdict


ALTERNATIVES = 3  # runners-up kept per drafted slot (`ModelDrafter.alternatives`)


class Interrupted(Exception):
    """Raised inside `propose` when the drafter's `interrupt()` says the proposal is no longer wanted."""


class ModelDrafter:
    """vocab_ids: [draft_vocab] target ids of the draft's tokens (None: the draft shares the target vocabulary).
    With a reduced vocabulary, target tokens outside it are fed to the draft as `unknown_id` and can never be
    proposed (draft probability 0), so verification stays exact."""

    def __init__(self, model, processing: Processing, *, target_vocab_size: int | None = None,
                 vocab_ids: torch.Tensor | None = None, unknown_id: int = 0, capacity: int | None = None,
                 stop_policy=None, lookup=None, int8_head: bool = False):
        # int8_head: the draft's output layer as int8 rows (its law is then that model's; verification stays exact)
        self.engine = TransformersTarget(model, capacity, int8_head=int8_head, decode_kernel=True)
        self.processing = processing
        # lookup.next_token(context) -> a token id or None: slots it fills are point masses (`draft-lookup`)
        self.lookup = lookup
        self.looked_up = 0  # drafted slots filled by lookup so far
        # stop_policy.stop(law, previous_law, index) -> [rows] bool, asked before each drafted token after the first
        # (SVIP's entropy rule, Kangaroo's confidence rule); laws are the draft's softmax at temperature 1
        self.stop_policy = stop_policy
        draft_vocab = self.engine.vocab_size
        self.vocab_ids = None if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.long)
        if self.vocab_ids is None:
            if target_vocab_size is not None and target_vocab_size != draft_vocab:
                raise VocabularyMismatch(f"the draft has {draft_vocab} tokens but the target has {target_vocab_size}; "
                                         "give vocab_ids to map a reduced draft vocabulary into target ids")
            self.to_draft = None
        else:
            if len(self.vocab_ids) > draft_vocab or (target_vocab_size and int(self.vocab_ids.max()) >= target_vocab_size):
                raise VocabularyMismatch(f"vocab_ids map {len(self.vocab_ids)} draft tokens (max id "
                                         f"{int(self.vocab_ids.max())}) onto a target of {target_vocab_size} tokens "
                                         f"with a draft of {draft_vocab} tokens")
            size = max(int(self.vocab_ids.max()) + 1, target_vocab_size or 0)
            self.to_draft = torch.full((size,), unknown_id, dtype=torch.long)
            self.to_draft[self.vocab_ids] = torch.arange(len(self.vocab_ids))
        self.cached: list[list[int]] = []  # per batch row: the target ids whose KV the draft holds
        self.forward_calls = 0
        # [rows, drafted] max of the draft's temperature-1 law at each drafted slot of the last proposal, known
        # before the slot's token is drawn (TETRIS ranks slots by it; at temperature 0 the drafted law is one-hot)
        self.confidence: torch.Tensor | None = None
        # with keep_runners_up (`parallel` sets it; off, the proposal skips the top-k per slot), at each drafted slot
        # of the last proposal, under the draft's temperature-1 law: the probability of the drafted token [rows,
        # drafted], and the ALTERNATIVES likeliest other tokens (target ids) with theirs [rows, drafted,
        # ALTERNATIVES]: its guesses of the target's correction were the slot rejected
        self.keep_runners_up = False
        self.drafted_probs: torch.Tensor | None = None
        self.alternatives: torch.Tensor | None = None
        self.alternative_probs: torch.Tensor | None = None
        # interrupt() -> bool, asked before every draft forward: True abandons the proposal (raises Interrupted);
        # `parallel` asks whether the request that arrived meanwhile still wants the drafting in progress
        self.interrupt = None

    def _draft_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens if self.to_draft is None else self.to_draft[tokens]

    def _law(self, logits: torch.Tensor, routes: torch.Tensor | None = None) -> torch.Tensor:
        if self.vocab_ids is not None:  # draft ids past the mapped ones (e.g. <unk>) are never proposed
            logits = logits[:, :len(self.vocab_ids)]
        return self.processing(logits, routes=routes)  # [rows, draft_vocab]

    def _routes(self, ctx: DecodeContext, drafted: list[torch.Tensor]) -> torch.Tensor | None:
        """[rows, vocab] the prefix constraint's routes for the next drafted token (None: no constraint)."""
        if self.processing.constraint is None:
            return None
        if self.vocab_ids is not None:
            raise InvalidRequest("a prefix constraint needs a draft with the target's vocabulary")
        continuations = torch.stack(drafted, 1).tolist() if drafted else [[]] * len(ctx.tokens)
        return prefix_routes(self.processing.constraint, ctx.tokens, continuations)[:, -1]

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        rows = ctx.rows
        if not self.cached or self.engine.cache is None or len(self.cached) <= int(rows.max()):
            self._reset(int(rows.max()) + 1)
        # committed tokens the draft has not scored yet ([rows, w] right-padded, with counts: at least the pending
        # one); they are fed with the first forward the proposal needs
        backlog = self._catch_up(ctx)
        positions = ctx.next_positions  # position of the first drafted token
        drafted, laws, confidence, runners_up = [], [], [], []
        stops = ChainStops(self.stop_policy, len(rows), budget)  # rows that stop keep drafting; they are cut after
        prefixes = [t.tolist() for t in ctx.tokens] if self.lookup is not None else None
        # `draft-lookup` without a stop rule: a slot that lookup fills in every row needs no draft law, so the
        # forward that would give it one is deferred; the next slot that needs the model feeds the backlog and
        # every deferred token in one forward (the law it reads is the draft's law after the same context). A
        # proposal that lookup fills throughout runs no draft forward at all.
        defer = prefixes is not None and self.stop_policy is None
        row_ids = rows.tolist()
        fills = self._lookup_rows(prefixes, row_ids) if prefixes is not None else None
        width = self.engine.vocab_size if self.vocab_ids is None else len(self.vocab_ids)
        unfed: list[torch.Tensor] = []  # drafted tokens not yet in the draft's cache
        fed = 0
        last = None
        uniforms = None if self.processing.greedy else draft_uniforms(ctx.seed, ctx.sample_ids, positions, budget)
        if not (defer and all(row_index >= 0 for row_index in fills)):
            last, backlog = self._feed(rows, backlog, torch.zeros(len(rows), 0, dtype=torch.long), positions), None
        for d in range(budget):
            if last is None:  # every row looked up: point masses, and their confidence is 1
                law = self._point_masses(torch.zeros(len(rows), width), fills)
                confidence.append(torch.ones(len(rows)))
                plain = law  # a point mass has no runners-up to guess
            else:
                plain = self._plain_law(last)  # the temperature-1 law: the stop rules' input and the confidence
                if stops.all_stop(plain, d):
                    break
                law = self._law(last, self._routes(ctx, drafted))
                if fills is not None:
                    law = self._point_masses(law, fills)
                confidence.append(plain.max(-1).values)
            if self.processing.greedy:
                index = law.argmax(-1)
            else:
                index = sample_categorical(law, uniforms[:, d])
            if self.keep_runners_up:
                runners_up.append(_runners_up(plain, index))
            token = index if self.vocab_ids is None else self.vocab_ids[index]
            drafted.append(token)
            laws.append(law)
            if d + 1 < budget:  # the last drafted token is fed at the next catch-up, if it is accepted
                if prefixes is not None:  # what lookup fills at the next slot
                    for prefix, t in zip(prefixes, token.tolist()):
                        prefix.append(t)
                    fills = self._lookup_rows(prefixes, row_ids)
                unfed.append(token)
                if defer and all(row_index >= 0 for row_index in fills):
                    last = None
                    continue
                feed = torch.stack(unfed, 1)  # [rows, u]: drafted tokens fed .. d
                last, backlog = self._feed(rows, backlog, feed, positions + fed), None
                fed, unfed = fed + feed.shape[1], []
        # the draft's cache holds the context and the drafted tokens it has scored (or, with the backlog never fed,
        # the context without the backlog)
        for i, row in enumerate(rows.tolist()):
            context = ctx.tokens[i].tolist()
            if backlog is not None:
                self.cached[row] = context[:len(context) - int(backlog[1][i])]
            else:
                self.cached[row] = context + [int(t[i]) for t in drafted[:fed]]
        ragged = stops.ragged(len(drafted))
        self.confidence = torch.stack(confidence, 1)
        if runners_up:
            self.drafted_probs, others, self.alternative_probs = (torch.stack(part, 1) for part in zip(*runners_up))
            self.alternatives = others if self.vocab_ids is None else self.vocab_ids[others]
        return Draft(torch.stack(drafted, 1), torch.stack(laws, 1), num_drafted=ragged, vocab_ids=self.vocab_ids)

    def _feed(self, rows: torch.Tensor, backlog, feed: torch.Tensor, first: torch.Tensor,
              logits: bool = True) -> torch.Tensor | None:
        """Score and cache the backlog's committed tokens (None: already fed) followed by the drafted tokens `feed`
        [rows, u], the first of them at position `first` [rows]; return the draft's logits after the last one
        (`logits` False: only cache them, and skip the output layer over the whole backlog)."""
        if self.interrupt is not None and self.interrupt():
            raise Interrupted
        u = feed.shape[1]
        if backlog is None:
            tokens, counts = feed, torch.zeros(len(rows), dtype=torch.long)
        else:
            pending, counts = backlog
            tokens = torch.zeros(len(rows), int(counts.max()) + u, dtype=torch.long)
            for i, count in enumerate(counts.tolist()):
                tokens[i, :count], tokens[i, count:count + u] = pending[i, :count], feed[i]
        length = counts + u
        at = first[:, None] - counts[:, None] + torch.arange(tokens.shape[1])  # [rows, w]
        # a ragged backlog (rows that accepted different counts, or new prompts): padding is not scored
        valid = length if bool((length < tokens.shape[1]).any()) else None
        scored = self.engine.score(self._draft_ids(tokens), at, rows, valid=valid,
                                   logits_to_keep=0 if logits else 1)  # [rows, w or 1, vocab]
        self.forward_calls += 1
        self.engine.commit(torch.arange(tokens.shape[1]) < length[:, None], rows)
        return scored[torch.arange(len(rows)), length - 1] if logits else None

    def _lookup_rows(self, prefixes: list[list[int]], rows: list[int]) -> list[int]:
        """Per row, the draft index of the token lookup continues its context with, or -1 where it has none (a
        token outside a reduced vocabulary cannot be proposed: the model's law stays)."""
        indices = []
        for prefix, row in zip(prefixes, rows):
            token, index = self.lookup.next_token(prefix, row), -1
            if token is not None and self.to_draft is None:
                index = token if token < self.engine.vocab_size else -1
            elif token is not None and token < len(self.to_draft):
                index = int(self.to_draft[token])
                index = index if index < len(self.vocab_ids) and int(self.vocab_ids[index]) == token else -1
            indices.append(index)
        return indices

    def _point_masses(self, law: torch.Tensor, indices: list[int]) -> torch.Tensor:
        """The slot's law with each looked-up row replaced by a point mass on its token."""
        law = law.clone()
        for i, index in enumerate(indices):
            if 0 <= index < law.shape[-1]:
                law[i] = 0
                law[i, index] = 1
                self.looked_up += 1
        return law

    def _plain_law(self, logits: torch.Tensor) -> torch.Tensor:
        if self.vocab_ids is not None:
            logits = logits[:, :len(self.vocab_ids)]
        return logits.float().softmax(-1)

    def observe(self, verdict: Verdict) -> None:
        pass  # the next catch-up compares cached tokens with the committed context

    def _reset(self, batch: int) -> None:
        self.engine.prefill([torch.zeros(1, dtype=torch.long)] * batch)  # empty caches
        self.cached = [[] for _ in range(batch)]

    def held(self) -> list[list[int]]:
        """The tokens each row's cache holds now; `rewind` undoes the proposals made since, row by row."""
        return list(self.cached)

    def rewind(self, held: list[list[int]], row: int, context: list[int]) -> None:
        """Return `row` to the part of what it `held` that proposals on `context` left intact: the longest common
        prefix of the two, as their catch-up computes it (they write only past it)."""
        keep = common_prefix(held[row], context)
        self.engine.cache.lengths[row] = keep
        self.cached[row] = held[row][:keep]

    # A backlog longer than this (a prompt: the first step, or a served queue's new request in a row) is cached in
    # a forward of its own over those rows, so the step's shared forward is not padded to a prompt's width for
    # every row, and a long-running row beside a long new prompt cannot overflow the padded window.
    LONG_BACKLOG = 16

    def _feed_long_backlogs(self, rows: torch.Tensor, feeds: list[list[int]]) -> None:
        """Cache all but the last token of every backlog longer than LONG_BACKLOG (in place: those feeds keep their
        last token, which the step's forward feeds with the others)."""
        long = [i for i, feed in enumerate(feeds) if len(feed) > self.LONG_BACKLOG]
        if not long:
            return
        counts = torch.tensor([len(feeds[i]) - 1 for i in long])
        tokens = torch.zeros(len(long), int(counts.max()), dtype=torch.long)
        for j, i in enumerate(long):
            tokens[j, :counts[j]] = torch.tensor(feeds[i][:-1])
            feeds[i] = feeds[i][-1:]
        subset = rows[long]
        # the backlog alone, nothing drafted (`first`: where a drafted token would go, right after the backlog)
        self._feed(subset, (tokens, counts), torch.zeros(len(long), 0, dtype=torch.long),
                   self.engine.cache.lengths[subset] + counts, logits=False)

    def _catch_up(self, ctx: DecodeContext):
        """Roll each row back to the longest common prefix of its cache and the committed context; return the
        committed tokens still to feed (at least the pending one), right-padded, and their counts."""
        feeds = []
        for i, row in enumerate(ctx.rows.tolist()):
            context = ctx.tokens[i].tolist()
            common = common_prefix(self.cached[row], context)
            self.engine.cache.lengths[row] = common
            feeds.append(context[common:])
        self._feed_long_backlogs(ctx.rows, feeds)
        counts = torch.tensor([len(f) for f in feeds])
        tokens = torch.zeros(len(feeds), int(counts.max()), dtype=torch.long)
        for i, feed in enumerate(feeds):
            tokens[i, :len(feed)] = torch.tensor(feed)
        return tokens, counts


def common_prefix(cached: list[int], context: list[int]) -> int:
    """How many leading tokens of `context` but its last (pending) one a cache holding `cached` keeps."""
    common, limit = 0, min(len(cached), len(context) - 1)
    while common < limit and cached[common] == context[common]:
        common += 1
    return common


def _runners_up(plain: torch.Tensor, drafted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probability of the drafted index [rows], the ALTERNATIVES likeliest other indices [rows, A], theirs)."""
    top = plain.topk(min(ALTERNATIVES + 1, plain.shape[-1]), -1)  # [rows, A + 1]
    order = torch.argsort((top.indices == drafted[:, None]).int(), dim=-1, stable=True)[:, :ALTERNATIVES]
    return plain.gather(-1, drafted[:, None])[:, 0], top.indices.gather(-1, order), top.values.gather(-1, order)
