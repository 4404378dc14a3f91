"""Every Triton kernel against its torch twin under TRITON_INTERPRET=1: odd and large vocabularies, ragged
rows, point-mass drafts, outputs poisoned before the call; integer outputs must be equal exactly."""

import pytest
import torch

from specgen import kernels
from specgen.kernels import reference

triton_ops = pytest.importorskip("specgen.kernels.triton_ops")


def _case(batch, k, vocab, seed, point_mass=False, sparse=False):
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(batch, k + 1, vocab, generator=g, dtype=torch.float64) ** 4
    if sparse:
        target = target * (torch.rand(target.shape, generator=g) < 0.3)
        target[..., 0] += 1e-3
    target = (target / target.sum(-1, keepdim=True)).float()
    draft = torch.rand(batch, k, vocab, generator=g, dtype=torch.float64) ** 4
    draft = (draft / draft.sum(-1, keepdim=True)).float()
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, k) if k else \
        torch.zeros(batch, 0, dtype=torch.long)
    drafted = torch.randint(0, k + 1, (batch,), generator=g)
    accept_u = torch.rand(batch, k, generator=g, dtype=torch.float64)
    emit_u = torch.rand(batch, k + 1, generator=g, dtype=torch.float64)
    return tokens, None if point_mass else draft, target, drafted, accept_u, emit_u


@pytest.mark.parametrize("batch,k,vocab", [(1, 0, 2), (3, 1, 7), (5, 4, 13), (4, 3, 1500), (2, 5, 4099)])
@pytest.mark.parametrize("point_mass", [False, True])
def test_rejection_sample_matches_torch(batch, k, vocab, point_mass):
    for seed in range(3):
        case = _case(batch, k, vocab, seed, point_mass, sparse=seed == 2)
        expected = reference.rejection_sample(*case)
        got = triton_ops.rejection_sample(*case)  # the wrapper allocates with torch.empty: every slot is written
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (seed, got, expected)


def test_rejection_sample_large_vocabulary():
    case = _case(1, 2, 262_144, 7)
    assert all(torch.equal(a, b) for a, b in zip(triton_ops.rejection_sample(*case), reference.rejection_sample(*case)))


def test_rejection_sample_accepts_everything_when_draft_equals_target():
    tokens, _, target, _, accept_u, emit_u = _case(3, 4, 11, 1)
    drafted = torch.full((3,), 4)
    out, accepted = triton_ops.rejection_sample(tokens, target[:, :4].contiguous(), target, drafted, accept_u, emit_u)
    assert accepted.tolist() == [4, 4, 4] and torch.equal(out[:, :4], tokens)


@pytest.mark.parametrize("batch,k", [(1, 0), (4, 3), (6, 7)])
def test_greedy_verify_matches_torch(batch, k):
    g = torch.Generator().manual_seed(k)
    tokens = torch.randint(0, 3, (batch, k), generator=g)
    argmax = torch.randint(0, 3, (batch, k + 1), generator=g)
    drafted = torch.randint(0, k + 1, (batch,), generator=g)
    expected = reference.greedy_verify(tokens, argmax, drafted)
    got = triton_ops.greedy_verify(tokens, argmax, drafted)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_ancestor_mask_matches_torch():
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 5], [-1, 0, 1, 2, 3, 4, 5]])
    assert torch.equal(triton_ops.ancestor_mask(parents), reference.ancestor_mask(parents))


def test_dispatch_forced_to_triton_gives_identical_generation():
    from specgen.samplers.acceptance import ChainRejection
    from specgen.samplers.loop import generate
    from specgen.samplers.policies import FixedLength
    from specgen.samplers.processing import Processing
    from specgen.samplers.toy import TableDrafter, TableLM, TableTarget

    target = TableLM(6, order=2, seed=3)
    draft = target.mixed_with(TableLM(6, order=2, seed=4), 0.4)
    prompts = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([0, 5, 4])]

    from specgen.samplers.acceptance import TreeRejection
    from specgen.samplers.toy import TableTreeDrafter

    def run():
        chain = generate(TableTarget(target), TableDrafter(draft, Processing()), ChainRejection(), prompts,
                         processing=Processing(), max_new_tokens=16, policy=FixedLength(3), seed=9).tokens
        tree = generate(TableTarget(target), TableTreeDrafter(draft, Processing(), (2, 2)), TreeRejection(), prompts,
                        processing=Processing(), max_new_tokens=12, seed=9).tokens
        return chain, tree

    kernels.set_backend("torch")
    expected = run()
    kernels.set_backend("triton")
    try:
        assert run() == expected
    finally:
        kernels.set_backend("auto")


@pytest.mark.parametrize("mode", ["with_replacement", "without_replacement", "deterministic"])
@pytest.mark.parametrize("vocab", [5, 37, 1100])
def test_tree_rejection_sample_matches_torch(mode, vocab):
    from specgen.samplers.processing import Processing
    from specgen.samplers.toy import TableLM, TableTreeDrafter
    from specgen.samplers.types import DecodeContext

    for seed in range(2):
        lm = TableLM(vocab, order=1, seed=seed)
        rows = 4
        ctx = DecodeContext([torch.tensor([1, (2 + r) % vocab]) for r in range(rows)], torch.arange(rows), torch.arange(rows), seed)
        tree = TableTreeDrafter(lm, Processing(top_k=3), (3, 2), mode).propose(ctx, 0)  # sparse laws: phantom kids
        g = torch.Generator().manual_seed(seed)
        target = torch.softmax(torch.randn(rows, tree.num_nodes, vocab, generator=g, dtype=torch.float64) * 3, -1)
        target[..., : vocab // 2] *= 0.2  # push mass around so rejections happen
        target = target / target.sum(-1, keepdim=True)
        accept_u = torch.rand(rows, tree.num_nodes, generator=g, dtype=torch.float64)
        emit_u = torch.rand(rows, tree.num_nodes, generator=g, dtype=torch.float64)
        probs = None if mode == "deterministic" else tree.draft_probs
        args = (tree.tokens, tree.parents, probs, target, accept_u, emit_u, mode == "without_replacement")
        expected, got = reference.tree_rejection_sample(*args), triton_ops.tree_rejection_sample(*args)
        for e, o in zip(expected, got):
            assert torch.equal(e, o), (mode, vocab, seed, expected, got)
