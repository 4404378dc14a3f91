"""Table-based toy language models with analytic probabilities: the exactness oracle's ground truth and the
engine of `specgen selfcheck`. A TableLM's next-token logits depend on the last `order` tokens only, so every
distribution is known exactly and whole output distributions can be enumerated."""

from __future__ import annotations

import torch

from specgen.kernels import sample_categorical
from specgen.samplers.noise import Purpose, counter_exponential, counter_uniform
from specgen.samplers.processing import Processing
from specgen.samplers.types import DecodeContext, Draft, DraftTree, Verdict


class TableLM:
    """Markov LM of order `order` with a seeded random logit table [vocab**order, vocab] (float64)."""

    def __init__(self, vocab_size: int, order: int = 1, seed: int = 0, scale: float = 2.0):
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size, self.order = vocab_size, order
        self.table = torch.randn(vocab_size ** order, vocab_size, generator=generator, dtype=torch.float64) * scale

    def logits(self, context) -> torch.Tensor:
        """[vocab] logits of the token after `context` (a sequence of ints; short contexts are 0-padded)."""
        tail = [0] * self.order + [int(t) for t in context]
        index = 0
        for token in tail[-self.order:]:
            index = index * self.vocab_size + token
        return self.table[index]

    def mixed_with(self, other: "TableLM", weight: float) -> "TableLM":
        """A model whose logits are (1 - weight) * self + weight * other: a draft of tunable quality."""
        mixed = TableLM.__new__(TableLM)
        mixed.vocab_size, mixed.order = self.vocab_size, self.order
        mixed.table = (1 - weight) * self.table + weight * other.table
        return mixed


class TableTarget:
    """A TargetModel over a TableLM whose "cache" is the list of committed tokens per row. It checks that the
    positions it is given agree with its cache, so position bugs in the loop fail loudly."""

    def __init__(self, lm: TableLM):
        self.lm, self.vocab_size = lm, lm.vocab_size
        self.cache: list[list[int]] = []
        self.forward_calls = 0
        self._last: torch.Tensor | None = None

    def prefill(self, prompts) -> None:
        self.cache = [[int(t) for t in p[:-1]] for p in prompts]

    def score(self, tokens, positions, rows, tree_mask=None):
        self.forward_calls += 1
        n = tokens.shape[1]
        mask = tree_mask if tree_mask is not None else torch.ones(n, n, dtype=torch.bool).tril().expand(len(rows), n, n)
        logits = torch.empty(len(rows), n, self.vocab_size, dtype=torch.float64)
        for i, row in enumerate(rows.tolist()):
            for slot in range(n):
                visible = tokens[i, mask[i, slot]].tolist()  # ancestors (in order) and the slot itself
                if int(positions[i, slot]) != len(self.cache[row]) + len(visible) - 1:
                    raise AssertionError(f"row {row} slot {slot}: position {int(positions[i, slot])} disagrees with cache")
                logits[i, slot] = self.lm.logits(self.cache[row] + visible)
        self._last = tokens
        return logits

    def commit(self, kept, rows) -> None:
        for i, row in enumerate(rows.tolist()):
            self.cache[row].extend(self._last[i, kept[i]].tolist())


class TableDrafter:
    """Draws a chain from a TableLM under its own `processing`, reporting the law it drew each token from.
    `point_mass=True` drafts the argmax instead and reports no probabilities (a deterministic drafter)."""

    def __init__(self, lm: TableLM, processing: Processing, point_mass: bool = False):
        self.lm, self.processing, self.point_mass = lm, processing, point_mass

    def law(self, context) -> torch.Tensor:
        return self.processing(self.lm.logits(context))

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        tokens = torch.zeros(len(ctx.tokens), budget, dtype=torch.long)
        probs = torch.zeros(len(ctx.tokens), budget, self.lm.vocab_size, dtype=torch.float64)
        for i, row_tokens in enumerate(ctx.tokens):
            sequence = row_tokens.tolist()
            for d in range(budget):
                probs[i, d] = self.law(sequence)
                position = len(sequence)
                if self.point_mass:
                    token = int(probs[i, d].argmax())
                else:
                    u = counter_uniform(ctx.seed, ctx.sample_ids[i], position, Purpose.DRAFT)
                    token = int(sample_categorical(probs[i, d], u))
                tokens[i, d] = token
                sequence.append(token)
        return Draft(tokens, None if self.point_mass else probs)

    def observe(self, verdict: Verdict) -> None:
        pass


class TableTreeDrafter:
    """Draws a fixed-shape tree: every node at depth d gets branching[d] children, drawn i.i.d. (with
    replacement), without replacement (Gumbel-top-k) or as the top candidates (deterministic)."""

    def __init__(self, lm: TableLM, processing: Processing, branching=(2, 2), siblings: str = "without_replacement"):
        self.lm, self.processing, self.branching, self.siblings = lm, processing, tuple(branching), siblings

    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree:
        rows_tokens, rows_parents, rows_probs = [], [], []
        for i, row_tokens in enumerate(ctx.tokens):
            prefix = row_tokens.tolist()
            tokens, parents, paths = [prefix[-1]], [-1], [prefix]
            probs = [self.processing(self.lm.logits(prefix))]
            frontier = [0]
            for width in self.branching:
                next_frontier = []
                for node in frontier:
                    for token in self._children(probs[node], width, ctx, i, len(paths[node])):
                        tokens.append(token)
                        parents.append(node)
                        paths.append(paths[node] + [token])
                        probs.append(self.processing(self.lm.logits(paths[-1])))
                        next_frontier.append(len(tokens) - 1)
                frontier = next_frontier
            rows_tokens.append(tokens)
            rows_parents.append(parents)
            rows_probs.append(torch.stack(probs))
        probs = None if self.siblings == "deterministic" else torch.stack(rows_probs)
        return DraftTree(torch.tensor(rows_tokens), torch.tensor(rows_parents), probs)

    def _children(self, law: torch.Tensor, width: int, ctx: DecodeContext, i: int, position: int) -> list[int]:
        sample = ctx.sample_ids[i]
        if self.siblings == "deterministic":
            return law.sort(descending=True, stable=True).indices[:width].tolist()
        if self.siblings == "with_replacement":
            u = counter_uniform(ctx.seed, sample, position, Purpose.DRAFT, torch.arange(width))
            return [int(sample_categorical(law, u_j)) for u_j in u]
        exponential = counter_exponential(ctx.seed, sample, position, Purpose.DRAFT_GUMBEL, torch.arange(len(law)))
        width = min(width, int((law > 0).sum()))
        return (law / exponential).topk(width).indices.tolist()  # Gumbel-top-k: ordered draws w/o replacement

    def observe(self, verdict: Verdict) -> None:
        pass
