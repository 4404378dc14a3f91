"""Online speculative decoding (OSD) on tiny random Llama pairs: which logits are trained, that only the draft
moves, that repeated updates raise agreement, the update interval and argument checks."""

import pytest
import torch

from tiny_models import save_tiny_pair
from specgen.errors import InvalidRequest
from specgen.modalities.text.training.distill.online import OnlineDistiller, run_stream, training_positions
from specgen.modalities.text.generator import TextGenerator
from specgen.samplers.types import StepEvent, TokenSource

A, R, B = TokenSource.ACCEPTED, TokenSource.RECOVERED, TokenSource.BONUS
PROMPTS = ["abc (x", "def f(a", "x = {b", "for i in", "if a == b", "lambda q", "k = (z", "while n"]


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    torch.set_num_threads(1)
    return TextGenerator(*save_tiny_pair(tmp_path_factory.mktemp("osd"), wide=True))


@pytest.fixture
def fresh(generator):
    """The generator with its draft restored to the saved weights after the test."""
    saved = {k: v.clone() for k, v in generator.draft_model.state_dict().items()}
    yield generator
    generator.draft_model.load_state_dict(saved)


def step(tokens, sources, row=0):
    accepted = sum(s == A for s in sources)
    return StepEvent(step=0, row=row, sample=0, tokens=tuple(tokens), sources=tuple(sources),
                     num_drafted=4, num_accepted=accepted, draft_s=0.0, verify_s=0.0, finished=False)


# prompt of 3 tokens, then steps: [acc acc rec] [acc acc acc acc bonus] [rec]; generated tokens sit at 3..11
PROMPT = [0, 4, 5]
EVENTS = [step([6, 7, 8], [A, A, R]), step([9, 10, 11, 12, 13], [A, A, A, A, B]), step([14], [R])]


def test_training_positions_are_the_logits_predicting_target_tokens():
    sources = [s for e in EVENTS for s in e.sources]
    # recovered token 8 at index 5, bonus 13 at index 10, recovered 14 at index 11: predicted from 4, 9, 10
    assert training_positions(3, sources, "wrong") == [4, 9, 10]
    assert training_positions(3, sources, "all") == list(range(2, 11))


def test_buffer_loss_is_the_forward_kl_at_those_logits(fresh):
    online = OnlineDistiller(fresh.draft_model, fresh.model, interval=100)
    online.observe(torch.tensor(PROMPT), EVENTS)
    ids = torch.tensor([PROMPT + [t for e in EVENTS for t in e.tokens]])
    with torch.no_grad():
        target_logp = fresh.model(input_ids=ids).logits[0].log_softmax(-1)  # [12, vocab]
        draft_logp = fresh.draft_model(input_ids=ids).logits[0].log_softmax(-1)
    kl = (target_logp.exp() * (target_logp - draft_logp)).sum(-1)  # [12] KL(target || draft) per logit
    with torch.no_grad():
        loss = online.buffer_loss()
    assert torch.isclose(loss, kl[[4, 9, 10]].mean(), rtol=1e-4, atol=0)
    assert not torch.isclose(loss, kl[[5, 10, 11]].mean(), rtol=1e-2, atol=0)  # the official code's off-by-one


def test_update_moves_only_the_draft(fresh):
    target_before = {k: v.clone() for k, v in fresh.model.state_dict().items()}
    draft_before = {k: v.clone() for k, v in fresh.draft_model.state_dict().items()}
    online = OnlineDistiller(fresh.draft_model, fresh.model, interval=4, lr=1e-2)
    results = run_stream(fresh, PROMPTS[:4], online=online, max_new_tokens=12, num_draft_tokens=4)
    assert [r["updated"] for r in results] == [False, False, False, True]
    assert online.updates == 1 and online.loss is not None and online.loss > 0 and not online.buffer
    for key, value in fresh.model.state_dict().items():
        assert torch.equal(value, target_before[key]), key
    assert all(p.grad is None for p in fresh.model.parameters())
    assert all(p.grad is None for p in fresh.draft_model.parameters())
    assert any(not torch.equal(v, draft_before[k]) for k, v in fresh.draft_model.state_dict().items())
    assert not fresh.draft_model.training and not fresh.model.training


def test_repeated_updates_raise_agreement_on_the_stream(fresh):
    online = OnlineDistiller(fresh.draft_model, fresh.model, interval=1000, lr=1e-2)
    run_stream(fresh, PROMPTS, online=online, max_new_tokens=16, num_draft_tokens=4)
    stream = list(online.buffer)
    assert online.buffered_positions > 8
    before = online.agreement()
    for _ in range(10):
        online.buffer = list(stream)
        assert online.update()
    online.buffer = list(stream)
    after = online.agreement()
    assert after > before + 0.05, (before, after)


def test_interval_and_buffer_cap_trigger_updates(fresh):
    online = OnlineDistiller(fresh.draft_model, fresh.model, interval=3)
    fired = [online.observe(PROMPT, EVENTS) for _ in range(7)]
    assert fired == [False, False, True, False, False, True, False]
    assert (online.requests, online.updates, len(online.buffer), online.buffered_positions) == (7, 2, 1, 3)
    capped = OnlineDistiller(fresh.draft_model, fresh.model, interval=100, max_buffer_tokens=20)
    assert [capped.observe(PROMPT, EVENTS) for _ in range(2)] == [False, True]  # 12 + 12 tokens >= 20


def test_stream_statistics(fresh):
    results = run_stream(fresh, PROMPTS[:2], online=None, max_new_tokens=10, num_draft_tokens=3)
    for r in results:
        assert r["accepted"] <= r["drafted"] and not r["updated"] and r["tau"] >= 1
        assert r["alpha_hat"] == r["accepted"] / (r["accepted"] + r["rejections"])


@pytest.mark.parametrize("kwargs", [{"interval": 0}, {"interval": 2.5}, {"lr": 0}, {"lr": -1e-3}, {"lr": 3},
                                    {"positions": "right"}, {"divergence": "l2"}, {"max_buffer_tokens": 0}])
def test_bad_arguments(generator, kwargs):
    with pytest.raises(InvalidRequest):
        OnlineDistiller(generator.draft_model, generator.model, **kwargs)


def test_bad_requests(generator):
    online = OnlineDistiller(generator.draft_model, generator.model)
    with pytest.raises(InvalidRequest):
        online.observe(PROMPT, [step([6], [R], row=1)])
    with pytest.raises(InvalidRequest):
        online.observe([], EVENTS)
    other = OnlineDistiller(generator.model, generator.model)  # not the generator's draft
    with pytest.raises(InvalidRequest):
        run_stream(generator, PROMPTS[:1], online=other, max_new_tokens=4, num_draft_tokens=2)
