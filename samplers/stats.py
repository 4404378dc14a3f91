"""Run statistics, named as in design.md, with measured and predicted speedups side by side."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from specgen.samplers.types import DraftTree, TokenSource, Verdict


def expected_tokens_per_step(alpha: float, gamma: float) -> float:
    """E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per verification under i.i.d. acceptance."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def ideal_speedup(alpha: float, gamma: float, cost_ratio: float) -> float:
    """Leviathan et al. Thm 3.8: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + 1)), c = draft/target step cost."""
    return expected_tokens_per_step(alpha, gamma) / (gamma * cost_ratio + 1.0)


def tally_positions(tested_at: list[int], accepted_at: list[int], accepted: int, rejected: bool) -> None:
    """Per draft position, in place: positions 1..accepted were tested and accepted, and the next one tested when
    it was rejected; drafts after a rejection were never tested, so they count nowhere."""
    depth = accepted + int(rejected)
    while len(tested_at) < depth:
        tested_at.append(0)
        accepted_at.append(0)
    for d in range(depth):
        tested_at[d] += 1
        accepted_at[d] += int(d < accepted)


@dataclass
class SpecStats:
    """Accumulates over the steps of one run; `summary()` gives the `stats` dict of the CLI/API/bench."""

    steps: int = 0  # target forward passes
    row_steps: int = 0  # row verifications (steps x active rows)
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    committed: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    draft_lengths: dict = field(default_factory=lambda: defaultdict(int))  # drafted tokens -> row verifications
    tested_at: list[int] = field(default_factory=list)  # per draft depth: drafted tokens that were tested
    accepted_at: list[int] = field(default_factory=list)
    verify_by_window: dict = field(default_factory=lambda: defaultdict(lambda: [0.0, 0]))  # n -> [seconds, count]
    # trees: Sequoia's acceptance-by-rank model, measured. Per sibling rank r: accepted parents whose children were
    # tested and that had a child of rank r, and how often that child was the accepted one; and every drafted
    # node by the sibling ranks on its path (the tree's shape, pooled over steps)
    rank_tested: list[int] = field(default_factory=list)
    rank_accepted: list[int] = field(default_factory=list)
    rank_paths: dict = field(default_factory=lambda: defaultdict(int))  # (r1, ..., rd) -> nodes
    tree_rows: int = 0
    # relaxed rules (PCG, SSD): what exact token-level sampling would have accepted with the same drafts and uniforms
    acceptance_level: str = "token"  # "token" (exact), "group" (PCG) or "tolerance" (SSD)
    exact_accepted: int = 0
    exact_rejections: int = 0
    # what a run's drafter or rule measured besides (`run_summary() -> dict`: a Jacobi window's changed drafts, a
    # relaxed rule's share of accepts the exact test would reject), added to the summary
    reports: list = field(default_factory=list)

    def update(self, verdict: Verdict, committed: int, draft_s: float, verify_s: float, window: int,
               tree: DraftTree | None = None) -> None:
        self.steps += 1
        if tree is not None and verdict.accepted_path is not None:
            self.record_tree(tree, verdict.accepted_path)
        self.row_steps += int(verdict.num_accepted.numel())
        rejected = (verdict.source == TokenSource.RECOVERED).any(-1).tolist()
        for n_drafted, n_acc, rej in zip(verdict.num_drafted.tolist(), verdict.num_accepted.tolist(), rejected):
            self.record_row(n_drafted, n_acc, rej)
        if verdict.exact_accepted is not None:
            self.acceptance_level = "group" if verdict.groups is not None else "tolerance"
            self.exact_accepted += int(verdict.exact_accepted.sum())
            self.exact_rejections += int((verdict.exact_accepted < verdict.num_drafted).sum())
        self.committed += committed
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.verify_by_window[window][0] += verify_s
        self.verify_by_window[window][1] += 1

    def record_row(self, drafted: int, accepted: int, rejected: bool) -> None:
        """One row's verification: per-depth counts stop at the first rejection (later drafts were never tested)."""
        self.drafted += drafted
        self.draft_lengths[drafted] += 1
        self.accepted += accepted
        self.rejections += int(rejected)
        tally_positions(self.tested_at, self.accepted_at, accepted, rejected)

    def record_tree(self, tree: DraftTree, accepted_path: torch.Tensor) -> None:
        """One step's trees: their shapes by sibling-rank paths, and which rank was accepted below each accepted
        node whose children were tested (a row stops where no child is accepted or at a leaf)."""
        ranks, parents = tree.sibling_rank.tolist(), tree.verified_parents.tolist()  # -2: never tested
        for b, path in enumerate(accepted_path.tolist()):
            self.tree_rows += 1
            rank_path: dict[int, tuple[int, ...]] = {0: ()}
            children: dict[int, list[int]] = {}
            for node in range(1, tree.num_nodes):
                if parents[b][node] >= 0:
                    rank_path[node] = rank_path[parents[b][node]] + (ranks[b][node],)
                    self.rank_paths[rank_path[node]] += 1
                    children.setdefault(parents[b][node], []).append(node)
            path = [n for n in path if n >= 0]
            for depth, node in enumerate(path):
                kids = children.get(node)
                if not kids:
                    break
                while len(self.rank_tested) < len(kids):
                    self.rank_tested.append(0)
                    self.rank_accepted.append(0)
                for r in range(len(kids)):
                    self.rank_tested[r] += 1
                if depth + 1 < len(path):
                    self.rank_accepted[ranks[b][path[depth + 1]]] += 1

    def tree_expected_tokens(self) -> float | None:
        """Sequoia's F(T) with the measured acceptance-by-rank vector a: tokens per step = 1 + the sum over
        drafted nodes of the product of a over the ranks on their path, averaged over the steps' trees."""
        if not self.tree_rows:
            return None
        accept = [a / t if t else 0.0 for a, t in zip(self.rank_accepted, self.rank_tested)]
        total = 0.0
        for path, nodes in self.rank_paths.items():
            product = 1.0
            for r in path:
                product *= accept[r] if r < len(accept) else 0.0
            total += nodes * product
        return 1.0 + total / self.tree_rows

    def expected_tokens(self, alpha: float) -> float:
        """E(alpha, gamma) averaged over the row verifications' own draft lengths: a drafter whose length varies
        (prompt lookup drafts nothing without a match, a stop rule cuts chains short) commits that many tokens
        per step under i.i.d. acceptance, fewer than E at the mean length (E is concave in gamma)."""
        rows = sum(self.draft_lengths.values())
        if not rows:
            return expected_tokens_per_step(alpha, 0.0)
        return sum(count * expected_tokens_per_step(alpha, length) for length, count in self.draft_lengths.items()) / rows

    def mean_verify_s(self, window: int) -> float | None:
        seconds, count = self.verify_by_window.get(window, (0.0, 0))
        return seconds / count if count else None

    def summary(self, *, method: str, lossless: bool, wall_s: float, ar_step_s: float | None = None) -> dict:
        alpha = self.accepted / (self.accepted + self.rejections) if self.accepted + self.rejections else None
        gamma = self.drafted / self.row_steps if self.row_steps else 0.0
        ar_step_s = ar_step_s if ar_step_s is not None else self.mean_verify_s(1)
        step_s = self.verify_s / self.steps if self.steps else None
        draft_token_s = self.draft_s / self.drafted if self.drafted else 0.0
        ideal = measured = None
        if alpha is not None and step_s:
            tree_expected = self.tree_expected_tokens()
            expected = tree_expected if tree_expected is not None else self.expected_tokens(alpha)
            ideal = expected / (gamma * draft_token_s / (ar_step_s or step_s) + 1.0)
            if ar_step_s:
                measured = expected * ar_step_s / (gamma * draft_token_s + step_s)
        relaxed = {}
        # relaxed rules: the acceptance figures are the relaxed rule's; exact sampling's on the same drafts go beside
        if self.acceptance_level != "token":
            tested = self.exact_accepted + self.exact_rejections
            relaxed = {"acceptance_level": self.acceptance_level, "exact_accepted": self.exact_accepted,
                       "exact_rejections": self.exact_rejections,
                       "exact_acceptance_rate": self.exact_accepted / self.drafted if self.drafted else None,
                       "exact_alpha_hat": self.exact_accepted / tested if tested else None}
            if self.acceptance_level == "group":
                relaxed.update(group_acceptance_rate=self.accepted / self.drafted if self.drafted else None,
                               group_alpha_hat=alpha)
        return {
            "method": method, "lossless": lossless, **relaxed,
            "steps": self.steps, "row_steps": self.row_steps,
            "drafted": self.drafted, "accepted": self.accepted, "rejections": self.rejections,
            "committed": self.committed,
            "tau": self.committed / self.row_steps if self.row_steps else 0.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "alpha_hat": alpha,
            "per_position_acceptance": [a / t if t else None for a, t in zip(self.accepted_at, self.tested_at)],
            "mean_draft_length": gamma,
            "draft_s": self.draft_s, "verify_s": self.verify_s, "wall_s": wall_s,
            "tokens_per_s": self.committed / wall_s if wall_s > 0 else None,
            "verify_s_by_window": {n: s / c for n, (s, c) in sorted(self.verify_by_window.items()) if c},
            "predicted_speedup_ideal": ideal,
            "predicted_speedup_measured": measured,
            **{key: value for report in self.reports for key, value in report().items()},
        }
