"""Adaptive draft-length policies: SVIP's entropy stop, Kangaroo's confidence stop and the cost model, as units.
Their invariance (greedy output identical with and without each policy, sampled output following the target) is
tested on a tiny transformers pair in tests/modalities/test_tree_drafter.py."""

import math

import pytest
import torch

from specgen.errors import InvalidRequest
from specgen.samplers.length_policies import (ConfidenceLength, CostModelLength, SvipLength, entropy,
                                              predicted_best_gamma)
from specgen.samplers.length_policies import POLICIES, make_policy
from specgen.samplers.stats import SpecStats, expected_tokens_per_step
from specgen.samplers.types import Verdict

PEAKED = torch.tensor([[0.97, 0.01, 0.01, 0.01]])
FLAT = torch.full((1, 4), 0.25)


def test_entropy():
    assert entropy(FLAT).item() == pytest.approx(math.log(4))
    assert entropy(torch.tensor([[1.0, 0.0]])).item() == 0.0


def test_svip_stops_after_an_uncertain_token():
    svip = SvipLength(16, threshold=0.3)  # sqrt(0.15 * H) > 0.3  <=>  H > 0.6 nats
    laws = torch.cat([PEAKED, FLAT])
    assert svip.stop(laws, torch.cat([FLAT, PEAKED]), 1).tolist() == [True, False]  # the previous law decides
    assert svip.next_length() == 16


def test_kangaroo_stops_before_an_unconfident_token():
    kangaroo = ConfidenceLength(6, threshold=0.6)
    assert kangaroo.stop(torch.cat([PEAKED, FLAT]), torch.cat([FLAT, FLAT]), 2).tolist() == [False, True]


def _stats(windows: dict[int, float], accepted: int, rejections: int, drafted: int, draft_s: float) -> SpecStats:
    stats = SpecStats(accepted=accepted, rejections=rejections, drafted=drafted, draft_s=draft_s)
    for n, seconds in windows.items():
        stats.verify_by_window[n] = [seconds * 4, 4]
    return stats


@pytest.mark.parametrize("alpha,draft_s,slope", [(0.8, 0.001, 0.0005), (0.5, 0.004, 0.002), (0.95, 0.0005, 0.0),
                                                 (0.3, 0.01, 0.01)])
def test_cost_model_picks_the_gamma_of_the_formula(alpha, draft_s, slope):
    verify = lambda n: 0.02 + slope * n
    stats = _stats({2: verify(2), 6: verify(6)}, accepted=int(1000 * alpha), rejections=1000 - int(1000 * alpha),
                   drafted=1000, draft_s=1000 * draft_s)
    choice = CostModelLength(5).decide(stats)
    best = predicted_best_gamma(alpha, verify(1), draft_s, verify, 16)
    assert choice["gamma"] == best
    assert choice["verify_slope_s"] == pytest.approx(slope) and choice["alpha"] == pytest.approx(alpha)
    brute = max(range(1, 17), key=lambda g: expected_tokens_per_step(alpha, g) * verify(1) / (g * draft_s + verify(g + 1)))
    assert best == brute


def test_cost_model_explores_then_decides():
    stats = _stats({2: 0.021, 6: 0.025}, accepted=90, rejections=10, drafted=100, draft_s=0.1)
    policy = make_policy("cost", 4)
    policy.attach(stats)
    verdict = Verdict(torch.tensor([1]), torch.tensor([[3, 4]]), torch.tensor([[0, 2]]), torch.tensor([4]))
    lengths = [policy.next_length()]
    for _ in range(4):
        policy.observe(verdict)
        lengths.append(policy.next_length())
    assert lengths[:3] == [4, 1, 4] and lengths[3] == policy.choice["gamma"] > 4  # cheap drafts, good alpha
    # without measurements it keeps its length
    blind = CostModelLength(3)
    for _ in range(5):
        blind.observe(verdict)
    assert blind.next_length() == 3


def test_registry_of_schedules():
    assert {"fixed", "heuristic", "svip", "kangaroo", "cost"} <= set(POLICIES)
    assert make_policy("svip", 12).next_length() == 12
    with pytest.raises(InvalidRequest):
        make_policy("sometimes", 3)
    with pytest.raises(InvalidRequest):
        make_policy("kangaroo", 0)


# ---- TETRIS -----------------------------------------------------------------------------------------------------

def test_tetris_selection_is_optimal_by_brute_force():
    import itertools

    from specgen.samplers.tetris import tetris_select

    generator = torch.Generator().manual_seed(0)
    for trial in range(30):
        batch, k = 3, 4
        estimates = torch.rand(batch, k, generator=generator, dtype=torch.float64)
        drafted = torch.randint(0, k + 1, (batch,), generator=generator)
        capacity = int(torch.randint(0, 9, (1,), generator=generator))
        kept = tetris_select(estimates, capacity, drafted)
        assert bool((kept <= drafted).all()) and int(kept.sum()) == min(capacity, int(drafted.sum()))
        cumulative = estimates.cumprod(-1)
        value = lambda counts: sum(float(cumulative[b, :c].sum()) for b, c in enumerate(counts))
        best = max(value(c) for c in itertools.product(*[range(int(d) + 1) for d in drafted])
                   if sum(c) <= capacity)
        assert value(kept.tolist()) == pytest.approx(best, abs=1e-12)


def test_tetris_with_a_slot_cost_keeps_the_prefix_that_pays_best_by_brute_force():
    """With a slot cost the budget is a cap: of all selections of at most `capacity` tokens (prefixes per row), the
    kept one maximises expected committed tokens per cost, (batch + sum P) / (1 + cost (batch + kept))."""
    import itertools

    from specgen.samplers.tetris import tetris_select

    generator = torch.Generator().manual_seed(1)
    cut_somewhere = False
    for trial in range(40):
        batch, k, cost = 3, 4, float(torch.empty(1).uniform_(0.01, 0.4, generator=generator))
        estimates = torch.rand(batch, k, generator=generator, dtype=torch.float64) ** 0.5
        drafted = torch.randint(0, k + 1, (batch,), generator=generator)
        capacity = int(torch.randint(0, 9, (1,), generator=generator))
        kept = tetris_select(estimates, capacity, drafted, slot_cost=cost)
        cumulative = estimates.cumprod(-1)
        rate = lambda counts: ((batch + sum(float(cumulative[b, :c].sum()) for b, c in enumerate(counts)))
                               / (1 + cost * (batch + sum(counts))))
        best = max(rate(c) for c in itertools.product(*[range(int(d) + 1) for d in drafted]) if sum(c) <= capacity)
        assert bool((kept <= drafted).all()) and int(kept.sum()) <= capacity
        assert rate(kept.tolist()) == pytest.approx(best, abs=1e-12)
        cut_somewhere |= int(kept.sum()) < min(capacity, int(drafted.sum()))
    assert cut_somewhere  # the cost changed some selections


def test_tetris_history_estimate_follows_each_rows_acceptance():
    """The history estimate: accepted over tested tokens per row (a rejection counts as tested, untested drafts
    do not), shrunk towards the batch's rate, decaying towards it for rows left unverified."""
    from specgen.samplers.tetris import TetrisDrafter
    from specgen.samplers.types import DecodeContext, Draft, Verdict

    class Lookup:  # point-mass drafts of 4 tokens for every row
        def propose(self, ctx, budget):
            return Draft(torch.ones(len(ctx.tokens), budget, dtype=torch.long))

        def observe(self, verdict):
            pass

    drafter = TetrisDrafter(Lookup(), capacity=4, estimate="history", decay=0.5)
    ctx = DecodeContext([torch.tensor([1, 2])] * 2, torch.tensor([0, 1]), torch.tensor([0, 1]), 0)
    first = drafter.propose(ctx, 4)
    assert first.drafted().tolist() == [2, 2]  # equal estimates: the budget is split, ties to the lower row
    for _ in range(6):  # row 0 accepts everything it drafts, row 1 rejects its first token
        drafter.propose(ctx, 4)
        drafter.observe(Verdict(torch.tensor([2, 0]), torch.zeros(2, 3, dtype=torch.long),
                                torch.zeros(2, 3, dtype=torch.long), torch.tensor([2, 2])))
    assert drafter.acceptance_rate(0) > 0.9 and drafter.acceptance_rate(1) < 0.5
    assert drafter.propose(ctx, 4).drafted().tolist() == [4, 0]  # the budget goes to the row that accepts
    with pytest.raises(InvalidRequest, match="unknown TETRIS estimate"):
        TetrisDrafter(Lookup(), capacity=4, estimate="guess")
    with pytest.raises(InvalidRequest, match="slot_cost"):
        TetrisDrafter(Lookup(), capacity=4, slot_cost=-1)


def _tetris_fit(estimate, capacity: int = 6000, slot_cost: float = 0.0):
    from specgen.samplers.acceptance import ChainRejection
    from specgen.samplers.chisquare import goodness_of_fit
    from specgen.samplers.tetris import TetrisDrafter
    from specgen.samplers.loop import generate
    from specgen.samplers.oracle import target_joint
    from specgen.samplers.length_policies import FixedLength
    from specgen.samplers.processing import Processing
    from specgen.samplers.toy import TableDrafter, TableLM, TableTarget

    target = TableLM(4, order=1, seed=31)
    draft = target.mixed_with(TableLM(4, order=1, seed=32, scale=3.0), 0.7)
    samples = 6000
    drafter = TetrisDrafter(TableDrafter(draft, Processing()), capacity=capacity, estimate=estimate,
                            slot_cost=slot_cost)
    result = generate(TableTarget(target), drafter, ChainRejection(), [torch.tensor([1, 2])] * samples,
                      processing=Processing(), max_new_tokens=3, policy=FixedLength(3), seed=9)
    fit = goodness_of_fit([tuple(t) for t in result.tokens], target_joint(target, Processing(), [1, 2], 3))
    return result, fit


@pytest.mark.slow
def test_tetris_through_the_loop_samples_the_target():
    """With token-free estimates the cut depends only on what was drawn before each token: exact (chi-square
    against the exact joint), while the batch drafts fewer tokens than it could."""
    result, fit = _tetris_fit("confidence")
    assert fit.p_value > 1e-4, fit
    assert result.stats["drafted"] <= 6000 * result.stats["steps"]  # the capacity, not 3 per row


@pytest.mark.slow
def test_tetris_with_history_estimates_and_a_slot_cost_samples_the_target():
    """Estimates from each row's past verdicts, a binding budget (1.5 drafted tokens per row on average) and a
    slot cost that leaves some drafts unverified: still exact, the cut depends on the past alone."""
    result, fit = _tetris_fit("history", capacity=9000, slot_cost=0.05)
    assert fit.p_value > 1e-4, fit
    assert result.stats["drafted"] <= 9000 * result.stats["steps"]


@pytest.mark.slow
def test_tetris_keyed_by_the_drafted_token_is_caught():
    """Negative control: ranking a token by its own draft probability lets its draw decide whether it is verified."""
    _, fit = _tetris_fit("drafted_token")
    assert fit.p_value < 1e-6, fit


def test_the_length_schedule_knob_names_every_policy():
    """The registry is torch-free, so it spells the schedules out; they must be the policies that exist."""
    from specgen.samplers.length_policies import POLICIES
    from specgen.samplers.registry import LENGTH_SCHEDULE

    assert set(LENGTH_SCHEDULE.choices) == set(POLICIES)
