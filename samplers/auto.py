"""`auto`: pick a method and its draft length per request from a calibrated cost model, and adapt between steps.

`AutoDrafter` holds candidate drafters (each with the rule matching the law it drafts from) and, before every
step, the choice the cost model predicts fastest:

    speed(plain)     = 1 / T_verify(R)
    speed(chain, g)  = E(g) / (R T_draft(g) + hit_R * T_verify(R (g + 1)) + (1 - hit_R) * T_verify(R))
    speed(tree)      = tau / (R T_draft + T_verify(R (nodes + 1)))

for a batch of R rows (tokens per row per second; hit_R = 1 - (1 - hit)^R, since a batch pads its rows' windows
to the longest).

T_verify(n) (one target forward over n slots) and T_draft come from calibration (`Costs`, measured once per
machine and model); E(g) = 1 + hit * sum_i prod_{j<=i} alpha_j from the acceptance per draft position, learnt
online and shrunk towards a prior (the calibration's, or for a drafter that runs no model a shadow run over the
prompt); `hit` is how often the drafter drafted anything. Model-free point-mass drafters are shadowed every step
(their proposal is compared with what was committed), so their estimates improve at no target cost; a model
drafter that is not running is probed now and then while an optimistic estimate could still beat the current
choice. A switch needs a margin (hysteresis), so noise does not flap the choice.

Exactness: the choice is made between steps from what has already been committed, and each step is verified by
`AutoRule` with the rule of the candidate that drafted it (plain decoding: nothing drafted, the chain rule), so
every step is an exact step of some lossless method and randomness stays keyed by position. Switching never
re-verifies committed tokens and never hands one candidate's draft to another's rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specgen.samplers.stats import tally_positions
from specgen.samplers.types import DecodeContext, Draft, DraftTree, Verdict

PLAIN = "ar"


@dataclass
class Costs:
    """Calibrated step costs in seconds: one target forward by window size, and each candidate's drafting cost
    as fixed + per_token * length (a tree: fixed only)."""

    verify_s: dict[int, float]
    draft_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    # what one step of the decoding loop costs besides the models' forwards (laws, acceptance, bookkeeping): about a
    # millisecond, a third of a plain step of the small speech and code models, so without it short drafts (more
    # steps) look as cheap as long ones
    overhead_s: float = 0.0
    # what each verified slot beyond the first adds inside the loop (the acceptance rule's laws over the vocabulary,
    # cache bookkeeping), measured by calibration runs; the first slot's share is in overhead_s
    verify_per_slot_s: float = 0.0

    def verify(self, n: int) -> float:
        """T_verify(n), linear between measured sizes, extended by the last segment's slope."""
        cache = self.__dict__.setdefault("_memo", {})
        if n not in cache:
            cache[n] = self._interpolate(n)
        return cache[n]

    def _interpolate(self, n: int) -> float:
        points = sorted(self.verify_s.items())
        if not points:
            raise ValueError("no verification cost measured")
        if len(points) == 1:
            return points[0][1]
        for (n0, t0), (n1, t1) in zip(points, points[1:]):
            if n <= n1:
                if n < n0:  # below the smallest measured size
                    return t0
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        (n0, t0), (n1, t1) = points[-2], points[-1]
        return t1 + max(t1 - t0, 0.0) / (n1 - n0) * (n - n1)

    def draft(self, name: str, length: int) -> float:
        fixed, per_token = self.draft_s.get(name, (0.0, 0.0))
        return fixed + per_token * length


@dataclass
class Candidate:
    """One method `auto` may run: its drafter, the rule matching the drafter's law, the draft lengths it may take
    (a tree: its fixed depth, with `nodes` drafted nodes), priors, and whether it can be shadowed (a model-free
    drafter proposing point masses)."""

    name: str
    drafter: object
    rule: object
    lengths: tuple[int, ...]
    nodes: int | None = None  # a tree's drafted nodes (the root excluded); None for a chain
    prior_alpha: float = 0.5
    # acceptance by draft position (given the earlier ones accepted) from the calibration run, its last entry
    # standing for every deeper one: a draft that has matched for a few tokens tends to go on matching (code pair,
    # draft-lookup: 0.81 at the first position, 0.89-0.95 from the fifth), so one pooled alpha keeps drafts short
    prior_alpha_at: tuple[float, ...] | None = None
    # the shadowed lookup candidate whose slots this one's proposals take where lookup finds a match (draft-lookup:
    # prompt lookup's): on a prompt where lookup predicts the prompt well, its prior is raised towards lookup's
    lookup_part: str | None = None
    default_length: int | None = None  # the method's own draft length (its calibration run drafts it)
    prior_hit: float = 1.0
    prior_tau: float | None = None  # tokens per step, for candidates judged by it (trees, stateful drafters)
    shadow: bool = False
    # a drafter whose proposals improve as it keeps running (a Jacobi window settles): judged by its tokens per
    # step over the run, not by acceptance per position, which is low while the window is cold
    stateful: bool = False
    # a stateful drafter's calibration run: tokens committed after each of its steps (mean over the calibration
    # prompts). Its early steps commit about one token each while the window settles, so the request's steps are
    # judged against the calibration's after as many steps, not against its whole-run tau
    prior_curve: tuple[float, ...] | None = None
    # a drafter that runs no model and keeps no window (prompt lookup, the model-free trees): taking over costs it
    # no catch-up forward, so a switch to it needs only FREE_SWITCH of the margin
    model_free: bool = False

    @property
    def is_tree(self) -> bool:
        return self.nodes is not None

    @property
    def by_tau(self) -> bool:
        return self.nodes is not None or self.stateful


@dataclass
class _Timing:
    """One candidate's timed steps in this request: measured and calibrated seconds of drafting and verifying."""

    draft_s: float = 0.0
    draft_predicted: float = 0.0
    verify_s: float = 0.0
    verify_predicted: float = 0.0
    steps: int = 0

    def ratios(self, weight: float) -> tuple[float, float]:
        """(drafting, verifying) measured over calibrated, each shrunk to 1 by `weight` pseudo-steps."""
        if not self.steps:
            return 1.0, 1.0
        return tuple((measured + weight * predicted / self.steps) / (predicted * (1 + weight / self.steps))
                     if predicted > 0 else 1.0
                     for measured, predicted in ((self.draft_s, self.draft_predicted),
                                                 (self.verify_s, self.verify_predicted)))


@dataclass
class _Estimate:
    """What has been seen of one candidate: per draft depth tested / accepted, steps that drafted anything."""

    tested_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    # steps whose draft reached each position, tested there or not: how often a length that deep has been tried
    drafted_at: list[int] = field(default_factory=list)
    steps: int = 0
    hits: int = 0
    committed: int = 0  # trees: tokens committed over `steps`

    def record(self, drafted: int, accepted: int, rejected: bool) -> None:
        self.steps += 1
        self.hits += int(drafted > 0)
        if drafted > 0:
            tally_positions(self.tested_at, self.accepted_at, accepted, rejected)
            self.drafted_at += [0] * max(drafted - len(self.drafted_at), 0)
            for d in range(drafted):
                self.drafted_at[d] += 1

    def tried_at(self, depth: int) -> list[int]:
        """Per position 1..depth, the steps whose draft reached it (never fewer than tested it: a tested position
        was drafted)."""
        return (self.drafted_at + [0] * max(depth - len(self.drafted_at), 0))[:depth]


def _committed_after(curve: tuple[float, ...], steps: int) -> float:
    """Tokens a calibration run had committed after its first `steps` steps (`curve`: after each step)."""
    return curve[steps - 1] if steps else 0.0


class AutoDrafter:
    """Runs one candidate per step (or none: plain decoding) and re-decides after each verdict."""

    PRIOR_WEIGHT = 4.0  # pseudo-observations behind each prior
    # the least (and, inverted, the most) the other candidates' evidence scales a prior by: drafters of one request
    # fare alike (a hard prompt is hard for each), but not exactly alike
    DIFFICULTY_FLOOR = 0.5
    PROBE_EVERY = 8  # steps between probes of a model drafter not running, growing by PROBE_GROWTH after each
    PROBE_GROWTH = 1.5

    PLAIN_DECIDE_EVERY = 8
    EARLY_STEPS, DECIDE_EVERY = 8, 4  # a decision after each of the first steps, then after every few
    # the share of the margin a switch needs to plain decoding or a model-free candidate: the margin stands for a
    # switch's catch-up forward as much as for the predictions' noise, and with the whole of it auto kept running
    # consensus' trees on Gemma at a predicted 1.03x while prompt lookup, shadowed beside it, was predicted (and ran)
    # at 1.17x
    FREE_SWITCH = 0.25
    KNOWN_STEPS = 8  # steps of its own in this request after which a candidate's prediction rests on the request
    # steps a newly chosen drafter runs before auto may leave it (re-lengthing it meanwhile): a completion's first
    # tokens are its hardest, and two rejections at the first position halved draft-lookup's predicted speed on the
    # code pair's bench prompts and sent auto to prompt lookup for the rest of the request (0.77x draft-lookup alone)
    TENURE = 8
    EXPLORE = 0.5  # the share of the gap to 1 an untested position's acceptance is raised by when choosing a length
    EXPLORE_REACH = 2  # the most tokens exploring adds to the point estimate's best length at one decision
    TIMING_WEIGHT = 3.0  # pseudo-steps at the calibrated cost behind each candidate's timed steps

    def __init__(self, candidates: list[Candidate], costs: Costs, *, margin: float = 0.05, prior_weight=None,
                 clock=None):
        self.candidates = {c.name: c for c in candidates}
        self.costs = costs
        self.margin = margin
        self.weight = self.PRIOR_WEIGHT if prior_weight is None else prior_weight
        self.estimates = {c.name: _Estimate() for c in candidates}
        self.step = 0
        self.choice: tuple[str, int] = (PLAIN, 0)
        self.step_rule = None  # the rule of the candidate that drafted this step (None: nothing drafted)
        self._running: str = PLAIN  # who drafts this step
        self._shadows: dict[str, tuple[DecodeContext, int]] = {}  # shadowed: the context and budget
        self._probe_credit = {c.name: 0 for c in candidates}  # steps not running since its last probe
        self._probe_gap = {c.name: self.PROBE_EVERY for c in candidates}
        self.timeline: list[dict] = []
        self.steps_by_method: dict[str, int] = {}
        # `clock` (e.g. time.perf_counter) times each step's drafting and verification, so the cost model learns
        # what this request's steps cost; None keeps to the calibration (deterministic choices)
        self.clock = clock
        self._timing: dict[str, _Timing] = {}
        self._clocked: dict[str, float] = {}  # this step's drafting seconds
        self._ran_last: str | None = None
        # when the previous step's verification ended, and the drafting seconds its observe took after it
        self._last_verified: float | None = None
        self._last_post = 0.0
        self._budget = 0
        self._lookup_share: dict[str, float] = {}
        self._settled = False
        self._chosen_at = 0  # the step the current choice was made at
        # whether any candidate is shadowed: then plain decoding is not for good (a shadow can bring auto back)
        self._watching = any(c.shadow for c in candidates)
        self._deciding: dict | None = None
        self.rows = 1  # the batch's active rows: every row verifies the chosen window (set by prime and propose)

    # ---- before the first step -------------------------------------------------------------------------------

    def prime(self, prompts, rows: int | None = None) -> None:
        """Priors from the prompt for shadowed drafters (how often lookup would have predicted the prompt's own
        tokens), then the first choice for a batch of `rows` rows (default: one per prompt)."""
        self.rows = max(len(prompts) if rows is None else rows, 1)
        prompt = [int(t) for t in torch.as_tensor(prompts[0]).flatten().tolist()]
        for cand in self.candidates.values():
            if cand.shadow and len(prompt) > 2:
                self._shadow_prompt(cand, prompt)
        for cand in self.candidates.values():
            if cand.lookup_part in self.candidates and self.candidates[cand.lookup_part].shadow:
                self._lift_by_lookup(cand)
        self._decide(first=True)

    def _lift_by_lookup(self, cand: Candidate) -> None:
        """Raise the prior of a candidate that drafts with prompt lookup where lookup matches: position by position
        to hit * lookup's acceptance + (1 - hit) * its own, where that is higher, from the lookup candidate's
        estimates on this prompt. The calibration prompts have little to repeat, so without this draft-lookup met a
        retrieval prompt priced as its draft model alone, and auto ran prompt lookup there (code pair, RAG: tau 2.7
        against draft-lookup's 4.4). Set once, before the first step, so it does not move with every shadowed step."""
        hit = self.hit_rate(cand.lookup_part)
        self._lookup_share[cand.name] = hit  # the slots lookup fills cost no draft forward
        own = self._profile(cand, max(len(cand.prior_alpha_at or ()), 8))
        lookup = self.alphas(cand.lookup_part, len(own))
        cand.prior_alpha_at = tuple(max(a, hit * b + (1.0 - hit) * a) for a, b in zip(own, lookup))

    def _shadow_prompt(self, cand: Candidate, prompt: list[int], last: int = 24) -> None:
        estimate = self.estimates[cand.name]
        budget = max(cand.lengths)
        for end in range(max(2, len(prompt) - last), len(prompt)):
            ctx = DecodeContext([torch.tensor(prompt[:end])], torch.zeros(1, dtype=torch.long),
                                torch.zeros(1, dtype=torch.long), 0)
            (tested, accepted), = _agreement(cand.drafter, ctx, [prompt[end:]], min(budget, len(prompt) - end))
            estimate.record(tested, accepted, accepted < tested)
        # the prompt is a weak witness: keep it at the prior's weight
        scale = self.weight / max(estimate.steps, 1)
        if scale < 1:
            estimate.tested_at = [round(t * scale) for t in estimate.tested_at]
            estimate.accepted_at = [round(a * scale) for a in estimate.accepted_at]
            estimate.drafted_at = [round(d * scale) for d in estimate.drafted_at]
            estimate.hits, estimate.steps = round(estimate.hits * scale), round(estimate.steps * scale)

    # ---- the cost model ----------------------------------------------------------------------------------------

    def difficulty(self, name: str) -> float:
        """How this request fares against the priors, from the candidates other than `name` that have run: the
        tokens they had accepted over those their priors predicted for the same drafts, shrunk to 1 by
        PRIOR_WEIGHT pseudo-tokens and kept within [DIFFICULTY_FLOOR, 1 / DIFFICULTY_FLOOR]. It scales `name`'s
        prior: without it a candidate that has not run keeps the calibration prompts' optimism while the running
        one meets this prompt, and a hard prompt walks `auto` from one untried method to the next (on the code
        pair: draft, then draft-lookup, then stand, then sequoia, each for a few steps). Shadowed candidates are
        left out both ways: their priors already come from this prompt."""
        seen = expected = 0.0
        for other, cand in self.candidates.items():
            est = self.estimates[other]
            if other == name or cand.shadow or est.steps == 0:
                continue
            if cand.by_tau:
                seen += est.committed - est.steps  # tokens beyond the one every step commits
                expected += self._prior_extra(cand, est.steps)
            else:
                seen += sum(est.accepted_at)
                expected += sum(t * a for t, a in zip(est.tested_at, self._profile(cand, len(est.tested_at))))
        ratio = (seen + self.weight) / (expected + self.weight)
        return min(max(ratio, self.DIFFICULTY_FLOOR), 1.0 / self.DIFFICULTY_FLOOR)

    @staticmethod
    def _prior_tau(cand: Candidate) -> float:
        return cand.prior_tau if cand.prior_tau is not None else 1.0 + cand.prior_alpha

    def prior_alpha(self, name: str) -> float:
        cand = self.candidates[name]
        return cand.prior_alpha if cand.shadow else min(cand.prior_alpha * self.difficulty(name), 0.99)

    @staticmethod
    def _profile(cand: Candidate, depth: int) -> list[float]:
        """The calibration's acceptance at positions 1..depth (the pooled prior where it measured none)."""
        at = cand.prior_alpha_at or (cand.prior_alpha,)
        return [at[min(d, len(at) - 1)] for d in range(depth)]

    def alphas(self, name: str, depth: int) -> list[float]:
        """Acceptance per draft position 1..depth: the calibration's profile over positions, its level set by how
        this request's drafts fared against it (and, for a candidate that has not run, by the request's
        difficulty), each position then shrunk towards it by its own tests."""
        memo = self._deciding
        if memo is not None and (name, depth) in memo:  # within one decision the estimates do not change
            return memo[name, depth]
        cand, est = self.candidates[name], self.estimates[name]
        size = max(depth, len(est.tested_at))
        level = self.prior_alpha(name) / cand.prior_alpha if cand.prior_alpha > 0 else 1.0
        priors = [min(a * level, 0.99) for a in self._profile(cand, size)]
        # the level takes twice the pseudo-tests: each test also moves its own position's estimate below, and one
        # rejection at the first position should not halve every draft's predicted length
        expected = sum(t * a for t, a in zip(est.tested_at, priors))
        ratio = (sum(est.accepted_at) + 2 * self.weight) / (expected + 2 * self.weight)
        out, weights = [], []
        for d in range(depth):
            tested = est.tested_at[d] if d < len(est.tested_at) else 0
            accepted = est.accepted_at[d] if d < len(est.accepted_at) else 0
            out.append((accepted + self.weight * min(priors[d] * ratio, 0.99)) / (tested + self.weight))
            weights.append(tested + self.weight)
        # non-decreasing over positions, as the calibration's profile: one rejection at the third position must not
        # read as a wall there that keeps every draft at two tokens
        out = nondecreasing(out, weights)
        if memo is not None:
            memo[name, depth] = out
        return out

    def hit_rate(self, name: str) -> float:
        cand, est = self.candidates[name], self.estimates[name]
        return (est.hits + self.weight * cand.prior_hit) / (est.steps + self.weight)

    def _tau(self, name: str) -> float:
        """Tokens per step predicted for the rest of the request (a tree, a Jacobi window): the prior's tokens beyond
        one per step, scaled by how this request's steps compare with the prior's over as many steps (shrunk by
        `weight` pseudo-steps at the other candidates' difficulty). A window's prior is its calibration run's rate
        after as many steps as it has run here: a cold window commits about a token a step (images: 20 to 30 steps
        of one token, then bursts of 8 to 14), and judged against the whole run's tau, auto left mc-sjd after 20
        steps for plain decoding where mc-sjd alone ran 1.44x plain (0.88x on the demo's image example)."""
        cand, est = self.candidates[name], self.estimates[name]
        weight = self.weight * (4 if cand.stateful else 1)  # a window's steps vary more than a tree's
        pseudo = weight * (self._prior_tau(cand) - 1.0)  # the prior's tokens beyond one a step, as evidence
        if pseudo <= 0:
            return (est.committed + weight) / (est.steps + weight)
        ratio = (est.committed - est.steps + pseudo * self.difficulty(name)) / \
            (self._prior_extra(cand, est.steps) + pseudo)
        return 1.0 + (self._prior_rest(cand, est.steps) - 1.0) * max(ratio, 0.0)

    def _prior_extra(self, cand: Candidate, steps: int) -> float:
        """Tokens beyond one per step that the prior commits over its first `steps` steps."""
        curve = cand.prior_curve
        if not curve or steps > len(curve):
            return (self._prior_tau(cand) - 1.0) * steps
        return _committed_after(curve, steps) - steps

    def _prior_rest(self, cand: Candidate, steps: int) -> float:
        """The prior's tokens per step after its first `steps` steps (near or past the calibration run's end: its
        tau)."""
        curve = cand.prior_curve
        if not curve or steps >= len(curve) - 1:
            return self._prior_tau(cand)
        return (curve[-1] - _committed_after(curve, steps)) / (len(curve) - steps)

    def expected_tokens(self, name: str, length: int, optimistic: bool = False) -> float:
        return self._expected_by_length(name, length, optimistic)[length]

    def _expected_by_length(self, name: str, depth: int, optimistic: bool = False,
                            explore: bool = False) -> list[float]:
        """E(g) for g = 0..depth (a tree: its tau at every index). `explore`: each position's acceptance raised
        towards 1 by EXPLORE of the gap while it has few tests of its own, so the length chosen reaches positions
        this request has not tested (a draft kept at 3 tokens never learns that the 6th is accepted 9 times in 10,
        and the calibration's short runs see less of that than a long completion does)."""
        cand, est = self.candidates[name], self.estimates[name]
        if cand.by_tau:
            tau = self._tau(name)
            return [tau + (1.0 / math.sqrt(est.steps + 1) if optimistic else 0.0)] * (depth + 1)
        alphas = self.alphas(name, depth)
        if optimistic:
            bonus = 1.0 / math.sqrt(sum(est.tested_at) + 1)
            alphas = [min(a + bonus, 0.999) for a in alphas]
        elif explore:
            # the raise fades with the steps that drafted that deep, not with the tests there: a deep position is
            # tested only where every earlier token was accepted, so on a prompt where long drafts break early its
            # raise never faded, and prompt lookup on Gemma 3 270M kept drafting 9 tokens (1.7x plain decoding) where
            # it commits 3.7 a step and 3 tokens ran 2.3x
            alphas = [a + (1.0 - a) * self.EXPLORE * self.weight / (t + self.weight)
                      for a, t in zip(alphas, est.tried_at(depth))]
        hit = self.hit_rate(name)
        out, total, run = [1.0], 0.0, 1.0
        for a in alphas:
            run *= a
            total += run
            out.append(1.0 + hit * total)
        return out

    def step_cost(self, name: str, length: int, hit: float | None = None) -> float:
        """Predicted seconds of one step: drafting and verification as calibrated, each scaled by how this
        request's timed steps of `name` compared with the calibration."""
        return self._step_costs(name, (length,), hit)[0]

    def _step_costs(self, name: str, lengths, hit: float | None = None) -> list[float]:
        """step_cost at each of `lengths`, the request's timing ratios and hit rate read once (the decision asks for
        every length of every candidate after each step)."""
        timing = self._timing.get(name)
        draft_ratio, verify_ratio = timing.ratios(self.TIMING_WEIGHT) if timing else (1.0, self._verify_ratio())
        if name == PLAIN:
            return [verify_ratio * self._verify_cost(PLAIN, 0)] * len(lengths)
        cand = self.candidates[name]
        if cand.is_tree:
            verify = [self._verify_cost(name, cand.nodes)] * len(lengths)
        else:
            hit = self.hit_rate(name) if hit is None else hit
            # a batch pads every row's window to the longest: a step verifies the full window when any row drafts
            hit = 1.0 - (1.0 - hit) ** self.rows
            missed = (1.0 - hit) * self._verify_cost(name, 0)
            verify = [hit * self._verify_cost(name, g) + missed for g in lengths]
        fixed = self._draft_cost(name, 0)
        per_token = self._draft_cost(name, 1) - fixed  # drafting is linear in the length
        return [draft_ratio * (fixed + per_token * g) + verify_ratio * v for g, v in zip(lengths, verify)]

    def _verify_ratio(self) -> float:
        """A candidate's verification ratio (measured over calibrated) before it has run: that of every timed step so
        far. Verification is the target's forward whoever drafted, and a request's forwards run faster or slower than
        the calibration's as a whole (another process's calibration, the machine's state): priced at the calibration
        while the running drafter's steps read 1.26 times it, plain decoding looked a fifth cheaper than it was, and
        auto left a Jacobi window on images that ran 1.4x plain decoding."""
        pooled = _Timing()
        for timing in self._timing.values():
            pooled.verify_s += timing.verify_s
            pooled.verify_predicted += timing.verify_predicted
            pooled.steps += timing.steps
        return pooled.ratios(self.TIMING_WEIGHT)[1]

    def _draft_cost(self, name: str, length: int) -> float:
        """Drafting `length` tokens on each of the batch's rows: the calibrated one-row cost times the rows (a small
        draft's forward costs about what its rows cost, like the target's: the code pair's draft-lookup drafted 8
        rows in 1.9 ms a step against 0.2 ms for one; the request's timed steps correct the rest)."""
        if name == PLAIN:
            return 0.0
        share = self._lookup_share.get(name, 0.0)  # of its slots, those prompt lookup fills: no draft forward
        fixed = self.costs.draft(name, 0)
        return self.rows * (fixed + (1.0 - share) * (self.costs.draft(name, length) - fixed))

    def _verify_cost(self, name: str, drafted: int) -> float:
        """Verifying `drafted` tokens (drafted + 1 slots) on each of the batch's rows inside the loop, with the
        loop's own cost per step (mostly the acceptance rule's: timed with the verification, so a plain step's timing
        compares like with like). A forward's cost follows the slots it scores, however they split into rows (Gemma 3
        270M: 8 rows of 4 slots 109 ms, one row of 32 slots 108 ms; benchmarks/batch-window-gemma-latest.md), so
        R rows cost T_verify(R * (drafted + 1)): on a full batch the target's spare compute that speculation spends
        on one row is spent on the other rows already, and plain decoding of 8 served Gemma rows ran 1.6 times as
        fast as prompt lookup chosen by a one-row cost model."""
        memo = self.__dict__.setdefault("_verify_memo", {})  # the calibration does not change during a request
        key = (self.rows, drafted)
        if key not in memo:
            slots = self.rows * (drafted + 1)
            memo[key] = (self.costs.verify(slots) + self.costs.verify_per_slot_s * (slots - 1)
                         + self.costs.overhead_s)
        return memo[key]

    def speed(self, name: str, length: int, optimistic: bool = False) -> float:
        """Predicted tokens per second."""
        if name == PLAIN:
            return 1.0 / self.step_cost(PLAIN, 0)
        return self.expected_tokens(name, length, optimistic) / self.step_cost(name, length)

    def best_length(self, name: str, optimistic: bool = False, explore: bool = False) -> tuple[int, float]:
        """(length, predicted tokens per second) of the candidate's fastest length (the shortest on ties). With
        `explore`, at most EXPLORE_REACH tokens beyond the point estimate's best length: where wide windows cost
        much (Gemma 3 270M: 10 slots cost 3.6 plain steps), the raised acceptance of untested positions made the
        first step of a request draft 9 tokens where the point estimate asked for 4; and at most EXPLORE_REACH beyond
        the deepest position this request's drafts have reached `weight` times (or the method's own length), so a
        draft grows by what its steps have shown: three accepted steps sent prompt lookup on Gemma from 5 tokens to 9
        on a maths prompt whose later drafts broke after 3 (1.7x plain decoding, where 3 tokens ran 2.3x)."""
        cand = self.candidates[name]
        lengths = cand.lengths
        if explore and not cand.by_tau:
            point = self.best_length(name)[0]
            tried = self.estimates[name].tried_at(max(lengths))
            known = next((d for d, t in enumerate(tried) if t < self.weight), len(tried))
            reach = min(point, max(known, cand.default_length or point)) + self.EXPLORE_REACH
            lengths = tuple(g for g in lengths if g <= reach) or lengths[:1]
        expected = self._expected_by_length(name, max(lengths), optimistic, explore)
        hit = None if cand.by_tau else self.hit_rate(name)
        best = None
        for g, cost in zip(lengths, self._step_costs(name, lengths, hit)):
            speed = expected[g] / cost
            if best is None or speed > best[1]:
                best = (g, speed)
        return best

    def predictions(self) -> dict[str, dict]:
        """Each candidate's best length and predicted speedup over plain decoding."""
        plain = self.speed(PLAIN, 0)
        out = {PLAIN: {"length": 0, "predicted_speedup": 1.0}}
        for name in self.candidates:
            length, speed = self.best_length(name)
            out[name] = {"length": length, "predicted_speedup": speed / plain}
        return out

    # ---- the decision --------------------------------------------------------------------------------------------

    def _decide(self, first: bool = False) -> None:
        self._deciding = {}  # alphas by (candidate, depth), for this decision only
        try:
            self._choose(first)
        finally:
            self._deciding = None

    def _choose(self, first: bool) -> None:
        current, length = self.choice
        # a drafter serving its first TENURE steps may only be re-lengthened: the other candidates' predictions are
        # not needed (on the code pair the decisions of a request's first steps were most of auto's own work)
        serving = not first and current != PLAIN and self.step - self._chosen_at < self.TENURE
        predicted = None if serving else self.predictions()
        choice = self.choice
        if first:
            best = max(predicted, key=lambda n: (predicted[n]["predicted_speedup"], n == PLAIN))
            # plain decoding unless a drafter is predicted faster by half the margin: the predictions err by about a
            # tenth, and a request that starts drafting for a predicted 1.05x ran at 0.9x (speech demo example)
            if best != PLAIN and predicted[best]["predicted_speedup"] < 1.0 + self.margin / 2:
                best = PLAIN
            choice = (best, self._length(best))
        else:
            # the current candidate at its best length: staying may re-length it (below), so a length that has
            # turned out too long is not a reason to leave (on Gemma a first draft of 9 tokens, rejected early,
            # sent auto from prompt lookup to consensus' trees at the second step)
            best = current if serving else max(predicted, key=lambda n: (predicted[n]["predicted_speedup"], n == PLAIN))
            if best != PLAIN and current != PLAIN and self.candidates[best].stateful and \
                    self.candidates[current].stateful:
                # one Jacobi window for another: the running one's tokens per step so far include its cold start, the
                # other's prior is a whole image's, and the switch restarts the window cold (images: auto left
                # mc-sjd for sjd in 7 of 10 requests and took up to 104 steps where mc-sjd alone took 79)
                best = current
            now = predicted[current]["predicted_speedup"] if best != current else 0.0
            if best == PLAIN and current != PLAIN and not self._watching:
                # plain decoding for good (nothing shadowed brings auto back) only when even an optimistic estimate
                # of the current drafter loses: on a speech prompt where `sd` alone commits 3.1 tokens a step, its
                # first 8 steps read 0.64x plain decoding and the other 462 steps ran plain
                now = self.best_length(current, optimistic=True)[1] / self.speed(PLAIN, 0)
            if best != current and predicted[best]["predicted_speedup"] > now * (1.0 + self._switch_margin(best)):
                choice = (best, self._length(best))
            elif current != PLAIN and not self.candidates[current].by_tau:
                # re-length within the candidate at half the margin: near its best length the predicted speed is
                # flat, and without one the length followed every accept and reject (4, 2, 4, 2, 7 on the code pair)
                new_length, new_speed = self.best_length(current, explore=True)
                # not below the method's own length while the drafter serves its first steps: a completion's first
                # tokens are its hardest, and two early rejections had draft-lookup on the code pair drafting 3
                # tokens where it runs 8 (tau 3.9-5.3 against 4.2-6.4 on held-out prompts, 0.72-0.86x of it alone)
                floor = min(length, self.candidates[current].default_length or 0) if serving else 0
                if new_length != length and new_length >= floor and \
                        new_speed > self._explore_speed(current, length) * (1 + self.margin / 2):
                    choice = (current, new_length)
        # plain decoding with nothing shadowed and no probes from it cannot learn anything that would make a drafter
        # win: the rest of the request is plain decoding at a plain step's cost (the decision's own bookkeeping was
        # 6 % of a speech request's time at the demo's example)
        self._settled = choice[0] == PLAIN and not self._watching
        if first or choice[0] != current:
            self._chosen_at = self.step
        if first or choice != self.choice:
            predicted = predicted or self.predictions()
            self.timeline.append({"step": self.step, "method": choice[0], "length": choice[1],
                                  "predicted": {n: round(p["predicted_speedup"], 3) for n, p in predicted.items()}})
        self.choice = choice

    def _switch_margin(self, name: str) -> float:
        """The margin a switch to `name` needs: FREE_SWITCH of it where the switch costs no catch-up and the
        prediction rests on this request (plain decoding where a shadowed candidate can still bring auto back; a
        model-free candidate shadowed or run for KNOWN_STEPS steps), the whole of it otherwise: a candidate known
        only by its calibration prior is a gamble (on Gemma, consensus' prior lured auto off prompt lookup two steps
        into a request, at a tree's cost), and plain decoding with nothing shadowed is for the rest of the request
        (speech: a few early rejections sent auto to plain decoding for good where `sd` ran 1.3 times as fast)."""
        if name == PLAIN:  # free unless it settles for good: with nothing shadowed, plain decoding never comes back
            return self.margin * (self.FREE_SWITCH if self._watching else 1.0)
        cand = self.candidates[name]
        known = cand.shadow or self.estimates[name].steps >= self.KNOWN_STEPS
        # from a drafter that takes this candidate's tokens wherever it has any (draft-lookup and prompt lookup), a
        # switch can only win the draft model's forwards on the other steps, and the shadowed estimate it rests on
        # tests deep positions only where the running drafter's tokens were accepted that far: the whole margin (with
        # a quarter, auto left draft-lookup for lookup on the code pair's retrieval prompt: 0.77x draft-lookup alone)
        running = self.candidates.get(self.choice[0])
        part = running is not None and running.lookup_part == name
        return self.margin * (self.FREE_SWITCH if cand.model_free and known and not part else 1.0)

    def _length(self, name: str) -> int:
        """The length a newly chosen candidate drafts: its best with exploration (the point estimate's for trees), and
        no more than the method's own default length while it has not run in this request: until then it is known
        by priors (or a shadow run) only, and draft-lookup's, raised by prompt lookup's hits on the prompt, had the
        first step of the code pair's requests draft 14 tokens where the method drafts 8; one early rejection then
        kept the request at 7, a step or two more than draft-lookup alone took (0.87-0.91x of it on four bench
        prompts, 0.90-0.97x with the cap). On Gemma 3 270M prompt lookup started at 5 tokens where it drafts 3: a
        6-slot window costs 28 ms there against 17 ms for 4 slots."""
        if name == PLAIN:
            return 0
        length = self.best_length(name, explore=True)[0]
        cand = self.candidates[name]
        if cand.default_length and not cand.by_tau and not self.steps_by_method.get(name):
            length = min(length, cand.default_length)
        return length

    def _explore_speed(self, name: str, length: int) -> float:
        return self._expected_by_length(name, length, explore=True)[length] / self.step_cost(name, length)

    def _probe(self) -> tuple[str, int] | None:
        """A model drafter not running whose optimistic speed still beats the current choice, once its turn is due.
        None while plain decoding runs: a drafter that has sat out re-feeds the whole context at its probe (on the
        speech pair four probes of a 200-step request cost it a tenth), and plain decoding was chosen because no
        drafter was predicted to beat it (shadowed lookup still can)."""
        current, length = self.choice
        if current == PLAIN:
            return None
        now = now_cost = None  # the current choice's speed and step cost, worked out once a probe is due
        for name, cand in self.candidates.items():
            # a stateful drafter's single step says little (its window starts cold): it is not probed
            if cand.shadow or cand.stateful or name == current:
                continue
            self._probe_credit[name] += 1
            if self._probe_credit[name] < self._probe_gap[name]:  # not due at any cost: skip the estimates below
                continue
            if now is None:
                now, now_cost = self.speed(current, length), self.step_cost(current, length)
            # the optimism decides whether to look, not how far: at the length the point estimate would run (an
            # optimistic length drafts the longest chain: on Gemma 3 270M one probe of 16 drafts verified a
            # 17-slot window, 134 ms against a step's 37). A probe dearer than the current step waits that many
            # times longer (a tree on the code pair costs about three of its chain steps)
            probe_length = self.best_length(name)[0]
            dearer = max(1.0, self.step_cost(name, probe_length) / now_cost)
            if self._probe_credit[name] < self._probe_gap[name] * dearer:
                continue
            self._probe_credit[name] = 0
            self._probe_gap[name] = round(self._probe_gap[name] * self.PROBE_GROWTH)
            # worth a look only when its point estimate is within the margin of the current choice: on Gemma every
            # untried drafter's optimism beat the current choice, and the probes with their catch-up forwards cost
            # a tenth of the steps
            if self.best_length(name)[1] >= now * (1.0 - self.margin) and \
                    self.best_length(name, optimistic=True)[1] > now * (1.0 + self.margin):
                return name, probe_length
        return None

    # ---- the Drafter protocol ----------------------------------------------------------------------------------

    def next_length(self) -> int:
        """What the loop may draft this step (>= 1 so `propose` runs and can shadow; plain returns nothing; 0 once
        settled on plain decoding, and then the loop proposes nothing)."""
        if self._settled:
            return 0
        probe = self._probe()
        self._running, length = probe if probe is not None else self.choice
        self.step_rule = None
        if self._running == PLAIN:
            return 1
        cand = self.candidates[self._running]
        return max(cand.lengths) if cand.is_tree else length

    def propose(self, ctx: DecodeContext, budget: int) -> Draft | DraftTree:
        self.rows = len(ctx.tokens)
        self._shadows = {}
        for name, cand in self.candidates.items():
            if cand.shadow and name != self._running:  # compared with what the step commits, in observe
                self._shadows[name] = (ctx, max(cand.lengths))
        self._budget = budget
        if self._running == PLAIN:
            self._clock_draft(None)
            return Draft.empty(len(ctx.tokens))
        cand = self.candidates[self._running]
        self.step_rule = cand.rule
        started = self._clock_draft(None)
        proposal = cand.drafter.propose(ctx, budget)
        self._clock_draft(started)
        return proposal

    def _clock_draft(self, started: float | None) -> float | None:
        """Times the running drafter's proposal (`started`: when it began); the verification starts at its end."""
        if self.clock is None:
            return None
        now = self.clock()
        if started is None:
            self._clocked = {"draft_s": 0.0}
        else:
            self._clocked = {"draft_s": now - started}
        return now

    def observe(self, verdict: Verdict) -> None:
        if self._settled:
            self.steps_by_method[PLAIN] = self.steps_by_method.get(PLAIN, 0) + 1
            self.step += 1
            return
        running = self._running if self.step_rule is not None else PLAIN
        self.steps_by_method[running] = self.steps_by_method.get(running, 0) + 1
        committed = [[t for t, s in zip(toks, srcs) if s >= 0]
                     for toks, srcs in zip(verdict.tokens.tolist(), verdict.source.tolist())]
        verified = self.clock() if self.clock is not None else None
        if running != PLAIN:
            cand, est = self.candidates[running], self.estimates[running]
            cand.drafter.observe(verdict)
            rejected = [any(s == 1 for s in srcs) for srcs in verdict.source.tolist()]  # TokenSource.RECOVERED
            for i, (drafted, accepted) in enumerate(zip(verdict.num_drafted.tolist(), verdict.num_accepted.tolist())):
                if cand.by_tau:
                    est.steps += 1
                    est.hits += 1
                    est.committed += len(committed[i])
                else:
                    est.record(drafted, accepted, rejected[i])
        learnt = running != PLAIN or bool(self._shadows)
        for name, (ctx, budget) in self._shadows.items():  # what a point-mass drafter would have had accepted
            est = self.estimates[name]
            for tested, accepted in _agreement(self.candidates[name].drafter, ctx, committed, budget):
                est.record(tested, accepted, accepted < tested)
        self._shadows = {}
        # time this step unless its drafter has just taken over: its first step catches up on what the others
        # committed, a cost of switching rather than of its steps (the drafter's observe counts as drafting)
        post = self.clock() - verified if verified is not None and running != PLAIN else 0.0
        if verified is not None and running == self._ran_last and self._clocked and self._last_verified is not None:
            if running != PLAIN and self.candidates[running].is_tree:
                drafted = self.candidates[running].nodes
            else:
                drafted = int(verdict.num_drafted.max()) if running != PLAIN else 0
            timing = self._timing.setdefault(running, _Timing())
            timing.draft_s += self._clocked["draft_s"] + post
            timing.draft_predicted += self._draft_cost(running, self._budget)
            # the rest of the step's wall time counts as verifying: the target's forward and the acceptance rule, and
            # what happens between steps (the loop's bookkeeping, the shadows' proposals, the decision), which the
            # calibration's overhead_s stands for; timing the forward alone left those out and priced a tree of
            # consensus on Gemma a tenth below what its steps cost, so auto kept it against a faster prompt lookup
            timing.verify_s += verified - self._last_verified - self._clocked["draft_s"] - self._last_post
            timing.verify_predicted += self._verify_cost(running, drafted)
            timing.steps += 1
        self._last_verified, self._last_post = verified, post
        self._clocked = {}
        self._ran_last = running
        self.step += 1
        # a plain step with nothing shadowed teaches nothing but its timing: re-decide every few such steps only (the
        # decision costs a few tenths of a millisecond, a tenth of a plain step of the speech pair); past a request's
        # first EARLY_STEPS steps, one step's evidence moves the estimates little, so every DECIDE_EVERY steps (on
        # the code pair, deciding after every step was 7 % of a request running draft-lookup throughout)
        due = self.step < self.EARLY_STEPS or self.step % self.DECIDE_EVERY == 0
        if (learnt and due) or self.step % self.PLAIN_DECIDE_EVERY == 0:
            self._decide()

    def run_summary(self) -> dict:
        """The choice, every switch with the predictions behind it, and the steps each method ran."""
        return {"auto": {"chosen": self.timeline[0]["method"] if self.timeline else PLAIN,
                         "switches": self.timeline[1:], "initial": self.timeline[0] if self.timeline else None,
                         "steps_by_method": dict(self.steps_by_method)}}


class AutoPolicy:
    """The loop's length policy for `auto`: the drafter decides."""

    def __init__(self, drafter: AutoDrafter):
        self.drafter = drafter

    def next_length(self) -> int:
        return self.drafter.next_length()

    def observe(self, verdict: Verdict) -> None:
        pass  # the drafter learns from the same verdict


class AutoRule:
    """Verifies each step with the rule of the candidate that drafted it; a step with nothing drafted with the
    plain chain rule (greedy matching or rejection sampling: both commit the target's own token)."""

    lossless = True
    name = "auto"

    def __init__(self, drafter: AutoDrafter, plain_rule):
        self.drafter, self.plain = drafter, plain_rule

    def _rule(self, proposal=None):
        if isinstance(proposal, Draft) and proposal.length == 0:
            return self.plain
        return self.drafter.step_rule or self.plain

    @property
    def uses_noise(self) -> bool:
        return getattr(self._rule(), "uses_noise", True)

    def __call__(self, proposal, target_probs, noise):
        return self._rule(proposal)(proposal, target_probs, noise)

    def decision_probs(self, proposal, target_probs):
        return self._rule(proposal).decision_probs(proposal, target_probs)


def nondecreasing(values: list[float], weights: list[float] | None = None) -> list[float]:
    """The closest non-decreasing fit to `values` in weighted least squares (pool adjacent violators)."""
    blocks: list[list] = []  # [mean, weight, count] of pooled runs
    for value, weight in zip(values, weights if weights is not None else [1.0] * len(values)):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (mean_b, weight_b, count_b), (mean_a, weight_a, count_a) = blocks.pop(), blocks.pop()
            pooled = weight_a + weight_b
            mean = (mean_a * weight_a + mean_b * weight_b) / pooled if pooled else (mean_a + mean_b) / 2
            blocks.append([mean, pooled, count_a + count_b])
    return [mean for mean, _, count in blocks for _ in range(count)]


def _agreement(drafter, ctx: DecodeContext, truths: list[list[int]], budget: int) -> list[tuple[int, int]]:
    """(slots compared, slots matched) per row between a point-mass drafter's proposal from `ctx` and `truths`, up
    to the first mismatch: the drafter's own `agreement` where it has one (it stops looking up there), else its
    whole proposal compared."""
    if hasattr(drafter, "agreement"):
        return drafter.agreement(ctx, truths, budget)
    proposal = drafter.propose(ctx, budget)
    out = []
    for i, truth in enumerate(truths):
        drafted = int(proposal.drafted()[i]) if proposal.length else 0
        accepted = _matched(proposal.tokens[i, :drafted].tolist(), truth)
        out.append((min(drafted, len(truth)), accepted))
    return out


def _matched(guess: list[int], truth: list[int]) -> int:
    n = 0
    while n < len(guess) and n < len(truth) and guess[n] == truth[n]:
        n += 1
    return n


def chain_lengths(default: int, maximum: int = 16) -> tuple[int, ...]:
    """Draft lengths a chain candidate may take: 1..max(maximum, default)."""
    return tuple(range(1, max(maximum, default) + 1))
