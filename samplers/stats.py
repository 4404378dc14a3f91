"""Run statistics, named as in design.md, with measured and predicted speedups side by side."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from specgen.samplers.types import TokenSource, Verdict


def expected_tokens_per_step(alpha: float, gamma: float) -> float:
    """E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per verification under i.i.d. acceptance."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def ideal_speedup(alpha: float, gamma: float, cost_ratio: float) -> float:
    """Leviathan et al. Thm 3.8: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + 1)), c = draft/target step cost."""
    return expected_tokens_per_step(alpha, gamma) / (gamma * cost_ratio + 1.0)


def measured_speedup(alpha: float, gamma: float, ar_step_s: float, draft_token_s: float, verify_s: float) -> float:
    """E(alpha, gamma) * T_ar / (gamma * T_draft + T_verify(gamma)), all times measured."""
    return expected_tokens_per_step(alpha, gamma) * ar_step_s / (gamma * draft_token_s + verify_s)


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
    tested_at: list[int] = field(default_factory=list)  # per draft depth: drafted tokens that were tested
    accepted_at: list[int] = field(default_factory=list)
    verify_by_window: dict = field(default_factory=lambda: defaultdict(lambda: [0.0, 0]))  # n -> [seconds, count]
    # relaxed rules (PCG, SSD): what exact token-level sampling would have accepted with the same drafts and uniforms
    acceptance_level: str = "token"  # "token" (exact), "group" (PCG) or "tolerance" (SSD)
    exact_accepted: int = 0
    exact_rejections: int = 0

    def update(self, verdict: Verdict, committed: int, draft_s: float, verify_s: float, window: int) -> None:
        self.steps += 1
        self.row_steps += int(verdict.num_accepted.numel())
        self.drafted += int(verdict.num_drafted.sum())
        accepted = verdict.num_accepted.tolist()
        rejected = (verdict.source == TokenSource.RECOVERED).any(-1).tolist()
        for n_acc, rej in zip(accepted, rejected):
            self.record_row(0, n_acc, rej)
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
        self.accepted += accepted
        self.rejections += int(rejected)
        depth = accepted + int(rejected)
        while len(self.tested_at) < depth:
            self.tested_at.append(0)
            self.accepted_at.append(0)
        for d in range(depth):
            self.tested_at[d] += 1
            self.accepted_at[d] += int(d < accepted)

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
            ideal = ideal_speedup(alpha, gamma, draft_token_s / (ar_step_s or step_s))
            if ar_step_s:
                measured = measured_speedup(alpha, gamma, ar_step_s, draft_token_s, step_s)
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
        }
