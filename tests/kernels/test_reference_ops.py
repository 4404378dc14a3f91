"""Exact input/output tables for the verification ops in `specgen.kernels` (the torch reference is the
specification every other backend must match). Probabilities are dyadic so every expectation is exact."""

from __future__ import annotations

import pytest
import torch

from specgen import kernels
from specgen.kernels import dispatch
from specgen.errors import InvalidRequest
from specgen.samplers.chisquare import goodness_of_fit

P = kernels.PLACEHOLDER
V = 7  # odd vocabulary
TINY = 2.0 ** -54  # the smallest uniform the counter noise produces
TOP = 1.0 - 2.0 ** -53  # the largest float64 below 1


def dist(entries: dict[int, float], vocab: int = V) -> torch.Tensor:
    probs = torch.zeros(vocab, dtype=torch.float64)
    for index, prob in entries.items():
        probs[index] = prob
    return probs


def u(*values) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


# One row, k = 3. Drafted tokens [2, 5, 1]:
#   slot 0: target(2) = .5,  draft(2) = .5  -> accept prob 1
#   slot 1: target(5) = .25, draft(5) = .5  -> accept prob .5; residual = {1, 3, 4} each 1/3
#   slot 2: target(1) = .75, draft(1) = .25 -> accept prob 1
#   slot 3: bonus law {3: .5, 5: .5}
TARGET = torch.stack([
    dist({1: .25, 2: .5, 3: .25}),
    dist({1: .25, 3: .25, 4: .25, 5: .25}),
    dist({0: .25, 1: .75}),
    dist({3: .5, 5: .5}),
])[None]
DRAFT = torch.stack([dist({2: .5, 3: .5}), dist({5: .5, 6: .5}), dist({0: .75, 1: .25})])[None]
TOKENS = torch.tensor([[2, 5, 1]])


def run(tokens, draft_probs, target_probs, num_drafted, accept_u, emit_u):
    out, num_accepted = kernels.rejection_sample(tokens, draft_probs, target_probs, torch.as_tensor(num_drafted),
                                                 accept_u, emit_u)
    return out.tolist(), num_accepted.tolist()


# ---- greedy_verify -------------------------------------------------------------------------------

@pytest.mark.parametrize("draft,argmax,num_drafted,expected,accepted", [
    ([[3, 1, 4]], [[3, 1, 4, 6]], [3], [[3, 1, 4, 6]], [3]),  # perfect match + bonus
    ([[3, 1, 4]], [[3, 2, 4, 6]], [3], [[3, 2, P, P]], [1]),  # mismatch at slot 1; the later match is ignored
    ([[5, 1, 4]], [[3, 1, 4, 6]], [3], [[3, P, P, P]], [0]),  # mismatch at slot 0
    ([[0, 0, 0]], [[0, 0, 1, 2]], [3], [[0, 0, 1, P]], [2]),
])
def test_greedy_verify_single_row(draft, argmax, num_drafted, expected, accepted):
    out, num_accepted = kernels.greedy_verify(torch.tensor(draft), torch.tensor(argmax), torch.tensor(num_drafted))
    assert out.tolist() == expected
    assert num_accepted.tolist() == accepted


def test_greedy_verify_empty_draft_gives_one_bonus_token():
    out, num_accepted = kernels.greedy_verify(torch.zeros(2, 0, dtype=torch.long), torch.tensor([[5], [2]]),
                                              torch.tensor([0, 0]))
    assert out.tolist() == [[5], [2]]
    assert num_accepted.tolist() == [0, 0]


def test_greedy_verify_ragged_rows():
    draft = torch.tensor([[3, 1, 4], [2, 2, 2], [6, 0, 0], [1, 1, 6]])
    argmax = torch.tensor([[3, 1, 4, 6], [2, 2, 2, 5], [6, 0, 0, 1], [1, 0, 6, 6]])
    out, num_accepted = kernels.greedy_verify(draft, argmax, torch.tensor([3, 1, 0, 2]))
    # Tokens after num_drafted are never accepted even where they match; the bonus comes from slot num_drafted.
    assert out.tolist() == [[3, 1, 4, 6], [2, 2, P, P], [6, P, P, P], [1, 0, P, P]]
    assert num_accepted.tolist() == [3, 1, 0, 1]


def test_greedy_verify_accepts_placeholder_padded_drafts():
    draft = torch.tensor([[3, P, P], [2, 2, P]])
    out, num_accepted = kernels.greedy_verify(draft, torch.tensor([[3, 4, 4, 4], [2, 2, 6, 6]]), torch.tensor([1, 2]))
    assert out.tolist() == [[3, 4, P, P], [2, 2, 6, P]]
    assert num_accepted.tolist() == [1, 2]


# ---- rejection_sample ----------------------------------------------------------------------------

@pytest.mark.parametrize("emit_last,bonus", [(0.75, 5), (0.25, 3), (TOP, 5), (TINY, 3)])
def test_rejection_sample_perfect_match_then_bonus(emit_last, bonus):
    out = run(TOKENS, DRAFT, TARGET, [3], u(0.9, 0.25, TOP), u(0.5, 0.5, 0.5, emit_last))
    assert out == ([[2, 5, 1, bonus]], [3])


@pytest.mark.parametrize("emit,recovered", [(0.1, 1), (0.5, 3), (0.9, 4), (TINY, 1), (TOP, 4)])
def test_rejection_sample_mismatch_recovers_from_the_residual(emit, recovered):
    # slot 1 (accept prob .5) is rejected; the residual {1, 3, 4} never returns the rejected token 5
    out = run(TOKENS, DRAFT, TARGET, [3], u(0.9, 0.75, 0.1), u(0.5, emit, 0.5, 0.5))
    assert out == ([[2, recovered, P, P]], [1])


def test_rejection_sample_acceptance_is_strict_u_below_ratio():
    assert run(TOKENS, DRAFT, TARGET, [3], u(0.9, 0.5, 0.1), u(0.5, 0.1, 0.5, 0.5))[1] == [1]  # u == ratio rejects
    assert run(TOKENS, DRAFT, TARGET, [3], u(0.9, 0.5 - 2 ** -53, 0.1), u(0.5, 0.1, 0.5, 0.5))[1] == [3]


def test_rejection_sample_rejects_at_slot_zero():
    tokens = torch.tensor([[3, 5, 1]])  # slot 0: target(3) = .25, draft(3) = .5 -> .5; residual = {1: 1}
    assert run(tokens, DRAFT, TARGET, [3], u(0.6, TINY, TINY), u(0.99, 0.5, 0.5, 0.5)) == ([[1, P, P, P]], [0])


def test_rejection_sample_empty_draft_gives_one_bonus_token():
    target = torch.stack([dist({4: 1.0}), dist({0: .5, 6: .5})])[:, None]  # [2, 1, V]
    for draft_probs in (None, torch.zeros(2, 0, V, dtype=torch.float64)):
        out = run(torch.zeros(2, 0, dtype=torch.long), draft_probs, target, [0, 0],
                  torch.zeros(2, 0, dtype=torch.float64), torch.tensor([[0.3], [0.7]], dtype=torch.float64))
        assert out == ([[4], [6]], [0, 0])


def test_rejection_sample_ragged_rows():
    tokens = TOKENS.repeat(3, 1)
    out = run(tokens, DRAFT.repeat(3, 1, 1), TARGET.repeat(3, 1, 1), [3, 1, 0],
              torch.full((3, 3), TINY, dtype=torch.float64),  # would accept every drafted token
              torch.tensor([[0.5, 0.5, 0.5, 0.75], [0.5, 0.6, 0.5, 0.5], [0.1, 0.5, 0.5, 0.5]], dtype=torch.float64))
    # row 1 stops after one drafted token: the bonus comes from the *target* at slot 1 (u = .6 -> 4), not from
    # the residual (which would give 3); row 2 drafted nothing: bonus from the target at slot 0.
    assert out == ([[2, 5, 1, 5], [2, 4, P, P], [1, P, P, P]], [3, 1, 0])


def test_rejection_sample_ragged_point_mass_rows():
    out = run(TOKENS.repeat(2, 1), None, TARGET.repeat(2, 1, 1), [2, 1],
              torch.full((2, 3), TINY, dtype=torch.float64),
              torch.tensor([[0.5, 0.5, 0.2, 0.5], [0.5, 0.6, 0.5, 0.5]], dtype=torch.float64))
    assert out == ([[2, 5, 0, P], [2, 4, P, P]], [2, 1])


def test_rejection_sample_placeholder_padded_drafts():
    """Ragged rows padded with PLACEHOLDER after num_drafted (vLLM's layout, accepted by greedy_verify too)."""
    tokens = torch.tensor([[2, 5, 1], [2, P, P], [P, P, P]])
    accept_u = torch.full((3, 3), TINY, dtype=torch.float64)
    emit_u = torch.tensor([[0.5, 0.5, 0.5, 0.75], [0.5, 0.6, 0.5, 0.5], [0.1, 0.5, 0.5, 0.5]], dtype=torch.float64)
    expected = ([[2, 5, 1, 5], [2, 4, P, P], [1, P, P, P]], [3, 1, 0])
    assert run(tokens, DRAFT.repeat(3, 1, 1), TARGET.repeat(3, 1, 1), [3, 1, 0], accept_u, emit_u) == expected
    assert run(tokens, None, TARGET.repeat(3, 1, 1), [3, 1, 0], accept_u, emit_u) == expected


@pytest.mark.parametrize("accept_u,emit,expected", [
    (u(0.4, 0.3, TINY), u(0.5, 0.9, 0.5, 0.5), ([[2, 4, P, P]], [1])),  # 0.3 >= target(5) = .25: reject
    (u(0.4, 0.3, TINY), u(0.5, 0.1, 0.5, 0.5), ([[2, 1, P, P]], [1])),
    (u(0.4, 0.2, 0.7), u(0.5, 0.5, 0.5, 0.25), ([[2, 5, 1, 3]], [3])),  # all accepted, bonus from slot 3
    (u(0.5, TINY, TINY), u(0.1, 0.5, 0.5, 0.5), ([[1, P, P, P]], [0])),  # reject 2 at slot 0: {1: .5, 3: .5}
    (u(0.5, TINY, TINY), u(0.9, 0.5, 0.5, 0.5), ([[3, P, P, P]], [0])),
    (u(0.4, 0.1, 0.75), u(0.5, 0.5, 0.7, 0.5), ([[2, 5, 0, P]], [2])),  # reject 1 at slot 2: target w/o 1 = {0: 1}
])
def test_rejection_sample_point_mass_drafts(accept_u, emit, expected):
    """draft_probs=None: accept with prob target(x); recover from the target with x zeroed."""
    assert run(TOKENS, None, TARGET, [3], accept_u, emit) == expected


def test_rejection_sample_point_mass_certain_token_is_always_accepted():
    target = torch.stack([dist({4: 1.0}), dist({2: 1.0}), dist({0: .5, 6: .5})])[None]
    out = run(torch.tensor([[4, 2]]), None, target, [2], u(TOP, TOP), u(0.5, 0.5, 0.75))
    assert out == ([[4, 2, 6]], [2])


def test_rejection_sample_zero_draft_prob_is_always_rejected():
    """The q = 0 guard: a token the draft could not have produced is rejected even for the smallest u."""
    target = torch.stack([dist({6: .5, 2: .5}), dist({0: 1.0})])[None]
    draft = dist({2: 1.0})[None, None]
    out = run(torch.tensor([[6]]), draft, target, [1], u(TINY), u(0.5, 0.5))
    assert out == ([[6, P]], [0])  # recovered from relu(target - draft) = {6: .5}
    # and a token the target gives zero probability is rejected too
    out = run(torch.tensor([[2]]), dist({2: .5, 3: .5})[None, None], torch.stack([dist({3: .5, 4: .5}), dist({0: 1.})])[None],
              [1], u(TINY), u(0.25, 0.5))
    assert out == ([[4, P]], [0])  # relu({3: .5, 4: .5} - {2: .5, 3: .5}) = {4: .5}


def test_rejection_sample_target_equal_to_draft_accepts_everything():
    gen = torch.Generator().manual_seed(3)
    target = torch.rand(4, 4, 13, generator=gen, dtype=torch.float64)
    target /= target.sum(-1, keepdim=True)
    tokens = torch.randint(0, 13, (4, 3), generator=gen)
    accept_u = torch.full((4, 3), TOP, dtype=torch.float64)
    out, num_accepted = kernels.rejection_sample(tokens, target[:, :3].clone(), target, torch.full((4,), 3),
                                                 accept_u, torch.rand(4, 4, generator=gen, dtype=torch.float64))
    assert num_accepted.tolist() == [3, 3, 3, 3]
    assert torch.equal(out[:, :3], tokens)


# ---- sample_categorical --------------------------------------------------------------------------

@pytest.mark.parametrize("weights", [
    [0.0, 0.3, 0.0, 0.0, 0.7, 0.0, 0.0],  # trailing zeros
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    [0.1, 0.2, 0.0, 0.3, 0.0, 0.4, 0.0],
    [1e-3, 0.0, 5.0, 0.0, 0.0, 1e-300, 0.0],  # unnormalised, with a tiny last positive weight
    [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0, 0.0, 0.0],
])
def test_sample_categorical_never_returns_a_zero_weight_index(weights):
    weights = torch.tensor(weights, dtype=torch.float64)
    extremes = [TINY, 2.0 ** -53, 1e-300, 0.5, TOP, 1.0 - 2.0 ** -52, 1.0 - 1e-15, 1.0 - 1e-12]
    uniforms = torch.cat([torch.tensor(extremes, dtype=torch.float64), torch.linspace(0, 1, 2001)[1:-1].double()])
    index = kernels.sample_categorical(weights.expand(len(uniforms), -1), uniforms)
    assert bool((weights[index] > 0).all()), index[weights[index] == 0]
    for single in (weights.float(), weights):  # float32 weights too
        assert float(weights[kernels.sample_categorical(single, torch.tensor(TOP, dtype=torch.float64))]) > 0


def test_sample_categorical_top_uniform_returns_the_last_positive_index():
    weights = torch.tensor([0.0, 0.3, 0.0, 0.0, 0.7, 0.0, 0.0], dtype=torch.float64)
    for top in (TOP, 1.0 - 2.0 ** -52):
        assert int(kernels.sample_categorical(weights, torch.tensor(top, dtype=torch.float64))) == 4
    assert int(kernels.sample_categorical(weights, torch.tensor(TINY, dtype=torch.float64))) == 1


@pytest.mark.parametrize("vocab", [7, 13])
def test_sample_categorical_follows_inverse_cdf_intervals(vocab):
    gen = torch.Generator().manual_seed(vocab)
    weights = torch.rand(vocab, generator=gen, dtype=torch.float64) * (torch.rand(vocab, generator=gen) > 0.3)
    weights[vocab // 2] = 0.25  # at least one positive weight
    cdf = weights.cumsum(0)
    total = float(cdf[-1])
    for index in range(vocab):
        low, high = float(cdf[index] - weights[index]) / total, float(cdf[index]) / total
        if weights[index] == 0:
            continue
        mid = torch.tensor((low + high) / 2, dtype=torch.float64)
        assert int(kernels.sample_categorical(weights, mid)) == index
        assert int(kernels.sample_categorical(weights / total, mid)) == index  # normalisation does not matter
        # just inside both ends of the interval
        inside = torch.tensor([low + (high - low) * 1e-6, high - (high - low) * 1e-6], dtype=torch.float64)
        assert kernels.sample_categorical(weights.expand(2, -1), inside).tolist() == [index, index]


def test_sample_categorical_batched():
    probs = torch.stack([
        torch.stack([dist({0: .5, 6: .5}), dist({3: 1.0}), dist({1: .25, 2: .25, 5: .5})]),
        torch.stack([dist({4: .75, 5: .25}), dist({0: .125, 6: .875}), dist({2: .5, 3: .5})]),
    ])  # [2, 3, V]
    uniform = torch.tensor([[0.75, 0.01, 0.3], [0.8, 0.1, 0.5]], dtype=torch.float64)
    out = kernels.sample_categorical(probs, uniform)
    assert out.shape == (2, 3)
    assert out.tolist() == [[6, 3, 2], [5, 0, 3]]
    # row by row it agrees with the unbatched op
    for b in range(2):
        for j in range(3):
            assert int(kernels.sample_categorical(probs[b, j], uniform[b, j])) == out[b, j]


# ---- accept_probability, residual_probs, ancestor_mask -------------------------------------------

def test_accept_probability_table():
    target = torch.tensor([0.3, 0.6, 0.2, 0.0, 0.5, 1.0])
    draft = torch.tensor([0.6, 0.3, 0.0, 0.4, 0.5, 0.0])
    result = kernels.accept_probability(target, draft)
    assert result.dtype == torch.float64
    expected = torch.tensor([0.5, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(result, expected, rtol=0, atol=1e-7)
    # in float64 the ratio is exact
    assert float(kernels.accept_probability(torch.tensor(0.25, dtype=torch.float64),
                                            torch.tensor(0.5, dtype=torch.float64))) == 0.5


def test_residual_probs_is_normalised_relu_of_the_difference():
    target = torch.stack([dist({0: .5, 1: .25, 2: .25}), dist({3: .5, 4: .5}), dist({1: 1.0})])
    draft = torch.stack([dist({0: .75, 1: .25}), dist({3: .5, 4: .5}), dist({1: .5, 6: .5})])
    result = kernels.residual_probs(target, draft)
    assert result.dtype == torch.float64
    assert torch.allclose(result.sum(-1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.equal(result[0], dist({2: 1.0}))
    assert torch.equal(result[1], target[1])  # target == draft: falls back to the target
    assert torch.equal(result[2], dist({1: 1.0}))
    assert bool((result >= 0).all())


def test_residual_probs_random_rows_are_distributions():
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(50, 13, generator=gen, dtype=torch.float64)
    draft = torch.rand(50, 13, generator=gen, dtype=torch.float64)
    target, draft = target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)
    result = kernels.residual_probs(target, draft)
    assert torch.allclose(result.sum(-1), torch.ones(50, dtype=torch.float64), atol=1e-12)
    assert bool(((result > 0) == (target > draft)).all())
    weights = (target - draft).clamp(min=0)
    assert torch.allclose(result, weights / weights.sum(-1, keepdim=True), atol=1e-15)


def test_ancestor_mask_literal_tree():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #   |
    #   6
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3]])
    expected = [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 0, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 0, 1],
    ]
    mask = kernels.ancestor_mask(parents)
    assert mask.dtype == torch.bool and mask.shape == (1, 7, 7)
    assert mask.int().tolist() == [expected]


def test_ancestor_mask_batched_rows_are_independent():
    parents = torch.tensor([[-1, 0, 1, 2, 3], [-1, 0, 0, 0, 0]])  # a chain and a star
    mask = kernels.ancestor_mask(parents)
    assert torch.equal(mask[0], torch.ones(5, 5, dtype=torch.bool).tril())
    star = torch.eye(5, dtype=torch.bool)
    star[:, 0] = True
    assert torch.equal(mask[1], star)


# ---- coupled_resample, gumbel_argmax (Jacobi decoding) ----------------------------------------------

# One window of five slots, dyadic laws whose keep probabilities and normalised residuals are multiples of 1/16:
#   slot 0: keep 2 w.p. 1, 3 w.p. .5; residual {1: 1}
#   slot 1: keep 4 w.p. 1, 6 never (the target gives it 0); residual {1: .5, 3: .5}
#   slot 2: draft == target: always kept (the residual is empty)
#   slot 3: disjoint supports: never kept; residual = the target
#   slot 4: keep 0 w.p. .25, 2 and 5 w.p. 1; residual {5: 1}
WINDOW_TARGET = torch.stack([dist({1: .25, 2: .5, 3: .25}), dist({1: .25, 3: .25, 4: .5}), dist({0: .25, 1: .75}),
                             dist({0: .5, 5: .5}), dist({0: .125, 2: .375, 5: .5})])
WINDOW_DRAFT = torch.stack([dist({2: .5, 3: .5}), dist({4: .5, 6: .5}), dist({0: .25, 1: .75}),
                            dist({2: .25, 6: .75}), dist({0: .5, 2: .375, 5: .125})])
GRID = 16  # uniforms at the midpoints (i + 1/2) / GRID: exact frequencies for multiples of 1/GRID


def _enumerate_window():
    """Every combination of drafts (one per slot, from its draft law's support) x keep uniform x draw uniform,
    in one batch. Returns (weight [rows] = P(drafts) / GRID^2, drafts, tokens, kept)."""
    supports = [torch.nonzero(law).squeeze(-1) for law in WINDOW_DRAFT]
    drafts = torch.cartesian_prod(*supports)  # [combos, 5]
    weight = torch.stack([WINDOW_DRAFT[s, drafts[:, s]] for s in range(5)], 1).prod(1)
    grid = (torch.arange(GRID, dtype=torch.float64) + 0.5) / GRID
    combos = len(drafts)
    drafts = drafts.repeat_interleave(GRID * GRID, 0)
    weight = weight.repeat_interleave(GRID * GRID, 0) / GRID ** 2
    keep_u = grid.repeat_interleave(GRID).repeat(combos)[:, None].expand(-1, 5)
    draw_u = grid.repeat(GRID * combos)[:, None].expand(-1, 5)
    rows = len(drafts)
    tokens, kept = kernels.coupled_resample(drafts, WINDOW_DRAFT.expand(rows, -1, -1),
                                            WINDOW_TARGET.expand(rows, -1, -1), keep_u, draw_u)
    return weight, drafts, tokens, kept


def test_coupled_resample_output_is_distributed_as_the_target_at_every_slot():
    weight, _, tokens, _ = _enumerate_window()
    assert float(weight.sum()) == 1.0
    for slot in range(5):  # P[token] = P[kept] 1{draft} + P[resampled] residual, summed exactly
        law = torch.zeros(V, dtype=torch.float64).index_add_(0, tokens[:, slot], weight)
        assert torch.equal(law, WINDOW_TARGET[slot]), (slot, law)


def test_coupled_resample_keeps_the_draft_with_probability_min_one_ratio():
    weight, drafts, tokens, kept = _enumerate_window()
    assert torch.equal(tokens[kept], drafts[kept])  # a kept slot is the old draft
    for slot in range(5):
        target, draft = WINDOW_TARGET[slot], WINDOW_DRAFT[slot]
        for token in torch.nonzero(draft).squeeze(-1).tolist():
            rows = drafts[:, slot] == token
            keep_rate = float(kept[rows, slot].double().mean())
            assert keep_rate == min(1.0, float(target[token] / draft[token])), (slot, token)
        # in expectation 1 - TV(target, draft) = sum min(target, draft), the largest possible
        assert float(weight[kept[:, slot]].sum()) == float(torch.minimum(target, draft).sum())
    assert not bool(kept[:, 3].any()) and bool(kept[:, 2].all())


def test_coupled_resample_threshold_is_strict_and_slots_do_not_break():
    draft, target = WINDOW_DRAFT[None], WINDOW_TARGET[None]
    tokens = torch.tensor([[3, 6, 1, 2, 0]])  # keep probabilities .5, 0, 1, 0, .25
    at = u(0.5, TINY, TOP, TINY, 0.25)  # u == keep probability rejects
    below = u(0.5 - 2 ** -53, TINY, TOP, TINY, 0.25 - 2 ** -54)
    draw = u(0.5, 0.75, 0.5, 0.75, 0.5)
    out, kept = kernels.coupled_resample(tokens, draft, target, at, draw)
    assert kept.tolist() == [[False, False, True, False, False]]
    assert out.tolist() == [[1, 3, 1, 5, 5]]  # every rejected slot resamples: there is no break
    out, kept = kernels.coupled_resample(tokens, draft, target, below, draw)
    assert kept.tolist() == [[True, False, True, False, True]] and out.tolist() == [[3, 3, 1, 5, 0]]


def test_gumbel_argmax_is_a_sample_from_the_target():
    gen = torch.Generator().manual_seed(2024)
    law = dist({0: .05, 2: .4, 3: .25, 5: .3})
    n = 20_000
    exponential = -torch.log(torch.rand(n, V, generator=gen, dtype=torch.float64))
    for probs in (law, law.float(), law * 3.0):  # float32 and unnormalised laws too
        index = kernels.gumbel_argmax(probs.expand(n, -1), exponential)
        assert index.shape == (n,) and index.dtype == torch.long
        assert bool((law[index] > 0).all())
        outcome = goodness_of_fit([(t,) for t in index.tolist()], {(t,): float(law[t]) for t in range(V)})
        assert outcome.p_value > 1e-4, outcome


def test_gumbel_argmax_never_returns_a_zero_probability_token():
    law = dist({1: 1e-300, 4: 1.0 - 2 ** -20})
    # Exp(1) variates -log(u) of float64 uniforms lie in (2^-54, 745): every combination of extremes
    extremes = torch.tensor([2 ** -54, 1e-300, 1e-12, 1.0, 37.4, 745.0], dtype=torch.float64)
    exponential = torch.cartesian_prod(*[extremes] * 3)[:, [0, 1, 0, 2, 2, 0, 1]]  # tokens 1 and 4: columns 1, 2
    index = kernels.gumbel_argmax(law.expand(len(exponential), -1), exponential)
    assert bool((law[index] > 0).all())
    assert set(index.tolist()) == {1, 4}  # a 1e-300 token still wins against enough noise on the other


def test_backend_dispatch():
    assert kernels.backend() == "auto"  # CUDA tensors go to Triton, CPU tensors to torch
    assert set(kernels.OPS) <= set(dir(kernels))
    assert not dispatch._uses_triton("rejection_sample", (torch.zeros(1),))
    assert not dispatch._uses_triton("sample_categorical", (torch.zeros(1),))  # no kernel: always torch
    with pytest.raises(InvalidRequest):
        kernels.set_backend("no-such-backend")
    assert kernels.backend() == "auto"


# ---- group_mass --------------------------------------------------------------------------------------------------

def test_group_mass_exact_table():
    # groups over V = 7: 0 -> {1, 2}, 1 -> {}, 2 -> {3, 4, 5}, 3 -> {6}
    indptr = torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32)
    member_ids = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int32)
    weights = torch.tensor([1.0, 0.5, 0.5, 1.0, 0.25, 1.0], dtype=torch.float64)
    probs = torch.stack([dist({1: .25, 2: .5, 3: .25}), dist({4: .5, 5: .5})])
    groups = torch.tensor([[0, 1, 2, -1], [2, 3, 0, 2]])
    assert kernels.group_mass(probs, groups, indptr, member_ids, weights, 3).tolist() == [
        [.5, 0.0, .125, 0.0], [.625, 0.0, 0.0, .625]]
    assert kernels.group_mass(probs, groups, indptr, member_ids, None, 3).tolist() == [
        [.75, 0.0, .25, 0.0], [1.0, 0.0, 0.0, 1.0]]
    assert kernels.group_mass(probs[:0], groups[:0], indptr, member_ids, None, 3).shape == (0, 4)
