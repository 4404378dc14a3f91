"""DraftTree bookkeeping on hand-built trees (every mask, depth and path written out), invalid trees, and
chain-shaped trees that must verify exactly like the chain rule under the same noise."""

from __future__ import annotations

import pytest
import torch

from specgen.errors import InvalidRequest
from specgen.samplers.acceptance import ChainRejection, TreeRejection
from specgen.samplers.noise import chain_noise, tree_noise
from specgen.samplers.types import AcceptanceNoise, Draft, DraftTree

#        0
#      /   \
#     1     2
#    / \     \
#   3   4     5
#   |
#   6
SEVEN_PARENTS = [-1, 0, 0, 1, 1, 2, 3]
SEVEN_TOKENS = [9, 4, 7, 1, 2, 3, 5]
SEVEN_MASK = [
    [1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0, 0],
    [1, 1, 0, 1, 0, 0, 0],
    [1, 1, 0, 0, 1, 0, 0],
    [1, 0, 1, 0, 0, 1, 0],
    [1, 1, 0, 1, 0, 0, 1],
]

#      0
#    / | \
#   1  2  3
#   |
#   4
FIVE_PARENTS = [-1, 0, 0, 0, 1]
FIVE_MASK = [
    [1, 0, 0, 0, 0],
    [1, 1, 0, 0, 0],
    [1, 0, 1, 0, 0],
    [1, 0, 0, 1, 0],
    [1, 1, 0, 0, 1],
]


def seven():
    return DraftTree.from_parents(SEVEN_TOKENS, SEVEN_PARENTS)


def test_seven_node_tree_literal_structure():
    tree = seven()
    assert tree.batch_size == 1 and tree.num_nodes == 7
    assert tree.ancestor_mask.int().tolist() == [SEVEN_MASK]
    assert tree.depths.tolist() == [[0, 1, 1, 2, 2, 2, 3]]
    assert tree.sibling_rank.tolist() == [[0, 0, 1, 0, 1, 0, 0]]
    assert tree.children == [[[1, 2], [3, 4], [5], [6], [], [], []]]
    # leaves 4, 5, 6 in node order, root to leaf, -1 padded to max depth + 1 = 4
    assert tree.leaf_paths.tolist() == [[[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]]


def test_five_node_tree_literal_structure():
    tree = DraftTree.from_parents([0, 1, 2, 3, 4], FIVE_PARENTS)
    assert tree.ancestor_mask.int().tolist() == [FIVE_MASK]
    assert tree.depths.tolist() == [[0, 1, 1, 1, 2]]
    assert tree.sibling_rank.tolist() == [[0, 0, 1, 2, 0]]
    assert tree.children == [[[1, 2, 3], [4], [], [], []]]
    assert tree.leaf_paths.tolist() == [[[0, 2, -1], [0, 3, -1], [0, 1, 4]]]


def test_batched_trees_of_different_shapes():
    # row 0: 0 -> {1 -> {3, 4}, 2 -> {5}}; row 1: a chain 0 -> 1 -> 2 -> 3 -> 4 -> 5
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 4]])
    tree = DraftTree(torch.arange(12).reshape(2, 6), parents)
    assert tree.depths.tolist() == [[0, 1, 1, 2, 2, 2], [0, 1, 2, 3, 4, 5]]
    assert tree.sibling_rank.tolist() == [[0, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]]
    assert tree.children[1] == [[1], [2], [3], [4], [5], []]
    assert torch.equal(tree.ancestor_mask[1], torch.ones(6, 6, dtype=torch.bool).tril())
    assert tree.ancestor_mask[0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ]
    # 3 leaves at most, depth 5 at most: row 0 pads its paths, row 1 pads whole leaf slots
    assert tree.leaf_paths.tolist() == [
        [[0, 1, 3, -1, -1, -1], [0, 1, 4, -1, -1, -1], [0, 2, 5, -1, -1, -1]],
        [[0, 1, 2, 3, 4, 5], [-1, -1, -1, -1, -1, -1], [-1, -1, -1, -1, -1, -1]],
    ]
    kept = tree.kept_slots(torch.tensor([[0, 2, 5, -1, -1, -1], [0, 1, 2, -1, -1, -1]]))
    assert kept.int().tolist() == [[1, 0, 1, 0, 0, 1], [1, 1, 1, 0, 0, 0]]


@pytest.mark.parametrize("path,kept", [
    ([0, 1, 3, 6], [1, 1, 0, 1, 0, 0, 1]),
    ([0, 1, 3, -1], [1, 1, 0, 1, 0, 0, 0]),
    ([0, 2, -1, -1], [1, 0, 1, 0, 0, 0, 0]),
    ([0, -1, -1, -1], [1, 0, 0, 0, 0, 0, 0]),
])
def test_kept_slots_for_an_accepted_path(path, kept):
    assert seven().kept_slots(torch.tensor([path])).int().tolist() == [kept]


def test_root_only_tree():
    tree = DraftTree.from_parents([3], [-1])
    assert tree.depths.tolist() == [[0]]
    assert tree.leaf_paths.tolist() == [[[0]]]
    assert tree.children == [[[]]]


@pytest.mark.parametrize("tokens,parents", [
    ([1, 2, 3], [0, 0, 0]),  # root not -1
    ([1, 2, 3], [2, -1, 0]),  # root not -1 (and node 1 claims to be a root)
    ([1, 2, 3], [-1, 2, 0]),  # node 1's parent comes after it
    ([1, 2, 3], [-1, 1, 1]),  # node 1 is its own parent
    ([1, 2, 3], [-1, 0, -1]),  # a second root
    ([1, 2, 3], [-1, 0, 3]),  # parent out of range
    ([1, 2, 3], [-1, 0]),  # shapes disagree
])
def test_invalid_trees_raise_invalid_request(tokens, parents):
    with pytest.raises(InvalidRequest):
        DraftTree(torch.tensor([tokens]), torch.tensor([parents]))


def test_invalid_tree_in_one_row_of_a_batch_is_rejected():
    with pytest.raises(InvalidRequest):
        DraftTree(torch.zeros(2, 3, dtype=torch.long), torch.tensor([[-1, 0, 0], [-1, 2, 0]]))


def test_draft_as_tree_layout():
    probs = torch.rand(2, 3, 5, dtype=torch.float64)
    draft = Draft(torch.tensor([[1, 2, 3], [4, 0, 4]]), probs)
    tree = draft.as_tree(torch.tensor([7, 8]))
    assert tree.tokens.tolist() == [[7, 1, 2, 3], [8, 4, 0, 4]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2]] * 2
    assert tree.depths.tolist() == [[0, 1, 2, 3]] * 2
    assert tree.sibling_rank.tolist() == [[0, 0, 0, 0]] * 2
    assert torch.equal(tree.draft_probs[:, :3], probs)  # node n's children were drawn from draft_probs[:, n]
    assert bool((tree.draft_probs[:, 3] == 0).all())
    assert Draft(torch.tensor([[1, 2]])).as_tree(torch.tensor([0])).draft_probs is None
    with pytest.raises(InvalidRequest):
        Draft(torch.tensor([[1, 2]]), num_drafted=torch.tensor([1])).as_tree(torch.tensor([0]))


def test_tree_noise_of_a_chain_tree_is_chain_noise():
    k, sample_ids, start = 4, torch.tensor([0, 5, 2]), torch.tensor([3, 10, 0])
    tree = Draft(torch.zeros(3, k, dtype=torch.long)).as_tree(torch.zeros(3, dtype=torch.long))
    chain_accept, chain_emit = chain_noise(11, sample_ids, start, k)
    tree_accept, tree_emit = tree_noise(11, sample_ids, start, tree.depths, tree.sibling_rank)
    assert torch.equal(tree_accept[:, 1:], chain_accept)  # node n + 1 tests drafted token n
    assert torch.equal(tree_emit, chain_emit)  # node n emits at chain slot n


def _padded(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad with -1 to `width` columns (a tree verdict may be narrower than the chain's k + 1)."""
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=-1)


def _chain_case(seed, batch=5, k=3, vocab=7, point_mass=False):
    gen = torch.Generator().manual_seed(seed)
    target = torch.rand(batch, k + 1, vocab, generator=gen, dtype=torch.float64) ** 2
    target = target * (torch.rand(batch, k + 1, vocab, generator=gen) > 0.25) + 1e-3
    target = target / target.sum(-1, keepdim=True)
    draft_probs = torch.rand(batch, k, vocab, generator=gen, dtype=torch.float64)
    draft_probs = draft_probs / draft_probs.sum(-1, keepdim=True)
    tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).reshape(batch, k)
    if point_mass:  # deterministic proposals: mostly the target's favourite token
        favourite = target[:, :k].argmax(-1)
        tokens = torch.where(torch.rand(batch, k, generator=gen) < 0.7, favourite, tokens)
    return Draft(tokens, None if point_mass else draft_probs), target


@pytest.mark.parametrize("point_mass", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_chain_tree_verifies_like_the_chain_rule(point_mass, seed):
    draft, target = _chain_case(seed, point_mass=point_mass)
    batch, k = draft.tokens.shape
    tree = draft.as_tree(torch.zeros(batch, dtype=torch.long))
    modes = ["deterministic"] if point_mass else ["with_replacement", "without_replacement"]
    sample_ids = torch.arange(batch)
    outcomes = set()
    for noise_seed in range(15):
        start = torch.full((batch,), 4 + noise_seed)
        chain = ChainRejection()(draft, target, AcceptanceNoise(*chain_noise(noise_seed, sample_ids, start, k)))
        outcomes.update(chain.num_accepted.tolist())
        noise = AcceptanceNoise(*tree_noise(noise_seed, sample_ids, start, tree.depths, tree.sibling_rank))
        for mode in modes:
            verdict = TreeRejection(mode)(tree, target, noise)
            assert torch.equal(verdict.num_accepted, chain.num_accepted)
            assert torch.equal(_padded(verdict.tokens, k + 1), chain.tokens)
            assert torch.equal(_padded(verdict.source, k + 1), chain.source)
            depth = torch.arange(k + 1)
            expected_path = torch.where(depth <= chain.num_accepted[:, None], depth, -1)
            assert torch.equal(_padded(verdict.accepted_path, k + 1), expected_path)
    assert len(outcomes) >= 3  # the noise exercised several stopping slots


@pytest.mark.parametrize("point_mass", [False, True])
def test_tree_rule_given_a_chain_draft_and_chain_noise_matches_the_chain_rule(point_mass):
    """TreeRejection also accepts a plain Draft (a chain is a tree with one child per node). Given the
    chain-layout noise that goes with a Draft (accept [batch, k], emit [batch, k + 1]), it must reach
    the chain rule's verdict."""
    draft, target = _chain_case(9, point_mass=point_mass)
    batch, k = draft.tokens.shape
    for noise_seed in range(10):
        noise = AcceptanceNoise(*chain_noise(noise_seed, torch.arange(batch), torch.full((batch,), 2), k))
        chain = ChainRejection()(draft, target, noise)
        tree = TreeRejection("deterministic" if point_mass else "without_replacement")(draft, target, noise)
        assert torch.equal(_padded(tree.tokens, k + 1), chain.tokens)
        assert torch.equal(tree.num_accepted, chain.num_accepted)


def test_tree_rule_verdict_for_a_chain_draft_has_the_chain_layout():
    """Every AcceptanceRule answers a Draft of length k with the Verdict layout [batch, k + 1] (tokens and
    source), whatever the noise: callers can swap ChainRejection and TreeRejection."""
    batch, k, vocab = 3, 3, 7
    target = torch.full((batch, k + 1, vocab), 1 / vocab, dtype=torch.float64)
    tokens = torch.tensor([[1, 2, 3], [0, 0, 0], [6, 5, 4]])
    draft_probs = torch.full((batch, k, vocab), 0.4 / (vocab - 1), dtype=torch.float64)
    draft_probs.scatter_(-1, tokens[..., None], 0.6)  # draft(x) = .6 > target(x): accept prob 5/21 < 1
    draft = Draft(tokens, draft_probs)
    emit = torch.full((batch, k + 1), 0.5, dtype=torch.float64)
    for value, accepted in ((1.0 - 2.0 ** -53, 0), (2.0 ** -54, k)):
        noise = AcceptanceNoise(torch.full((batch, k), value, dtype=torch.float64), emit)
        for rule in (ChainRejection(), TreeRejection("with_replacement"), TreeRejection("without_replacement")):
            verdict = rule(draft, target, noise)
            assert verdict.num_accepted.tolist() == [accepted] * batch
            assert verdict.tokens.shape == (batch, k + 1), (rule, value)
            assert verdict.source.shape == (batch, k + 1), (rule, value)
            assert torch.equal(verdict.num_committed, verdict.num_accepted + 1)


def test_sparse_vocabulary_draft_as_tree_verifies_like_the_chain_rule():
    """A Draft over a reduced draft vocabulary (vocab_ids) turned into a tree: its draft_probs must span the
    target vocabulary, so tree verification gives the chain verdict."""
    vocab, k = 7, 2
    vocab_ids = torch.tensor([1, 3, 4])  # the largest draft id (4) is below vocab - 1
    sparse = torch.tensor([[[0.5, 0.25, 0.25], [0.25, 0.25, 0.5]]], dtype=torch.float64)
    draft = Draft(torch.tensor([[3, 4]]), sparse, vocab_ids=vocab_ids)
    target = torch.full((1, k + 1, vocab), 1 / vocab, dtype=torch.float64)
    tree = draft.as_tree(torch.tensor([0]))
    for noise_seed in range(10):
        chain_u = chain_noise(noise_seed, torch.tensor([0]), torch.tensor([0]), k)
        tree_u = tree_noise(noise_seed, torch.tensor([0]), torch.tensor([0]), tree.depths, tree.sibling_rank)
        chain = ChainRejection()(draft, target, AcceptanceNoise(*chain_u))
        verdict = TreeRejection("without_replacement")(tree, target, AcceptanceNoise(*tree_u))
        assert torch.equal(_padded(verdict.tokens, k + 1), chain.tokens)


@pytest.mark.parametrize("nodes", [1, 2, 6])
def test_chain_constructor_fills_what_the_parents_would_give(nodes):
    tokens = torch.randint(0, 9, (3, nodes))
    fast = DraftTree.chain(tokens)
    walked = DraftTree(tokens, torch.arange(-1, nodes - 1).repeat(3, 1))
    assert fast.is_chain and walked.is_chain
    for name in ("ancestor_mask", "depths", "sibling_rank"):
        assert torch.equal(getattr(fast, name), getattr(walked, name)), name
    assert not DraftTree(torch.tensor([[5, 1, 2]]), torch.tensor([[-1, 0, 0]])).is_chain  # two siblings
