"""Continuous batching: `speculative_generate(queue=...)` serves a request queue through a fixed number of batch
rows, a finished request's row taking the next one. Each request must come out exactly as it does alone: on the
toy model token for token at temperature 1, on a tiny HF pair token for token against plain greedy decoding,
with every drafter and with TETRIS; a target that does not really re-prefill a row (the negative control) fails
the same comparison."""

import pytest
import torch

from tiny_models import save_tiny
from specgen.errors import InvalidRequest
from specgen.samplers.acceptance import make_rule
from specgen.samplers.loop import generate, speculative_generate
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing


def _serve(target, drafter, processing, requests, batch, **options) -> dict[int, list[int]]:
    """requests: [(sample id, prompt)]; the first `batch` start the batch, the rest wait in the queue."""
    out: dict[int, list[int]] = {}
    finished = []
    first, rest = requests[:batch], requests[batch:]
    for event in speculative_generate(target, drafter, make_rule("chain", processing), [p for _, p in first],
                                      processing=processing, sample_ids=[s for s, _ in first], queue=iter(rest),
                                      **options):
        out.setdefault(event.sample, []).extend(event.tokens)
        if event.finished:
            finished.append(event.sample)
    assert sorted(finished) == sorted(s for s, _ in requests)  # every request ends exactly once
    return out


def _alone(target, drafter, processing, sample_id, prompt, **options) -> list[int]:
    events = speculative_generate(target, drafter, make_rule("chain", processing), [prompt], processing=processing,
                                  sample_ids=[sample_id], **options)
    return [t for event in events for t in event.tokens]


def _toy_requests(count: int, vocab: int, seed: int = 0):
    rng = torch.Generator().manual_seed(seed)
    return [(100 + i, torch.randint(0, vocab, (int(torch.randint(1, 6, (1,), generator=rng)),), generator=rng))
            for i in range(count)]


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_served_requests_equal_their_solo_runs_on_the_toy_model(batch):
    """At temperature 1 a request's tokens are a function of (seed, sample id, prompt) alone: served in any
    row of any batch, after any other requests, they are the solo run's tokens."""
    from specgen.samplers.toy import TableDrafter, TableLM, TableTarget

    target_lm = TableLM(5, order=2, seed=3)
    draft_lm = target_lm.mixed_with(TableLM(5, order=2, seed=4, scale=3.0), 0.6)
    processing = Processing(temperature=1.0)
    requests = _toy_requests(7, 5)
    options = dict(max_new_tokens=9, seed=11, policy=FixedLength(3), stop_tokens=(4,))
    served = _serve(TableTarget(target_lm), TableDrafter(draft_lm, processing), processing, requests, batch,
                    **options)
    for sample_id, prompt in requests:
        assert served[sample_id] == _alone(TableTarget(target_lm), TableDrafter(draft_lm, processing), processing,
                                           sample_id, prompt, **options)
    assert any(len(tokens) < 9 for tokens in served.values())  # some stopped early: rows finish at different steps


def test_queue_errors():
    from specgen.samplers.toy import TableLM, TableTarget

    class NoRefill:
        vocab_size = 5

    processing = Processing()
    with pytest.raises(InvalidRequest, match="cannot serve a request queue"):
        next(speculative_generate(NoRefill(), None, make_rule("chain", processing), [torch.tensor([1])],
                                  processing=processing, max_new_tokens=2, queue=iter([])))
    with pytest.raises(InvalidRequest, match="at least one token"):
        list(speculative_generate(TableTarget(TableLM(5, order=1, seed=0)), None, make_rule("chain", processing),
                                  [torch.tensor([1])], processing=processing, max_new_tokens=2,
                                  queue=iter([(1, torch.tensor([], dtype=torch.long))])))
    with pytest.raises(InvalidRequest, match="iterate speculative_generate"):
        generate(TableTarget(TableLM(5, order=1, seed=0)), None, make_rule("chain", processing), [torch.tensor([1])],
                 processing=processing, max_new_tokens=2, queue=iter([]))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from specgen.modalities.text.generator import TextGenerator

    root = tmp_path_factory.mktemp("models")
    return TextGenerator(save_tiny(root / "target", 0), save_tiny(root / "draft", 1, layers=1, hidden=16))


PROMPTS = ["ab", "hello wor", "abcabcab", "the cat sat on the", "x", "mississippi mis", "aaaa", "to be or not to"]


def _greedy_requests(generator):
    return [(10 + i, generator.encode(text)) for i, text in enumerate(PROMPTS)]


def _drafter(generator, kind: str, processing: Processing):
    from specgen.modalities.drafters.model import ModelDrafter
    from specgen.modalities.text.ngram import PromptLookupDrafter
    from specgen.samplers.tetris import TetrisDrafter

    vocab = generator.model.config.vocab_size
    model = lambda: ModelDrafter(generator.draft_model, processing, target_vocab_size=vocab)  # noqa: E731
    return {"none": lambda: None, "model": model, "ngram": PromptLookupDrafter,
            "tetris-history": lambda: TetrisDrafter(PromptLookupDrafter(), 6, "history", slot_cost=0.05),
            "tetris-confidence": lambda: TetrisDrafter(model(), 5, "confidence")}[kind]()


@pytest.mark.parametrize("kind", ["none", "model", "ngram", "tetris-history", "tetris-confidence"])
def test_served_queue_equals_plain_greedy_decoding_on_a_tiny_hf_pair(pair, kind):
    processing = Processing(temperature=0.0)
    requests = _greedy_requests(pair)
    capacity = max(len(p) for _, p in requests) + 40
    options = dict(max_new_tokens=12, policy=FixedLength(0 if kind == "none" else 4))
    served = _serve(pair.target(capacity), _drafter(pair, kind, processing), processing, requests, 3, **options)
    for sample_id, prompt in requests:
        plain = _alone(pair.target(capacity), None, processing, sample_id, prompt, max_new_tokens=12,
                       policy=FixedLength(0))
        assert served[sample_id] == plain, (kind, sample_id)


def test_a_target_that_keeps_a_rows_old_cache_fails_the_comparison(pair):
    """Negative control: prefill_rows that only moves the row's length (its cache still holds the previous
    request's keys) gives requests served after the first ones other tokens than plain decoding."""
    from specgen.modalities.runtime.transformers_adapter import TransformersTarget

    class StaleRows(TransformersTarget):
        def prefill_rows(self, prompts, rows):
            if not getattr(self, "started", False):  # the batch's first prefill is a real one
                self.started = True
                return super().prefill_rows(prompts, rows)
            self.cache.lengths[rows] = torch.tensor([len(p) - 1 for p in prompts])

    processing = Processing(temperature=0.0)
    requests = _greedy_requests(pair)
    capacity = max(len(p) for _, p in requests) + 40
    stale = StaleRows(pair.model, capacity, decode_kernel=True)
    served = _serve(stale, _drafter(pair, "model", processing), processing, requests, 3, max_new_tokens=12,
                    policy=FixedLength(4))
    differ = [sid for sid, prompt in requests
              if served[sid] != _alone(pair.target(capacity), None, processing, sid, prompt, max_new_tokens=12,
                                       policy=FixedLength(0))]
    assert differ and min(differ) >= 13  # only the queued requests (served after another one) go wrong


def test_prefill_rows_scores_as_a_fresh_prefill(pair):
    """After rows have decoded, re-prefilling one of them gives its next forward the logits a target prefilled
    with that prompt alone gives; the other row's cache is untouched."""
    first, second, new = (pair.encode(t) for t in ("hello wor", "abcabc", "the cat sat"))
    target = pair.target(64)
    target.prefill([first, second])
    rows = torch.arange(2)
    tokens = torch.stack([first[-1:], second[-1:]])
    positions = torch.tensor([[len(first) - 1], [len(second) - 1]])
    target.score(tokens, positions, rows)
    target.commit(torch.ones(2, 1, dtype=torch.bool), rows)
    target.prefill_rows([new], torch.tensor([1]))
    both = target.score(torch.stack([torch.tensor([5]), new[-1:]]), torch.tensor([[len(first)], [len(new) - 1]]),
                        rows)
    fresh = pair.target(64)
    fresh.prefill([new])
    alone = fresh.score(new[-1:][None], torch.tensor([[len(new) - 1]]), torch.arange(1))
    assert torch.allclose(both[1], alone[0], atol=1e-5)
    reference = pair.target(64)
    reference.prefill([torch.cat([first, torch.tensor([5])])])
    row0 = reference.score(torch.tensor([[5]]), torch.tensor([[len(first)]]), torch.arange(1))
    assert torch.allclose(both[0], row0[0], atol=1e-5)


def test_a_long_new_prompt_beside_a_long_running_row_fits_the_draft(pair):
    """A row that takes a long new prompt while another row is far along: the draft caches the prompt in a forward
    of its own (a shared padded forward would need the long row's length plus the prompt's width, past the
    model's 96 positions), and its law equals a fresh drafter's on that prompt."""
    from specgen.modalities.drafters.model import ModelDrafter
    from specgen.samplers.types import DecodeContext

    processing = Processing(temperature=0.0)
    vocab = pair.model.config.vocab_size
    rng = torch.Generator().manual_seed(1)
    running = torch.randint(2, vocab, (70,), generator=rng)
    new = torch.randint(2, vocab, (40,), generator=rng)
    drafter = ModelDrafter(pair.draft_model, processing, target_vocab_size=vocab)
    drafter.propose(DecodeContext([running, new[:3]], torch.arange(2), torch.tensor([0, 1])), 2)
    step = drafter.propose(DecodeContext([running, new], torch.arange(2), torch.tensor([0, 2])), 2)
    fresh = ModelDrafter(pair.draft_model, processing, target_vocab_size=vocab)
    alone = fresh.propose(DecodeContext([new], torch.arange(1), torch.tensor([2])), 2)
    assert torch.equal(step.tokens[1], alone.tokens[0])
    assert torch.allclose(step.draft_probs[1], alone.draft_probs[0])
