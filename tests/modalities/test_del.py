"""DEL (modalities/drafters/dynamic_exit.py) on a tiny random Llama with random adapters at exit layers 1 and 2: the
target keeps each exit layer's hidden states without changing a logit, the shadow tokens are what each exit's
self-draft computes at the committed positions (a shadow fed another exit's states is caught), the choice of
(exit layer, length) follows the throughput model, every proposal is the chosen exit's law, and the output is the
target's: greedy equality with plain decoding (also with the exit layer switched every step and in a served queue),
chi-square at temperature 1 with its leaking negative control, and exact enumeration with a context-dependent exit."""

import pytest
import torch

from chain_checks import (LeakyRule, memo, queued_and_alone, sampled_fit, save_random_adapter,
                          stopped_chain_proposals)
from tiny_models import HFTable, save_tiny
from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.drafters import dynamic_exit
from specgen.modalities.drafters.dynamic_exit import DynamicDraftExit, ExitChoice, ShadowExit, choose_exit
from specgen.modalities.pipeline import servable
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.modalities.text.training.kangaroo import draft_logits
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint
from specgen.samplers.processing import Processing
from specgen.samplers.registry import get_method

PROMPT = "abc abc abc (x"
EXITS = (1, 2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("del") / "target"
    save_tiny(folder, 0, layers=3, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    return folder, model, {layer: save_random_adapter(model, folder, layer, seed=layer, agreement=0.5 + 0.1 * layer)
                          for layer in EXITS}


@pytest.fixture(scope="module")
def generator(tiny):
    return TextGenerator(str(tiny[0]))


def exit_logits(tiny, layer):
    """context -> the self-draft's logits at exit `layer`, the reference way (transformers' layers, then the
    adapter module), memoised."""
    folder, model, adapters = tiny

    @torch.no_grad()
    def logits(context):
        hidden = model.model(input_ids=torch.tensor([list(context)]), output_hidden_states=True).hidden_states
        return draft_logits(model, adapters[layer], hidden[layer])[0, -1].double()

    return memo(logits)


# ---- the target keeps each exit layer's states; the shadows read them --------------------------------------------


def test_kept_layer_states_are_the_models_and_change_no_logit(generator, tiny):
    folder, model, _ = tiny
    ids = generator.encode(PROMPT)
    window = torch.cat([ids[-1:], ids[:4]])[None]
    positions = (len(ids) - 1 + torch.arange(5))[None]
    plain, kept = generator.target(), generator.target()
    kept.keep_layer_features(EXITS)
    for engine in (plain, kept):
        engine.prefill([ids])
    assert torch.equal(plain.score(window, positions, torch.arange(1)), kept.score(window, positions, torch.arange(1)))
    kept.commit(torch.tensor([[True, True, True, False, False]]), torch.arange(1))
    context = torch.cat([ids, ids[:2]])
    hidden = model.model(input_ids=context[None], output_hidden_states=True).hidden_states
    for layer in EXITS:
        stored = kept.layer_features[layer][0, :len(context) - 1]
        assert torch.allclose(stored, hidden[layer][0, :len(context) - 1], atol=1e-4)


def shadow_hits(tiny, exit_layer, fed_layer, context):
    """(hits, positions) of exit `exit_layer`'s shadow fed the target's states after `fed_layer` layers, and the
    reference count from the adapter's own law (transformers' layers, then the adapter module)."""
    folder, model, adapters = tiny
    hidden = model.model(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states
    shadow = ShadowExit(model, adapters[exit_layer], 96)
    hits, seen = torch.zeros(1), torch.zeros(1)
    for end in range(4, len(context) + 1, 3):  # a few steps' worth of committed tokens at a time
        seen_now = shadow.matches([0], [context[:end]], hidden[fed_layer], counted_from=[3])
        hits, seen = hits + seen_now.hits, seen + seen_now.seen
        assert len(seen_now.confidence) == int(seen_now.seen.sum()) and bool((seen_now.confidence <= 1).all())
    reference = draft_logits(model, adapters[exit_layer], hidden[exit_layer])[0].argmax(-1)
    expected = sum(int(reference[p]) == context[p + 1] for p in range(2, len(context) - 1))
    return int(hits), int(seen), expected


def greedy_context(generator):
    """The prompt and the target's own greedy continuation (where an exit's drafts sometimes agree)."""
    return generator.encode(PROMPT).tolist() + generator.generate(PROMPT, method="ar", max_new_tokens=20).tokens


def test_shadow_tokens_are_the_exits_own_drafts(tiny, generator):
    context = greedy_context(generator)
    for layer in EXITS:
        hits, seen, expected = shadow_hits(tiny, layer, layer, context)
        assert seen == len(context) - 3 and hits == expected
    assert 0 < expected < seen  # the check can tell matches from misses


def test_a_shadow_fed_another_exits_states_is_caught(tiny, generator):
    context = greedy_context(generator)
    hits, _, expected = shadow_hits(tiny, 2, 1, context)
    assert hits != expected


# ---- the choice --------------------------------------------------------------------------------------------------


def test_the_choice_maximises_predicted_throughput():
    step = lambda n: 1.0 + 0.1 * (n - 1)  # noqa: E731
    cheap_weak = choose_exit({1: 0.5, 2: 0.6}, {1: 0.05, 2: 0.3}, step, 8)
    assert cheap_weak.exit_layer == 1 and cheap_weak.length <= 3
    strong = choose_exit({1: 0.5, 2: 0.95}, {1: 0.05, 2: 0.05}, step, 8)
    assert strong.exit_layer == 2 and strong.length > cheap_weak.length
    # cheaper drafted tokens, longer drafts
    assert choose_exit({1: 0.8}, {1: 0.02}, step, 16).length > choose_exit({1: 0.8}, {1: 0.3}, step, 16).length
    # a small predicted gain does not move the current exit layer; a large one does
    close = choose_exit({1: 0.80, 2: 0.82}, {1: 0.1, 2: 0.1}, step, 8, current=1)
    assert close.exit_layer == 1
    assert choose_exit({1: 0.5, 2: 0.95}, {1: 0.1, 2: 0.1}, step, 8, current=1).exit_layer == 2
    assert choose_exit({1: 0.9}, {1: 0.1}, step, 1) == ExitChoice(1, 1, pytest.approx(1.9 / 1.2))


def test_the_dynamic_draft_exit_stops_where_another_token_no_longer_pays():
    draft_exit = DynamicDraftExit()
    draft_exit.rates = torch.linspace(0.05, 0.95, dynamic_exit.BINS)  # match rate rises with confidence
    draft_exit.threshold = 0.5
    sure, unsure = torch.tensor([[0.97, 0.03]]), torch.tensor([[0.55, 0.45]])
    assert not bool(draft_exit.stop(sure, sure, 1)[0])  # 0.95 * 0.95
    assert not bool(draft_exit.stop(sure, sure, 2)[0])  # 0.95^3 = 0.86
    assert bool(draft_exit.stop(unsure, sure, 3)[0])  # 0.86 * 0.55 < 0.5
    rows = torch.stack([sure[0], unsure[0]])
    assert draft_exit.stop(rows, rows, 1).tolist() == [False, True]  # row by row: 0.90 and 0.30


# ---- serving -----------------------------------------------------------------------------------------------------


class ChosenLaw:
    """Wraps the DEL drafter; keeps (context, exit layer, draft) of every proposal."""

    def __init__(self, drafter):
        self.drafter, self.seen = drafter, []

    def propose(self, ctx, budget):
        draft = self.drafter.propose(ctx, budget)
        self.seen.append(([t.tolist() for t in ctx.tokens], self.drafter.current.exit_layer, draft))
        return draft

    def observe(self, verdict):
        self.drafter.observe(verdict)


def alternate(monkeypatch):
    """Make every step switch exit layers (the hardest case for the self-drafts' caches)."""
    steps = iter(range(10_000))
    monkeypatch.setattr(dynamic_exit, "choose_exit",
                        lambda alphas, costs, step_s, longest, current=None: ExitChoice(EXITS[next(steps) % 2], 3, 1.0))


def test_every_proposal_is_the_chosen_exits_law(generator, tiny, monkeypatch):
    alternate(monkeypatch)
    folder, model, adapters = tiny
    pipeline = generator.pipeline("del", [generator.encode(PROMPT)], max_new_tokens=24,
                                  sampling={"temperature": 1.0, "top_k": 4})
    recorder = ChosenLaw(pipeline.drafter)
    pipeline.drafter = recorder
    list(pipeline.run([generator.encode(PROMPT)] * 2))
    laws = {layer: exit_logits(tiny, layer) for layer in EXITS}
    worst, chosen = 0.0, set()
    for contexts, layer, draft in recorder.seen:
        chosen.add(layer)
        for row, context in enumerate(contexts):
            for slot in range(int(draft.drafted()[row])):
                law = pipeline.processing(laws[layer](context + draft.tokens[row, :slot].tolist()))
                worst = max(worst, float((draft.draft_probs[row, slot].double() - law).abs().max()))
    assert chosen == set(EXITS) and worst < 1e-4


@pytest.mark.parametrize("params", [{}, {"exit_layers": "2", "num_draft_tokens": 4}, {"confidence": 0.9},
                                    {"draft_exit": "calibrated"}])
def test_greedy_del_equals_plain_decoding(generator, params):
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=40)
    spec = generator.generate(PROMPT, method="del", max_new_tokens=40, **params)
    assert spec.tokens == plain.tokens and spec.stats["lossless"]
    assert spec.stats["accepted"] > 0
    assert set(spec.stats["exit_alpha"]) == ({2} if "exit_layers" in params else {1, 2})
    batch = generator.generate(PROMPT, method="del", max_new_tokens=40, num_samples=2, **params)
    assert all(s["tokens"] == plain.tokens for s in batch.samples)


def test_greedy_del_switching_every_step_equals_plain_decoding(generator, monkeypatch):
    alternate(monkeypatch)
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=40)
    spec = generator.generate(PROMPT, method="del", max_new_tokens=40)
    assert spec.tokens == plain.tokens and spec.stats["exit_layer_switches"] > 5
    served, alone = queued_and_alone(generator, "del")
    assert served == alone


def test_sampled_del_follows_the_target(generator):
    fit, stats = sampled_fit(generator, "del", {})
    assert fit.p_value > 1e-4, fit
    assert stats["tau"] > 1.05


def test_the_drafts_law_leaking_into_the_output_fails_the_same_test(generator):
    fit, _ = sampled_fit(generator, "del", {}, LeakyRule())
    assert fit.p_value < 1e-6, fit


@pytest.mark.parametrize("rule,exact", [(ChainRejection(), True), (LeakyRule(), False)])
def test_the_chain_rule_with_a_context_dependent_exit_is_exact(tiny, rule, exact):
    """Each step's exit layer depends on the context (as DEL's choice does, through the committed tokens' shadows):
    the output is still the target's joint."""
    model = tiny[1]
    processing = Processing(temperature=1.0, top_k=2)
    laws = {}
    for layer in EXITS:
        logits = exit_logits(tiny, layer)
        laws[layer] = (memo(lambda c, logits=logits: processing(logits(c))),
                       memo(lambda c, logits=logits: logits(c).softmax(-1)))
    prompt = (0, 2, 3)

    def proposals(prefix):
        law, plain = laws[EXITS[sum(prefix) % 2]]
        return stopped_chain_proposals(law, plain, prefix, 1 + len(prefix) % 2, 0.0)

    out = exact_output(HFTable(model), processing, rule, proposals, prompt, 3)
    gap = max_abs_diff(out, target_joint(HFTable(model), processing, prompt, 3))
    assert gap < 1e-9 if exact else gap > 1e-3


# ---- where it is served ------------------------------------------------------------------------------------------


def test_bad_exit_layers_and_targets_without_adapters_are_refused(tmp_path, generator):
    with pytest.raises(InvalidRequest, match="exit layer"):
        generator.generate(PROMPT, method="del", max_new_tokens=2, exit_layers="1,3")
    with pytest.raises(InvalidRequest, match="comma-separated"):
        generator.generate(PROMPT, method="del", max_new_tokens=2, exit_layers="one")
    folder = tmp_path / "other"
    save_tiny(folder, 5, layers=3, hidden=32)
    other = TextGenerator(str(folder))
    with pytest.raises(ModelNotFound, match="'del'"):
        other.generate("ab", method="del", max_new_tokens=2)
    assert not servable(other, get_method("text", "del")) and servable(generator, get_method("text", "del"))
