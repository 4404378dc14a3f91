"""Static draft trees from the EAGLE-style head (EAGLE-1's trees, as LANTERN++ uses), guidance included.

Features. The target keeps its final-normed hidden states (`LlamaRunner.keep_hidden`); after prefill and after
every verification this drafter stores the features of the slots that were kept. A row whose context is
x_0..x_{L-1} (x_{L-1} pending) has features f_0..f_{L-2}.

Head cache. Pair t is fc([embed(x_t); f_{t-1}]) at position t; the head's own position-indexed cache holds pairs
1..m. Each step first feeds the missing true pairs up to t = L - 1 (the pending token) and commits them; the
last one's output predicts f_{L-1}, whose law (target lm_head, the same Processing as the target: guidance,
codes only, temperature, top-k) drafts the root's children. A child y of a node with predicted feature g is
the pair fc([embed(y); g]) one position deeper; every tree round scores the requested nodes and their
ancestors with the ancestor mask and commits nothing (EAGLE-1: deeper nodes feed on predicted features).

Guidance. The unconditioned twin of each row runs through the head too (its own features, its own prompt), and
the draft law combines both halves exactly as the target's does (LANTERN's drafters do the same).

Children: without replacement by Gumbel-top-k keyed per node (verify with siblings="without_replacement"),
or the top candidates at temperature 0 ("deterministic")."""

from __future__ import annotations

from typing import Sequence

import torch

from specgen.kernels import decode_step, sample_categorical
from specgen.modalities.image.eagle_head.head import EagleHead
from specgen.modalities.runtime.llama_runner import fast_matmul_dtype
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.modalities.drafters.tree import tree_from_builders, trees_ancestor_mask
from specgen.samplers import trees
from specgen.samplers.noise import Purpose, counter_uniform
from specgen.samplers.processing import Processing
from specgen.samplers.types import DecodeContext, DraftTree


class EagleTreeDrafter:
    def __init__(self, target_model, feature_target: TransformersTarget, head: EagleHead, processing: Processing,
                 shape: Sequence[int], *, siblings: str | None = None, uncond_prompt: torch.Tensor | None = None,
                 capacity: int = 1024):
        """feature_target: the (inner, unguided) TransformersTarget the loop verifies with; its runner keeps
        hidden states. siblings: "without_replacement" (default when sampling) or "deterministic" (the top
        candidates; always so at temperature 0). uncond_prompt: the unconditioned prompt when the target is
        guided (rows r and r + batch)."""
        if feature_target.runner is None:
            raise ValueError("the EAGLE head needs a Llama-architecture target (its features come from our runner)")
        feature_target.runner.keep_hidden = True
        self.features_from = feature_target.runner
        self.embed = target_model.model.embed_tokens.weight.detach()
        self.lm_head = target_model.lm_head.weight.detach()
        self.head = head
        # fc([embed(x); f]) = token_rows[x] + feature_fc f: the token half made once per token, two ops per pair
        dim, fc = self.embed.shape[1], head.fc.weight.detach()
        self.token_rows = torch.nn.functional.linear(self.embed, fc[:, :dim].to(self.embed.dtype))  # [vocab, d]
        self.feature_fc = fc[:, dim:].contiguous()
        self.engine = TransformersTarget(head.body, capacity=capacity + 2 * len(shape) + 2,
                                         matmul_dtype=head_matmul_dtype(head.body), decode_kernel=True)
        self.processing = processing
        self.shape = list(shape)
        # a chain (every node one child) drafts level by level with one new pair per forward (`_chain`)
        self.chain = self.shape == trees.chain_shape(len(self.shape) - 1)
        self.siblings = "deterministic" if processing.greedy else (siblings or "without_replacement")
        self.rank_processing = processing if not processing.greedy else Processing(
            temperature=1.0, top_k=processing.top_k, guidance_scale=processing.guidance_scale, hooks=processing.hooks)
        self.uncond_prompt = None if uncond_prompt is None else torch.as_tensor(uncond_prompt)
        self.guided = uncond_prompt is not None
        self.batch = 0
        self.features: list[torch.Tensor] = []  # per head row: [positions known, d]
        self.head_len: list[int] = []  # per head row: pairs in the head cache
        self.forward_calls = 0
        self._step_rows: torch.Tensor | None = None

    # ---- rows ------------------------------------------------------------------------------------------------
    def _head_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.cat([rows, rows + self.batch]) if self.guided else rows

    def _tokens(self, row_tokens: torch.Tensor, half: int) -> torch.Tensor:
        if half == 0:
            return row_tokens
        prompt = self.uncond_prompt
        return torch.cat([prompt, row_tokens[len(prompt):]])

    def _start(self, ctx: DecodeContext) -> None:
        """First step: the batch size and the prompt features the target's prefill left."""
        self.batch = int(ctx.rows.max()) + 1
        halves = 2 if self.guided else 1
        hidden = self.features_from.last_hidden  # [halves * batch, P - 1, d] after prefill
        lengths = [len(t) - 1 for t in ctx.tokens]
        self.features = [hidden[r][: lengths[r % self.batch]].clone() if lengths[r % self.batch] else
                         hidden.new_zeros(0, hidden.shape[-1]) for r in range(halves * self.batch)]
        self.head_len = [0] * (halves * self.batch)
        self.engine.prefill([torch.zeros(1, dtype=torch.long)] * (halves * self.batch))  # empty caches

    # ---- one step ---------------------------------------------------------------------------------------------
    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree:
        if self.batch == 0:
            self._start(ctx)
        rows = ctx.rows
        self._step_rows = rows
        head_rows = self._head_rows(rows)
        halves = 2 if self.guided else 1
        contexts = [self._tokens(ctx.tokens[i % len(rows)], i // len(rows)) for i in range(len(head_rows))]
        root_features = self._catch_up(head_rows.tolist(), contexts)  # [head rows, d]: predicted f_{L-1}
        root_laws = self._laws(root_features[:, None], (ctx.next_positions)[:, None])[:, 0]  # [rows, vocab]
        if self.chain:
            return self._chain(ctx, root_features, root_laws, head_rows, min(len(self.shape) - 1, max(1, budget)))
        builders = [self._builder(ctx, i, budget) for i in range(len(rows))]
        node_features: list[dict[int, torch.Tensor]] = [{0: root_features[i::len(rows)]} for i in range(len(rows))]
        score = lambda later, wanted: self._score_nodes(ctx, builders, node_features, later, wanted, halves)  # noqa: E731
        trees.run_builders(builders, trees.laws_with_root(root_laws, score))
        return tree_from_builders(builders, self.lm_head.shape[0], self.siblings == "without_replacement")

    def observe(self, verdict) -> None:
        """Keep the target's features of the slots verification kept (the pending token and the accepted path)."""
        if self._step_rows is None:  # the loop drafted nothing this step (its last token): no features needed
            return
        rows, self._step_rows = self._step_rows, None
        hidden = self.features_from.last_hidden  # [halves * rows, slots, d]
        path = verdict.accepted_path
        for half in range(2 if self.guided else 1):
            for i, row in enumerate(rows.tolist()):
                kept = path[i][path[i] >= 0] if path is not None else torch.arange(int(verdict.num_accepted[i]) + 1)
                r = row + half * self.batch
                self.features[r] = torch.cat([self.features[r], hidden[half * len(rows) + i, kept]])

    # ---- head forwards ---------------------------------------------------------------------------------------
    def _pair(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        # tokens [n], features [..., n, d] -> head inputs [..., n, d] (the head's fc over [embedding; feature])
        return self.token_rows[tokens] + torch.nn.functional.linear(features.to(self.feature_fc.dtype), self.feature_fc)

    def _catch_up(self, head_rows: list[int], contexts: list[torch.Tensor]) -> torch.Tensor:
        """Feed each row's missing true pairs t = head_len + 1 .. L - 1 and commit them; returns the last output."""
        starts = [self.head_len[r] + 1 for r in head_rows]
        ends = [len(c) - 1 for c in contexts]  # the pending token's position
        width = max(e - s + 1 for s, e in zip(starts, ends))
        counts = torch.tensor([e - s + 1 for s, e in zip(starts, ends)])
        if len(set(starts)) == 1 and len(set(ends)) == 1:  # rows in step (an image and its guidance twin)
            t = torch.arange(starts[0], ends[0] + 1)
            features = torch.stack([self.features[r][t - 1] for r in head_rows])  # [rows, width, d]
            inputs = self._pair(torch.stack([c[t] for c in contexts]), features)
            positions = t.expand(len(head_rows), -1)
        else:
            inputs = self.embed.new_zeros(len(head_rows), width, self.embed.shape[1])
            positions = torch.zeros(len(head_rows), width, dtype=torch.long)
            for j, (r, s, e, context) in enumerate(zip(head_rows, starts, ends, contexts)):
                t = torch.arange(s, e + 1)
                inputs[j, : len(t)] = self._pair(context[t], self.features[r][t - 1])
                positions[j, : len(t)] = t
                positions[j, len(t):] = e  # padding slots: never kept
        valid = torch.arange(width) < counts[:, None]
        mask = None  # every row the same count: a plain causal window
        if not bool(valid.all()):
            mask = torch.ones(width, width, dtype=torch.bool).tril() & valid[:, None, :]
            mask |= torch.eye(width, dtype=torch.bool)
        hidden = self.engine.score(inputs, positions, torch.tensor(head_rows), mask)  # [rows, width, d]
        self.forward_calls += 1
        self.engine.commit(valid, torch.tensor(head_rows))
        for r, e in zip(head_rows, ends):
            self.head_len[r] = e
        return hidden[torch.arange(len(head_rows)), counts - 1]

    def _laws(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Predicted features [halves * rows, n, d] -> the draft's processed laws [rows, n, vocab]."""
        logits = torch.nn.functional.linear(features, self.lm_head)
        if self.guided:
            cond, uncond = logits.chunk(2)
            return self.rank_processing(cond, positions, uncond)
        return self.rank_processing(logits, positions)

    def _chain(self, ctx, features: torch.Tensor, root_laws: torch.Tensor, head_rows: torch.Tensor,
               depth: int) -> DraftTree:
        """A chain of `depth` drafted tokens, level by level with one new pair per head row and forward: each
        level's pair is committed to the head cache (its ancestors are the path already there), and the cache is
        rolled back to the true pairs after. One child per node is a plain draw from the node's law (inverse CDF,
        the same law as Gumbel-top-1) with a uniform keyed by (seed, sample, its position, DRAFT), as a draft
        model's chain draws. features: [head rows, d], the root's predicted features; root_laws: [rows, vocab]."""
        halves = len(head_rows) // len(ctx.rows)
        root_positions = ctx.next_positions - 1  # [rows]
        uniforms = None
        if self.siblings != "deterministic":
            levels = root_positions[:, None] + torch.arange(1, depth + 1)  # [rows, depth]
            uniforms = counter_uniform(ctx.seed, ctx.sample_ids[:, None], levels, Purpose.DRAFT)
        laws, tokens = [root_laws], [torch.tensor([int(t[-1]) for t in ctx.tokens])]
        lengths = self.engine.cache.lengths[head_rows].clone()
        try:
            for level in range(1, depth + 1):
                law = laws[-1]
                token = law.argmax(-1) if uniforms is None else sample_categorical(law, uniforms[:, level - 1])
                tokens.append(token)  # [rows]
                if level == depth:
                    break
                positions = (root_positions + level)[:, None]  # [rows, 1]
                inputs = self._pair(token.repeat(halves), features)[:, None]  # [head rows, 1, d]
                hidden = self.engine.score(inputs, positions.repeat(halves, 1), head_rows)
                self.forward_calls += 1
                self.engine.cache.lengths[head_rows] += 1  # keep the pair: the next level attends to it
                features = hidden[:, 0]
                laws.append(self._laws(hidden, positions + 1)[:, 0])  # [rows, vocab]
        finally:
            self.engine.cache.lengths[head_rows] = lengths
        probs = None
        if self.siblings == "without_replacement":  # node n's law drew node n + 1; the leaf drew nothing
            probs = torch.stack(laws + [torch.zeros_like(root_laws)], 1)  # [rows, depth + 1, vocab]
        return DraftTree.chain(torch.stack(tokens, 1), probs)

    def _score_nodes(self, ctx, builders, node_features, index, requests, halves) -> list[dict]:
        """Laws at the requested nodes (rows `index`), from one head forward over them and their non-root
        ancestors; stores each scored node's predicted feature for its children."""
        subsets, parents = trees.scored_subtrees([builders[i] for i in index], requests)
        width, dim = parents.shape[1] - 1, self.embed.shape[1]
        inputs = self.embed.new_zeros(halves, len(index), width, dim)
        for j, (i, subset) in enumerate(zip(index, subsets)):
            b = builders[i]
            tokens = torch.tensor([b.tokens[n] for n in subset])
            parent_features = torch.stack([node_features[i][b.parents[n]] for n in subset], 1)  # [halves, n, d]
            inputs[:, j, : len(subset)] = self._pair(tokens, parent_features)
        mask = trees_ancestor_mask(parents)[:, 1:, 1:]
        depths = mask.sum(-1)
        positions = (ctx.next_positions[index] - 1)[:, None] + depths  # [rows, width]
        rows = ctx.rows[index]
        head_rows = torch.cat([rows, rows + self.batch]) if self.guided else rows
        hidden = self.engine.score(inputs.reshape(halves * len(index), width, dim), positions.repeat(halves, 1),
                                   head_rows, mask.repeat(halves, 1, 1))
        self.forward_calls += 1
        hidden = hidden.reshape(halves, len(index), width, dim)
        # laws only where asked: the wanted nodes, padded to one width
        slots = [[subset.index(node) for node in wanted] for subset, wanted in zip(subsets, requests)]
        most = max(len(s) for s in slots)
        take = torch.tensor([s + [s[-1]] * (most - len(s)) for s in slots])  # [rows, most]
        picked = hidden.gather(2, take[None, :, :, None].expand(halves, -1, -1, dim))
        laws = self._laws(picked.reshape(halves * len(index), most, dim), positions.gather(1, take) + 1)
        out = []
        for j, (i, subset, wanted) in enumerate(zip(index, subsets, requests)):
            for k, node in enumerate(subset):
                node_features[i][node] = hidden[:, j, k]
            out.append({node: laws[j, k] for k, node in enumerate(wanted)})
        return out

    def _builder(self, ctx: DecodeContext, i: int, budget: int) -> trees.TreeBuilder:
        root_position = int(ctx.next_positions[i]) - 1
        sample, holder = int(ctx.sample_ids[i]), []

        def order(node, law, width):
            return trees.keyed_order(holder[0], node, law, width, seed=ctx.seed, sample=sample,
                                     root_position=root_position, siblings=self.siblings)

        builder = trees.StaticBuilder(int(ctx.tokens[i][-1]), order, trees.truncated_shape(self.shape, max(1, budget)))
        holder.append(builder)
        return builder


def head_matmul_dtype(body) -> torch.dtype | None:
    """float32 where the compiled decode step builds: a head level is then one compiled call (~0.1 ms for its layer,
    batch-invariant, as every token's arithmetic is the same), where bfloat16 matmuls would take torch's per-op path
    (~0.4 ms a level on one thread); else bfloat16 where that is batch-invariant and faster. The head only drafts, so
    its dtype moves acceptance, never the committed law."""
    return None if decode_step.available() else fast_matmul_dtype(body)
