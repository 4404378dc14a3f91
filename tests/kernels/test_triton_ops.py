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
    from specgen.samplers.length_policies import FixedLength
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


# ---- Jacobi ops: coupled_resample and gumbel_argmax ----------------------------------------------

def _laws(shape, g, sparse):
    weights = torch.rand(shape, generator=g, dtype=torch.float64) ** 4
    if sparse:  # zeros in the laws, at least one positive entry per law
        weights = weights * (torch.rand(shape, generator=g) < 0.3)
        weights[..., 0] += 1e-3
    return weights / weights.sum(-1, keepdim=True)


def _coupled_case(batch, k, vocab, seed, sparse=False):
    """Draft laws near the target ones (so slots are both kept and resampled), float32 like model outputs;
    some drafts sit where their own law is zero or are PLACEHOLDER (never kept)."""
    g = torch.Generator().manual_seed(seed)
    target = _laws((batch, k, vocab), g, sparse)
    draft = 0.5 * target + 0.5 * _laws((batch, k, vocab), g, sparse)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    odd = torch.rand(batch, k, generator=g) < 0.2
    tokens = torch.where(odd, torch.randint(-1, vocab, (batch, k), generator=g), tokens)
    keep_u = torch.rand(batch, k, generator=g, dtype=torch.float64)
    draw_u = torch.rand(batch, k, generator=g, dtype=torch.float64)
    return tokens, draft.float(), target.float(), keep_u, draw_u


def _assert_coupled_equal(case):
    expected, got = reference.coupled_resample(*case), triton_ops.coupled_resample(*case)
    assert got[1].dtype == torch.bool and got[0].dtype == torch.long
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (got, expected)
    return expected


@pytest.mark.parametrize("batch,k,vocab", [(1, 1, 2), (3, 4, 13), (4, 3, 1500), (2, 5, 4099)])
def test_coupled_resample_matches_torch(batch, k, vocab):
    kept = []
    for seed in range(3):
        kept.append(_assert_coupled_equal(_coupled_case(batch, k, vocab, seed, sparse=seed == 2))[1])
    kept = torch.cat([x.flatten() for x in kept])
    assert batch * k < 4 or (bool(kept.any()) and not bool(kept.all()))  # both branches were exercised


def test_coupled_resample_float64_laws_and_extreme_uniforms():
    tokens, draft, target, keep_u, draw_u = _coupled_case(4, 6, 37, 5, sparse=True)
    keep_u[0], draw_u[1] = 2.0 ** -54, 2.0 ** -54
    keep_u[2], draw_u[3] = 1.0 - 2.0 ** -53, 1.0 - 2.0 ** -53
    _assert_coupled_equal((tokens, draft.double(), target.double(), keep_u, draw_u))


def test_coupled_resample_empty_residual_draws_from_the_target():
    """Draft law == target law: the residual is empty. Drafts the law gives zero weight (and PLACEHOLDER drafts
    read at token 0, here of weight 0) are rejected and redrawn from the target; the rest are all kept."""
    g = torch.Generator().manual_seed(11)
    target = _laws((3, 5, 41), g, sparse=True)
    target[..., 0] = 0.0
    target = target / target.sum(-1, keepdim=True)
    tokens = torch.randint(-1, 41, (3, 5), generator=g)
    keep_u = torch.rand(3, 5, generator=g, dtype=torch.float64)
    draw_u = torch.rand(3, 5, generator=g, dtype=torch.float64)
    out, kept = _assert_coupled_equal((tokens, target.clone(), target, keep_u, draw_u))
    positive = target.gather(-1, tokens.clamp(min=0)[..., None]).squeeze(-1) > 0
    assert torch.equal(kept, positive) and not bool(kept.all())
    assert bool((target.gather(-1, out.clamp(min=0)[..., None]) > 0).all())
    # a degenerate all-zero law follows the reference's clamp too (the last index)
    zeros = torch.zeros(1, 2, 9, dtype=torch.float64)
    degenerate = (torch.tensor([[3, -1]]), zeros, zeros, keep_u[:1, :2], draw_u[:1, :2])
    assert _assert_coupled_equal(degenerate)[0].tolist() == [[8, 8]]


def test_coupled_resample_large_vocabulary():
    tokens, draft, target, _, draw_u = _coupled_case(1, 2, 262_144, 7)
    keep_u = torch.tensor([[1.0 - 2.0 ** -53, 2.0 ** -54]], dtype=torch.float64)  # resample slot 0, keep slot 1
    tokens[0, 0] = int((draft[0, 0] - target[0, 0]).argmax())  # target/draft < 1 there
    tokens[0, 1] = int(draft[0, 1].argmax())
    _, kept = _assert_coupled_equal((tokens, draft, target, keep_u, draw_u))
    assert kept.tolist() == [[False, True]]


def _gumbel_case(shape, seed, sparse=False):
    g = torch.Generator().manual_seed(seed)
    target = _laws(shape, g, sparse)
    exponential = -torch.log(torch.rand(shape, generator=g, dtype=torch.float64))
    return target, exponential


@pytest.mark.parametrize("shape", [(1, 1, 2), (3, 4, 13), (2, 3, 1500), (2, 2, 4099), (5, 37)])
def test_gumbel_argmax_matches_torch(shape):
    for seed in range(3):
        target, exponential = _gumbel_case(shape, seed, sparse=seed == 2)
        for probs in (target, target.float()):
            expected = reference.gumbel_argmax(probs, exponential)
            assert torch.equal(triton_ops.gumbel_argmax(probs, exponential), expected)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:divide by zero:RuntimeWarning")
def test_gumbel_argmax_ties_infinities_nans_and_broadcasting():
    vocab = 2100  # ties inside one block and across blocks (BLOCK = 1024): the first maximal index wins
    target = torch.zeros(4, vocab, dtype=torch.float64)
    target[0, [5, 1500, 2000]] = 1 / 3
    target[1, [1500, 2000]] = 0.5
    target[2] = 1 / vocab
    target[3, 7] = 1.0
    exponential = torch.ones(4, vocab, dtype=torch.float64)
    exponential[3, 9] = 0.0  # 0/0 = NaN: torch's argmax returns the first NaN
    expected = reference.gumbel_argmax(target, exponential)
    assert expected.tolist() == [5, 1500, 0, 9]
    assert torch.equal(triton_ops.gumbel_argmax(target, exponential), expected)
    exponential[3, 9], exponential[3, 7] = 1.0, 0.0  # target / 0 = inf
    assert triton_ops.gumbel_argmax(target, exponential).tolist() == [5, 1500, 0, 7]
    target, exponential = _gumbel_case((2, 3, 19), 4)  # one noise row shared by every leading index
    assert torch.equal(triton_ops.gumbel_argmax(target, exponential[0, 0]),
                       reference.gumbel_argmax(target, exponential[0, 0]))
    assert triton_ops.gumbel_argmax(target[:0], exponential[:0]).shape == (0, 3)


def test_gumbel_argmax_large_vocabulary():
    target, exponential = _gumbel_case((1, 1, 262_144), 8)
    assert torch.equal(triton_ops.gumbel_argmax(target, exponential), reference.gumbel_argmax(target, exponential))


@pytest.mark.parametrize("coupling", ["maximal", "gumbel"])
def test_dispatch_forced_to_triton_gives_identical_jacobi_generation(coupling):
    from specgen.samplers.acceptance import ChainRejection
    from specgen.samplers.jacobi import JacobiDrafter
    from specgen.samplers.loop import generate
    from specgen.samplers.length_policies import FixedLength
    from specgen.samplers.processing import Processing
    from specgen.samplers.toy import TableLM, TableTarget

    target = TableLM(6, order=2, seed=5, scale=0.5)
    prompts = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([0, 5, 4])]
    calls = []

    def spy(name):
        original = getattr(triton_ops, name)

        def wrapped(*args):
            calls.append(name)
            return original(*args)
        return wrapped

    def run():
        return generate(TableTarget(target), JacobiDrafter(6, coupling, "random"), ChainRejection(), prompts,
                        processing=Processing(top_k=4), max_new_tokens=12, policy=FixedLength(3), seed=9).tokens

    kernels.set_backend("torch")
    expected = run()
    name = "coupled_resample" if coupling == "maximal" else "gumbel_argmax"
    kernels.set_backend("triton")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(triton_ops, name, spy(name))
            assert run() == expected
    finally:
        kernels.set_backend("auto")
    assert calls  # the Triton kernel really ran


# ---- group_mass: PCG's coarse-grained masses and LANTERN++'s neighbour masses over CSR tables -------------------

def _group_case(rows, m, vocab, seed, weighted=True, max_size=9):
    """Random CSR groups (sizes 1..max_size, one empty group when vocab allows), laws with zeros, listed group ids
    with -1 padding."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, max_size + 1, (vocab,), generator=g)
    if vocab > 2:
        sizes[1] = 0  # a neighbour list may be empty
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)]).to(torch.int32)
    member_ids = torch.randint(0, vocab, (int(sizes.sum()),), generator=g).to(torch.int32)
    weights = torch.rand(member_ids.numel(), generator=g, dtype=torch.float64) if weighted else None
    probs = _laws((rows, vocab), g, sparse=seed % 2 == 1).float()
    group_ids = torch.randint(-1, vocab, (rows, m), generator=g)
    return probs, group_ids, indptr, member_ids, weights, int(sizes.max())


@pytest.mark.parametrize("rows,m,vocab,max_size", [(1, 1, 2, 1), (3, 5, 13, 4), (4, 7, 1100, 9), (2, 3, 4099, 1500)])
@pytest.mark.parametrize("weighted", [True, False])
def test_group_mass_matches_torch(rows, m, vocab, max_size, weighted):
    for seed in range(3):
        case = _group_case(rows, m, vocab, seed, weighted, max_size)
        expected, got = reference.group_mass(*case), triton_ops.group_mass(*case)
        assert got.dtype == torch.float64 and got.shape == (rows, m)
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-15), (seed, got, expected)
        assert bool((got[case[1] < 0] == 0).all())


def test_group_mass_of_token_groups_under_forced_triton_dispatch():
    from specgen.samplers.groups import build_groups

    g = torch.Generator().manual_seed(0)
    groups = build_groups(torch.randn(300, 6, generator=g), 0.3, 310)
    probs = _laws((3, 310), g, sparse=False)
    kernels.set_backend("torch")
    expected = groups.coarse(probs)
    kernels.set_backend("triton")
    try:
        assert torch.allclose(groups.coarse(probs), expected, rtol=1e-12, atol=1e-15)
    finally:
        kernels.set_backend("auto")
    assert torch.allclose(expected, probs @ groups.dense_weights.T, atol=1e-14)
