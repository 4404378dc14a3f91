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

    def logits_at(self, history: torch.Tensor) -> torch.Tensor:
        """[..., order] last tokens (oldest first) -> [..., vocab] logits."""
        index = torch.zeros(history.shape[:-1], dtype=torch.long)
        for o in range(self.order):
            index = index * self.vocab_size + history[..., o]
        return self.table[index]

    def history(self, context) -> list[int]:
        """The last `order` tokens of a context, 0-padded on the left."""
        return ([0] * self.order + [int(t) for t in context])[-self.order:] if self.order else []

    def logits(self, context) -> torch.Tensor:
        """[vocab] logits of the token after `context` (a sequence of ints)."""
        return self.logits_at(torch.tensor(self.history(context)))

    def mixed_with(self, other: "TableLM", weight: float) -> "TableLM":
        """A model whose logits are (1 - weight) * self + weight * other: a draft of tunable quality."""
        mixed = TableLM.__new__(TableLM)
        mixed.vocab_size, mixed.order = self.vocab_size, self.order
        mixed.table = (1 - weight) * self.table + weight * other.table
        return mixed


class TableTarget:
    """A TargetModel over a TableLM whose "cache" is the list of committed tokens per row, vectorised over
    rows. It checks that the positions it is given agree with its cache, so position bugs fail loudly."""

    def __init__(self, lm: TableLM):
        self.lm, self.vocab_size = lm, lm.vocab_size
        self.cache: list[list[int]] = []
        self.forward_calls = 0
        self._last: torch.Tensor | None = None

    def prefill(self, prompts) -> None:
        self.cache = [[int(t) for t in p[:-1]] for p in prompts]

    def prefill_rows(self, prompts, rows) -> None:
        for prompt, row in zip(prompts, torch.as_tensor(rows).tolist()):
            self.cache[row] = [int(t) for t in prompt[:-1]]

    def score(self, tokens, positions, rows, tree_mask=None, valid=None):  # scores the padding too
        self.forward_calls += 1
        batch, n = tokens.shape
        if tree_mask is None:  # a causal chain
            parents = (torch.arange(n) - 1).expand(batch, n)
            depths = torch.arange(n).expand(batch, n)
        else:
            depths = tree_mask.sum(-1) - 1
            is_parent = tree_mask & (depths[:, None, :] == depths[:, :, None] - 1)
            parents = torch.where(depths > 0, is_parent.int().argmax(-1), -1)
        cache_len = torch.tensor([len(self.cache[r]) for r in rows.tolist()])
        if not torch.equal(positions, cache_len[:, None] + depths):
            raise AssertionError("score() positions disagree with the cache lengths and tree depths")
        order = self.lm.order
        tail = torch.tensor([self.lm.history(self.cache[r]) for r in rows.tolist()]).reshape(batch, order)
        history = torch.empty(batch, n, order, dtype=torch.long)
        node = torch.arange(n).expand(batch, n)  # walk from each slot towards the root, then into the cache
        back = torch.zeros(batch, n, dtype=torch.long)
        for o in range(order):
            inside = node >= 0
            from_tree = tokens.gather(1, node.clamp(min=0))
            from_cache = tail.gather(1, (order - 1 - back).clamp(min=0))
            history[..., order - 1 - o] = torch.where(inside, from_tree, from_cache)
            back = back + (~inside).long()
            node = torch.where(inside, parents.gather(1, node.clamp(min=0)), -1)
        self._last = tokens
        return self.lm.logits_at(history)

    def commit(self, kept, rows) -> None:
        for i, row in enumerate(rows.tolist()):
            self.cache[row].extend(self._last[i, kept[i]].tolist())


def _histories(lm: TableLM, ctx: DecodeContext) -> torch.Tensor:
    return torch.tensor([lm.history(t.tolist()) for t in ctx.tokens], dtype=torch.long).reshape(len(ctx.tokens), lm.order)


class TableDrafter:
    """Draws a chain from a TableLM under its own `processing` (vectorised over rows), reporting the law it
    drew each token from. `point_mass=True` drafts the argmax and reports no probabilities (deterministic)."""

    def __init__(self, lm: TableLM, processing: Processing, point_mass: bool = False):
        self.lm, self.processing, self.point_mass = lm, processing, point_mass

    def law(self, context) -> torch.Tensor:
        return self.processing(self.lm.logits(context))

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        history, positions = _histories(self.lm, ctx), ctx.next_positions
        tokens, probs = [], []
        for d in range(budget):
            law = self.processing(self.lm.logits_at(history))  # [rows, vocab]
            if self.point_mass:
                token = law.argmax(-1)
            else:
                token = sample_categorical(law, counter_uniform(ctx.seed, ctx.sample_ids, positions + d, Purpose.DRAFT))
            tokens.append(token)
            probs.append(law)
            history = torch.cat([history[:, 1:], token[:, None]], 1)
        return Draft(torch.stack(tokens, 1), None if self.point_mass else torch.stack(probs, 1))

    def observe(self, verdict: Verdict) -> None:
        pass


class TableTreeDrafter:
    """Draws a fixed-shape tree (vectorised over rows): every node at depth d gets branching[d] children,
    drawn i.i.d. (with replacement), without replacement (Gumbel-top-k) or as the top candidates
    (deterministic)."""

    def __init__(self, lm: TableLM, processing: Processing, branching=(2, 2), siblings: str = "without_replacement"):
        self.lm, self.processing, self.branching, self.siblings = lm, processing, tuple(branching), siblings

    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree:
        rows = len(ctx.tokens)
        root_history = _histories(self.lm, ctx)
        tokens = [torch.tensor([int(t[-1]) for t in ctx.tokens])]
        parents, depths, histories = [-1], [0], [root_history]
        laws = [self.processing(self.lm.logits_at(root_history))]
        frontier = [0]
        for width in self.branching:
            next_frontier = []
            for node in frontier:
                position = ctx.next_positions + depths[node]  # where node's children go
                kids = self._children(laws[node], width, ctx, position)  # [rows, width]
                for c in range(kids.shape[1]):
                    history = torch.cat([histories[node][:, 1:], kids[:, c:c + 1]], 1)
                    tokens.append(kids[:, c])
                    parents.append(node)
                    depths.append(depths[node] + 1)
                    histories.append(history)
                    laws.append(self.processing(self.lm.logits_at(history)))
                    next_frontier.append(len(tokens) - 1)
            frontier = next_frontier
        probs = None if self.siblings == "deterministic" else torch.stack(laws, 1)
        return DraftTree(torch.stack(tokens, 1), torch.tensor(parents).expand(rows, -1), probs)

    def _children(self, law: torch.Tensor, width: int, ctx: DecodeContext, position: torch.Tensor) -> torch.Tensor:
        if self.siblings == "deterministic":
            return law.sort(dim=-1, descending=True, stable=True).indices[:, :width]
        lanes = torch.arange(width)
        if self.siblings == "with_replacement":
            u = counter_uniform(ctx.seed, ctx.sample_ids[:, None], position[:, None], Purpose.DRAFT, lanes)
            return sample_categorical(law[:, None, :].expand(-1, width, -1), u)
        # Where the law has fewer than `width` candidates, the extra children get draft probability 0; the
        # rule treats them as never drawn.
        vocab = torch.arange(law.shape[-1])
        exponential = counter_exponential(ctx.seed, ctx.sample_ids[:, None], position[:, None], Purpose.DRAFT_GUMBEL, vocab)
        return (law / exponential).topk(width, dim=-1).indices  # Gumbel-top-k: ordered draws w/o replacement

    def observe(self, verdict: Verdict) -> None:
        pass


class GuidedTableLM:
    """Classifier-free guidance over a TableLM, for the oracle: logits(context) = uncond + s * (cond - uncond),
    where the unconditioned context swaps the prompt for its unconditioned twin (as `GuidedTarget` does)."""

    def __init__(self, lm: TableLM, prompt, uncond_prompt, scale: float):
        self.lm, self.prompt, self.uncond_prompt, self.scale = lm, list(prompt), list(uncond_prompt), scale
        self.vocab_size = lm.vocab_size

    def logits(self, context) -> torch.Tensor:
        context = list(context)
        generated = context[len(self.prompt):]
        cond, uncond = self.lm.logits(context), self.lm.logits(self.uncond_prompt + generated)
        return uncond + self.scale * (cond - uncond)
