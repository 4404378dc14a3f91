"""`auto`: the cost model's choices, and exactness through switches in all three layers (the exact oracle with
switches at fixed steps, chi-square through the loop with adaptive switches, greedy equality) plus a negative
control (a switch whose first proposal keeps the previous drafter's tokens under the new drafter's law)."""

import dataclasses
from collections import defaultdict

import pytest
import torch

from specgen.samplers.acceptance import ChainRejection, GreedyMatch, TreeRejection
from specgen.samplers.auto import (PLAIN, AutoDrafter, AutoPolicy, AutoRule, Candidate, Costs, _Timing,
                                   nondecreasing)
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.loop import generate, speculative_generate
from specgen.samplers.oracle import (chain_proposals, max_abs_diff, outcomes, target_joint, target_probs_for,
                                     tree_proposals)
from specgen.samplers.processing import Processing
from specgen.samplers.trees import GreedyTreeMatch
from specgen.samplers.toy import TableDrafter, TableLM, TableTarget, TableTreeDrafter
from specgen.samplers.types import DecodeContext, Draft

VOCAB, HORIZON = 4, 3
TARGET = TableLM(VOCAB, order=1, seed=31)
DRAFT = TARGET.mixed_with(TableLM(VOCAB, order=1, seed=32, scale=3.0), 0.7)
PLAIN_PROCESSING = Processing()
HOT = Processing(temperature=1.6)
PROMPT = [1, 2]
COSTS = Costs({1: 1.0, 2: 1.15, 3: 1.3, 4: 1.45, 5: 1.6}, {"cold": (0.02, 0.05), "hot": (0.02, 0.05)})


def candidates(processing=PLAIN_PROCESSING):
    chain_rule = GreedyMatch() if processing.greedy else ChainRejection()
    return [Candidate("cold", TableDrafter(DRAFT, processing), chain_rule, (1, 2, 3), prior_alpha=0.7),
            Candidate("hot", TableDrafter(DRAFT, HOT), chain_rule, (1, 2, 3), prior_alpha=0.5),
            Candidate("lookup", TableDrafter(DRAFT, processing, point_mass=True), chain_rule, (1, 2, 3),
                      prior_alpha=0.6, shadow=True),
            Candidate("tree", TableTreeDrafter(DRAFT, processing, (2, 1)), TreeRejection("without_replacement"),
                      (2,), nodes=4, prior_tau=2.0)]


class Scripted(AutoDrafter):
    """Follows a fixed schedule of (method, length) by step instead of the cost model."""

    def __init__(self, schedule, cands):
        super().__init__(cands, COSTS)
        self.schedule = schedule
        self._decide()

    def _probe(self):
        return None

    def _decide(self, first=False):
        self.choice = self.schedule[self.step % len(self.schedule)]


# ---- the cost model ------------------------------------------------------------------------------------

def test_costs_interpolate_and_extend():
    costs = Costs({1: 1.0, 3: 2.0, 5: 2.5})
    assert costs.verify(1) == 1.0 and costs.verify(2) == 1.5 and costs.verify(4) == 2.25
    assert costs.verify(7) == pytest.approx(3.0)  # the last segment's slope
    assert costs.verify(0) == 1.0


def test_expensive_verification_falls_back_to_plain_decoding():
    """Verifying a window costs so much that no acceptance pays for it: plain decoding, predicted 1.0."""
    costs = Costs({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 7: 7.0}, {"cold": (0.0, 0.3)})
    auto = AutoDrafter(candidates()[:1], costs)
    auto.prime([torch.tensor(PROMPT)])
    assert auto.choice == (PLAIN, 0)
    assert auto.predictions()["cold"]["predicted_speedup"] < 1.0


def test_plain_decoding_for_good_needs_even_an_optimistic_estimate_to_lose():
    """With nothing shadowed, leaving a drafter for plain decoding is for the rest of the request: a few rejections
    (a hard start) do not settle it, many do."""
    costs = Costs({1: 1.0, 2: 1.3, 3: 1.6, 4: 1.9}, {"cold": (0.0, 0.05)})
    verdicts = {}
    for tests in (10, 200):
        auto = AutoDrafter([dataclasses.replace(candidates()[0], prior_alpha=0.8)], costs, margin=0.2)
        auto.prime([torch.tensor(PROMPT)])
        assert auto.choice[0] == "cold"
        for _ in range(tests):  # rejected at the first token every time
            auto.estimates["cold"].record(3, 0, True)
        auto.step = auto.TENURE
        # the point estimate alone would leave in both cases
        assert auto.predictions()["cold"]["predicted_speedup"] < 1.0 / (1.0 + auto.margin)
        auto._decide()
        verdicts[tests] = auto.choice[0]
    assert verdicts == {10: "cold", 200: PLAIN}


def test_one_jacobi_window_is_not_left_for_another():
    """A running Jacobi window's tokens per step include its cold start while another's prior is a whole image's,
    and a switch restarts the window: auto keeps the running one (a chain drafter predicted as fast is taken)."""
    costs = Costs({1: 1.0, 2: 1.1, 3: 1.2, 9: 1.5}, {"a": (0.0, 0.01), "b": (0.0, 0.01)})
    for stateful, switched in ((True, False), (False, True)):
        a = Candidate("a", None, None, (8,), stateful=True, prior_alpha=0.5, prior_tau=2.0)
        b = Candidate("b", None, None, (8,), stateful=stateful, prior_alpha=0.5 if stateful else 0.95,
                      prior_tau=8.0 if stateful else None, shadow=not stateful)  # a shadow keeps its prior
        auto = AutoDrafter([a, b], costs, margin=0.2)
        auto.choice, auto.step = ("a", 8), auto.TENURE
        for _ in range(40):  # a commits 1.5 tokens a step
            auto.estimates["a"].steps += 1
            auto.estimates["a"].committed += 1.5
        assert auto.predictions()["b"]["predicted_speedup"] > 1.3 * auto.predictions()["a"]["predicted_speedup"]
        auto._decide()
        assert (auto.choice[0] == "b") == switched


def test_a_jacobi_window_is_judged_against_its_calibration_after_as_many_steps():
    """A window's calibration run committed one token a step for its first 30 steps, then 6 a step (a cold window
    settling): a request at one token a step for 30 steps is where the calibration was and keeps the window, while
    against the whole run's tau it would look a loser; at one token a step for 60 steps it is far behind and goes."""
    costs = Costs({1: 1.0, 16: 2.5}, {"jacobi": (0.0, 0.0)})
    curve = tuple(float(k + 1) if k < 30 else 30.0 + 6.0 * (k - 29) for k in range(66))  # 256 tokens in 66 steps
    verdicts = {}
    for with_curve in (True, False):
        for steps in (30, 60):
            window = Candidate("jacobi", None, None, (15,), stateful=True, prior_tau=curve[-1] / len(curve),
                               prior_curve=curve if with_curve else None)
            auto = AutoDrafter([window], costs, margin=0.1)
            auto.choice, auto.step, auto._chosen_at = ("jacobi", 15), steps, 0
            seen = auto.estimates["jacobi"]
            seen.steps = seen.committed = seen.hits = steps
            auto._decide()
            verdicts[with_curve, steps] = auto.choice[0]
    assert verdicts == {(True, 30): "jacobi", (True, 60): PLAIN, (False, 30): PLAIN, (False, 60): PLAIN}


def test_cheap_verification_picks_the_length_of_the_formula():
    costs = Costs({n: 1.0 + 0.01 * n for n in range(1, 18)}, {"cold": (0.0, 0.01)})
    cand = candidates()[0]
    cand.lengths = tuple(range(1, 17))
    auto = AutoDrafter([cand], costs, prior_weight=1e9)  # the prior only: alpha 0.7 everywhere
    auto.EXPLORE = 0.0
    auto.prime([torch.tensor(PROMPT)])
    speed = lambda g: (1 - 0.7 ** (g + 1)) / 0.3 / (0.01 * g + costs.verify(g + 1))
    assert auto.choice == ("cold", max(range(1, 17), key=speed))
    # exploring, untested positions count as more likely accepted: the first length is longer, never shorter
    exploring = AutoDrafter([cand], costs, prior_weight=1e9)
    exploring.prime([torch.tensor(PROMPT)])
    assert exploring.choice[1] > auto.choice[1]


def test_a_full_batch_prices_every_rows_window_and_keeps_to_plain_decoding():
    """A forward costs what its slots cost however they split into rows: bandwidth-bound up to 4 slots, then each
    slot its own compute. One row drafts (4 slots cost about one); a batch of 8 rows, whose plain step already
    scores 8 slots, gains nothing from drafting and decodes plainly; the step's cost and the drafting follow the
    rows. A one-row cost model (the old one) would have the batch draft."""
    costs = Costs({1: 1.0, 2: 1.02, 4: 1.05, 8: 2.1, 16: 4.2, 32: 8.4}, {"cold": (0.01, 0.02)})
    cand = dataclasses.replace(candidates()[0], prior_alpha=0.8)
    one = AutoDrafter([cand], costs, prior_weight=1e9)
    one.prime([torch.tensor(PROMPT)])
    assert one.choice[0] == "cold"
    batch = AutoDrafter([cand], costs, prior_weight=1e9)
    batch.prime([torch.tensor(PROMPT)] * 8)
    assert batch.rows == 8 and batch.choice == (PLAIN, 0)
    assert batch.step_cost(PLAIN, 0) == pytest.approx(costs.verify(8))
    assert batch.step_cost("cold", 3) == pytest.approx(8 * (0.01 + 3 * 0.02) + costs.verify(32))
    assert one.step_cost("cold", 3) == pytest.approx(0.01 + 3 * 0.02 + costs.verify(4))
    # the rows follow the batch: one row left, drafting pays again
    assert AutoDrafter([cand], costs, prior_weight=1e9).rows == 1
    batch.propose(DecodeContext([torch.tensor(PROMPT)], torch.zeros(1, dtype=torch.long),
                                torch.zeros(1, dtype=torch.long)), 3)
    assert batch.rows == 1 and batch.predictions()["cold"]["predicted_speedup"] > 1.5


def test_a_candidate_that_has_not_run_drafts_no_more_than_its_default_length():
    """Known by priors only, a candidate starts at most at the method's own length; once it has run, its
    estimates may take it further."""
    costs = Costs({n: 1.0 + 0.01 * n for n in range(1, 18)}, {"cold": (0.0, 0.01)})
    cand = dataclasses.replace(candidates()[0], lengths=tuple(range(1, 17)), default_length=3)
    auto = AutoDrafter([cand], costs)
    auto.prime([torch.tensor(PROMPT)])
    assert auto.choice == ("cold", 3) and auto.best_length("cold", explore=True)[0] > 3
    auto.estimates["cold"].record(3, 3, False)  # evidence alone (a shadow) is not a run of its own
    assert auto._length("cold") == 3
    auto.steps_by_method["cold"] = 1
    assert auto._length("cold") > 3


def test_a_drafter_serving_its_first_steps_keeps_at_least_its_own_length():
    """Early rejections do not shorten a newly chosen drafter below its method's own length until its tenure is
    over (a completion's first tokens are its hardest); afterwards the estimates decide."""
    costs = Costs({n: 1.0 + 0.3 * n for n in range(1, 18)}, {"cold": (0.0, 0.01)})
    cand = dataclasses.replace(candidates()[0], lengths=tuple(range(1, 17)), prior_alpha=0.9, default_length=6)
    auto = AutoDrafter([cand], costs, margin=0.05)
    auto.choice, auto._chosen_at, auto.step = ("cold", 6), 0, 3
    for _ in range(3):
        auto.estimates["cold"].record(6, 0, True)  # rejected at the first token, three times
    assert auto.best_length("cold", explore=True)[0] < 6
    auto._decide()
    assert auto.choice == ("cold", 6)
    auto.step = auto.TENURE
    auto._decide()
    assert auto.choice[0] == "cold" and auto.choice[1] < 6


def test_auto_switches_away_from_a_drafter_that_is_rejected():
    costs = Costs({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6}, {"a": (0.0, 0.05), "b": (0.0, 0.05)})
    a = Candidate("a", None, None, (1, 2, 3), prior_alpha=0.9)
    b = Candidate("b", None, None, (1, 2, 3), prior_alpha=0.6)
    auto = AutoDrafter([a, b], costs)
    auto._decide(first=True)
    assert auto.choice[0] == "a"
    for _ in range(30):  # a is rejected at its first token every time
        auto.estimates["a"].record(3, 0, True)
    # a newly chosen drafter serves TENURE steps first (a completion's first tokens are its hardest); meanwhile
    # only its length may change
    auto.step = auto.TENURE - 1
    auto._decide()
    assert auto.choice[0] == "a"
    auto.step = auto.TENURE
    auto._decide()
    assert auto.choice[0] == "b" and auto.timeline[-1]["method"] == "b"
    assert set(auto.timeline[-1]["predicted"]) == {PLAIN, "a", "b"}


def test_a_candidate_that_has_not_run_shares_the_requests_difficulty():
    """A prompt on which the running drafter is rejected is hard for the others too: their priors are scaled by
    the accepted-to-predicted ratio of what ran (within the floor), the shadowed candidate's is not, and an easy
    prompt raises them."""
    costs = Costs({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6}, {"a": (0.0, 0.05), "b": (0.0, 0.05)})
    a = Candidate("a", None, None, (1, 2, 3), prior_alpha=0.8)
    b = Candidate("b", None, None, (1, 2, 3), prior_alpha=0.8)
    tree = Candidate("tree", None, None, (2,), nodes=4, prior_tau=3.0)
    look = Candidate("look", None, None, (1, 2, 3), prior_alpha=0.6, shadow=True)
    auto = AutoDrafter([a, b, tree, look], costs)
    fresh = auto.predictions()["b"]["predicted_speedup"]
    assert auto.difficulty("b") == pytest.approx(1.0) and auto.prior_alpha("b") == pytest.approx(0.8)
    for _ in range(3):  # a: 3 drafted, the second rejected (1 of 2 tested accepted; the prior predicted 1.6)
        auto.estimates["a"].record(3, 1, True)
    hard = (3 + auto.weight) / (3 * 1.6 + auto.weight)
    assert auto.difficulty("b") == pytest.approx(hard) and auto.prior_alpha("b") == pytest.approx(0.8 * hard)
    assert auto.difficulty("a") == 1.0  # its own evidence counts once, in its own estimate
    assert auto.prior_alpha("look") == 0.6  # shadowed: its prior comes from this prompt already
    assert auto.predictions()["b"]["predicted_speedup"] < fresh
    assert auto.expected_tokens("tree", 2) == pytest.approx(1.0 + 2.0 * hard)
    for _ in range(200):  # hopeless: the floor
        auto.estimates["a"].record(3, 0, True)
    assert auto.difficulty("b") == AutoDrafter.DIFFICULTY_FLOOR
    easy = AutoDrafter([a, b, tree, look], costs)
    for _ in range(200):
        easy.estimates["a"].record(3, 3, False)
    assert easy.difficulty("b") == pytest.approx((600 + easy.weight) / (480 + easy.weight))
    assert easy.prior_alpha("b") == 0.99  # 0.8 * 1.25, kept below 1


def test_hysteresis_keeps_the_choice_within_the_margin():
    costs = Costs({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6}, {"a": (0.0, 0.05), "b": (0.0, 0.05)})
    a = Candidate("a", None, None, (2,), prior_alpha=0.6)
    b = Candidate("b", None, None, (2,), prior_alpha=0.61)
    auto = AutoDrafter([a, b], costs, margin=0.2)
    auto.choice, auto.step = ("a", 2), auto.TENURE  # past its first steps: free to leave
    auto._decide()
    assert auto.choice == ("a", 2)


def test_a_switch_that_costs_no_catch_up_needs_a_quarter_of_the_margin():
    """Switching to a model-free candidate (or plain decoding) costs no catch-up forward, so once its prediction
    rests on this request it needs only FREE_SWITCH of the margin; a model drafter, or a model-free one known only by
    its prior, still needs the whole of it."""
    costs = Costs({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6}, {"a": (0.0, 0.05), "b": (0.0, 0.05)})
    for model_free, steps, switched in ((False, 20, False), (True, 20, True), (True, 0, False)):
        a = Candidate("a", None, None, (2,), prior_alpha=0.6)
        b = Candidate("b", None, None, (2,), prior_alpha=0.7, model_free=model_free)
        auto = AutoDrafter([a, b], costs, margin=0.2)
        for i in range(steps):  # b has run in this request: 2 drafted, 1 or 2 accepted
            auto.estimates["b"].record(2, 1 + i % 2, i % 2 == 0)
        auto.choice, auto.step = ("a", 2), auto.TENURE  # a has served its first steps
        assert 1.0 + 0.2 * auto.FREE_SWITCH < auto.speed("b", 2) / auto.speed("a", 2) < 1.2
        auto._decide()
        assert (auto.choice[0] == "b") == switched


def test_a_step_is_timed_whole_including_the_time_between_steps():
    """What a step costs besides its drafting counts as verifying, the time the loop spends between steps
    included: a consumer that holds each step for 50 s of the fake clock shows in the running candidate's timing."""
    clock = [0.0]

    def tick():
        clock[0] += 1.0
        return clock[0]

    greedy = Processing(temperature=0)
    auto = AutoDrafter(candidates(greedy)[:2], COSTS, clock=tick)
    auto.prime([torch.tensor(PROMPT)])
    events = speculative_generate(TableTarget(TARGET), auto, AutoRule(auto, GreedyMatch()), [torch.tensor(PROMPT)],
                                  processing=greedy, max_new_tokens=30, policy=AutoPolicy(auto))
    for _ in events:
        clock[0] += 50.0
    steps = sum(t.steps for t in auto._timing.values())
    assert steps >= 2 and all(t.verify_s >= 50.0 * t.steps for t in auto._timing.values()), auto._timing


def test_exploring_lengthens_a_draft_by_at_most_explore_reach_tokens():
    """Untested positions' raised acceptance may lengthen a draft, by EXPLORE_REACH tokens beyond the point
    estimate's best length at one decision: where wide windows cost much, a first step once drafted 9 for 4."""
    costs = Costs({n: 1.0 + 0.08 * n for n in range(1, 18)}, {"a": (0.0, 0.01)})
    auto = AutoDrafter([Candidate("a", None, None, tuple(range(1, 17)), prior_alpha=0.7)], costs)
    point = auto.best_length("a")[0]
    explored = auto.best_length("a", explore=True)[0]
    assert point < explored == point + auto.EXPLORE_REACH
    auto.EXPLORE_REACH = 16
    assert auto.best_length("a", explore=True)[0] > point + 2  # what exploring alone would have drafted


def test_exploring_grows_a_draft_by_what_its_steps_have_shown():
    """Exploring reaches at most EXPLORE_REACH past the method's own length until drafts have reached deeper
    `weight` times; its raise at a position fades with the steps that drafted that deep, tested there or not (drafts
    that break early never test their deep positions)."""
    costs = Costs({n: 1.0 + 0.02 * n for n in range(1, 18)}, {"a": (0.0, 0.001)})
    cand = Candidate("a", None, None, tuple(range(1, 17)), prior_alpha=0.95, default_length=3)
    auto = AutoDrafter([cand], costs)
    assert auto.best_length("a")[0] > 7  # the point estimate alone asks for a long draft
    assert auto.best_length("a", explore=True)[0] == 3 + auto.EXPLORE_REACH
    est = auto.estimates["a"]
    for _ in range(int(auto.weight)):  # drafts of 6 tokens, every one accepted: positions 1-6 are known
        est.record(6, 6, False)
    assert auto.best_length("a", explore=True)[0] == 6 + auto.EXPLORE_REACH
    # 8-token drafts rejected at the second token: positions 3-8 drafted (so tried) but never tested
    broken = AutoDrafter([cand], costs)
    for _ in range(12):
        broken.estimates["a"].record(8, 1, True)
    assert broken.estimates["a"].tested_at == [12, 12] and broken.estimates["a"].tried_at(8) == [12] * 8
    raised = broken._expected_by_length("a", 8, explore=True)[8] - broken._expected_by_length("a", 8)[8]
    untried = AutoDrafter([cand], costs)
    for _ in range(12):
        untried.estimates["a"].record(2, 1, True)
    assert raised < untried._expected_by_length("a", 8, explore=True)[8] - untried._expected_by_length("a", 8)[8]


def test_a_length_that_turned_out_too_long_is_re_lengthened_not_left():
    """The current candidate is judged at its best length, not at the one it runs: a draft that turned out too
    long is shortened, not a reason to switch to another candidate."""
    costs = Costs({n: 1.0 + 0.3 * n for n in range(1, 12)}, {"a": (0.0, 0.01), "b": (0.0, 0.01)})
    a = Candidate("a", None, None, tuple(range(1, 10)), prior_alpha=0.6)
    b = Candidate("b", None, None, tuple(range(1, 10)), prior_alpha=0.62)  # a little better than a at its best
    auto = AutoDrafter([a, b], costs, margin=0.2)
    auto.choice, auto.step = ("a", 9), auto.TENURE
    assert auto.best_length("a")[1] < auto.best_length("b")[1] < 1.2 * auto.best_length("a")[1]
    assert auto.best_length("b")[1] > 1.2 * auto.speed("a", 9)
    auto._decide()
    assert auto.choice[0] == "a" and auto.choice[1] < 9


def test_nondecreasing_fit_pools_adjacent_violators():
    assert nondecreasing([0.8, 0.6, 0.9]) == pytest.approx([0.7, 0.7, 0.9])
    assert nondecreasing([0.8, 0.6, 0.9], [3.0, 1.0, 1.0]) == pytest.approx([0.75, 0.75, 0.9])
    assert nondecreasing([0.1, 0.2, 0.3]) == [0.1, 0.2, 0.3]


def test_acceptance_by_position_follows_the_calibrated_profile():
    """The calibration's acceptance by position (rising with depth) makes a long draft worth its cost where one
    pooled alpha would keep it short; one rejection at a middle position lowers that position and its neighbours
    together (the estimates stay non-decreasing) rather than walling the draft off there."""
    costs = Costs({n: 1.0 + 0.1 * n for n in range(1, 18)}, {"a": (0.0, 0.05)})
    flat = Candidate("a", None, None, tuple(range(1, 17)), prior_alpha=0.8)
    rising = Candidate("a", None, None, tuple(range(1, 17)), prior_alpha=0.8,
                       prior_alpha_at=(0.7, 0.8, 0.9, 0.95))
    assert AutoDrafter([rising], costs).best_length("a")[0] > AutoDrafter([flat], costs).best_length("a")[0]
    auto = AutoDrafter([rising], costs)
    assert auto.alphas("a", 6) == pytest.approx([0.7, 0.8, 0.9, 0.95, 0.95, 0.95])
    auto.estimates["a"].record(3, 2, True)  # positions 1-2 accepted, 3 rejected
    alphas = auto.alphas("a", 6)
    assert alphas == sorted(alphas) and alphas[2] > 0.6
    assert alphas[2] < 0.9  # but lower than before


def test_a_candidate_not_yet_timed_verifies_at_the_timed_steps_ratio():
    """Verification is the target's forward whoever drafted: where the running drafter's verifications read 1.5 times
    the calibration, plain decoding and the other candidates are priced at 1.5 times theirs too (shrunk towards the
    calibration by TIMING_WEIGHT pseudo-steps), not at the calibration."""
    costs = Costs({1: 1.0, 2: 1.15, 3: 1.3, 4: 1.45}, {"cold": (0.0, 0.05), "hot": (0.0, 0.05)})
    auto = AutoDrafter(candidates()[:2], costs)
    assert auto.step_cost(PLAIN, 0) == pytest.approx(1.0)
    steps = 30
    timing = auto._timing.setdefault("cold", _Timing())
    timing.verify_predicted, timing.verify_s, timing.steps = steps * 1.3, steps * 1.3 * 1.5, steps
    ratio = (1.5 * steps + auto.TIMING_WEIGHT) / (steps + auto.TIMING_WEIGHT)
    assert auto.step_cost(PLAIN, 0) == pytest.approx(ratio)
    assert auto.step_cost("hot", 2) == pytest.approx(costs.draft("hot", 2) + ratio * costs.verify(3))


def test_timed_steps_correct_the_calibrated_costs():
    """With a clock, each candidate's drafting and verification are timed: a drafter whose proposals take far
    longer than calibrated loses the choice to one that keeps to its calibration (the first step after a switch,
    a catch-up, is not timed)."""
    clock = [0.0]

    class Slow:  # proposes as "cold" does, but each proposal takes 40 s of the fake clock
        def __init__(self, inner):
            self.inner = inner

        def propose(self, ctx, budget):
            clock[0] += 40.0
            return self.inner.propose(ctx, budget)

        def observe(self, verdict):
            self.inner.observe(verdict)

    greedy = Processing(temperature=0)
    cands = candidates(greedy)[:2]
    cands[0].drafter = Slow(cands[0].drafter)
    cands[0].prior_alpha, cands[1].prior_alpha = 0.8, 0.7
    costs = Costs({1: 1.0, 2: 1.15, 3: 1.3, 4: 1.45}, {"cold": (0.0, 0.05), "hot": (0.0, 0.05)})

    def tick():
        clock[0] += 1.0
        return clock[0]

    auto = AutoDrafter(cands, costs, clock=tick)
    auto.prime([torch.tensor(PROMPT)])
    assert auto.choice[0] == "cold"
    result = generate(TableTarget(TARGET), auto, AutoRule(auto, GreedyMatch()), [torch.tensor(PROMPT)],
                      processing=greedy, max_new_tokens=30, policy=AutoPolicy(auto))
    timing = auto._timing["cold"]
    assert timing.steps >= 1 and timing.draft_s > 10 * timing.draft_predicted
    assert auto.choice[0] != "cold" and auto.steps_by_method.get("hot", 0) > 0, auto.timeline
    plain = generate(TableTarget(TARGET), None, GreedyMatch(), [torch.tensor(PROMPT)], processing=greedy,
                     max_new_tokens=30)
    assert result.tokens == plain.tokens
    untimed = AutoDrafter(candidates(greedy)[:2], costs)  # no clock: the calibration alone
    assert untimed._timing == {} and untimed.step_cost("cold", 2) == pytest.approx(costs.draft("cold", 2)
                                                                                   + costs.verify(3))


def test_a_prompt_lookup_predicts_well_lifts_the_drafter_that_uses_lookup():
    """Before the first step, a drafter whose slots prompt lookup fills (draft-lookup) takes, position by position,
    the lookup's acceptance on this prompt in proportion to its hit rate where that is higher than its own prior,
    and its drafting is priced for the share of slots lookup fills at no draft forward."""
    costs = Costs({n: 1.0 + 0.1 * n for n in range(1, 18)}, {"dl": (0.1, 0.2), "look": (0.0, 0.0)})
    dl = Candidate("dl", None, None, (1, 2, 3, 4), prior_alpha=0.5, prior_alpha_at=(0.5, 0.6), lookup_part="look")
    look = Candidate("look", None, None, (1, 2, 3, 4), prior_alpha=0.9, shadow=True)
    auto = AutoDrafter([dl, look], costs)
    before = auto.step_cost("dl", 4)
    for _ in range(20):  # lookup drafted and was right at every step of the prompt
        auto.estimates["look"].record(4, 4, False)
    auto._lift_by_lookup(dl)
    hit = auto.hit_rate("look")
    assert hit > 0.8 and dl.prior_alpha_at[0] > 0.8 and list(dl.prior_alpha_at) == sorted(dl.prior_alpha_at)
    assert auto.step_cost("dl", 4) == pytest.approx(before - hit * 0.2 * 4)
    unlifted = Candidate("dl", None, None, (1, 2, 3, 4), prior_alpha=0.95, prior_alpha_at=(0.95,), lookup_part="look")
    hopeless = AutoDrafter([unlifted, Candidate("look", None, None, (1, 2), prior_alpha=0.1, shadow=True)], costs)
    hopeless._lift_by_lookup(unlifted)
    assert unlifted.prior_alpha_at[0] == 0.95  # never lowered


def test_probes_skip_candidates_the_point_estimate_rules_out():
    """An untried candidate is probed only while its point estimate is within the margin of the current choice:
    optimism alone (alpha near 1 before any test) does not buy a probe step."""
    costs = Costs({1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}, {"a": (0.0, 0.05), "b": (0.0, 0.05)})
    a = Candidate("a", None, None, (1, 2, 3), prior_alpha=0.9)
    far = Candidate("b", None, None, (1, 2, 3), prior_alpha=0.2)
    auto = AutoDrafter([a, far], costs)
    auto._decide(first=True)
    assert auto.choice[0] == "a"
    assert all(auto._probe() is None for _ in range(200))
    near = Candidate("b", None, None, (1, 2, 3), prior_alpha=0.88)
    auto = AutoDrafter([a, near], costs)
    auto._decide(first=True)
    assert any(auto._probe() is not None for _ in range(200))


def test_shadowing_learns_a_lookup_drafters_acceptance_during_plain_steps():
    """In plain decoding the point-mass candidate is proposed but not verified; what was committed tells its
    acceptance, so auto switches to it once it has been right often enough."""
    cands = candidates(Processing(temperature=0))
    costs = Costs({1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5, 7: 4.0},
                  {"cold": (5.0, 5.0), "hot": (5.0, 5.0), "lookup": (0.0, 0.0), "tree": (5.0, 0.0)})
    cands[2].prior_alpha = 0.0
    auto = AutoDrafter(cands, costs)
    auto.prime([torch.tensor([0])])
    assert auto.choice == (PLAIN, 0)
    # the draft's argmax chain agrees with the target's argmax on this table often: greedy decoding learns it
    result = generate(TableTarget(TARGET), auto, AutoRule(auto, GreedyMatch()), [torch.tensor(PROMPT)],
                      processing=Processing(temperature=0), max_new_tokens=40, policy=AutoPolicy(auto))
    assert sum(auto.estimates["lookup"].tested_at) > 0
    assert auto.steps_by_method.get("lookup", 0) > 0, auto.timeline
    plain = generate(TableTarget(TARGET), None, GreedyMatch(), [torch.tensor(PROMPT)],
                     processing=Processing(temperature=0), max_new_tokens=40)
    assert result.tokens == plain.tokens


# ---- layer 1: the exact oracle with switches at fixed steps ----------------------------------------------

SCHEDULE = [("cold", 2), (PLAIN, 0), ("tree", 2), ("lookup", 2), ("hot", 1), ("cold", 3)]


def proposals_for(name, length, prefix, mislabel_from=None):
    """Every proposal candidate `name` makes at `prefix` with its probability. mislabel_from: the control's bug,
    the tokens drawn by that earlier candidate's law but labelled with this one's."""
    laws = {"cold": lambda c: PLAIN_PROCESSING(DRAFT.logits(c)), "hot": lambda c: HOT(DRAFT.logits(c))}
    if name == PLAIN:
        return [(1.0, Draft.empty(1))]
    if name == "tree":
        return list(tree_proposals(laws["cold"], prefix, (2, 1), "without_replacement"))
    if name == "lookup":
        return list(chain_proposals(laws["cold"], prefix, length, point_mass=True))
    if mislabel_from is not None:
        return list(chain_proposals(laws[mislabel_from], prefix, length, reported_law=laws[name]))
    return list(chain_proposals(laws[name], prefix, length))


def switched_output(schedule, mislabel=False):
    """The exact law of the first HORIZON tokens when step s runs schedule[s] (AutoRule picks each step's rule)."""
    cands = {c.name: c for c in candidates()}
    auto = Scripted(schedule, list(cands.values()))
    rule = AutoRule(auto, ChainRejection())
    memo = {}

    def dist(prefix, need, step):
        if need <= 0:
            return {(): 1.0}
        if (prefix, need, step) in memo:
            return memo[(prefix, need, step)]
        name, length = schedule[step % len(schedule)]
        previous = schedule[(step - 1) % len(schedule)][0] if step else None
        buggy = mislabel and previous in ("cold", "hot") and name in ("cold", "hot") and previous != name
        out = defaultdict(float)
        for proposal_prob, proposal in proposals_for(name, length, list(prefix), previous if buggy else None):
            auto.step_rule = None if name == PLAIN else cands[name].rule  # what propose sets for this step
            decisions = rule.decision_probs(proposal, target_probs_for(proposal, TARGET, PLAIN_PROCESSING, prefix))
            for stop_prob, law, accepted in outcomes(proposal, decisions):
                for token in (law > 0).nonzero().flatten().tolist():
                    committed = tuple(accepted + [token])[:need]
                    weight = proposal_prob * stop_prob * float(law[token])
                    if weight == 0:
                        continue
                    for tail, p in dist(prefix + committed, need - len(committed), step + 1).items():
                        out[committed + tail] += weight * p
        memo[(prefix, need, step)] = dict(out)
        return memo[(prefix, need, step)]

    return dist(tuple(PROMPT), HORIZON, 0)


def test_oracle_switching_between_steps_is_exact():
    exact = target_joint(TARGET, PLAIN_PROCESSING, PROMPT, HORIZON)
    for rotation in (0, 2, 3):
        schedule = SCHEDULE[rotation:] + SCHEDULE[:rotation]
        assert max_abs_diff(switched_output(schedule), exact) < 1e-12, schedule


def test_oracle_negative_control_mislabelled_switch_is_caught():
    exact = target_joint(TARGET, PLAIN_PROCESSING, PROMPT, HORIZON)
    schedule = [("cold", 3), ("hot", 3)]
    assert max_abs_diff(switched_output(schedule), exact) < 1e-12
    assert max_abs_diff(switched_output(schedule, mislabel=True), exact) > 1e-3


# ---- layer 2: chi-square through the loop, with the cost model switching as it learns -----------------------

CHI_HORIZON, ROWS, BATCHES = 3, 250, 40
P_PASS, P_FAIL = 1e-4, 1e-6


class MislabelledSwitch(Scripted):
    """Bug: at a switch between the two chain drafters the first proposal keeps the tokens the previous drafter
    drew (by its law) but reports the new drafter's law."""

    def propose(self, ctx, budget):
        proposal = super().propose(ctx, budget)
        previous = self.schedule[(self.step - 1) % len(self.schedule)][0] if self.step else None
        if previous in ("cold", "hot") and self._running in ("cold", "hot") and previous != self._running:
            old = self.candidates[previous].drafter.propose(ctx, budget)
            law = self.candidates[self._running].drafter.law
            reported = torch.stack([torch.stack([law(row.tolist() + old.tokens[i, :d].tolist()) for d in range(budget)])
                                    for i, row in enumerate(ctx.tokens)])
            return Draft(old.tokens, reported)
        return proposal


def sampled(make_auto, prompt, seed=3, rows=ROWS):
    samples = []
    for batch in range(BATCHES):
        auto = make_auto(batch)
        result = generate(TableTarget(TARGET), auto, AutoRule(auto, ChainRejection()),
                          [torch.tensor(prompt)] * rows, processing=PLAIN_PROCESSING, max_new_tokens=CHI_HORIZON,
                          policy=AutoPolicy(auto), seed=seed * 1000 + batch)
        samples += [tuple(t) for t in result.tokens]
    return samples


def adaptive(batch):
    """The real decision rule with margin 0, on costs where every candidate is close: it switches as it learns."""
    auto = AutoDrafter(candidates(), COSTS, margin=0.0, prior_weight=1.0)
    auto.PROBE_EVERY = 1
    auto.prime([torch.tensor(PROMPT)])
    return auto


@pytest.mark.parametrize("prompt", [PROMPT, [3, 0, 1]])
def test_adaptive_auto_samples_the_target(prompt):
    seen = set()

    def make(batch):
        auto = adaptive(batch)
        seen.add(auto.choice[0])
        return auto

    fit = goodness_of_fit(sampled(make, prompt), target_joint(TARGET, PLAIN_PROCESSING, prompt, CHI_HORIZON))
    assert fit.p_value > P_PASS, fit


def test_scripted_switches_sample_the_target_and_the_mislabelled_switch_fails():
    exact = target_joint(TARGET, PLAIN_PROCESSING, PROMPT, CHI_HORIZON)
    schedule = [("hot", 2), ("cold", 2)]  # the control moves the law by TV 0.043 (the oracle's number)
    good = goodness_of_fit(sampled(lambda b: Scripted(schedule, candidates()), PROMPT, rows=1000), exact)
    assert good.p_value > P_PASS, good
    bad = goodness_of_fit(sampled(lambda b: MislabelledSwitch(schedule, candidates()), PROMPT, rows=1000), exact)
    assert bad.p_value < P_FAIL, bad


# ---- layer 2b: greedy equality through the loop ----------------------------------------------------------

def test_auto_greedy_equals_plain_greedy_through_switches():
    greedy = Processing(temperature=0)
    for schedule in (SCHEDULE, [("tree", 2), ("lookup", 3)], [(PLAIN, 0)]):
        auto = Scripted(schedule, candidates(greedy))
        auto.candidates["tree"].rule = GreedyTreeMatch()
        result = generate(TableTarget(TARGET), auto, AutoRule(auto, GreedyMatch()), [torch.tensor(PROMPT)] * 3,
                          processing=greedy, max_new_tokens=30, policy=AutoPolicy(auto))
        plain = generate(TableTarget(TARGET), None, GreedyMatch(), [torch.tensor(PROMPT)] * 3,
                         processing=greedy, max_new_tokens=30)
        assert result.tokens == plain.tokens, schedule
