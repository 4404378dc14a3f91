"""PCG (GroupRejection) and SSD (ToleranceRejection): the groups' tables, exactness in groups by enumeration and
by chi-square, the bounds each relaxed rule states, and negative controls that must fail the same checks."""

import math

import pytest
import torch

from specgen import kernels
from specgen.errors import InvalidRequest
from specgen.samplers.acceptance import ChainRejection, make_rule
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.group_acceptance import GroupRejection, ToleranceRejection
from specgen.samplers.groups import TokenGroups, build_groups, swap_tokens
from specgen.samplers.loop import generate
from specgen.samplers.noise import Purpose, chain_noise, counter_uniform
from specgen.samplers.oracle import (chain_proposals, exact_group_output, exact_output, group_marginals, max_abs_diff,
                                     target_joint)
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableDrafter, TableLM, TableTarget
from specgen.samplers.types import AcceptanceNoise, Draft


def ring(vocab: int, step_degrees: float) -> torch.Tensor:
    """Embeddings on a circle: with theta between cos(2 step) and cos(step), each group holds a token and its two
    neighbours, so groups overlap in a chain (every inner token has three owners)."""
    angles = torch.arange(vocab, dtype=torch.float64) * math.radians(step_degrees)
    return torch.stack([angles.cos(), angles.sin()], -1)


def law(vocab: int, g: torch.Generator, scale: float = 2.0) -> torch.Tensor:
    return torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * scale, -1)


def random_groups(vocab: int, theta: float, g: torch.Generator, total: int | None = None) -> TokenGroups:
    return build_groups(torch.randn(vocab, 3, generator=g), theta, total or vocab)


def single_step(target: torch.Tensor, draft: torch.Tensor, bonus: torch.Tensor | None = None):
    """One drafted token, every possible value as its own row: (Draft [vocab, 1], target_probs [vocab, 2, vocab])."""
    vocab = target.numel()
    bonus = target if bonus is None else bonus
    proposal = Draft(torch.arange(vocab)[:, None], draft.expand(vocab, 1, vocab).clone())
    return proposal, torch.stack([target, bonus]).expand(vocab, 2, vocab).clone()


def emitted_laws(rule, target, draft):
    """Exact laws of the first committed slot: (group law [groups], (group, token) law [groups, vocab], token law)."""
    proposal, target_probs = single_step(target, draft)
    decisions = rule.group_decision_probs(proposal, target_probs)
    accept = decisions.owner_accept[:, 0]  # [t, groups]: drafted t tested in group g and accepted
    rejected = draft * (1 - accept.sum(-1))  # [t]
    joint = (rejected[:, None, None] * decisions.emit_joint[:, 0]).sum(0)  # [groups, vocab]
    joint = joint + (draft[:, None] * accept).T  # an accepted t is committed with its group
    return joint.sum(-1), joint, joint.sum(0)


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


# ---- the groups ------------------------------------------------------------------------------------------------


def test_groups_are_reflexive_symmetric_and_column_stochastic():
    groups = build_groups(ring(7, 40), 0.5, 10, special_ids=[3])
    assert [groups.members(k) for k in range(10)] == [[0, 1], [0, 1, 2], [1, 2], [3], [4, 5], [4, 5, 6], [5, 6],
                                                      [7], [8], [9]]
    for token in range(10):  # cosine is symmetric: the owners of t are the members of G(t)
        assert groups.owners(token) == groups.members(token)
    weights = groups.dense_weights
    assert torch.allclose(weights.sum(0), torch.ones(10, dtype=torch.float64))
    assert weights[1, 0] == 0.5 and weights[1, 1] == 1 / 3 and weights[3, 3] == 1.0
    assert groups.member_ids.dtype == torch.int32 and groups.owner_indptr.dtype == torch.int32
    stats = groups.stats(range(7))
    assert stats["groups"] == 7 and stats["max_size"] == 3 and stats["singletons"] == pytest.approx(1 / 7)


@pytest.mark.parametrize("theta", [1.0, 1.5])
def test_theta_of_one_or_more_gives_singletons(theta):
    embeddings = torch.ones(6, 4)  # identical rows: cosine 1 everywhere (up to rounding)
    groups = build_groups(embeddings, theta, 8)
    assert groups.sizes.tolist() == [1] * 8 and torch.equal(groups.dense_weights, torch.eye(8, dtype=torch.float64))


def test_chunked_construction_matches_the_dense_definition(tmp_path):
    g = torch.Generator().manual_seed(3)
    embeddings = torch.randn(300, 8, generator=g)
    groups = build_groups(embeddings, 0.4, 305, special_ids=[7, 299], chunk_rows=17)
    unit = embeddings / embeddings.norm(dim=-1, keepdim=True)
    similar = (unit @ unit.T) > 0.4
    similar[[7, 299]] = False
    similar[:, [7, 299]] = False
    similar |= torch.eye(300, dtype=torch.bool)
    for k in (0, 7, 150, 299):
        assert groups.members(k) == similar[k].nonzero().flatten().tolist()
    assert groups.members(303) == [303]
    assert build_groups(embeddings, 0.4, 305, special_ids=[7, 299]).member_ids.tolist() == groups.member_ids.tolist()
    loaded = TokenGroups.load(groups.save(tmp_path / "g.npz"))
    assert loaded.theta == pytest.approx(0.4)
    for name in ("member_indptr", "member_ids", "owner_indptr", "owner_ids", "owner_counts"):
        assert torch.equal(getattr(loaded, name), getattr(groups, name))


def test_coarse_law_is_w_times_p_and_sums_to_one():
    g = torch.Generator().manual_seed(1)
    groups = random_groups(40, 0.3, g, total=45)
    probs = torch.softmax(torch.randn(3, 2, 45, generator=g, dtype=torch.float64), -1)
    coarse = groups.coarse(probs)
    assert coarse.shape == (3, 2, 45)
    assert torch.allclose(coarse, probs @ groups.dense_weights.T, atol=1e-15)
    assert torch.allclose(coarse.sum(-1), torch.ones(3, 2, dtype=torch.float64))
    some = torch.tensor([[0, 5, -1], [44, 3, 3], [1, 2, 39]])
    expected = torch.where(some >= 0, coarse[:, 0].gather(1, some.clamp(min=0)), 0.0)
    assert torch.allclose(groups.mass(probs[:, 0], some), expected)


def test_swap_tokens_replaces_tokens_by_group_mates():
    groups = build_groups(ring(7, 40), 0.5, 10, special_ids=[3])
    tokens = torch.arange(10).repeat(50)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(swap_tokens(tokens, groups, 0.0, g), tokens)
    swapped = swap_tokens(tokens, groups, 1.0, g)
    grouped = (groups.sizes[tokens] > 1) | torch.tensor([groups.owner_counts[t] > 1 for t in tokens.tolist()])
    assert bool((swapped[grouped] != tokens[grouped]).all())  # every token with a group mate moved
    assert torch.equal(swapped[~grouped], tokens[~grouped])  # singletons and specials stay
    for before, after in zip(tokens.tolist(), swapped.tolist()):
        assert any(after in groups.members(k) for k in groups.owners(before))
    half = swap_tokens(tokens, groups, 0.5, g)
    assert 0.3 < float((half != tokens)[grouped].double().mean()) < 0.7
    with pytest.raises(InvalidRequest, match="swap rate"):
        swap_tokens(tokens, groups, 1.5)


# ---- exactness in groups, one step -----------------------------------------------------------------------------


@pytest.mark.parametrize("residual", ["explicit", "thinning"])
@pytest.mark.parametrize("seed", range(4))
def test_one_step_emitted_group_is_distributed_as_the_coarse_target(seed, residual):
    g = torch.Generator().manual_seed(seed)
    vocab = 12
    groups = random_groups(vocab, [0.2, 0.5, 0.8, 0.95][seed], g)
    target, draft = law(vocab, g), law(vocab, g)
    group_law, _, token_law = emitted_laws(GroupRejection(groups, residual), target, draft)
    assert torch.allclose(group_law, groups.coarse(target), atol=1e-12)
    assert float(token_law.sum()) == pytest.approx(1.0)


def test_group_acceptance_is_at_least_token_acceptance():
    g = torch.Generator().manual_seed(5)
    for trial in range(30):
        vocab = int(torch.randint(3, 20, (1,), generator=g))
        groups = random_groups(vocab, float(torch.rand(1, generator=g)) * 0.9, g)
        target, draft = law(vocab, g, 3.0), law(vocab, g, 3.0)
        proposal, target_probs = single_step(target, draft)
        accept = GroupRejection(groups).decision_probs(proposal, target_probs).accept_probs[:, 0]
        alpha_group = float((draft * accept).sum())
        coarse_target, coarse_draft = groups.coarse(target), groups.coarse(draft)
        assert alpha_group == pytest.approx(float(torch.minimum(coarse_target, coarse_draft).sum()), abs=1e-12)
        assert alpha_group >= float(torch.minimum(target, draft).sum()) - 1e-12, trial


def test_draft_equal_to_target_is_always_accepted():
    g = torch.Generator().manual_seed(2)
    groups = random_groups(9, 0.4, g)
    target = law(9, g)
    proposal, target_probs = single_step(target, target)
    accept = GroupRejection(groups).decision_probs(proposal, target_probs).accept_probs[:, 0]
    assert torch.allclose(accept, torch.ones(9, dtype=torch.float64))


def test_singletons_are_chain_rejection():
    """theta >= 1: every decision, and every sampled verdict with the explicit residual, is ChainRejection's."""
    g = torch.Generator().manual_seed(4)
    vocab, batch, k = 11, 64, 3
    groups = build_groups(torch.randn(vocab, 3, generator=g), 1.0, vocab)
    target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g) * 2, -1)  # float32, as models give
    draft = torch.softmax(torch.randn(batch, k, vocab, generator=g) * 2, -1)
    tokens = kernels.sample_categorical(draft, torch.rand(batch, k, generator=g, dtype=torch.float64))
    drafted = torch.randint(0, k + 1, (batch,), generator=g)
    noise = _noise(batch, k, seed=8)
    for proposal in (Draft(tokens, draft, drafted), Draft(tokens, None, drafted)):
        exact = ChainRejection().decision_probs(proposal, target)
        group = GroupRejection(groups).decision_probs(proposal, target)
        assert torch.equal(exact.accept_probs, group.accept_probs)
        assert torch.equal(exact.emit_probs, group.emit_probs)
        chain = ChainRejection()(proposal, target, noise)
        pcg = GroupRejection(groups, "explicit")(proposal, target, noise)
        assert torch.equal(chain.tokens, pcg.tokens) and torch.equal(chain.num_accepted, pcg.num_accepted)
        assert torch.equal(pcg.groups, pcg.tokens)  # singleton group k is token k
        assert torch.equal(pcg.exact_accepted, pcg.num_accepted)
        assert bool((chain.num_accepted < drafted).any()) and bool((chain.num_accepted == drafted).any())


# ---- exactness in groups along a chain, for every realised prefix --------------------------------------------

VOCAB, HORIZON, PROMPT = 5, 3, (1, 2)
TARGET = TableLM(VOCAB, order=2, seed=31)
DRAFT = TARGET.mixed_with(TableLM(VOCAB, order=2, seed=32, scale=3.0), 0.7)
RING = build_groups(ring(VOCAB, 50), 0.5, VOCAB)  # {0,1}, {0,1,2}, {1,2,3}, {2,3,4}, {3,4}


def draft_law(processing):
    return lambda context: processing(DRAFT.logits(context))


def coarse_target(processing, prefix):
    return RING.coarse(processing(TARGET.logits(list(prefix))).double())


def chains(processing, k):
    """Every chain of k draft tokens after a prefix, with its probability (the oracle's proposals)."""
    return lambda prefix: chain_proposals(draft_law(processing), prefix, k)


def group_marginal_error(rule, processing, k=2):
    joint = exact_group_output(TARGET, processing, rule, chains(processing, k), PROMPT, HORIZON)
    assert sum(joint.values()) == pytest.approx(1.0, abs=1e-12)
    worst = 0.0
    for prefix, groups in group_marginals(joint, HORIZON).items():
        expected = coarse_target(processing, PROMPT + prefix)
        got = torch.tensor([groups.get(g, 0.0) for g in range(VOCAB)], dtype=torch.float64)
        worst = max(worst, float((got - expected).abs().max()))
    return worst, joint


@pytest.mark.parametrize("processing", [Processing(), Processing(temperature=0.8, top_k=3)])
@pytest.mark.parametrize("k", [1, 2])
def test_group_marginal_matches_the_target_at_every_step_of_a_chain(processing, k):
    worst, joint = group_marginal_error(GroupRejection(RING), processing, k)
    assert worst < 1e-9
    # the token-level decisions (what the token oracle enumerates) are the same process
    tokens = exact_output(TARGET, processing, GroupRejection(RING), chains(processing, k), PROMPT, HORIZON)
    marginal: dict = {}
    for (seq, _), prob in joint.items():
        marginal[seq] = marginal.get(seq, 0.0) + prob
    assert max_abs_diff(tokens, marginal) < 1e-9
    # ...and it is not the target's token law: PCG is lossy at token level
    assert max_abs_diff(tokens, target_joint(TARGET, processing, PROMPT, HORIZON)) > 1e-3


class BestOwnerRejection(GroupRejection):
    """NEGATIVE CONTROL: tests each drafted token in its owner group with the largest P_c/Q_c instead of a
    uniformly drawn one. Acceptance goes up and the group law is no longer P_c."""

    def _best(self, tokens, target_probs, draft_probs):
        groups = self.groups
        width = int(groups.owner_counts.max())
        start = groups.owner_indptr.long()[tokens]  # [batch, k]
        slots = torch.arange(width)
        inside = slots < groups.owner_counts.long()[tokens][..., None]
        entries = (start[..., None] + slots).clamp(max=groups.owner_ids.numel() - 1)
        owners = torch.where(inside, groups.owner_ids.long()[entries], -1)
        batch, k = tokens.shape
        flat = owners.reshape(batch * k, width)
        ratio = (groups.mass(target_probs.reshape(batch * k, -1), flat)
                 / groups.mass(draft_probs.reshape(batch * k, -1), flat).clamp(min=1e-300))
        best = torch.where(flat >= 0, ratio, -1.0).argmax(-1, keepdim=True)
        return flat.gather(1, best).reshape(batch, k)

    def choose_owner(self, tokens, uniform, target_probs, draft_probs):
        return self._best(tokens, target_probs, draft_probs)

    def owner_law(self, tokens, target_probs, draft_probs):
        best = self._best(tokens, target_probs, draft_probs)
        return torch.nn.functional.one_hot(best, self.groups.num_groups).double()


def test_negative_control_best_owner_fails_the_group_enumeration():
    worst, _ = group_marginal_error(BestOwnerRejection(RING), Processing())
    assert worst > 1e-2


def test_emitted_token_is_not_distributed_as_the_target():
    """Crafted: tokens 0 and 1 share both their groups; the draft always proposes 1, which the target never
    emits. Half the time 1 is accepted for its group: TV(emitted token, target) = 0.5, while the group law holds."""
    embeddings = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
    groups = build_groups(embeddings, 0.5, 3)
    assert [groups.members(k) for k in range(3)] == [[0, 1], [0, 1], [2]]
    target = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)
    draft = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    group_law, _, token_law = emitted_laws(GroupRejection(groups), target, draft)
    assert torch.allclose(group_law, groups.coarse(target))
    assert torch.allclose(token_law, torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64))
    assert tv(token_law, target) == pytest.approx(0.5)


def test_token_distance_stays_within_the_stated_bound():
    """TV(emitted token, target) <= sum_k min(P_c, Q_c)(k) * TV(target | k, draft | k)."""
    g = torch.Generator().manual_seed(9)
    for _ in range(20):
        vocab = 10
        groups = random_groups(vocab, 0.4, g)
        target, draft = law(vocab, g), law(vocab, g)
        _, _, token_law = emitted_laws(GroupRejection(groups), target, draft)
        weights = groups.dense_weights
        coarse_target, coarse_draft = groups.coarse(target), groups.coarse(draft)
        within_target = weights * target / coarse_target[:, None]
        within_draft = weights * draft / coarse_draft[:, None]
        within_tv = 0.5 * (within_target - within_draft).abs().sum(-1)  # [groups]
        bound = float((torch.minimum(coarse_target, coarse_draft) * within_tv).sum())
        assert tv(token_law, target) <= bound + 1e-12


# ---- the sampled rule: chi-square against the exact laws -------------------------------------------------------


def _noise(batch: int, k: int, seed: int) -> AcceptanceNoise:
    sample_ids, start = torch.arange(batch), torch.full((batch,), 10)
    accept, emit = chain_noise(seed, sample_ids, start, k)
    return AcceptanceNoise(accept, emit, seed, sample_ids, start[:, None] + torch.arange(1, k + 2))


def _sampled_step(rule, target, draft, n, k, seed):
    """n rows of one step with k drafted tokens from constant per-slot laws: target [k + 1, vocab], draft [k, vocab]."""
    ids = torch.arange(n)
    u = counter_uniform(seed, ids[:, None], torch.arange(k)[None] + 11, Purpose.DRAFT)
    tokens = kernels.sample_categorical(draft.expand(n, k, -1), u)
    proposal = Draft(tokens, draft.expand(n, k, -1))
    return rule(proposal, target.expand(n, k + 1, -1), _noise(n, k, seed))


CHI_VOCAB = 8
CHI_GROUPS = build_groups(ring(CHI_VOCAB, 40), 0.5, CHI_VOCAB)  # overlapping neighbour groups on a ring
_g = torch.Generator().manual_seed(17)
CHI_TARGET = torch.stack([law(CHI_VOCAB, _g) for _ in range(3)])  # [k + 1, vocab]
CHI_DRAFT = torch.stack([law(CHI_VOCAB, _g) for _ in range(2)])  # [k, vocab]


@pytest.mark.parametrize("rule", [GroupRejection(CHI_GROUPS, "explicit"), GroupRejection(CHI_GROUPS, "thinning"),
                                  GroupRejection(CHI_GROUPS, "thinning", thinning_rounds=1)],  # falls back often
                         ids=["explicit", "thinning", "thinning-1-round"])
def test_sampled_groups_and_tokens_fit_the_exact_laws(rule):
    verdict = _sampled_step(rule, CHI_TARGET, CHI_DRAFT, 30_000, 2, seed=5)
    _, joint, _ = emitted_laws(GroupRejection(CHI_GROUPS), CHI_TARGET[0], CHI_DRAFT[0])
    expected = {(g, u): float(joint[g, u]) for g in range(CHI_VOCAB) for u in range(CHI_VOCAB) if joint[g, u] > 0}
    first = list(zip(verdict.groups[:, 0].tolist(), verdict.tokens[:, 0].tolist()))
    fit = goodness_of_fit(first, expected)
    assert fit.p_value > 1e-4, fit
    # the second slot, after the first was accepted, is again distributed as P_c of its own target law
    second = verdict.groups[verdict.num_accepted >= 1, 1].tolist()
    coarse = CHI_GROUPS.coarse(CHI_TARGET[1])
    fit = goodness_of_fit([(g,) for g in second], {(g,): float(coarse[g]) for g in range(CHI_VOCAB)})
    assert fit.p_value > 1e-4, fit
    rejected = verdict.num_accepted == 0
    assert bool(rejected.any()) and bool((~rejected).any())
    for group, token in first[:500]:  # every committed token is a member of its group
        assert token in CHI_GROUPS.members(group)


def test_negative_control_best_owner_fails_the_chi_square():
    verdict = _sampled_step(BestOwnerRejection(CHI_GROUPS), CHI_TARGET, CHI_DRAFT, 30_000, 2, seed=5)
    coarse = CHI_GROUPS.coarse(CHI_TARGET[0])
    fit = goodness_of_fit([(g,) for g in verdict.groups[:, 0].tolist()],
                          {(g,): float(coarse[g]) for g in range(CHI_VOCAB)})
    assert fit.p_value < 1e-6, fit


def test_the_loop_tags_committed_tokens_with_groups_and_the_first_group_fits():
    rule, n = GroupRejection(RING, "thinning"), 3000
    result = generate(TableTarget(TARGET), TableDrafter(DRAFT, Processing()), rule, [torch.tensor(PROMPT)] * n,
                      processing=Processing(), max_new_tokens=4, policy=FixedLength(2), seed=3)
    first_groups = []
    for event in result.events:
        assert len(event.extra["groups"]) == len(event.tokens)
        for token, group in zip(event.tokens, event.extra["groups"]):
            assert token in RING.members(group)
        if event.step == 0:
            first_groups.append((event.extra["groups"][0],))
    expected = coarse_target(Processing(), PROMPT)
    fit = goodness_of_fit(first_groups, {(g,): float(expected[g]) for g in range(VOCAB)})
    assert fit.p_value > 1e-4, fit
    summary = result.stats
    assert summary["acceptance_level"] == "group" and summary["lossless"] is False
    assert summary["group_alpha_hat"] == summary["alpha_hat"]
    assert summary["exact_alpha_hat"] <= summary["alpha_hat"] + 0.05
    assert 0 < summary["exact_accepted"] <= summary["drafted"]


def test_bad_options_and_missing_noise_keys_are_clear_errors():
    with pytest.raises(InvalidRequest, match="unknown residual"):
        GroupRejection(RING, "best")
    with pytest.raises(InvalidRequest, match="needs token groups"):
        make_rule("group", Processing())
    assert isinstance(make_rule("group", Processing(temperature=0), groups=RING), GroupRejection)
    proposal, target_probs = single_step(law(VOCAB, torch.Generator()), law(VOCAB, torch.Generator()))
    bare = AcceptanceNoise(torch.rand(VOCAB, 1, dtype=torch.float64), torch.rand(VOCAB, 2, dtype=torch.float64))
    with pytest.raises(InvalidRequest, match="seed, sample_ids and positions"):
        GroupRejection(RING)(proposal, target_probs, bare)
    for beta in (-0.1, 1.5, float("nan"), "x"):
        with pytest.raises(InvalidRequest, match="beta"):
            ToleranceRejection(beta)


# ---- SSD: the tolerance rule ------------------------------------------------------------------------------------


def _chain_case(seed, batch=48, k=3, vocab=9):
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g) * 2, -1)
    target[..., 0] = 0  # a token the target rules out (a constraint or top-k)
    target = target / target.sum(-1, keepdim=True)
    draft = torch.softmax(torch.randn(batch, k, vocab, generator=g) * 2, -1)
    tokens = kernels.sample_categorical(draft, torch.rand(batch, k, generator=g, dtype=torch.float64))
    drafted = torch.randint(0, k + 1, (batch,), generator=g)
    return Draft(tokens, draft, drafted), target, _noise(batch, k, seed)


def test_tolerance_zero_is_chain_rejection():
    for seed in range(3):
        proposal, target, noise = _chain_case(seed)
        for draft in (proposal, Draft(proposal.tokens, None, proposal.num_drafted)):
            exact = ChainRejection().decision_probs(draft, target)
            ssd = ToleranceRejection(0.0).decision_probs(draft, target)
            assert torch.equal(exact.accept_probs, ssd.accept_probs) and torch.equal(exact.emit_probs, ssd.emit_probs)
            chain, tolerant = ChainRejection()(draft, target, noise), ToleranceRejection(0.0)(draft, target, noise)
            assert torch.equal(chain.tokens, tolerant.tokens)
            assert torch.equal(tolerant.exact_accepted, chain.num_accepted)


def test_tolerance_accepts_more_and_never_where_the_target_is_zero():
    proposal, target, noise = _chain_case(7)
    exact = ChainRejection().decision_probs(proposal, target).accept_probs
    relaxed = ToleranceRejection(0.2).decision_probs(proposal, target).accept_probs
    assert bool((relaxed >= exact).all()) and bool((relaxed > exact).any())
    ruled_out = target[:, :3].gather(-1, proposal.tokens[..., None]).squeeze(-1) == 0
    assert bool((relaxed[ruled_out] == 0).all())
    tokens = torch.zeros(4, 1, dtype=torch.long)  # token 0: probability 0 under the target, 1 under the draft
    draft = torch.zeros(4, 1, 9)
    draft[..., 0] = 1
    verdict = ToleranceRejection(1.0)(Draft(tokens, draft), target[:4, :2], _noise(4, 1, 1))
    assert verdict.num_accepted.tolist() == [0, 0, 0, 0]
    sampled = ToleranceRejection(0.2)(proposal, target, noise)
    assert bool((sampled.num_accepted >= ChainRejection()(proposal, target, noise).num_accepted).all())
    assert bool((sampled.exact_accepted <= sampled.num_accepted).all())


@pytest.mark.parametrize("beta", [0.05, 0.2, 0.6])
def test_tolerance_token_distance_is_at_most_beta_and_tv(beta):
    g = torch.Generator().manual_seed(int(beta * 100))
    for _ in range(10):
        target, draft = law(10, g), law(10, g)
        proposal, target_probs = single_step(target, draft)
        decisions = ToleranceRejection(beta).decision_probs(proposal, target_probs)
        accept = decisions.accept_probs[:, 0]
        token_law = draft * accept + ((draft * (1 - accept))[:, None] * decisions.emit_probs[:, 0]).sum(0)
        assert float(token_law.sum()) == pytest.approx(1.0)
        assert tv(token_law, target) <= min(beta, tv(target, draft)) + 1e-12
    out = exact_output(TARGET, Processing(), ToleranceRejection(beta), chains(Processing(), 2), PROMPT, HORIZON)
    assert sum(out.values()) == pytest.approx(1.0)
    assert max_abs_diff(out, target_joint(TARGET, Processing(), PROMPT, HORIZON)) > 1e-4


def test_groups_of_another_vocabulary_are_refused():
    proposal, target_probs = single_step(law(6, torch.Generator()), law(6, torch.Generator()))
    with pytest.raises(InvalidRequest, match="cover 5 tokens but the target has 6"):
        GroupRejection(RING).decision_probs(proposal, target_probs)
    with pytest.raises(InvalidRequest, match="cover 5 tokens"):
        GroupRejection(RING)(proposal, target_probs, _noise(6, 1, 0))
