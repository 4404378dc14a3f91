"""Counter-based noise, the one processed distribution, run statistics and draft-length policies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

import specgen.samplers.noise as noise_module
from specgen.errors import InvalidRequest
from specgen.samplers.acceptance import make_rule
from specgen.samplers.loop import generate
from specgen.samplers.noise import Purpose, chain_noise, counter_exponential, counter_uniform, tree_noise
from specgen.samplers.length_policies import FixedLength, HeuristicLength, make_policy
from specgen.samplers.processing import Processing
from specgen.samplers.stats import SpecStats, expected_tokens_per_step, ideal_speedup
from specgen.samplers.toy import TableLM, TableTarget
from specgen.samplers.types import DraftTree, Verdict

N = 100_000
CHUNK = 10_000  # keep each call small: large elementwise int64 ops are slow when CPU threads are oversubscribed


def draws(seed, sample, position, purpose, lane=0):
    """counter_uniform over a 1-D index tensor in one of sample/position/lane, computed in chunks."""
    for name, value in (("sample", sample), ("position", position), ("lane", lane)):
        if torch.is_tensor(value) and value.numel() > CHUNK:
            parts = []
            for start in range(0, value.numel(), CHUNK):
                args = {"sample": sample, "position": position, "lane": lane, name: value[start:start + CHUNK]}
                parts.append(counter_uniform(seed, args["sample"], args["position"], purpose, args["lane"]))
            return torch.cat(parts)
    return counter_uniform(seed, sample, position, purpose, lane)


# ---- counter_uniform -----------------------------------------------------------------------------

def test_counter_uniform_is_deterministic_and_float64():
    positions = torch.arange(1000)
    first = counter_uniform(5, 3, positions, Purpose.ACCEPT)
    second = counter_uniform(5, 3, positions.clone(), Purpose.ACCEPT)
    assert first.dtype == torch.float64 and first.shape == (1000,)
    assert torch.equal(first, second)


def test_counter_uniform_elementwise_equals_scalar_calls_and_broadcasts():
    samples, positions = torch.tensor([0, 1, 7]), torch.tensor([0, 3, 100, 2 ** 31])
    grid = counter_uniform(9, samples[:, None], positions[None, :], Purpose.EMIT, 2)
    assert grid.shape == (3, 4)
    for i, s in enumerate(samples.tolist()):
        for j, p in enumerate(positions.tolist()):
            assert float(grid[i, j]) == float(counter_uniform(9, s, p, Purpose.EMIT, 2))


def test_counter_uniform_is_strictly_inside_the_unit_interval():
    u = draws(0, 0, torch.arange(N), Purpose.ACCEPT)
    assert bool(((u > 0) & (u < 1)).all())
    u = draws(2 ** 63 + 12345, torch.arange(N), 7, Purpose.DRAFT, 3)
    assert bool(((u > 0) & (u < 1)).all())


@pytest.mark.parametrize("hash_bits", [0, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF])
def test_counter_uniform_extreme_hashes_stay_inside_the_unit_interval(monkeypatch, hash_bits):
    """Whatever the hash words are (here forced to all zeros, all ones, ...), the uniform is in (0, 1):
    u == 1 would reject a drafted token whose accept probability is exactly 1."""
    monkeypatch.setattr(noise_module, "_mix32", lambda x: np.full_like(np.asarray(x), hash_bits))
    u = float(counter_uniform(0, 0, 0, Purpose.ACCEPT))
    assert 0.0 < u < 1.0, repr(u)


def test_counter_uniform_differs_for_every_key_component():
    seeds = [0, 1, 7, 2 ** 32, 2 ** 32 + 1, 2 ** 40 + 3]  # seeds differing only above bit 32 must differ too
    samples, positions, lanes = torch.arange(4), torch.arange(64), torch.arange(4)
    values = [counter_uniform(seed, samples[:, None, None], positions[None, :, None], purpose, lanes[None, None, :])
              for seed in seeds for purpose in Purpose]
    flat = torch.cat([v.flatten() for v in values])
    assert flat.numel() == len(seeds) * len(Purpose) * 4 * 64 * 4
    assert flat.unique().numel() == flat.numel()


@pytest.mark.parametrize("axis", ["position", "sample", "lane", "seed"])
def test_counter_uniform_is_uniform_ks(axis):
    index = torch.arange(N)
    if axis == "position":
        u = draws(0, 0, index, Purpose.ACCEPT)
    elif axis == "sample":
        u = draws(3, index, 17, Purpose.EMIT)
    elif axis == "lane":
        u = draws(3, 1, 17, Purpose.DRAFT_GUMBEL, index)
    else:  # consecutive seeds, one draw each
        u = torch.stack([counter_uniform(seed, 0, 0, Purpose.ACCEPT) for seed in range(500)])
    assert scipy_stats.kstest(u.numpy(), "uniform").pvalue > 1e-3
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / len(u))


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def test_counter_uniform_pairwise_independence_sanity():
    bound = 5 / math.sqrt(N)  # five standard errors of a correlation estimate
    positions = torch.arange(N + 1)
    u = draws(0, 0, positions, Purpose.ACCEPT)
    assert abs(_corr(u[:-1], u[1:])) < bound  # adjacent positions
    assert abs(_corr(u[:-2], u[2:])) < bound
    accept = draws(0, 0, positions[:N], Purpose.ACCEPT)
    emit = draws(0, 0, positions[:N], Purpose.EMIT)
    assert abs(_corr(accept, emit)) < bound  # different purposes at the same position
    assert abs(_corr(draws(0, 0, positions[:N], Purpose.ACCEPT),
                     draws(0, 1, positions[:N], Purpose.ACCEPT))) < bound  # neighbouring samples
    assert abs(_corr(draws(0, 0, positions[:N], Purpose.ACCEPT),
                     draws(1, 0, positions[:N], Purpose.ACCEPT))) < bound  # neighbouring seeds
    assert abs(_corr(draws(0, 0, positions[:N], Purpose.DRAFT, 0),
                     draws(0, 0, positions[:N], Purpose.DRAFT, 1))) < bound  # neighbouring lanes
    # joint cells of adjacent pairs: a 4 x 4 contingency table looks independent
    cells = (u[:-1] * 4).long() * 4 + (u[1:] * 4).long()
    counts = torch.bincount(cells, minlength=16).numpy()
    assert scipy_stats.chisquare(counts).pvalue > 1e-3


def test_counter_exponential_is_positive_and_has_mean_one():
    e = torch.cat([counter_exponential(4, 0, torch.arange(i, i + CHUNK), Purpose.DRAFT_GUMBEL)
                   for i in range(0, N, CHUNK)])
    assert bool(torch.isfinite(e).all() & (e > 0).all())
    assert abs(float(e.mean()) - 1.0) < 5 / math.sqrt(N)
    assert scipy_stats.kstest(e.numpy(), "expon").pvalue > 1e-3


def test_chain_noise_is_keyed_by_absolute_position_not_by_batch_or_length():
    sample_ids, start = torch.tensor([0, 3, 1]), torch.tensor([5, 0, 12])
    accept, emit = chain_noise(8, sample_ids, start, 4)
    assert accept.shape == (3, 4) and emit.shape == (3, 5)
    short_accept, short_emit = chain_noise(8, sample_ids, start, 2)
    assert torch.equal(short_accept, accept[:, :2]) and torch.equal(short_emit, emit[:, :3])
    for row in range(3):
        one_accept, one_emit = chain_noise(8, sample_ids[row:row + 1], start[row:row + 1], 4)
        assert torch.equal(one_accept[0], accept[row]) and torch.equal(one_emit[0], emit[row])
    # drafted token i sits at position start + 1 + i
    assert float(accept[1, 2]) == float(counter_uniform(8, 3, 3, Purpose.ACCEPT))
    assert float(emit[2, 4]) == float(counter_uniform(8, 1, 17, Purpose.EMIT))


def test_tree_noise_lanes_are_sibling_ranks():
    depths, ranks = torch.tensor([[0, 1, 1, 2]]), torch.tensor([[0, 0, 1, 0]])
    accept, emit = tree_noise(2, torch.tensor([4]), torch.tensor([10]), depths, ranks)
    assert float(accept[0, 2]) == float(counter_uniform(2, 4, 11, Purpose.ACCEPT, 1))
    assert float(accept[0, 3]) == float(counter_uniform(2, 4, 12, Purpose.ACCEPT, 0))
    assert float(emit[0, 2]) == float(counter_uniform(2, 4, 12, Purpose.EMIT))
    assert float(accept[0, 1]) != float(accept[0, 2])  # siblings get different uniforms


# ---- Processing ----------------------------------------------------------------------------------

def test_temperature_zero_is_a_one_hot_on_the_first_maximal_index():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, 0.5, 0.5]], dtype=torch.float64)
    probs = Processing(temperature=0)(logits)
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    assert Processing(temperature=0).greedy and not Processing(temperature=0.5).greedy


def test_temperature_scales_logits():
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0], dtype=torch.float64)
    assert torch.allclose(Processing(temperature=0.5)(logits), torch.softmax(logits / 0.5, -1), atol=1e-15)
    assert torch.allclose(Processing()(logits), torch.softmax(logits, -1), atol=1e-15)


@pytest.mark.parametrize("top_k,kept", [
    (1, [1, 2]),  # ties at the k-th value are kept
    (2, [1, 2]),
    (3, [1, 2, 3]),
    (4, [0, 1, 2, 3, 4]),  # ties at the 4th value (1.0) are kept
    (0, [0, 1, 2, 3, 4]),  # off
    (9, [0, 1, 2, 3, 4]),  # larger than the vocabulary: off
])
def test_top_k_keeps_ties(top_k, kept):
    logits = torch.tensor([1.0, 3.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    probs = Processing(top_k=top_k)(logits)
    assert (probs > 0).nonzero().flatten().tolist() == kept
    expected = torch.softmax(logits[kept], -1)
    assert torch.allclose(probs[kept], expected, atol=1e-15)


@pytest.mark.parametrize("top_p,expected", [
    (0.45, [0, 1, 0, 0]),  # 0.5 alone reaches 0.45
    (0.5, [0, 1, 0, 0]),  # exactly reached: no further token
    (0.75, [0, 2 / 3, 0, 1 / 3]),
    (0.55, [0, 2 / 3, 0, 1 / 3]),  # 0.5 + 0.25
    (0.8, [1 / 7, 4 / 7, 0, 2 / 7]),  # plus the first of the tied 0.125s (stable order)
    (0.9, [0.125, 0.5, 0.125, 0.25]),
    (1.0, [0.125, 0.5, 0.125, 0.25]),
])
def test_top_p_keeps_the_smallest_prefix_reaching_top_p(top_p, expected):
    logits = torch.tensor([0.125, 0.5, 0.125, 0.25], dtype=torch.float64).log()
    probs = Processing(top_p=top_p)(logits)
    assert probs.tolist() == pytest.approx(expected, abs=1e-12)


def test_top_k_then_top_p_then_temperature_compose():
    logits = torch.tensor([[0.0, 2.0, 1.0, 3.0, -1.0]], dtype=torch.float64)
    probs = Processing(temperature=2.0, top_k=3, top_p=0.6)(logits)
    base = torch.softmax(torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64) / 2.0, -1)  # tokens 1, 2, 3
    # sorted: 3 (0.506), 1 (0.307), 2 (0.186): mass before token 1 is 0.506 < 0.6, before 2 is 0.81
    kept = torch.tensor([0.0, base[0], 0.0, base[2], 0.0], dtype=torch.float64)
    assert torch.allclose(probs, kept / kept.sum(), atol=1e-12)


def test_guidance_combines_cond_and_uncond():
    gen = torch.Generator().manual_seed(0)
    cond = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64)
    uncond = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64)
    for scale in (0.0, 1.0, 1.5, 4.0):
        probs = Processing(guidance_scale=scale)(cond, None, uncond)
        assert torch.allclose(probs, torch.softmax(uncond + scale * (cond - uncond), -1), atol=1e-12)
    greedy = Processing(temperature=0, guidance_scale=3.0)(cond, None, uncond)
    assert torch.equal(greedy.argmax(-1), (uncond + 3.0 * (cond - uncond)).argmax(-1))
    assert torch.equal(Processing(guidance_scale=3.0).logits(cond, None, uncond), uncond + 3.0 * (cond - uncond))


def test_guidance_without_uncond_logits_is_an_invalid_request():
    with pytest.raises(InvalidRequest):
        Processing(guidance_scale=2.0)(torch.zeros(1, 5))


def test_hooks_get_positions_and_run_after_guidance_before_temperature():
    seen = []

    def forbid_position_token(logits, positions):
        seen.append((logits.clone(), positions.clone()))
        banned = torch.nn.functional.one_hot(positions % logits.shape[-1], logits.shape[-1]).bool()
        return logits.masked_fill(banned, float("-inf"))

    cond = torch.randn(2, 3, 5, dtype=torch.float64)
    uncond = torch.randn(2, 3, 5, dtype=torch.float64)
    positions = torch.tensor([[4, 5, 6], [0, 1, 2]])
    probs = Processing(temperature=0.5, guidance_scale=2.0, hooks=(forbid_position_token,))(cond, positions, uncond)
    assert len(seen) == 1
    assert torch.equal(seen[0][1], positions)
    assert torch.allclose(seen[0][0], uncond + 2.0 * (cond - uncond))  # guided, not yet divided by temperature
    assert bool((probs.gather(-1, (positions % 5)[..., None]) == 0).all())
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3, dtype=torch.float64))


def test_processing_dtypes():
    assert Processing()(torch.zeros(3, dtype=torch.float64)).dtype == torch.float64
    assert Processing()(torch.zeros(3, dtype=torch.bfloat16)).dtype == torch.float32
    assert Processing(temperature=0)(torch.zeros(3, dtype=torch.float16)).dtype == torch.float32


@pytest.mark.parametrize("options", [
    dict(temperature=-0.1), dict(temperature=float("nan")),
    dict(top_p=0.0), dict(top_p=-0.5), dict(top_p=1.5), dict(top_p=float("nan")),
    dict(top_k=-1),
])
def test_invalid_processing_raises_invalid_request(options):
    with pytest.raises(InvalidRequest):
        Processing(**options)


# ---- stats ---------------------------------------------------------------------------------------

def test_expected_tokens_per_step():
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens_per_step(0.0, 3) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.8, 8) == pytest.approx((1 - 0.8 ** 9) / 0.2)


def test_ideal_speedup_worked_values():
    best = max(range(1, 31), key=lambda g: ideal_speedup(0.8, g, 0.05))
    assert best == 8
    assert ideal_speedup(0.8, 8, 0.05) == pytest.approx(3.09, abs=0.005)
    assert ideal_speedup(0.70, 4, 0.3) == pytest.approx(1.26, abs=0.005)
    assert ideal_speedup(0.85, 4, 0.3) == pytest.approx(1.69, abs=0.005)
    assert ideal_speedup(0.70, 4, 0.1) == pytest.approx(1.98, abs=0.005)
    assert ideal_speedup(0.85, 4, 0.1) == pytest.approx(2.65, abs=0.005)
    for c, gamma in ((0.01, 7), (0.02, 6), (0.05, 4), (0.1, 3)):  # OSD's search over [1, 99] at alpha 0.6
        assert max(range(1, 100), key=lambda g: ideal_speedup(0.6, g, c)) == gamma
    for alpha, c in ((0.6, 0.1), (0.9, 0.3)):  # Corollary 3.9 at gamma = 1
        assert ideal_speedup(alpha, 1, c) == pytest.approx((1 + alpha) / (1 + c))
    assert ideal_speedup(0.0, 4, 0.0) == 1.0


def _verdict(tokens, num_accepted, num_drafted):
    return Verdict.from_chain(torch.tensor(tokens), torch.tensor(num_accepted), torch.tensor(num_drafted))


def test_spec_stats_on_hand_made_verdicts():
    first = _verdict([[1, 2, 3, 4, 5], [1, 6, -1, -1, -1], [2, 3, 4, -1, -1]], [4, 1, 2], [4, 4, 2])
    assert first.source.tolist() == [[0, 0, 0, 0, 2], [0, 1, -1, -1, -1], [0, 0, 2, -1, -1]]
    assert first.num_committed.tolist() == [5, 2, 3] and first.num_rejections.tolist() == [0, 1, 0]
    second = _verdict([[6, -1, -1, -1]], [0], [3])  # rejected at the first drafted token
    stats = SpecStats()
    stats.update(first, committed=10, draft_s=0.1, verify_s=0.2, window=5)
    stats.update(second, committed=1, draft_s=0.05, verify_s=0.1, window=4)
    summary = stats.summary(method="draft", lossless=True, wall_s=2.0, ar_step_s=0.08)
    assert summary["method"] == "draft" and summary["lossless"] is True
    assert (summary["steps"], summary["row_steps"]) == (2, 4)
    assert (summary["drafted"], summary["accepted"], summary["rejections"], summary["committed"]) == (13, 7, 2, 11)
    assert summary["tau"] == pytest.approx(11 / 4)
    assert summary["acceptance_rate"] == pytest.approx(7 / 13)
    assert summary["alpha_hat"] == pytest.approx(7 / 9)
    # depth 0: tested by all 4 rows, accepted by 3; depth 1: tested 3, accepted 2; depths 2, 3: 1 of 1
    assert summary["per_position_acceptance"] == pytest.approx([3 / 4, 2 / 3, 1.0, 1.0])
    assert summary["mean_draft_length"] == pytest.approx(13 / 4)
    assert summary["tokens_per_s"] == pytest.approx(11 / 2.0)
    assert summary["verify_s_by_window"] == pytest.approx({4: 0.1, 5: 0.2})
    assert summary["wall_s"] == 2.0
    draft_token_s, step_s = 0.15 / 13, 0.3 / 2
    # E(alpha, gamma) over the four rows' own draft lengths 4, 4, 2 and 3, not at their mean 13/4
    expected = sum(expected_tokens_per_step(7 / 9, g) for g in (4, 4, 2, 3)) / 4
    assert expected < expected_tokens_per_step(7 / 9, 13 / 4)
    assert summary["predicted_speedup_ideal"] == pytest.approx(expected / (13 / 4 * draft_token_s / 0.08 + 1))
    assert summary["predicted_speedup_measured"] == pytest.approx(expected * 0.08 / (13 / 4 * draft_token_s + step_s))


def test_predicted_speedups_of_a_fixed_length_are_leviathans():
    stats = SpecStats()
    for _ in range(3):
        stats.update(_verdict([[1, 2, 3, 4], [5, 9, -1, -1]], [3, 1], [3, 3]), committed=6, draft_s=0.03,
                     verify_s=0.1, window=4)
    summary = stats.summary(method="draft", lossless=True, wall_s=1.0, ar_step_s=0.05)
    alpha, draft_token_s = 4 / 5, 0.09 / 18
    assert summary["predicted_speedup_ideal"] == pytest.approx(ideal_speedup(alpha, 3, draft_token_s / 0.05))
    assert summary["predicted_speedup_measured"] == pytest.approx(
        expected_tokens_per_step(alpha, 3) * 0.05 / (3 * draft_token_s + 0.1))


def test_spec_stats_plain_decoding():
    lm = TableLM(5, order=1, seed=0)
    processing = Processing()
    result = generate(TableTarget(lm), None, make_rule("none", processing), [torch.tensor([1]), torch.tensor([2, 3])],
                      processing=processing, max_new_tokens=6, seed=1)
    summary = result.stats
    assert summary["steps"] == 6 and summary["row_steps"] == 12 and summary["committed"] == 12
    assert summary["tau"] == 1.0
    assert summary["drafted"] == 0 and summary["accepted"] == 0
    assert summary["acceptance_rate"] is None and summary["alpha_hat"] is None
    assert summary["per_position_acceptance"] == []
    assert all(source == (2,) for source in (e.sources for e in result.events))  # every token is a bonus token


def test_fixed_length_policy():
    policy = FixedLength(3)
    verdict = _verdict([[6, -1, -1, -1]], [0], [3])
    for _ in range(3):
        policy.observe(verdict)
        assert policy.next_length() == 3
    assert FixedLength(0).next_length() == 0
    with pytest.raises(InvalidRequest):
        FixedLength(-1)


def test_heuristic_length_policy():
    all_accepted = _verdict([[1, 2, 3], [1, 2, 3]], [2, 2], [2, 2])
    one_rejected = _verdict([[1, 2, 3], [1, 9, -1]], [2, 1], [2, 2])
    policy = HeuristicLength(5, minimum=2, maximum=10)
    assert policy.next_length() == 5
    policy.observe(all_accepted)
    assert policy.next_length() == 7
    policy.observe(all_accepted)
    policy.observe(all_accepted)
    assert policy.next_length() == 10  # capped at the maximum
    policy.observe(one_rejected)
    assert policy.next_length() == 9
    for _ in range(20):
        policy.observe(one_rejected)
    assert policy.next_length() == 2  # never below the minimum
    policy.observe(all_accepted)
    assert policy.next_length() == 4
    for bad in (dict(num_draft_tokens=0, minimum=0), dict(num_draft_tokens=3, minimum=4),
                dict(num_draft_tokens=70, maximum=64)):
        with pytest.raises(InvalidRequest):
            HeuristicLength(**bad)


def test_make_policy():
    assert isinstance(make_policy("fixed", 4), FixedLength) and make_policy("fixed", 4).next_length() == 4
    assert isinstance(make_policy("heuristic", 4), HeuristicLength) and make_policy("heuristic", 4).next_length() == 4
    with pytest.raises(InvalidRequest):
        make_policy("no-such-schedule", 4)


def test_tree_prediction_uses_the_measured_acceptance_by_rank():
    """Sequoia's F(T) from the measured vector: root children of ranks 0 and 1, a grandchild under rank 0.
    Steps accept (rank 0, then its child), (rank 1), (nothing): rank 0 is accepted 2 of 4 times its parent was
    tested, rank 1 once of 3, so a step expects 1 + a0 + a1 + a0 * a0 tokens."""
    tree = DraftTree.from_parents([5, 6, 7, 8], [-1, 0, 0, 1])
    stats = SpecStats()
    for path, accepted in (([0, 1, 3], 2), ([0, 2, -1], 1), ([0, -1, -1], 0)):
        verdict = Verdict.from_chain(torch.tensor([[1] * (accepted + 1) + [-1] * (2 - accepted)]),
                                     torch.tensor([accepted]), torch.tensor([3]), accepted_path=torch.tensor([path]))
        stats.update(verdict, committed=accepted + 1, draft_s=0.01, verify_s=0.1, window=4, tree=tree)
    assert stats.rank_tested == [4, 3] and stats.rank_accepted == [2, 1]
    a0, a1 = 0.5, 1 / 3
    assert stats.tree_expected_tokens() == pytest.approx(1 + a0 + a1 + a0 * a0)
    summary = stats.summary(method="sequoia", lossless=True, wall_s=1.0, ar_step_s=0.05)
    assert summary["tau"] == pytest.approx(2.0)
    assert summary["predicted_speedup_measured"] == pytest.approx((1 + a0 + a1 + a0 * a0) * 0.05 / (0.01 + 0.1))


def test_decoding_freezes_the_collector_once_per_loaded_model(monkeypatch):
    """`gc.freeze` keeps full collections from walking a loaded model's objects; it runs the first time a model
    decodes and never again for it (a frozen object is never collected as a cycle, so freezing every request
    would keep each request's cyclic garbage), and never for targets without a model."""
    import gc

    from specgen.samplers import loop

    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(1))
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    for model in (first, first, None, object(), second, first, second):
        loop._freeze_once(model)
    assert len(calls) == 2
