"""Model-free drafters (stand, rest, consensus) and retrieval datastores: the suffix array against brute force, a
resumable build, the tokenizer check, tries, exactness on TableLMs (oracle, pairs of paths) and on tiny HF models
(greedy equality, chi-square), and the negative control that leaks one path's future into another's draft."""

import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_models import CHARS, HFTable, char_tokenizer, save_tiny_pair

from specgen.errors import InvalidRequest, ModelNotFound, VocabularyMismatch
from specgen.kernels import sample_categorical
from specgen.modalities.drafters.consensus import ConsensusDrafter
from specgen.modalities.drafters.retrieval import RestDrafter, candidates_as_tree, trie_tree
from specgen.modalities.drafters.stand import StandDrafter
from specgen.modalities.text import datastore as ds
from specgen.samplers.acceptance import ChainRejection, TreeRejection
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.loop import generate
from specgen.samplers.noise import Purpose, counter_uniform
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableLM, TableTarget
from specgen.samplers.types import DecodeContext, Draft

PLAIN = Processing(temperature=1.0)


# ---- the suffix array and the datastore ---------------------------------------------------------------------------

def test_suffix_array_and_matches_agree_with_brute_force():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 4, 2000).astype(np.int32)
    tokens[rng.integers(0, 2000, 40)] = ds.SEPARATOR
    order = ds.sort_suffixes(tokens)
    padded = np.concatenate([tokens, np.full(ds.MAX_MATCH + 64, ds.SEPARATOR, np.int32)])
    keys = [tuple(padded[i:i + ds.MAX_MATCH]) for i in order]
    assert keys == sorted(keys) and sorted(order.tolist()) == list(range(len(tokens)))
    store = ds.Datastore(None, {}, padded, order)
    for _ in range(100):
        query = rng.integers(0, 4, int(rng.integers(1, 9))).tolist()
        lo, hi = store.match_range(query)
        expected = {i for i in range(len(tokens)) if padded[i:i + len(query)].tolist() == query}
        assert set(order[lo:hi].tolist()) == expected
    n, lo, hi = store.longest_match([3, 3, 3] + tokens[100:110].tolist(), 16, 2)
    assert n >= 10 and 110 - n in order[lo:hi].tolist()
    for cont in store.continuations(lo, hi, n, 5, 8):
        assert ds.SEPARATOR not in cont and len(cont) <= 5


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    words = ["abc abc (x)", "def f(x):\n  return x", "the cat sat on the mat", "abc (x) def"]
    for i in range(12):
        (folder / f"doc{i:02d}.txt").write_text("\n".join(words[(i + j) % 4] for j in range(6)))
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "skip.txt").write_text("zzzz")
    return folder


def test_build_resumes_and_checks_the_tokenizer(corpus, tmp_path, monkeypatch):
    tokenizer = char_tokenizer()
    monkeypatch.setattr(ds, "SHARD_BYTES", 200)  # several shards
    files = ds.corpus_files(corpus)
    assert len(files) == 12 and all("__pycache__" not in f.parts for f in files)
    calls = []

    def failing(texts):
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    with pytest.raises(KeyboardInterrupt):
        ds.tokenize_corpus(files, failing, tmp_path / "work")
    done = sorted(p.name for p in (tmp_path / "work").glob("shard-*"))
    assert len(done) == 2
    calls.clear()
    resumed = ds.tokenize_corpus(files, failing.__wrapped__ if hasattr(failing, "__wrapped__") else
                                 (lambda texts: [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]),
                                 tmp_path / "work")
    fresh = ds.tokenize_corpus(files, lambda texts: [tokenizer(t, add_special_tokens=False)["input_ids"]
                                                     for t in texts], tmp_path / "fresh")
    assert np.array_equal(resumed, fresh) and (fresh == ds.SEPARATOR).sum() == len(files)

    report = ds.build("rest", corpus, tmp_path / "store", tokenizer, model="tiny", log=lambda line: None)
    meta = json.loads((tmp_path / "store" / "meta.json").read_text())
    assert meta["tokens"] == report["tokens"] > 0 and report["size_bytes"] > 0 and "build_s" in report
    assert not (tmp_path / "store" / "build").exists()
    ds.Datastore.open(tmp_path / "store", ds.tokenizer_fingerprint(tokenizer))
    with pytest.raises(VocabularyMismatch, match="tiny"):
        ds.Datastore.open(tmp_path / "store", ds.tokenizer_fingerprint(char_tokenizer(CHARS[::-1])))
    with pytest.raises(ModelNotFound):
        ds.Datastore.open(tmp_path / "nothing")
    with pytest.raises(InvalidRequest):
        ds.Datastore.open(tmp_path / "store", kind="dresd")


# ---- tries -----------------------------------------------------------------------------------------------------------

def test_trie_keeps_the_heaviest_nodes_as_a_tree():
    tokens, parents = trie_tree([([1, 2, 3], 1.0), ([1, 2, 4], 1.0), ([1, 5], 3.0), ([6], 0.5)], 4, 8)
    # 1 (weight 5), its children 5 (3) before 2 (2), then 3 (1; ties with 4 go to the lower id); 6 (0.5) is cut
    assert tokens == [1, 5, 2, 3] and parents == [-1, 0, 0, 2]
    tree = candidates_as_tree([9, 9], [(tokens, parents), ([], [])])
    assert tree.tokens.shape == (2, 5) and tree.tokens[1].tolist() == [9, 9, 9, 9, 9]
    assert tree.parents[0].tolist() == [-1, 0, 1, 1, 3]
    assert trie_tree([([1, 2, 3], 1.0)], 8, 2) == ([1, 2], [-1, 0])


# ---- exactness on TableLMs: oracle and chi-square ------------------------------------------------------------------

TARGET = TableLM(3, order=2, seed=41)
PROMPT = (1, 2, 0, 1, 2, 2, 1, 0, 1)


def test_rest_candidates_are_exact_under_the_oracle():
    """The rest drafter's own candidates for each prefix (context + a fixed corpus), verified by the deterministic
    rule: the output law is the target's, at temperature 1 and under warping."""
    corpus = np.array([1, 2, 0, 1, 1, 2, 2, 0, 1, 2, 1, 0], dtype=np.int32)
    padded = np.concatenate([corpus, np.full(ds.MAX_MATCH + 64, ds.SEPARATOR, np.int32)])
    drafter = RestDrafter(ds.Datastore(None, {}, padded, ds.sort_suffixes(corpus)), tree_budget=4, max_depth=3,
                          min_match=1, context_weight=2.0)

    def proposals(prefix):
        ctx = DecodeContext([torch.tensor(prefix)], torch.tensor([0]), torch.tensor([0]))
        yield 1.0, drafter.propose(ctx, 3)

    for processing in (PLAIN, Processing(temperature=0.7, top_k=2)):
        out = exact_output(TARGET, processing, TreeRejection("deterministic"), proposals, PROMPT, 3)
        assert max_abs_diff(out, target_joint(TARGET, processing, PROMPT, 3)) < 1e-9
    assert drafter.run_summary()["matched_steps"] > 0


def test_consensus_is_exact_per_path_for_any_neighbour_text():
    """With the neighbours' text frozen, a path's proposals depend on its own prefix alone: the oracle applies."""
    drafter = ConsensusDrafter(tree_budget=4, max_depth=3, max_match=4, min_match=1)
    neighbour = torch.tensor([1, 2, 0, 1, 2, 1, 1, 0, 2, 2, 1, 0, 1])

    def proposals(prefix):
        ctx = DecodeContext([torch.tensor(prefix), neighbour], torch.tensor([0, 1]), torch.tensor([0, 1]))
        tree = drafter.propose(ctx, 3)
        yield 1.0, type(tree)(tree.tokens[:1], tree.parents[:1])

    out = exact_output(TARGET, PLAIN, TreeRejection("deterministic"), proposals, PROMPT, 3)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, 3)) < 1e-9


LOOP_TARGET = TableLM(4, order=1, seed=31)
LOOP_PROMPT = [1, 2, 3, 1, 2, 0, 1, 2]


class LeakyConsensus(ConsensusDrafter):
    """Negative control: path 2k is offered, as a one-token chain, the token path 2k + 1 is about to emit (path
    2k + 1 drafts nothing, so it emits from the target with its own noise at its next position, which this drafter
    reads): one path's future leaks into another's acceptance."""

    def propose(self, ctx, budget):
        ids = ctx.sample_ids.tolist()
        where = {sample: i for i, sample in enumerate(ids)}
        tokens = torch.zeros(len(ids), 1, dtype=torch.long)
        drafted = torch.zeros(len(ids), dtype=torch.long)
        for i, sample in enumerate(ids):
            j = where.get(sample + 1) if sample % 2 == 0 else None
            if j is None:
                continue
            u = counter_uniform(ctx.seed, ctx.sample_ids[j:j + 1], ctx.next_positions[j:j + 1], Purpose.EMIT)
            tokens[i, 0] = sample_categorical(PLAIN(LOOP_TARGET.logits(ctx.tokens[j].tolist()))[None], u)[0]
            drafted[i] = 1
        return Draft(tokens, None, num_drafted=drafted)


def pair_fits(drafter, rule, pairs=800):
    """Pairs of paths of one prompt (samples 2k and 2k + 1 draft for each other): their first tokens against the
    product of the target's marginals, and each path's first three tokens against the target's joint."""
    result = generate(TableTarget(LOOP_TARGET), drafter, rule, [torch.tensor(LOOP_PROMPT)] * (2 * pairs),
                      processing=PLAIN, max_new_tokens=3, policy=FixedLength(3), seed=17)
    first_tokens = [(a[0], b[0]) for a, b in zip(result.tokens[0::2], result.tokens[1::2])]
    first = PLAIN(LOOP_TARGET.logits(LOOP_PROMPT))
    product = {(a, b): float(first[a] * first[b]) for a in range(4) for b in range(4)}
    paths = [tuple(t) for t in result.tokens]
    return (goodness_of_fit(first_tokens, product),
            goodness_of_fit(paths, target_joint(LOOP_TARGET, PLAIN, LOOP_PROMPT, 3)), result)


def test_consensus_paths_follow_the_target_and_stay_independent():
    drafter = ConsensusDrafter(tree_budget=4, max_depth=3, max_match=4, min_match=1, group=2)
    pairs, paths, result = pair_fits(drafter, TreeRejection("deterministic"))
    assert pairs.p_value > 1e-4 and paths.p_value > 1e-4, (pairs, paths)
    assert result.stats["tau"] > 1.2


def test_a_neighbours_future_token_as_a_draft_alone_keeps_paths_independent():
    """Not a leak of randomness: a candidate is verified with the path's own noise, so whatever it is (here the
    token the neighbour is about to emit) the path's token follows the target given the candidate."""
    pairs, _, _ = pair_fits(LeakyConsensus(group=2), ChainRejection(), pairs=400)
    assert pairs.p_value > 1e-4, pairs


class NeighbourNoise(TreeRejection):
    """Negative control: path 2k is verified with path 2k + 1's acceptance and emission noise (paths batched under
    one key): one path's randomness, hence its future tokens, leaks into another's acceptance."""

    def __call__(self, tree, target_probs, noise):
        ids = noise.sample_ids.tolist()
        where = {sample: i for i, sample in enumerate(ids)}
        accept, emit = noise.accept_uniform.clone(), noise.emit_uniform.clone()
        for i, sample in enumerate(ids):
            j = where.get(sample + 1) if sample % 2 == 0 else None
            if j is not None:
                accept[i], emit[i] = noise.accept_uniform[j], noise.emit_uniform[j]
        return super().__call__(tree, target_probs, dataclasses.replace(noise, accept_uniform=accept,
                                                                        emit_uniform=emit))


def test_consensus_leaking_a_neighbours_randomness_into_acceptance_fails():
    drafter = ConsensusDrafter(tree_budget=4, max_depth=3, max_match=4, min_match=1, group=2)
    pairs, paths, _ = pair_fits(drafter, NeighbourNoise("deterministic"))
    assert pairs.p_value < 1e-6, pairs
    assert paths.p_value > 1e-4  # each path alone still follows the target: only the pair test sees the leak


def test_unshared_stand_samples_do_not_depend_on_their_neighbours():
    """share='none' (and rest, ngram): a sample's tokens are the same alone or among other samples."""
    def run(sample_ids):
        drafter = StandDrafter(4, PLAIN, tree_budget=4, max_depth=3, max_ngram=2, top_k=3, share="none")
        result = generate(TableTarget(LOOP_TARGET), drafter, TreeRejection(drafter.siblings),
                          [torch.tensor(LOOP_PROMPT)] * len(sample_ids), processing=PLAIN, max_new_tokens=12,
                          policy=FixedLength(3), seed=7, sample_ids=sample_ids)
        return result.tokens

    together = run([0, 1, 2])
    assert run([1])[0] == together[1] and run([2, 0])[1] == together[0]


# ---- tiny HF models through TextGenerator ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    from specgen.modalities.text.generator import TextGenerator

    return TextGenerator(*save_tiny_pair(tmp_path_factory.mktemp("free-models"), wide=True))


@pytest.fixture(scope="module")
def tiny_store(generator, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("store") / "rest"
    ds.build("rest", corpus, out, generator.tokenizer, model="tiny", log=lambda line: None)
    return str(out)


@pytest.fixture(scope="module")
def dense_store(generator, corpus, tmp_path_factory):
    from specgen.modalities.drafters.dense import embedder_for

    out = tmp_path_factory.mktemp("store") / "dresd"
    report = ds.build("dresd", corpus, out, generator.tokenizer, model="tiny", embedder=embedder_for(generator),
                      log=lambda line: None)
    assert report["dense_keys"] > 0 and report["dense_dim"] <= 64 and (out / "dense" / "index.faiss").exists()
    return str(out)


def stores(method, tiny_store, dense_store):
    return {"rest": {"datastore": tiny_store}, "dresd": {"datastore": dense_store}}.get(method, {})


PROMPT_TEXT = "abc abc (x) def f(x):\n  return"


@pytest.mark.parametrize("method,params", [("stand", {}), ("stand", {"tree_budget": 3, "max_depth": 2}),
                                           ("rest", {}), ("dresd", {}), ("consensus", {})])
def test_greedy_model_free_methods_equal_plain_decoding(generator, tiny_store, dense_store, method, params):
    params = {**params, **stores(method, tiny_store, dense_store)}
    plain = generator.generate(PROMPT_TEXT, method="ar", max_new_tokens=40)
    spec = generator.generate(PROMPT_TEXT, method=method, max_new_tokens=40, **params)
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.stats["lossless"] and spec.stats["steps"] <= plain.stats["steps"]


def test_greedy_consensus_samples_equal_plain_decoding(generator):
    plain = generator.generate(PROMPT_TEXT, method="ar", max_new_tokens=30)
    spec = generator.generate(PROMPT_TEXT, method="consensus", max_new_tokens=30, num_samples=3)
    assert all(s["tokens"] == plain.tokens for s in spec.samples)
    assert spec.stats["tau"] > 1.0


def test_a_datastore_for_another_tokenizer_is_refused(generator, corpus, tmp_path):
    ds.build("rest", corpus, tmp_path / "other", char_tokenizer(CHARS[::-1]), model="other", log=lambda line: None)
    with pytest.raises(VocabularyMismatch, match="other"):
        generator.generate("abc", method="rest", max_new_tokens=4, datastore=str(tmp_path / "other"))


def test_dresd_needs_a_dense_datastore_of_its_embedder(generator, tiny_store, dense_store):
    with pytest.raises(InvalidRequest, match="dresd"):
        generator.generate("abc", method="dresd", max_new_tokens=4, datastore=tiny_store)
    meta = json.loads((Path(dense_store) / "dense" / "embedder.json").read_text())
    from specgen.modalities.drafters.dense import DenseDrafter, embedder_for

    drafter_store = ds.Datastore.open(dense_store)
    embedder = embedder_for(generator)
    embedder.name = "another model"
    with pytest.raises(InvalidRequest, match="embedded with"):
        DenseDrafter(drafter_store, embedder)
    assert meta["dim"] == embedder.dim


def test_incremental_embedding_equals_a_full_forward(generator):
    from specgen.modalities.drafters.dense import embedder_for

    embedder = embedder_for(generator)
    context = generator.encode("abc abc (x) def").tolist()
    for end in (5, 6, 9, len(context)):  # the sample's cache grows by 1, then 3, then the rest
        step = embedder.query(0, context[:end])
    full, _ = embedder.hidden(torch.tensor([context]))
    assert np.allclose(step, full[0, -1].numpy(), atol=1e-5)
    assert np.allclose(embedder.query(0, context[:4]), embedder.hidden(torch.tensor([context[:4]]))[0][0, -1].numpy(),
                       atol=1e-5)  # a context that is not an extension starts over


@pytest.mark.slow
@pytest.mark.parametrize("method", ["stand", "rest", "dresd", "consensus"])
def test_sampled_model_free_methods_follow_the_target(generator, tiny_store, dense_store, method):
    params = stores(method, tiny_store, dense_store)
    prompt = "ab" + generator.generate("ab", method="ar", max_new_tokens=40).text  # the target's own phrases
    result = generator.generate(prompt, method=method, temperature=1.0, top_k=4, seed=13, num_samples=1000,
                                max_new_tokens=3, **params)
    expected = target_joint(HFTable(generator.model), Processing(temperature=1.0, top_k=4),
                            generator.encode(prompt).tolist(), 3)
    fit = goodness_of_fit([tuple(s["tokens"]) for s in result.samples], expected)
    assert fit.p_value > 1e-4, fit
    assert result.stats["accepted"] > 0  # drafts were accepted: the test exercises the tree rule
    counts = Counter(tuple(s["tokens"]) for s in result.samples)
    assert len(counts) > 3
