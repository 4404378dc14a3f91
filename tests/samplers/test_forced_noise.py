"""Forced-noise tests: with the randomness passed in as data, every sampler realises exactly the
probabilities its rule reports in `decision_probs` (which the exact oracle enumerates).

(a) u = 2**-54 accepts every drafted token with accept prob > 0 along the walk; u = the largest double below
    1 accepts only where the accept prob is exactly 1.
(b) for random accept uniforms, the sampler's walk is the walk implied by `u < accept_probs`.
(c) at the stop slot/node, the emit uniform at the midpoint of token y's CDF interval under the decision's
    emit law makes the sampler emit y, for every y with positive probability.
"""

from __future__ import annotations

import pytest
import torch

from specgen.samplers.acceptance import ChainRejection, GreedyMatch, TreeRejection
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableLM, TableTarget, TableTreeDrafter
from specgen.samplers.types import AcceptanceNoise, DecodeContext, Draft, DraftTree, TokenSource

TINY = 2.0 ** -54
TOP = 1.0 - 2.0 ** -53  # the largest float64 below 1 (note 1 - 2**-54 rounds to exactly 1.0)
MODES = ("with_replacement", "without_replacement", "deterministic")


def random_probs(gen, *shape, zero_frac=0.3):
    """Distributions over the last axis with some exact zeros (never all zero), float64."""
    weights = torch.rand(*shape, generator=gen, dtype=torch.float64) + 0.05
    weights = weights * (torch.rand(*shape, generator=gen) >= zero_frac)
    weights[..., 0] += (weights.sum(-1) == 0) * 1.0
    return weights / weights.sum(-1, keepdim=True)


def midpoints(law: torch.Tensor) -> dict[int, float]:
    """{token: uniform at the midpoint of its inverse-CDF interval} for tokens with positive probability."""
    cdf = law.cumsum(0)
    total = float(cdf[-1])
    return {y: float(cdf[y] - law[y] / 2) / total for y in range(len(law)) if law[y] > 0}


def midpoint_rounds(laws: list[torch.Tensor]) -> list[list[tuple[int, float]]]:
    """Rounds of (token, uniform) per row, so that every row visits every token of its law with positive
    probability in as few sampler calls as possible (rows with fewer tokens repeat their last one)."""
    per_row = [list(midpoints(law).items()) for law in laws]
    rounds = max(len(items) for items in per_row)
    return [[items[min(r, len(items) - 1)] for items in per_row] for r in range(rounds)]


# ---- chains --------------------------------------------------------------------------------------

def chain_case(seed, batch=6, k=4, vocab=7, point_mass=False, ragged=True):
    gen = torch.Generator().manual_seed(seed)
    target = random_probs(gen, batch, k + 1, vocab)
    draft_probs = random_probs(gen, batch, k, vocab)
    same = torch.rand(batch, k, generator=gen) < 0.3  # some slots where draft == target: accept prob exactly 1
    draft_probs = torch.where(same[..., None], target[:, :k], draft_probs)
    tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).reshape(batch, k)
    if point_mass:  # deterministic proposals: sometimes the target's favourite, sometimes any token
        favourite = target[:, :k].argmax(-1)
        tokens = torch.where(torch.rand(batch, k, generator=gen) < 0.5, favourite, tokens)
    num_drafted = torch.randint(0, k + 1, (batch,), generator=gen) if ragged else torch.full((batch,), k)
    if ragged:
        num_drafted[0] = k  # at least one full row
    draft = Draft(tokens, None if point_mass else draft_probs, num_drafted=num_drafted)
    return draft, target, gen


def chain_walk(accept_probs, accept_u, drafted):
    """num_accepted implied by the decisions for each row."""
    result = []
    for b in range(accept_probs.shape[0]):
        n = 0
        while n < int(drafted[b]) and float(accept_u[b, n]) < float(accept_probs[b, n]):
            n += 1
        result.append(n)
    return result


def check_chain_verdict(verdict, draft, num_accepted):
    assert verdict.num_accepted.tolist() == num_accepted
    for b, n in enumerate(num_accepted):
        assert verdict.tokens[b, :n].tolist() == draft.tokens[b, :n].tolist()
        assert bool((verdict.tokens[b, n + 1:] == -1).all())
        expected = TokenSource.RECOVERED if n < int(draft.drafted()[b]) else TokenSource.BONUS
        assert int(verdict.source[b, n]) == expected


CHAIN_CASES = [
    pytest.param(ChainRejection(), dict(point_mass=False), id="rejection-sampled"),
    pytest.param(ChainRejection(), dict(point_mass=True), id="rejection-point-mass"),
    pytest.param(ChainRejection(), dict(point_mass=False, vocab=13, k=3), id="rejection-v13-k3"),
    pytest.param(GreedyMatch(), dict(point_mass=False), id="greedy"),
]


@pytest.mark.parametrize("rule,options", CHAIN_CASES)
@pytest.mark.parametrize("seed", range(4))
def test_chain_extreme_uniforms(rule, options, seed):
    draft, target, gen = chain_case(seed, **options)
    decisions = rule.decision_probs(draft, target)
    batch, k = draft.tokens.shape
    emit_u = torch.rand(batch, k + 1, generator=gen, dtype=torch.float64)
    low = rule(draft, target, AcceptanceNoise(torch.full((batch, k), TINY, dtype=torch.float64), emit_u))
    high = rule(draft, target, AcceptanceNoise(torch.full((batch, k), TOP, dtype=torch.float64), emit_u))
    for b in range(batch):
        probs = decisions.accept_probs[b, :int(draft.drafted()[b])]
        positive = int((probs > 0).long().cumprod(0).sum())
        certain = int((probs == 1).long().cumprod(0).sum())
        assert int(low.num_accepted[b]) == positive
        assert int(high.num_accepted[b]) == certain
    check_chain_verdict(low, draft, low.num_accepted.tolist())
    check_chain_verdict(high, draft, high.num_accepted.tolist())


@pytest.mark.parametrize("rule,options", CHAIN_CASES)
@pytest.mark.parametrize("seed", range(3))
def test_chain_walk_follows_decision_probs(rule, options, seed):
    draft, target, gen = chain_case(100 + seed, **options)
    decisions = rule.decision_probs(draft, target)
    batch, k = draft.tokens.shape
    assert bool((decisions.accept_probs[torch.arange(k) >= draft.drafted()[:, None]] == 0).all())
    seen = set()
    for _ in range(40):
        accept_u = torch.rand(batch, k, generator=gen, dtype=torch.float64)
        emit_u = torch.rand(batch, k + 1, generator=gen, dtype=torch.float64)
        verdict = rule(draft, target, AcceptanceNoise(accept_u, emit_u))
        expected = chain_walk(decisions.accept_probs, accept_u, draft.drafted())
        check_chain_verdict(verdict, draft, expected)
        seen.update(expected)
    if not isinstance(rule, GreedyMatch):
        assert len(seen) >= 2  # the test exercised different stopping slots


@pytest.mark.parametrize("rule,options", CHAIN_CASES)
@pytest.mark.parametrize("seed", range(3))
def test_chain_emits_by_inverse_cdf_of_the_decision_law(rule, options, seed):
    draft, target, gen = chain_case(200 + seed, **options)
    decisions = rule.decision_probs(draft, target)
    batch, k = draft.tokens.shape
    assert torch.allclose(decisions.emit_probs.sum(-1), torch.ones(batch, k + 1, dtype=torch.float64), atol=1e-12)
    for trial in range(3):
        accept_u = torch.rand(batch, k, generator=gen, dtype=torch.float64) ** (trial + 1)
        stops = chain_walk(decisions.accept_probs, accept_u, draft.drafted())
        for plan in midpoint_rounds([decisions.emit_probs[b, stop] for b, stop in enumerate(stops)]):
            emit_u = torch.rand(batch, k + 1, generator=gen, dtype=torch.float64)
            for b, (stop, (_, mid)) in enumerate(zip(stops, plan)):
                emit_u[b, stop] = mid
            verdict = rule(draft, target, AcceptanceNoise(accept_u, emit_u))
            assert verdict.num_accepted.tolist() == stops
            for b, (stop, (y, _)) in enumerate(zip(stops, plan)):
                assert int(verdict.tokens[b, stop]) == y, (b, stop, y)


def test_chain_recovered_law_is_the_residual_and_bonus_law_is_the_target():
    """decision_probs itself, written out: residual norm(relu(target - draft)) at drafted slots, the target
    at the bonus slot and beyond num_drafted; accept prob min(1, target/draft) (target(x) for point masses)."""
    draft, target, _ = chain_case(7)
    decisions = ChainRejection().decision_probs(draft, target)
    for b in range(draft.batch_size):
        drafted = int(draft.drafted()[b])
        for i in range(draft.length + 1):
            if i < drafted:
                q = draft.draft_probs[b, i]
                x = int(draft.tokens[b, i])
                expected_accept = min(1.0, float(target[b, i, x] / q[x])) if q[x] > 0 else 0.0
                assert float(decisions.accept_probs[b, i]) == pytest.approx(expected_accept, abs=1e-15)
                residual = (target[b, i] - q).clamp(min=0)
                expected = residual / residual.sum() if residual.sum() > 0 else target[b, i]
                assert torch.allclose(decisions.emit_probs[b, i], expected, atol=1e-15)
            else:
                assert torch.equal(decisions.emit_probs[b, i], target[b, i])
    point, target, _ = chain_case(7, point_mass=True)
    decisions = ChainRejection().decision_probs(point, target)
    for b in range(point.batch_size):
        for i in range(int(point.drafted()[b])):
            x = int(point.tokens[b, i])
            assert float(decisions.accept_probs[b, i]) == float(target[b, i, x])
            zeroed = target[b, i].clone()
            zeroed[x] = 0
            if zeroed.sum() > 0:
                assert torch.allclose(decisions.emit_probs[b, i], zeroed / zeroed.sum(), atol=1e-15)


def test_sparse_draft_vocabulary_matches_the_dense_draft():
    gen = torch.Generator().manual_seed(5)
    vocab, k, batch = 13, 3, 4
    vocab_ids = torch.tensor([1, 4, 5, 8, 11])
    sparse = random_probs(gen, batch, k, len(vocab_ids), zero_frac=0.2)
    local = torch.multinomial(sparse.reshape(-1, len(vocab_ids)), 1, generator=gen).reshape(batch, k)
    tokens = vocab_ids[local]
    target = random_probs(gen, batch, k + 1, vocab)
    sparse_draft = Draft(tokens, sparse, vocab_ids=vocab_ids)
    dense_draft = Draft(tokens, sparse_draft.dense_draft_probs(vocab))
    rule = ChainRejection()
    assert torch.equal(rule.decision_probs(sparse_draft, target).accept_probs,
                       rule.decision_probs(dense_draft, target).accept_probs)
    for _ in range(20):
        noise = AcceptanceNoise(torch.rand(batch, k, generator=gen, dtype=torch.float64),
                                torch.rand(batch, k + 1, generator=gen, dtype=torch.float64))
        assert torch.equal(rule(sparse_draft, target, noise).tokens, rule(dense_draft, target, noise).tokens)


# ---- trees ---------------------------------------------------------------------------------------

def random_tree_case(seed, siblings, batch=8, nodes=9, vocab=7):
    """Random shapes (a different tree per row), children drawn as the sibling mode says."""
    gen = torch.Generator().manual_seed(seed)
    target = random_probs(gen, batch, nodes, vocab, zero_frac=0.25)
    draft_probs = random_probs(gen, batch, nodes, vocab, zero_frac=0.2)
    same = torch.rand(batch, nodes, generator=gen) < 0.25
    draft_probs = torch.where(same[..., None], target, draft_probs)
    tokens = torch.zeros(batch, nodes, dtype=torch.long)
    parents = torch.full((batch, nodes), -1, dtype=torch.long)
    for b in range(batch):
        for n in range(1, nodes):
            # each parent gets at most as many children as its draft has support (for draws w/o replacement)
            while True:
                parent = int(torch.randint(0, n, (1,), generator=gen))
                support = int((draft_probs[b, parent] > 0).sum())
                if int((parents[b, 1:n] == parent).sum()) < min(support, 3):
                    break
            parents[b, n] = parent
        tokens[b, 0] = int(torch.randint(0, vocab, (1,), generator=gen))
        for parent in range(nodes):
            kids = (parents[b] == parent).nonzero().flatten()
            if len(kids) == 0:
                continue
            law = draft_probs[b, parent]
            if siblings == "with_replacement":
                drawn = torch.multinomial(law, len(kids), replacement=True, generator=gen)
            elif siblings == "without_replacement":
                drawn = torch.multinomial(law, len(kids), replacement=False, generator=gen)
            else:  # distinct fixed candidates, including tokens the target rules out
                drawn = torch.randperm(vocab, generator=gen)[:len(kids)]
            tokens[b, kids] = drawn
    tree = DraftTree(tokens, parents, None if siblings == "deterministic" else draft_probs)
    return tree, target, gen


def table_tree_case(seed, siblings, branching=(2, 2)):
    """A tree from TableTreeDrafter for a small batch, scored by TableTarget under its tree mask."""
    lm = TableLM(5, order=2, seed=seed)
    draft_lm = lm.mixed_with(TableLM(5, order=2, seed=seed + 50), 0.5)
    processing = Processing(temperature=1.0, top_k=4)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 0, 2]), torch.tensor([3, 3, 1])]
    ctx = DecodeContext(prompts, torch.arange(3), torch.tensor([0, 1, 2]), seed=seed)
    tree = TableTreeDrafter(draft_lm, processing, branching, siblings).propose(ctx, 0)
    target = TableTarget(lm)
    target.prefill(prompts)
    start = ctx.next_positions - 1
    logits = target.score(tree.tokens, start[:, None] + tree.depths, ctx.rows, tree.ancestor_mask)
    return tree, processing(logits), torch.Generator().manual_seed(seed)


def tree_walk(tree, accept_probs, accept_u, b):
    """The path implied by the decisions: children tried in order, the first with u < accept prob is taken."""
    path = [0]
    while True:
        chosen = None
        for kid in tree.children[b][path[-1]]:
            if float(accept_u[b, kid]) < float(accept_probs[b, kid]):
                chosen = kid
                break
        if chosen is None:
            return path
        path.append(chosen)


def check_tree_verdict(verdict, tree, b, path):
    depth = len(path) - 1
    assert int(verdict.num_accepted[b]) == depth
    assert verdict.accepted_path[b, :depth + 1].tolist() == path
    assert bool((verdict.accepted_path[b, depth + 1:] == -1).all())
    assert verdict.tokens[b, :depth].tolist() == tree.tokens[b, path[1:]].tolist()
    assert bool((verdict.tokens[b, depth + 1:] == -1).all())
    assert verdict.source[b, :depth].tolist() == [TokenSource.ACCEPTED] * depth
    stop_has_children = len(tree.children[b][path[-1]]) > 0
    assert int(verdict.source[b, depth]) == (TokenSource.RECOVERED if stop_has_children else TokenSource.BONUS)


def tree_cases():
    cases = []
    for mode in MODES:
        for seed in range(2):
            cases.append(pytest.param(mode, "random", seed, id=f"{mode}-random-{seed}"))
        cases.append(pytest.param(mode, "table", 11, id=f"{mode}-table"))
    return cases


def make_tree_case(mode, kind, seed):
    if kind == "random":
        return random_tree_case(seed, mode)
    return table_tree_case(seed, mode, branching=(3, 1) if mode == "deterministic" else (2, 2))


@pytest.mark.parametrize("mode,kind,seed", tree_cases())
def test_tree_extreme_uniforms(mode, kind, seed):
    tree, target, gen = make_tree_case(mode, kind, seed)
    rule = TreeRejection(mode)
    decisions = rule.decision_probs(tree, target)
    shape = tree.tokens.shape
    emit_u = torch.rand(*shape, generator=gen, dtype=torch.float64)
    for value, keep in ((TINY, lambda a: a > 0), (TOP, lambda a: a == 1)):
        verdict = rule(tree, target, AcceptanceNoise(torch.full(shape, value, dtype=torch.float64), emit_u))
        for b in range(tree.batch_size):
            path = [0]
            while True:  # the first child (in order) that the extreme uniform accepts
                kids = [kid for kid in tree.children[b][path[-1]] if keep(float(decisions.accept_probs[b, kid]))]
                if not kids:
                    break
                path.append(kids[0])
            check_tree_verdict(verdict, tree, b, path)


@pytest.mark.parametrize("mode,kind,seed", tree_cases())
def test_tree_walk_follows_decision_probs(mode, kind, seed):
    tree, target, gen = make_tree_case(mode, kind, 300 + seed)
    rule = TreeRejection(mode)
    decisions = rule.decision_probs(tree, target)
    shape = tree.tokens.shape
    depths = set()
    for _ in range(10):
        accept_u = torch.rand(*shape, generator=gen, dtype=torch.float64)
        verdict = rule(tree, target, AcceptanceNoise(accept_u, torch.rand(*shape, generator=gen, dtype=torch.float64)))
        for b in range(tree.batch_size):
            path = tree_walk(tree, decisions.accept_probs, accept_u, b)
            check_tree_verdict(verdict, tree, b, path)
            depths.add(len(path))
    assert len(depths) >= 2


@pytest.mark.parametrize("mode,kind,seed", tree_cases())
def test_tree_emits_by_inverse_cdf_of_the_decision_law(mode, kind, seed):
    tree, target, gen = make_tree_case(mode, kind, 600 + seed)
    rule = TreeRejection(mode)
    decisions = rule.decision_probs(tree, target)
    shape = tree.tokens.shape
    assert torch.allclose(decisions.emit_probs.sum(-1), torch.ones(shape, dtype=torch.float64), atol=1e-12)
    for trial in range(2):
        accept_u = torch.rand(*shape, generator=gen, dtype=torch.float64) ** (trial + 1)
        paths = [tree_walk(tree, decisions.accept_probs, accept_u, b) for b in range(tree.batch_size)]
        for plan in midpoint_rounds([decisions.emit_probs[b, path[-1]] for b, path in enumerate(paths)]):
            emit_u = torch.rand(*shape, generator=gen, dtype=torch.float64)
            for b, (path, (_, mid)) in enumerate(zip(paths, plan)):
                emit_u[b, path[-1]] = mid
            verdict = rule(tree, target, AcceptanceNoise(accept_u, emit_u))
            for b, (path, (y, _)) in enumerate(zip(paths, plan)):
                depth = len(path) - 1
                assert verdict.accepted_path[b, :depth + 1].tolist() == path
                assert int(verdict.tokens[b, depth]) == y, (b, path[-1], y)


def reference_node(p: torch.Tensor, q: torch.Tensor | None, children: list[int], mode: str):
    """core.md section 7, written independently of the library: per-child accept probs and the final law."""
    p = p.double().clone()
    q = None if q is None or mode == "deterministic" else q.double().clone()
    accepts = []
    for c in children:
        if q is None:
            accepts.append(float(p[c]))
            rest = p.clone()
            rest[c] = 0
            if rest.sum() > 0:
                p = rest / rest.sum()
            continue
        accepts.append(min(1.0, float(p[c] / q[c])) if q[c] > 0 else 0.0)
        residual = (p - q).clamp(min=0)
        if residual.sum() > 0:
            p = residual / residual.sum()
        if mode == "without_replacement":
            q[c] = 0
            if q.sum() > 0:
                q = q / q.sum()
    return accepts, p


@pytest.mark.parametrize("mode", MODES)
def test_tree_decision_probs_follow_the_sibling_rules(mode):
    tree, target, _ = random_tree_case(42, mode, batch=6, nodes=10)
    decisions = TreeRejection(mode).decision_probs(tree, target)
    for b in range(tree.batch_size):
        for node in range(tree.num_nodes):
            kids = tree.children[b][node]
            q = None if tree.draft_probs is None else tree.draft_probs[b, node]
            accepts, law = reference_node(target[b, node], q, tree.tokens[b, kids].tolist(), mode)
            assert decisions.accept_probs[b, kids].tolist() == pytest.approx(accepts, abs=1e-12)
            assert torch.allclose(decisions.emit_probs[b, node], law, atol=1e-12)
            if not kids:  # a leaf emits a bonus token from the target
                assert torch.equal(decisions.emit_probs[b, node], target[b, node].double())


def test_tree_sibling_rules_on_a_literal_node():
    """One root with children [0, 1] over vocab 3: target (.5, .25, .25), draft (.25, .5, .25)."""
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    tree = DraftTree.from_parents([2, 0, 1], [-1, 0, 0], torch.stack([q, q, q]))
    target = torch.stack([p, p, p])[None]
    # with replacement: child 0 accepted w.p. 1 (never rejected); child 1 then sees residual relu(p - q) = (1, 0, 0)
    d = TreeRejection("with_replacement").decision_probs(tree, target)
    assert d.accept_probs[0, 1:].tolist() == [1.0, 0.0]
    # without replacement, children [1, 0]: accept 1 w.p. .5; on rejection p <- (1, 0, 0), q <- (.5, 0, .5):
    # child 0 accepted w.p. min(1, 1/.5) = 1
    tree = DraftTree.from_parents([2, 1, 0], [-1, 0, 0], torch.stack([q, q, q]))
    d = TreeRejection("without_replacement").decision_probs(tree, target)
    assert d.accept_probs[0, 1:].tolist() == [0.5, 1.0]
    d = TreeRejection("with_replacement").decision_probs(tree, target)
    assert d.accept_probs[0, 1:].tolist() == [0.5, 1.0]
    # deterministic, children [1, 0]: accept 1 w.p. .25; then p <- (2/3, 0, 1/3): accept 0 w.p. 2/3; then emit 2
    d = TreeRejection("deterministic").decision_probs(tree, target)
    assert d.accept_probs[0, 1:].tolist() == pytest.approx([0.25, 2 / 3], abs=1e-15)
    assert d.emit_probs[0, 0].tolist() == pytest.approx([0.0, 0.0, 1.0], abs=1e-15)
