"""LANTERN and LANTERN++: relaxed tree verification for visual tokens, where the target spreads low mass over
many codes that decode to nearly the same patch (Jang et al. 2024, arXiv 2410.03355; Park et al. 2025, arXiv
2502.06352).

Each code x has latent neighbours NN[x]: the other codes of the VQ codebook ordered by L2 distance to x's vector
(`latent_neighbours`). A drafted code borrows the target mass of its nearest neighbours, as long as the moved
mass stays within a budget (c_i = sum of the target law over the i nearest):

    LANTERN   (delta):   i* = max{i <= k : c_i <= delta}              additive
    LANTERN++ (lambda):  i* = max{i <= k : c_i <= (lambda - 1) p(x)}  multiplicative: p~(x) <= lambda p(x)
    p~(x) = p(x) + c_{i*}  (p(x) when no prefix fits)

and is accepted with min(1, p~(x) / q(x)) (q = the law it was drawn from; 1 for deterministic candidates).
delta = 0 and lambda = 1 give p~ = p: exact tree verification.

Residual. On a rejection the next sibling (or the recovered token) uses norm(relu(p - min(q, p~))): the mass
the relaxed test could have accepted is removed, which is the total-variation-optimal residual for a relaxed
acceptance (COOL-SD, arXiv 2601.09212), and the bound below rests on it. The official LANTERN code instead
subtracts q and zeroes the neighbours in q (LlamaGen file) or in p (Lumina-mGPT and Anole files), which is not
consistent between its own model files; with lambda = 1 all of these are the exact residual norm(relu(p - q)).

Bound. With this residual, at one node the law r of the token the walk commits there satisfies
    TV(r, p) <= sum over tried children j of P(reach j) * sum_x relu(min(q_j, p~_j)(x) - p_j(x))
(by induction over the tries: each try can overshoot p only where min(q_j, p~_j) exceeds the residual p_j).
With lambda every inner sum is at most min(1, lambda - 1), so TV(r, p) <= w * min(1, lambda - 1) for a node
with w children, and over n committed tokens TV(joint) <= n * w * min(1, lambda - 1). The exact enumeration in
tests/samplers/test_lantern.py checks both the per-node and the joint statements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen import kernels
from specgen.errors import InvalidRequest
from specgen.samplers.acceptance import TreeRejection
from specgen.samplers.types import DraftTree


def latent_neighbours(codebook: torch.Tensor, k: int, vocab_size: int | None = None) -> torch.Tensor:
    """[vocab_size, k] int64: for each code (row of `codebook` [codes, dim]) its k nearest other codes by L2,
    nearest first (a code is not its own neighbour); ids at or past the codebook get -1 (no neighbours)."""
    codes = codebook.shape[0]
    if not 1 <= k < codes:
        raise InvalidRequest(f"the number of latent neighbours must be in [1, {codes - 1}], got {k}")
    distances = torch.cdist(codebook.double(), codebook.double())
    distances.fill_diagonal_(float("inf"))
    nearest = distances.topk(k, largest=False).indices  # ascending distance
    table = torch.full((vocab_size or codes, k), -1, dtype=torch.long)
    table[:codes] = nearest
    return table


@dataclass(frozen=True)
class Relaxation:
    """The moved-mass budget: `delta` (LANTERN) or `lam` (LANTERN++), over the first k columns of `neighbours`."""

    neighbours: torch.Tensor  # [vocab, K] int64, -1 padded
    k: int
    delta: float | None = None
    lam: float | None = None

    def __post_init__(self):
        if (self.delta is None) == (self.lam is None):
            raise InvalidRequest("give exactly one of delta (LANTERN) and lambda (LANTERN++)")
        if self.delta is not None and not 0 <= self.delta <= 1:
            raise InvalidRequest(f"delta must be in [0, 1], got {self.delta}")
        if self.lam is not None and not self.lam >= 1:
            raise InvalidRequest(f"lambda must be >= 1, got {self.lam}")
        if not 1 <= self.k <= self.neighbours.shape[1]:
            raise InvalidRequest(f"k must be in [1, {self.neighbours.shape[1]}], got {self.k}")

    @property
    def exact(self) -> bool:
        return self.delta == 0 or self.lam == 1

    def moved_mass(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., vocab] laws -> [..., vocab] mass c_{i*} each token would borrow from its neighbours."""
        vocab = probs.shape[-1]
        table = self.neighbours[:vocab, : self.k]  # [vocab, k]; ids past the table borrow nothing
        if table.shape[0] < vocab:
            table = torch.cat([table, table.new_full((vocab - table.shape[0], self.k), -1)])
        gathered = probs[..., table.clamp(min=0)] * (table >= 0)  # [..., vocab, k]
        cumulative = gathered.cumsum(-1)
        budget = self.delta if self.lam is None else (self.lam - 1) * probs[..., None]
        return torch.where(cumulative <= budget, cumulative, 0.0).amax(-1)

    def moved_at(self, probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """moved_mass(probs) at one token per row, [batch, vocab], [batch] -> [batch] (same arithmetic)."""
        if self.exact:
            return torch.zeros_like(probs[:, 0])
        inside = tokens < self.neighbours.shape[0]
        table = self.neighbours[tokens.clamp(max=self.neighbours.shape[0] - 1), : self.k]  # [batch, k]
        table = torch.where(inside[:, None], table, -1)
        cumulative = (probs.gather(1, table.clamp(min=0)) * (table >= 0)).cumsum(-1)
        budget = self.delta if self.lam is None else (self.lam - 1) * probs.gather(1, tokens[:, None])
        return torch.where(cumulative <= budget, cumulative, 0.0).amax(-1)

    def relaxed(self, probs: torch.Tensor) -> torch.Tensor:
        """p~ for every token: p + moved mass (== p when exact)."""
        return probs if self.exact else probs + self.moved_mass(probs)


class RelaxedTreeRejection(TreeRejection):
    """Tree verification with LANTERN's relaxed acceptance; `siblings` as for TreeRejection. Counts how many
    accepted tokens needed the relaxation (`relaxed_accepts` of `accepts`, `relaxed_share`)."""

    def __init__(self, relaxation: Relaxation, siblings="without_replacement"):
        super().__init__(siblings)
        self.relaxation = relaxation
        self.lossless = relaxation.exact
        kind = f"delta={relaxation.delta}" if relaxation.lam is None else f"lambda={relaxation.lam}"
        self.name = f"lantern-{kind}-k{relaxation.k}"
        self.reset_counts()

    def reset_counts(self) -> None:
        self.accepts, self.relaxed_accepts = 0, 0

    def accept_probs(self, residual: torch.Tensor, draft: torch.Tensor | None, token: torch.Tensor):
        """(relaxed, exact) acceptance probabilities of `token` [batch], without the full relaxed law."""
        at_token = residual.gather(-1, token[:, None]).squeeze(-1)
        relaxed = at_token + self.relaxation.moved_at(residual, token)
        if draft is None:
            return relaxed.clamp(max=1.0), at_token
        draft_at_token = draft.gather(-1, token[:, None]).squeeze(-1)
        drawn = draft_at_token > 0
        safe = torch.where(drawn, draft_at_token, 1.0)
        return (torch.where(drawn, (relaxed / safe).clamp(max=1.0), 0.0),
                torch.where(drawn, (at_token / safe).clamp(max=1.0), 0.0))

    def sibling_step(self, residual: torch.Tensor, draft: torch.Tensor | None, token: torch.Tensor):
        # the exact step's draft update (and, for point-mass candidates, its residual: relu(p - min(1, p~) at x)
        # zeroes x exactly as the exact rule does); only the residual after a drawn child changes
        _, exact_residual, next_draft = kernels.sibling_step(residual, draft, token,
                                                             self.siblings == "without_replacement")
        accept, _ = self.accept_probs(residual, draft, token)
        if draft is None:
            return accept, exact_residual, None
        drawn = draft.gather(-1, token[:, None]) > 0  # a child the draft gave 0 was never drawn: nothing moves
        relaxed = self.relaxation.relaxed(residual)  # [batch, vocab]
        next_residual = torch.where(drawn, _normalised(torch.relu(residual - torch.minimum(draft, relaxed)), residual),
                                    residual)
        return accept, next_residual, next_draft

    def walk(self, tree: DraftTree, target_probs, accept_uniform, emit_uniform):
        """The verification walk row by row (trees here are small; this also counts relaxed acceptances)."""
        if tree.num_nodes > 1 and tree.is_chain:
            return self._walk_chain(tree, target_probs, accept_uniform, emit_uniform)  # batched, in the base
        kids = kernels.tree_children(tree.verified_parents).tolist()
        sampled = self.siblings != "deterministic" and tree.draft_probs is not None
        paths, outputs, rejected = [], [], []
        for row in range(tree.batch_size):
            node, path, output, tested = 0, [0], [], False
            while True:
                residual = target_probs[row, node].double()[None]  # [1, vocab]
                draft = tree.draft_probs[row, node].double()[None] if sampled else None
                chosen, tested = -1, False
                for kid in (k for k in kids[row][node] if k >= 0):
                    token = tree.tokens[row, kid:kid + 1]
                    accept, exact_accept = self.accept_probs(residual, draft, token)
                    uniform = float(accept_uniform[row, kid])
                    if uniform < float(accept[0]):
                        chosen = kid
                        self.accepts += 1
                        self.relaxed_accepts += uniform >= float(exact_accept[0])
                        break
                    _, residual, draft = self.sibling_step(residual, draft, token)  # the residual only when needed
                    tested = True
                if chosen < 0:
                    output.append(int(kernels.sample_categorical(residual, emit_uniform[row, node:node + 1])[0]))
                    break
                output.append(int(tree.tokens[row, chosen]))
                path.append(chosen)
                node = chosen
            paths.append(path)
            outputs.append(output)
            rejected.append(tested)
        return _packed(paths, outputs, rejected)

    def chain_accept(self, laws, drafts, tokens):
        return self.accept_probs(laws, drafts, tokens)[0]

    def _chain_walked(self, laws, drafts, children, accept_uniform, num_accepted) -> None:
        """Count the accepted codes of a batched chain walk and those the exact test would have rejected."""
        exact = TreeRejection.chain_accept(self, laws, drafts, children.reshape(-1)).reshape(children.shape)
        accepted = torch.arange(children.shape[1]) < num_accepted[:, None]
        self.accepts += int(accepted.sum())
        self.relaxed_accepts += int((accepted & (accept_uniform[:, 1:] >= exact)).sum())

    @property
    def relaxed_share(self) -> float:
        """Of the accepted drafted tokens, the share the exact test would have rejected (same uniforms)."""
        return self.relaxed_accepts / self.accepts if self.accepts else 0.0

    def run_summary(self) -> dict:
        return {"relaxed_share": self.relaxed_share}  # accepted codes the exact test would reject


def _packed(paths: list[list[int]], outputs: list[list[int]], rejected: list[bool]):
    """Per-row walk results as the rule returns them: (path, tokens, num_accepted, rejected), -1 / PLACEHOLDER
    padded to the longest path."""
    width = max(len(p) for p in paths)
    path_t = torch.tensor([p + [-1] * (width - len(p)) for p in paths])
    tokens = torch.tensor([o + [kernels.PLACEHOLDER] * (width - len(o)) for o in outputs])
    return path_t, tokens, torch.tensor([len(p) - 1 for p in paths]), torch.tensor(rejected)


def _normalised(mass: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    # a zero residual is never sampled from (its node accepts with probability 1); keep the law well defined
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 0, mass / torch.where(total > 0, total, 1.0), fallback)
