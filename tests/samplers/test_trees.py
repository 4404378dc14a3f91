"""Draft-tree shapes (Sequoia's DP, named shapes, expected accepted tokens) and the tree constructions (static,
DySpec, EAGLE-2): exact enumeration on TableLMs to 1e-9, chi-square through the loop, and negative controls that
must fail the same tests."""

import random

import pytest
import torch

from specgen.errors import InvalidRequest
from specgen.samplers import trees
from specgen.samplers.acceptance import TreeRejection
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.loop import generate
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint, tree_proposals
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableLM, TableTarget

NOTES_P = [0.62, 0.15, 0.07, 0.04, 0.02]  # notes/seeds.md section 1 worked example


# ---- shapes ---------------------------------------------------------------------------------------------------

def ordered_trees(nodes: int):
    """Every ordered tree (children ranked) with `nodes` nodes, root included, as breadth-first parent arrays."""
    def forests(n):  # ordered forests of n nodes: a tuple of trees, each tree the forest of its children
        if n == 0:
            yield ()
            return
        for first in range(1, n + 1):
            for sub in forests(first - 1):
                for rest in forests(n - first):
                    yield (sub,) + rest

    def flatten(children):
        parents, queue = [-1], [(0, children)]
        while queue:
            node, kids = queue.pop(0)
            for kid in kids:
                parents.append(node)
                queue.append((len(parents) - 1, kid))
        return parents

    for forest in forests(nodes - 1):
        yield flatten(forest)


def brute_force(probs, budget, max_depth=None):
    best = 0.0
    for m in range(1, budget + 2):
        for parents in ordered_trees(m):
            if max_depth is not None and max(trees.depths_of(parents)) > max_depth:
                continue
            best = max(best, trees.expected_accepted(parents, probs))
    return best


def test_ordered_tree_enumeration_counts_catalan_numbers():
    assert [len(list(ordered_trees(m))) for m in range(1, 8)] == [1, 1, 2, 5, 14, 42, 132]


@pytest.mark.parametrize("m,unconstrained,depth3", [(4, 2.243, 2.243), (8, 2.727, 2.649), (16, 3.205, 3.002),
                                                     (32, 3.664, 3.263)])
def test_sequoia_dp_reproduces_the_worked_example(m, unconstrained, depth3):
    free = trees.sequoia_tree(NOTES_P, m - 1)
    shallow = trees.sequoia_tree(NOTES_P, m - 1, max_depth=3)
    assert len(free) == m and len(shallow) == m and max(trees.depths_of(shallow)) <= 3
    assert trees.expected_accepted(free, NOTES_P) == pytest.approx(unconstrained, abs=1e-3)
    assert trees.expected_accepted(shallow, NOTES_P) == pytest.approx(depth3, abs=1e-3)
    # without a depth limit, best-first by path product reaches the same optimum (DySpec's objective)
    greedy = trees.best_first_tree(NOTES_P, m - 1)
    assert trees.expected_accepted(greedy, NOTES_P) == pytest.approx(trees.expected_accepted(free, NOTES_P), abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_sequoia_dp_matches_brute_force(seed):
    rng = random.Random(seed)
    raw = sorted((rng.random() for _ in range(rng.randint(1, 4))), reverse=True)
    probs = [x / (sum(raw) + rng.random()) for x in raw]
    for budget in range(0, 6):
        for depth in (None, 1, 2, 3):
            tree = trees.sequoia_tree(probs, budget, depth)
            assert len(tree) <= budget + 1
            assert depth is None or max(trees.depths_of(tree)) <= depth
            assert trees.expected_accepted(tree, probs) == pytest.approx(brute_force(probs, budget, depth), abs=1e-12)


def test_sequoia_beats_chains_and_fixed_shapes_of_the_same_budget():
    for shape in (trees.chain_shape(15), trees.k_ary_shape(2, 3), trees.named_shape("k-ary-4x2")[:16]):
        budget = len(shape) - 1
        assert (trees.expected_accepted(trees.sequoia_tree(NOTES_P, budget), NOTES_P)
                >= trees.expected_accepted(shape, NOTES_P) - 1e-12)
    eagle = trees.named_shape("eagle")
    dp = trees.sequoia_tree(NOTES_P, len(eagle) - 1, max_depth=max(trees.depths_of(eagle)))
    assert trees.expected_accepted(dp, NOTES_P) > trees.expected_accepted(eagle, NOTES_P)


def test_named_shapes_and_paths():
    # EAGLE's mc_sim_7b_63: 25 paths (26 nodes with the root), 4 root children, depth 5
    eagle = trees.named_shape("eagle")
    assert len(eagle) == 26 and eagle.count(0) == 4 and max(trees.depths_of(eagle)) == 5
    medusa = trees.named_shape("medusa")
    assert len(medusa) == 64 and medusa.count(0) == 10
    assert trees.shape_from_paths([[0], [1], [0, 0], [0, 1], [1, 0]]) == [-1, 0, 0, 1, 1, 2]
    assert trees.chain_shape(3) == [-1, 0, 1, 2]
    assert trees.sibling_ranks([-1, 0, 0, 1, 1, 2]) == [0, 0, 1, 0, 1, 0]
    assert trees.expected_accepted([-1, 0, 0, 1], [0.5, 0.25]) == pytest.approx(1 + 0.5 + 0.25 + 0.25)
    with pytest.raises(InvalidRequest):
        trees.shape_from_paths([[0, 0]])  # no parent path
    with pytest.raises(InvalidRequest):
        trees.named_shape("bush")
    with pytest.raises(InvalidRequest):
        trees.sequoia_tree([0.8, 0.5], 4)  # sums above 1


# ---- exact enumeration of the constructions ---------------------------------------------------------------------

TARGET = TableLM(3, order=2, seed=21)
DRAFT = TARGET.mixed_with(TableLM(3, order=2, seed=22, scale=4.0), 0.7)
PLAIN = Processing(temperature=1.0)
WARPED = Processing(temperature=0.8, top_k=2)  # zero draft probabilities exercise the padding children
PROMPT, HORIZON = (1, 2), 3


def law(lm, processing):
    cache = {}

    def at(context):
        key = tuple(context)
        if key not in cache:
            cache[key] = processing(lm.logits(context))
        return cache[key]

    return at


def exact(make_builder, siblings, processing=PLAIN, rule_siblings=None, horizon=HORIZON, draft_processing=None):
    draft_law = law(DRAFT, draft_processing or processing)
    proposals = lambda prefix: trees.enumerate_builder(make_builder, draft_law, prefix, siblings)
    out = exact_output(TARGET, processing, TreeRejection(rule_siblings or siblings), proposals, PROMPT, horizon)
    return max_abs_diff(out, target_joint(TARGET, processing, PROMPT, horizon))


STATIC = lambda root, order: trees.StaticBuilder(root, order, [-1, 0, 0, 1])
DYSPEC = lambda root, order: trees.DySpecBuilder(root, order, 3)
EAGLE2 = lambda root, order: trees.Eagle2Builder(root, order, 3, top_k=2, depth=2)


def test_enumerated_proposals_are_distributions():
    for make, siblings in ((STATIC, "without_replacement"), (DYSPEC, "without_replacement")):
        total = sum(p for p, _ in trees.enumerate_builder(make, law(DRAFT, PLAIN), PROMPT, siblings))
        assert total == pytest.approx(1.0, abs=1e-9)


def test_static_tree_without_replacement_is_exact():
    assert exact(STATIC, "without_replacement") < 1e-9


def test_static_tree_under_warping_is_exact():
    assert exact(STATIC, "without_replacement", WARPED) < 1e-9


def test_dyspec_without_replacement_is_exact():
    assert exact(DYSPEC, "without_replacement") < 1e-9


def test_dyspec_batched_rounds_are_exact():
    """Popping past a node whose law is unknown (DySpec's batched expansion) keeps the keys token-free."""
    batched = lambda root, order: trees.DySpecBuilder(root, order, 3, per_round=2)
    assert exact(batched, "without_replacement", horizon=2) < 1e-9


def test_dyspec_and_eagle2_deterministic_are_exact():
    assert exact(DYSPEC, "deterministic") < 1e-9
    assert exact(EAGLE2, "deterministic") < 1e-9
    assert exact(lambda r, o: trees.Eagle2Builder(r, o, 4, top_k=2, depth=3), "deterministic", WARPED) < 1e-9


def test_greedy_target_gives_the_greedy_sequence():
    greedy = Processing(temperature=0)
    for make in (STATIC, DYSPEC, EAGLE2):
        assert exact(make, "deterministic", greedy, draft_processing=PLAIN) < 1e-12


def test_dyspec_builds_the_best_first_tree():
    """With the draft's top candidates (the T = 0 ordering) DySpec's batched rounds give the top-N nodes by path
    probability: every node left out (a child of a built node) is worth no more than the least built node."""
    draft_law = law(DRAFT, PLAIN)

    def value(path):
        v, context = 1.0, list(PROMPT)
        for token in path:
            v *= float(draft_law(context)[token])
            context.append(token)
        return v

    for budget in (1, 3, 5, 8):
        builder = trees.DySpecBuilder(PROMPT[-1], lambda node, l, width: trees.top_order(l, width), budget)
        trees.run_builders([builder], lambda req: [{n: draft_law(list(PROMPT) + builder.path(n)) for n in req[0]}])
        built = {tuple(builder.path(n)) for n in range(1, len(builder.tokens))}
        assert len(built) == budget
        left_out = {path + (t,) for path in built | {()} for t in range(3)} - built
        assert max(value(p) for p in left_out) <= min(value(p) for p in built) + 1e-15


# negative controls: each must miss the target's joint by far more than 1e-9

def test_dyspec_keyed_by_the_drawn_token_fails_the_oracle():
    """Ranking an undrawn sibling by its own drawn token makes the choice to try it depend on it: biased."""
    token_keyed = lambda root, order: trees.DySpecBuilder(root, order, 3, token_key=True)
    assert exact(token_keyed, "without_replacement", horizon=2) > 1e-3


def test_eagle2_rerank_of_drawn_children_fails_the_without_replacement_rule():
    """EAGLE-2's re-ranking keeps a child on its own score: with children drawn without replacement and verified
    by the without-replacement rule that is biased (hence eagle2 verifies deterministic candidates)."""
    assert exact(lambda r, o: trees.Eagle2Builder(r, o, 2, top_k=2, depth=2), "without_replacement", horizon=2) > 1e-3


def test_stored_laws_that_are_not_the_drawing_laws_fail_the_oracle():
    """A static tree drawn from a hotter draft but storing the plain draft law (a stale q) is biased."""
    hot, plain = law(DRAFT, Processing(temperature=1.7)), law(DRAFT, PLAIN)

    def proposals(prefix):
        for prob, tree in trees.enumerate_builder(STATIC, hot, prefix, "without_replacement"):
            contexts = [list(prefix) + tree.tokens[0, tree.ancestor_mask[0, n].nonzero().flatten()[1:]].tolist()
                        for n in range(tree.num_nodes)]
            stale = torch.stack([plain(c) for c in contexts])[None]
            yield prob, type(tree)(tree.tokens, tree.parents, stale)

    out = exact_output(TARGET, PLAIN, TreeRejection("without_replacement"), proposals, PROMPT, 2)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, 2)) > 1e-3


def test_iid_children_verified_without_replacement_stay_exact():
    """Not a bug: a repeated i.i.d. child has draft probability 0 once its twin was rejected (never accepted), and
    a child that differs from the earlier ones is distributed as a draw without replacement."""
    draft_law = law(DRAFT, PLAIN)
    proposals = lambda prefix: tree_proposals(draft_law, prefix, (2, 1), "with_replacement")
    out = exact_output(TARGET, PLAIN, TreeRejection("without_replacement"), proposals, PROMPT, 2)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, 2)) < 1e-9


# ---- through the loop: chi-square against the exact joint ------------------------------------------------------

LOOP_TARGET = TableLM(4, order=1, seed=31)
LOOP_DRAFT = LOOP_TARGET.mixed_with(TableLM(4, order=1, seed=32, scale=3.0), 0.7)
PROMPTS = ([1, 2], [3, 0, 1, 2, 3])
SAMPLES = 6_000  # per prompt
P_PASS, P_FAIL = 1e-4, 1e-6


def loop_drafter(construction, siblings, token_key=False):
    draft_law = law(LOOP_DRAFT, PLAIN)

    def make(root, order, depth):
        if construction == "static":
            return trees.StaticBuilder(root, order, [-1, 0, 0, 1, 1, 3])
        if construction == "dyspec":
            return trees.DySpecBuilder(root, order, 5, max_depth=depth, token_key=token_key)
        return trees.Eagle2Builder(root, order, 5, top_k=2, depth=min(3, depth))

    return trees.ContextLawDrafter(draft_law, make, siblings)


def loop_fits(drafter, siblings, seed=5):
    prompts = [torch.tensor(PROMPTS[i % 2]) for i in range(2 * SAMPLES)]
    result = generate(TableTarget(LOOP_TARGET), drafter, TreeRejection(siblings), prompts, processing=PLAIN,
                      max_new_tokens=3, policy=FixedLength(3), seed=seed)
    fits = []
    for parity, prompt in enumerate(PROMPTS):
        samples = [tuple(t) for t in result.tokens[parity::2]]
        fits.append(goodness_of_fit(samples, target_joint(LOOP_TARGET, PLAIN, prompt, 3)))
    return result, fits


@pytest.mark.slow
@pytest.mark.parametrize("construction,siblings", [("static", "without_replacement"),
                                                   ("dyspec", "without_replacement"), ("eagle2", "deterministic")])
def test_loop_samples_the_target(construction, siblings):
    result, fits = loop_fits(loop_drafter(construction, siblings), siblings)
    for fit in fits:
        assert fit.p_value > P_PASS, (construction, fit)
    assert result.stats["tau"] > 1.5


@pytest.mark.slow
def test_loop_catches_a_token_keyed_dyspec():
    _, fits = loop_fits(loop_drafter("dyspec", "without_replacement", token_key=True), "without_replacement")
    assert min(f.p_value for f in fits) < P_FAIL


# ---- greedy tree verification -----------------------------------------------------------------------------------

def test_greedy_tree_match_gives_the_greedy_sequence():
    greedy = Processing(temperature=0)
    for make in (STATIC, DYSPEC, EAGLE2):
        proposals = lambda prefix: trees.enumerate_builder(make, law(DRAFT, PLAIN), prefix, "deterministic")
        out = exact_output(TARGET, greedy, trees.GreedyTreeMatch(), proposals, PROMPT, HORIZON)
        assert max_abs_diff(out, target_joint(TARGET, greedy, PROMPT, HORIZON)) < 1e-12


@pytest.mark.parametrize("seed", range(5))
def test_greedy_tree_match_equals_the_deterministic_rule_under_a_one_hot_target(seed):
    from specgen.samplers.types import AcceptanceNoise, DraftTree

    generator = torch.Generator().manual_seed(seed)
    batch, nodes, vocab = 3, 9, 4
    parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, n, (1,), generator=generator))
                                                for n in range(1, nodes)]) for _ in range(batch)])
    tokens = torch.randint(0, vocab, (batch, nodes), generator=generator)
    tree = DraftTree(tokens, parents, depth_limit=torch.tensor([9, 2, 1]))
    target = Processing(temperature=0)(torch.randn(batch, nodes, vocab, generator=generator))
    noise = AcceptanceNoise(torch.full((batch, nodes), 0.5, dtype=torch.float64),
                            torch.full((batch, nodes), 0.5, dtype=torch.float64))
    fast = trees.GreedyTreeMatch()(tree, target, noise)
    slow = TreeRejection("deterministic")(tree, target, noise)
    assert torch.equal(fast.num_accepted, slow.num_accepted) and torch.equal(fast.tokens, slow.tokens)
    assert torch.equal(fast.source, slow.source) and torch.equal(fast.accepted_path, slow.accepted_path)
