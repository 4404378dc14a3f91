"""LANTERN / LANTERN++ relaxed tree verification: latent neighbours, exactness at delta = 0 / lambda = 1 (exact
enumeration on TableLMs), total variation growing with lambda and within the stated bounds, the sampler walk
against the enumerated law (chi-square), and a negative control: borrowing past the budget breaks the per-node
bound."""

import pytest
import torch

from specgen.errors import InvalidRequest
from specgen.samplers import trees
from specgen.samplers.acceptance import TreeRejection
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.lantern import Relaxation, RelaxedTreeRejection, latent_neighbours
from specgen.samplers.loop import generate
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableLM, TableTarget, TableTreeDrafter
from specgen.samplers.types import DraftTree

VOCAB = 4
TARGET = TableLM(VOCAB, order=1, seed=41, scale=1.0)  # flat laws, as visual tokens have
DRAFT = TARGET.mixed_with(TableLM(VOCAB, order=1, seed=42, scale=2.0), 0.6)
CODEBOOK = torch.tensor([[0.0, 0.0], [0.1, 0.0], [1.0, 1.0], [1.1, 0.9]])
NEIGHBOURS = latent_neighbours(CODEBOOK, VOCAB - 1)
PLAIN = Processing(temperature=1.0)
PROMPT = (1,)
HORIZON = {"without_replacement": 2, "deterministic": 3}  # enumerating orderings without replacement is costly
SHAPE = [-1, 0, 0, 1]  # two children at the root, one grandchild under the first


def law(lm, processing=PLAIN):
    return lambda context: processing(lm.logits(context))


def static_proposals(siblings, shape=SHAPE):
    builder = lambda root, order: trees.StaticBuilder(root, order, shape)
    return lambda prefix: trees.enumerate_builder(builder, law(DRAFT), prefix, siblings)


def joint(rule, siblings="without_replacement", horizon=None, shape=SHAPE):
    horizon = horizon or HORIZON[siblings]
    return exact_output(TARGET, PLAIN, rule, static_proposals(siblings, shape), PROMPT, horizon)


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


def relaxed_rule(siblings="without_replacement", k=2, **budget):
    return RelaxedTreeRejection(Relaxation(NEIGHBOURS, k, **budget), siblings)


# ---- neighbours ----------------------------------------------------------------------------------------------

def test_latent_neighbours_are_the_nearest_other_codes_in_order():
    table = latent_neighbours(CODEBOOK, 3, vocab_size=7)
    for code in range(VOCAB):
        distances = [(float((CODEBOOK[code] - CODEBOOK[o]).norm()), o) for o in range(VOCAB) if o != code]
        assert table[code].tolist() == [o for _, o in sorted(distances)[:3]]
    assert table[5:].eq(-1).all()  # non-code ids borrow nothing
    with pytest.raises(InvalidRequest):
        latent_neighbours(CODEBOOK, VOCAB)


def test_moved_mass_is_the_longest_prefix_within_budget():
    probs = torch.tensor([[0.30, 0.05, 0.20, 0.25, 0.20]], dtype=torch.float64)
    for relaxation in (Relaxation(NEIGHBOURS, 3, lam=1.5), Relaxation(NEIGHBOURS, 2, delta=0.3)):
        every = relaxation.moved_mass(probs)[0]
        at = [float(relaxation.moved_at(probs, torch.tensor([t]))[0]) for t in range(5)]
        assert at == every.tolist()  # the one-token shortcut the sampler uses is the same arithmetic
    # code 0's neighbours: 1 (0.05), then 2 or 3 ...; with lambda 1.5 the budget is 0.15: only code 1 fits
    # (id 4 is past this codebook: it borrows nothing)
    relaxed = Relaxation(NEIGHBOURS, 3, lam=1.5).relaxed(probs)
    assert float(relaxed[0, 0]) == pytest.approx(0.35)
    # code 1 (0.05) with lambda 1.5 may borrow 0.025: its nearest (code 0, 0.30) does not fit
    assert float(relaxed[0, 1]) == pytest.approx(0.05)
    assert float(Relaxation(NEIGHBOURS, 3, delta=0.3).relaxed(probs)[0, 1]) == pytest.approx(0.35)
    with pytest.raises(InvalidRequest):
        Relaxation(NEIGHBOURS, 2, lam=0.5)
    with pytest.raises(InvalidRequest):
        Relaxation(NEIGHBOURS, 2)


# ---- exactness at the identity settings -----------------------------------------------------------------------

@pytest.mark.parametrize("siblings", ["without_replacement", "deterministic"])
@pytest.mark.parametrize("budget", [{"lam": 1.0}, {"delta": 0.0}])
def test_identity_settings_are_exact_tree_verification(siblings, budget):
    rule = relaxed_rule(siblings, **budget)
    assert rule.lossless
    out = joint(rule, siblings)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, HORIZON[siblings])) < 1e-9
    assert max_abs_diff(out, joint(TreeRejection(siblings), siblings)) < 1e-12


# ---- total variation: monotone in lambda, within the stated bound -----------------------------------------------

LAMBDAS = (1.0, 1.1, 1.5, 2.0, 3.0, 5.0)


@pytest.mark.parametrize("siblings", ["without_replacement", "deterministic"])
def test_total_variation_grows_with_lambda_within_the_bound(siblings):
    horizon = HORIZON[siblings]
    reference = target_joint(TARGET, PLAIN, PROMPT, horizon)
    distances = [tv(joint(relaxed_rule(siblings, k=3, lam=lam), siblings), reference) for lam in LAMBDAS]
    assert distances[0] < 1e-9 and distances[-1] > 0.02
    assert all(b >= a - 1e-12 for a, b in zip(distances, distances[1:])), distances
    width = 2  # the most children any node has
    for lam, distance in zip(LAMBDAS, distances):
        assert distance <= horizon * width * min(1.0, lam - 1) + 1e-12


def node_law(rule, target, draft, siblings="without_replacement"):
    """The law of the token committed at the root of a three-child tree, averaged over the children's draws."""
    builder = lambda root, order: trees.StaticBuilder(root, order, [-1, 0, 0, 0])
    out = torch.zeros(VOCAB, dtype=torch.float64)
    for prob, tree in trees.enumerate_builder(builder, lambda context: draft, (0,), siblings):
        decisions = rule.decision_probs(tree, target.expand(tree.num_nodes, -1)[None])
        reach = 1.0
        for kid in tree.children[0][0]:
            out[int(tree.tokens[0, kid])] += prob * reach * float(decisions.accept_probs[0, kid])
            reach *= 1 - float(decisions.accept_probs[0, kid])
        out += prob * reach * decisions.emit_probs[0, 0]
    return out


def laws(count=30):
    generator = torch.Generator().manual_seed(5)
    for _ in range(count):
        yield (torch.softmax(torch.randn(VOCAB, generator=generator, dtype=torch.float64), -1),
               torch.softmax(2 * torch.randn(VOCAB, generator=generator, dtype=torch.float64), -1))


class Unbudgeted(Relaxation):
    """Negative control: borrows all k neighbours' mass whatever the budget."""

    def moved_mass(self, probs):
        table = self.neighbours[: probs.shape[-1], : self.k]
        return (probs[..., table.clamp(min=0)] * (table >= 0)).sum(-1)

    def moved_at(self, probs, tokens):
        return self.moved_mass(probs).gather(1, tokens[:, None]).squeeze(1)


@pytest.mark.parametrize("lam", [1.05, 1.3, 2.0])
def test_per_node_bound_holds_and_an_unbudgeted_borrow_breaks_it(lam):
    bound = 3 * min(1.0, lam - 1)  # three children at the node
    worst, worst_unbudgeted = 0.0, 0.0
    for target, draft in laws(10):
        ours = node_law(relaxed_rule(lam=lam, k=3), target, draft)
        assert float(ours.sum()) == pytest.approx(1.0)
        worst = max(worst, 0.5 * float((ours - target).abs().sum()))
        unbudgeted = node_law(RelaxedTreeRejection(Unbudgeted(NEIGHBOURS, 3, lam=lam)), target, draft)
        worst_unbudgeted = max(worst_unbudgeted, 0.5 * float((unbudgeted - target).abs().sum()))
    assert worst <= bound + 1e-12
    if lam < 1.2:
        assert worst_unbudgeted > bound


# ---- the sampler walk realises the enumerated law ------------------------------------------------------------------

@pytest.mark.parametrize("siblings,budget", [("without_replacement", {"lam": 3.0}), ("deterministic", {"delta": 0.3})])
def test_the_walk_samples_the_enumerated_relaxed_law(siblings, budget):
    # the drafter's shape: two children at the root, one under each
    expected = joint(relaxed_rule(siblings, k=3, **budget), siblings, horizon=2, shape=[-1, 0, 0, 1, 2])
    rule = relaxed_rule(siblings, k=3, **budget)
    drafter = TableTreeDrafter(DRAFT, PLAIN, branching=(2, 1), siblings=siblings)
    # a third token keeps the loop from capping the first steps' trees (a capped node is not tested: a bonus
    # token is exact where the enumeration's relaxed test would run); the first two tokens are compared
    result = generate(TableTarget(TARGET), drafter, rule, [list(PROMPT)] * 4000, processing=PLAIN,
                      max_new_tokens=3, policy=FixedLength(2), seed=3)
    samples = [tuple(t[:2]) for t in result.tokens]
    fit = goodness_of_fit(samples, expected)
    assert fit.p_value > 1e-4, fit
    assert rule.accepts > 0 and 0 < rule.relaxed_share < 1
    # negative control: the same samples are far from the exact target law
    assert goodness_of_fit(samples, target_joint(TARGET, PLAIN, PROMPT, 2)).p_value < 1e-6


@pytest.mark.parametrize("lam,siblings", [(1.0, "without_replacement"), (5.0, "without_replacement"),
                                          (3.0, "deterministic"), (None, "without_replacement"),
                                          (None, "deterministic"), (None, "with_replacement")])
def test_batched_chain_walk_equals_the_node_by_node_walk(lam, siblings):
    """A chain is walked with every node's acceptance probability in one call; the same uniforms must give the
    same path, tokens and relaxed counts as the generic walk, with and without per-row depth limits. lam None:
    the exact rule, whose generic walk is `kernels.tree_rejection_sample`."""
    generator = torch.Generator().manual_seed(0)
    vocab, batch, depth = 40, 3, 6
    neighbours = latent_neighbours(torch.randn(vocab, 4, generator=generator), 5)
    for trial in range(60):
        target = torch.rand(batch, depth + 1, vocab, generator=generator).pow(3)
        draft = torch.rand(batch, depth + 1, vocab, generator=generator).pow(3)
        target, draft = target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)
        tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator).reshape(batch, depth + 1)
        limit = torch.tensor([depth, 2, 4]) if trial % 2 else None
        probs = draft if siblings != "deterministic" else None
        accept = torch.rand(batch, depth + 1, dtype=torch.float64, generator=generator)
        emit = torch.rand(batch, depth + 1, dtype=torch.float64, generator=generator)
        results = []
        for batched in (True, False):
            tree = DraftTree(tokens, torch.arange(-1, depth).repeat(batch, 1), probs, limit)
            tree.__dict__["is_chain"] = batched  # False: the node-by-node walk over the same chain
            if lam is None:
                rule = TreeRejection(siblings)
                results.append((rule.walk(tree, target, accept, emit), 0, 0))
            else:
                rule = RelaxedTreeRejection(Relaxation(neighbours, 5, lam=lam), siblings)
                results.append((rule.walk(tree, target, accept, emit), rule.accepts, rule.relaxed_accepts))
        (fast, fast_accepts, fast_relaxed), (slow, slow_accepts, slow_relaxed) = results
        assert all(torch.equal(a, b) for a, b in zip(fast, slow)), trial
        assert (fast_accepts, fast_relaxed) == (slow_accepts, slow_relaxed)
