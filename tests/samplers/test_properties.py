"""Property tests (hypothesis) of verdicts and of the draft-verify loop on table models."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specgen.kernels import PLACEHOLDER, sample_categorical
from specgen.samplers.acceptance import ChainRejection, GreedyMatch, TreeRejection, make_rule
from specgen.samplers.loop import generate
from specgen.samplers.noise import Purpose, counter_uniform
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableDrafter, TableLM, TableTarget, TableTreeDrafter
from specgen.samplers.types import AcceptanceNoise, Draft, DraftTree, TokenSource

TINY = 2.0 ** -54
TOP = 1.0 - 2.0 ** -53

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
# Loop runs are slower; shrinking is skipped so a failure is reported without re-running many generations.
LOOP = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])


def random_probs(gen, *shape, zero_frac=0.3):
    weights = (torch.rand(*shape, generator=gen, dtype=torch.float64) + 0.05)
    weights = weights * (torch.rand(*shape, generator=gen) >= zero_frac)
    weights[..., 0] += (weights.sum(-1) == 0) * 1.0
    return weights / weights.sum(-1, keepdim=True)


def uniforms(gen, shape, mode):
    """float64 uniforms in (0, 1): random, or pushed to the extremes."""
    if mode == "tiny":
        return torch.full(shape, TINY, dtype=torch.float64)
    if mode == "top":
        return torch.full(shape, TOP, dtype=torch.float64)
    values = torch.rand(*shape, generator=gen, dtype=torch.float64).clamp(TINY, TOP)
    if mode == "mixed":
        pick = torch.randint(0, 3, shape, generator=gen)
        values = torch.where(pick == 0, TINY, torch.where(pick == 1, TOP, values))
    return values


chain_cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2 ** 31 - 1),
    "batch": st.integers(1, 4),
    "k": st.integers(0, 5),
    "vocab": st.integers(2, 9),
    "kind": st.sampled_from(["sampled", "point_mass", "greedy"]),
    "ragged": st.booleans(),
    "noise": st.sampled_from(["random", "tiny", "top", "mixed"]),
})


def build_chain(case):
    gen = torch.Generator().manual_seed(case["seed"])
    batch, k, vocab = case["batch"], case["k"], case["vocab"]
    target = random_probs(gen, batch, k + 1, vocab)
    draft_probs = random_probs(gen, batch, k, vocab)
    tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).reshape(batch, k) if k else \
        torch.zeros(batch, 0, dtype=torch.long)
    drafted = torch.randint(0, k + 1, (batch,), generator=gen) if case["ragged"] else torch.full((batch,), k)
    draft = Draft(tokens, None if case["kind"] == "point_mass" else draft_probs, num_drafted=drafted)
    rule = GreedyMatch() if case["kind"] == "greedy" else ChainRejection()
    noise = AcceptanceNoise(uniforms(gen, (batch, k), case["noise"]), uniforms(gen, (batch, k + 1), case["noise"]))
    return draft, target, rule, noise


@FAST
@given(chain_cases)
def test_chain_verdict_layout(case):
    draft, target, rule, noise = build_chain(case)
    verdict = rule(draft, target, noise)
    vocab, k = case["vocab"], case["k"]
    n_acc, drafted = verdict.num_accepted, draft.drafted()
    assert verdict.tokens.shape == (case["batch"], k + 1)
    assert torch.equal(verdict.num_drafted, drafted)
    assert bool(((n_acc >= 0) & (n_acc <= drafted)).all())
    assert torch.equal(verdict.num_committed, n_acc + 1)
    for b in range(case["batch"]):
        n = int(n_acc[b])
        committed = verdict.tokens[b, :n + 1]
        assert bool(((committed >= 0) & (committed < vocab)).all())  # valid ids, no placeholder inside
        assert bool((verdict.tokens[b, n + 1:] == PLACEHOLDER).all())
        assert torch.equal(committed[:n], draft.tokens[b, :n])  # accepted = a drafted prefix
        emitted = TokenSource.RECOVERED if n < int(drafted[b]) else TokenSource.BONUS
        expected_source = [TokenSource.ACCEPTED] * n + [emitted] + [-1] * (k - n)
        assert verdict.source[b].tolist() == expected_source
        # the emitted token has positive probability under the law it comes from
        assert float(target[b, n, int(verdict.tokens[b, n])]) > 0 or case["kind"] == "greedy"
    assert torch.equal(verdict.num_rejections, (n_acc < drafted).long())


@FAST
@given(chain_cases)
def test_chain_draft_equal_to_target_accepts_every_drafted_token(case):
    draft, target, _, noise = build_chain({**case, "kind": "sampled"})
    k = case["k"]
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    # tokens drawn from the target itself, reported with the target's law
    tokens = torch.multinomial(target[:, :k].reshape(-1, case["vocab"]), 1, generator=gen).reshape(-1, k) if k else \
        draft.tokens
    same = Draft(tokens, target[:, :k].clone(), num_drafted=draft.num_drafted)
    verdict = ChainRejection()(same, target, noise)
    assert torch.equal(verdict.num_accepted, same.drafted())
    assert bool((verdict.source.gather(1, same.drafted()[:, None]) == TokenSource.BONUS).all())


tree_cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2 ** 31 - 1),
    "batch": st.integers(1, 3),
    "nodes": st.integers(1, 8),
    "vocab": st.integers(3, 8),
    "mode": st.sampled_from(["with_replacement", "without_replacement", "deterministic"]),
    "noise": st.sampled_from(["random", "tiny", "top", "mixed"]),
})


def build_tree(case, draft_is_target=False):
    gen = torch.Generator().manual_seed(case["seed"])
    batch, nodes, vocab = case["batch"], case["nodes"], case["vocab"]
    target = random_probs(gen, batch, nodes, vocab)
    draft_probs = target.clone() if draft_is_target else random_probs(gen, batch, nodes, vocab)
    parents = torch.full((batch, nodes), -1, dtype=torch.long)
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen)
    for b in range(batch):
        for n in range(1, nodes):
            parents[b, n] = int(torch.randint(0, n, (1,), generator=gen))
        for node in range(nodes):  # children drawn without replacement from the node's draft law
            kids = (parents[b] == node).nonzero().flatten()
            law = draft_probs[b, node]
            if 0 < len(kids) <= int((law > 0).sum()):
                tokens[b, kids] = torch.multinomial(law, len(kids), replacement=False, generator=gen)
    mode = case["mode"]
    tree = DraftTree(tokens, parents, None if mode == "deterministic" else draft_probs)
    noise = AcceptanceNoise(uniforms(gen, (batch, nodes), case["noise"]), uniforms(gen, (batch, nodes), case["noise"]))
    return tree, target, noise


@FAST
@given(tree_cases)
def test_tree_verdict_layout(case):
    tree, target, noise = build_tree(case)
    verdict = TreeRejection(case["mode"])(tree, target, noise)
    for b in range(case["batch"]):
        n = int(verdict.num_accepted[b])
        path = verdict.accepted_path[b, :n + 1].tolist()
        assert path[0] == 0 and bool((verdict.accepted_path[b, n + 1:] == -1).all())
        for parent, child in zip(path, path[1:]):
            assert int(tree.parents[b, child]) == parent
        assert int(verdict.num_committed[b]) == n + 1
        assert verdict.tokens[b, :n].tolist() == tree.tokens[b, path[1:]].tolist()
        emitted = int(verdict.tokens[b, n])
        assert 0 <= emitted < case["vocab"]
        stop_is_leaf = not tree.children[b][path[-1]]
        assert int(verdict.source[b, n]) == (TokenSource.BONUS if stop_is_leaf else TokenSource.RECOVERED)
        if stop_is_leaf:
            assert float(target[b, path[-1], emitted]) > 0
        assert bool((verdict.source[b, n + 1:] == -1).all())
        assert bool((verdict.tokens[b, n + 1:] == PLACEHOLDER).all())


@FAST
@given(tree_cases.filter(lambda c: c["mode"] != "deterministic"))
def test_tree_draft_equal_to_target_takes_the_first_child_to_a_leaf(case):
    tree, target, noise = build_tree(case, draft_is_target=True)
    verdict = TreeRejection(case["mode"])(tree, target, noise)
    for b in range(case["batch"]):
        node, path = 0, [0]
        while tree.children[b][node]:
            node = tree.children[b][node][0]
            path.append(node)
        if all(float(target[b, p, int(tree.tokens[b, c])]) > 0 for p, c in zip(path, path[1:])):
            assert verdict.accepted_path[b, :len(path)].tolist() == path
            assert int(verdict.source[b, len(path) - 1]) == TokenSource.BONUS


# ---- the loop ------------------------------------------------------------------------------------

loop_cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2 ** 20),
    "vocab": st.integers(2, 7),
    "order": st.integers(1, 2),
    "k": st.integers(1, 5),
    "max_new_tokens": st.integers(1, 10),
    "prompts": st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=5), min_size=1, max_size=3),
    "drafter": st.sampled_from(["sampled", "point_mass", "hot", "tree-without", "tree-with", "tree-deterministic"]),
})


def models(case):
    lm = TableLM(case["vocab"], order=case["order"], seed=case["seed"])
    draft_lm = lm.mixed_with(TableLM(case["vocab"], order=case["order"], seed=case["seed"] + 1), 0.5)
    prompts = [torch.tensor([t % case["vocab"] for t in p]) for p in case["prompts"]]
    return lm, draft_lm, prompts


def make_drafter(case, draft_lm):
    kind = case["drafter"]
    if kind.startswith("tree-"):
        siblings = {"tree-without": "without_replacement", "tree-with": "with_replacement",
                    "tree-deterministic": "deterministic"}[kind]
        branching = (2,) * min(case["k"], 3)
        return TableTreeDrafter(draft_lm, Processing(temperature=1.0), branching, siblings), TreeRejection(siblings)
    processing = Processing(temperature=1.6 if kind == "hot" else 1.0)
    return TableDrafter(draft_lm, processing, point_mass=kind == "point_mass"), None


def run(case, processing, *, drafter=True, prompts=None, sample_ids=None, seed=0):
    lm, draft_lm, all_prompts = models(case)
    proposer, rule = make_drafter(case, draft_lm) if drafter else (None, None)
    rule = rule or make_rule("chain", processing)
    result = generate(TableTarget(lm), proposer, rule, prompts if prompts is not None else all_prompts,
                      processing=processing, max_new_tokens=case["max_new_tokens"], policy=FixedLength(case["k"]),
                      seed=seed, sample_ids=sample_ids)
    return result


def argmax_chain(lm, prompt, n):
    context = [int(t) for t in prompt]
    for _ in range(n):
        context.append(int(lm.logits(context).argmax()))
    return context[len(prompt):]


@LOOP
@given(loop_cases)
def test_greedy_speculative_equals_the_target_argmax_chain(case):
    lm, _, prompts = models(case)
    result = run(case, Processing(temperature=0))
    for prompt, tokens in zip(prompts, result.tokens):
        assert tokens == argmax_chain(lm, prompt, case["max_new_tokens"])
    assert result.stats["committed"] == sum(len(t) for t in result.tokens)


@LOOP
@given(loop_cases)
def test_plain_decoding_is_inverse_cdf_sampling_with_counter_noise(case):
    """drafter None: the token at absolute position j of sample i is sample_categorical(processed target,
    counter_uniform(seed, i, j, EMIT)) -- reproducible and independent of the batch by construction."""
    lm, _, prompts = models(case)
    processing = Processing(temperature=0.9, top_k=max(1, case["vocab"] - 1))
    seed = case["seed"] % 1000
    result = run(case, processing, drafter=False, seed=seed)
    for i, (prompt, tokens) in enumerate(zip(prompts, result.tokens)):
        context = prompt.tolist()
        for _ in range(case["max_new_tokens"]):
            u = counter_uniform(seed, i, len(context), Purpose.EMIT)
            context.append(int(sample_categorical(processing(lm.logits(context)), u)))
        assert tokens == context[len(prompt):]


@LOOP
@given(loop_cases, st.booleans())
def test_same_seed_same_tokens(case, speculative):
    processing = Processing(temperature=1.0)
    first = run(case, processing, drafter=speculative, seed=7)
    second = run(case, processing, drafter=speculative, seed=7)
    assert first.tokens == second.tokens
    assert [e.sources for e in first.events] == [e.sources for e in second.events]
    assert all(len(t) == case["max_new_tokens"] for t in first.tokens)


@LOOP
@given(loop_cases)
def test_plain_decoding_batch_row_equals_the_row_alone(case):
    processing = Processing(temperature=1.0)
    _, _, prompts = models(case)
    batch = run(case, processing, drafter=False, seed=3)
    for i, prompt in enumerate(prompts):
        alone = run(case, processing, drafter=False, prompts=[prompt], sample_ids=[i], seed=3)
        assert alone.tokens[0] == batch.tokens[i]


@LOOP
@given(loop_cases)
def test_speculative_batch_row_equals_the_row_alone(case):
    processing = Processing(temperature=1.0)
    _, _, prompts = models(case)
    batch = run(case, processing, seed=3)
    for i, prompt in enumerate(prompts):
        alone = run(case, processing, prompts=[prompt], sample_ids=[i], seed=3)
        assert alone.tokens[0] == batch.tokens[i], (i, case)


def test_speculative_batch_row_equals_the_row_alone_at_the_end_of_generation():
    """A fixed instance of the property above. Rows progress at different speeds; near the end of generation
    one row's draft budget must not depend on how far the other rows still have to go."""
    vocab = 5
    lm = TableLM(vocab, order=2, seed=1)
    draft_lm = lm.mixed_with(TableLM(vocab, order=2, seed=2), 0.5)
    processing = Processing(temperature=1.0)
    prompts = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([0, 4, 1])]

    def tokens(rows, sample_ids):
        return generate(TableTarget(lm), TableDrafter(draft_lm, processing), ChainRejection(), rows,
                        processing=processing, max_new_tokens=7, policy=FixedLength(4), seed=0,
                        sample_ids=sample_ids).tokens

    batch = tokens(prompts, None)
    alone = [tokens([p], [i])[0] for i, p in enumerate(prompts)]
    assert alone == batch
