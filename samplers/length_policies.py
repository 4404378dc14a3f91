"""Draft-length policies: fixed, Hugging Face's heuristic, SVIP (entropy), Kangaroo-style confidence and a cost model.

A policy gives the loop the next draft length (`next_length`, a cap) and learns from verdicts (`observe`). The
per-token policies also answer `stop(law, previous_law, index) -> [rows] bool`: a drafter that drafts token by
token asks it before drafting token `index` (>= 1), with the draft's softmax law for that token and for the
previous one; True ends that row's draft there. The laws are the draft's plain softmax (temperature 1), whatever
the sampling temperature, so the same rule runs greedy and sampled decoding. Policies change only how much is
drafted, never what is committed: verification makes the output the target's whatever the draft length.
"""

from __future__ import annotations

import torch

from specgen.errors import InvalidRequest
from specgen.samplers.stats import SpecStats, expected_tokens_per_step
from specgen.samplers.types import Verdict


class FixedLength:
    def __init__(self, num_draft_tokens: int):
        if num_draft_tokens < 0:
            raise InvalidRequest(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
        self.length = num_draft_tokens

    def next_length(self) -> int:
        return self.length

    def observe(self, verdict: Verdict) -> None:
        pass


class HeuristicLength:
    """Hugging Face assisted generation's "heuristic" schedule: +2 when every drafted token of every row
    was accepted, otherwise -1 (never below `minimum`)."""

    def __init__(self, num_draft_tokens: int = 5, minimum: int = 1, maximum: int = 64):
        if not 1 <= minimum <= num_draft_tokens <= maximum:
            raise InvalidRequest("need 1 <= minimum <= num_draft_tokens <= maximum")
        self.length, self.minimum, self.maximum = num_draft_tokens, minimum, maximum

    def next_length(self) -> int:
        return self.length

    def observe(self, verdict: Verdict) -> None:
        if bool((verdict.num_accepted >= verdict.num_drafted).all()):
            self.length = min(self.maximum, self.length + 2)
        else:
            self.length = max(self.minimum, self.length - 1)


def entropy(law: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] -> [rows] Shannon entropy in nats."""
    law = law.double()
    return -(law * torch.where(law > 0, law.log(), torch.zeros_like(law))).sum(-1)


class _TokenwisePolicy:
    def __init__(self, num_draft_tokens: int):
        if num_draft_tokens < 1:
            raise InvalidRequest(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.length = num_draft_tokens

    def next_length(self) -> int:
        return self.length

    def observe(self, verdict: Verdict) -> None:
        pass


class ChainStops:
    """A token-wise stop rule (`stop(law, previous_law, index) -> [rows] bool`, e.g. SVIP's or Kangaroo's) applied to
    one batched chain proposal: rows that stop keep drafting with the batch, and `ragged` cuts them where they
    stopped. `policy` None: no rule (every row drafts the whole budget)."""

    def __init__(self, policy, rows: int, budget: int):
        self.policy = policy
        self.num_drafted = torch.full((rows,), budget, dtype=torch.long)
        self.stopped = torch.zeros(rows, dtype=torch.bool)
        self.previous: torch.Tensor | None = None

    def all_stop(self, law: torch.Tensor, index: int) -> bool:
        """Ask the rule before drafted token `index` (after the first) with the draft's temperature-1 law there
        [rows, vocab]; True when every row has stopped (the proposal ends)."""
        if self.policy is None:
            return False
        if index > 0:
            stopping = ~self.stopped & self.policy.stop(law, self.previous, index).to(torch.bool)
            self.num_drafted = torch.where(stopping, index, self.num_drafted)
            self.stopped |= stopping
            if bool(self.stopped.all()):
                return True
        self.previous = law
        return False

    def ragged(self, drafted: int) -> torch.Tensor | None:
        """[rows] tokens each row keeps of the `drafted` proposed (None without a rule: all of them)."""
        return None if self.policy is None else self.num_drafted.clamp(max=drafted)


class SvipLength(_TokenwisePolicy):
    """SVIP (Zhang et al., arXiv 2411.18462; `vanilla-sd/eval_specbench.py`): after each drafted token, stop when
    sqrt(coefficient * H(q)) > threshold, H the entropy of the law that token was drawn from (acceptance is
    roughly bounded below by 1 - sqrt(c * H)). num_draft_tokens is the hard cap."""

    def __init__(self, num_draft_tokens: int = 16, threshold: float = 0.3, coefficient: float = 0.15):
        super().__init__(num_draft_tokens)
        self.threshold, self.coefficient = threshold, coefficient

    def stop(self, law: torch.Tensor, previous_law: torch.Tensor, index: int) -> torch.Tensor:
        return (self.coefficient * entropy(previous_law)).sqrt() > self.threshold


class ConfidenceLength(_TokenwisePolicy):
    """Kangaroo's early exit of drafting (Liu et al., arXiv 2404.18911): do not draft a token whose draft top-1
    probability is below `threshold` (the code's default 0.6). num_draft_tokens is the hard cap."""

    def __init__(self, num_draft_tokens: int = 8, threshold: float = 0.6):
        super().__init__(num_draft_tokens)
        self.threshold = threshold

    def stop(self, law: torch.Tensor, previous_law: torch.Tensor, index: int) -> torch.Tensor:
        return law.max(-1).values < self.threshold


class CostModelLength:
    """Chooses gamma in 1..maximum maximising E(alpha, gamma) * T_ar / (gamma * T_draft + T_verify(gamma + 1))
    (core.md section 6) from this run's measurements: alpha = accepted / (accepted + rejections), T_draft = draft
    seconds per drafted token, T_verify(n) a least-squares line through the mean verification time per window
    size n, T_ar = T_verify(1) on that line. It explores first (gamma = start, then 1, then start again) so that
    two window sizes are measured; `attach(stats)` gives it the run's SpecStats (the text generator does)."""

    EXPLORE = 3

    def __init__(self, num_draft_tokens: int = 5, maximum: int = 16, stats: SpecStats | None = None):
        maximum = max(maximum, num_draft_tokens)
        if num_draft_tokens < 1:
            raise InvalidRequest(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.start, self.maximum, self.stats = num_draft_tokens, maximum, stats
        self.steps, self.length = 0, num_draft_tokens
        self.choice: dict | None = None  # the last decision, for traces and tests

    def attach(self, stats: SpecStats) -> None:
        self.stats = stats

    def next_length(self) -> int:
        return self.length

    def observe(self, verdict: Verdict) -> None:
        self.steps += 1
        if self.steps < self.EXPLORE:
            self.length = 1 if self.steps == 1 else self.start
            return
        choice = self.decide(self.stats) if self.stats is not None else None
        if choice is not None:
            self.choice, self.length = choice, choice["gamma"]

    def decide(self, stats: SpecStats) -> dict | None:
        measured = {n: s / c for n, (s, c) in stats.verify_by_window.items() if c}
        tested = stats.accepted + stats.rejections
        if len(measured) < 2 or not tested or not stats.drafted:
            return None
        alpha = min(stats.accepted / tested, 0.999)
        draft_token_s = stats.draft_s / stats.drafted
        intercept, slope = _line(measured)
        verify = lambda n: max(intercept + slope * n, 1e-9)
        ar_step_s = verify(1)
        speedups = {g: expected_tokens_per_step(alpha, g) * ar_step_s / (g * draft_token_s + verify(g + 1))
                    for g in range(1, self.maximum + 1)}
        gamma = max(speedups, key=lambda g: (speedups[g], -g))
        return {"gamma": gamma, "alpha": alpha, "draft_token_s": draft_token_s, "verify_intercept_s": intercept,
                "verify_slope_s": slope, "predicted_speedup": speedups[gamma]}


def _line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares intercept and slope through (n, seconds); a negative slope is clamped to 0."""
    xs, ys = list(points), list(points.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if var else 0.0
    slope = max(slope, 0.0)
    return mean_y - slope * mean_x, slope


def predicted_best_gamma(alpha: float, ar_step_s: float, draft_token_s: float, verify_s, maximum: int = 16) -> int:
    """gamma maximising E(alpha, gamma) * T_ar / (gamma * T_draft + verify_s(gamma + 1)) (for tests and docs)."""
    score = lambda g: expected_tokens_per_step(alpha, g) * ar_step_s / (g * draft_token_s + verify_s(g + 1))
    return max(range(1, maximum + 1), key=lambda g: (score(g), -g))


# 'svip' and 'kangaroo' stop drafting token by token: only drafters that consult `policy.stop` (the text model
# drafter) use that part; 'cost' needs the run's SpecStats (`attach`).
POLICIES = {"fixed": FixedLength, "heuristic": HeuristicLength, "svip": SvipLength, "kangaroo": ConfidenceLength,
            "cost": CostModelLength}


def make_policy(name: str, num_draft_tokens: int):
    try:
        return POLICIES[name](num_draft_tokens)
    except KeyError:
        raise InvalidRequest(f"unknown length schedule {name!r}; choose from: {', '.join(POLICIES)}") from None
