"""The loop's hooks for a server: `cancelled(sample id)` withdraws a request and frees its row, and a queue that
is empty now may hand out requests later. Neither may change what the other requests get, token for token."""

import torch

from specgen.samplers.acceptance import make_rule
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.loop import speculative_generate
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableDrafter, TableLM, TableTarget

TARGET_LM = TableLM(5, order=2, seed=3)
DRAFT_LM = TARGET_LM.mixed_with(TableLM(5, order=2, seed=4, scale=3.0), 0.6)
PROCESSING = Processing(temperature=1.0)
OPTIONS = dict(max_new_tokens=9, seed=11, policy=FixedLength(3), stop_tokens=(4,))
PLACEHOLDER = -1


def _requests(count: int):
    rng = torch.Generator().manual_seed(0)
    return [(100 + i, torch.randint(0, 5, (int(torch.randint(1, 6, (1,), generator=rng)),), generator=rng))
            for i in range(count)]


def _run(prompts, sample_ids, **options):
    out, finished = {}, []
    events = speculative_generate(TableTarget(TARGET_LM), TableDrafter(DRAFT_LM, PROCESSING),
                                  make_rule("chain", PROCESSING), prompts, processing=PROCESSING,
                                  sample_ids=sample_ids, **OPTIONS, **options)
    for event in events:
        out.setdefault(event.sample, []).extend(event.tokens)
        if event.finished:
            finished.append(event.sample)
    return out, finished


def _alone(sample_id, prompt):
    return _run([prompt], [sample_id])[0][sample_id]


class LaterQueue:
    """Empty until `release()`; then it hands out its requests (a server's queue between arrivals)."""

    def __init__(self, requests):
        self.waiting, self.ready = list(requests), []

    def __iter__(self):
        return self

    def __next__(self):
        if not self.ready:
            raise StopIteration
        return self.ready.pop(0)

    def release(self):
        self.ready, self.waiting = self.ready + self.waiting, []


def test_a_cancelled_request_stops_and_its_row_serves_the_next_one_exactly():
    requests = _requests(5)
    solo = {sample_id: _alone(sample_id, prompt) for sample_id, prompt in requests}
    victim = max(solo, key=lambda sample_id: len(solo[sample_id]))  # the longest: one step cannot finish it
    gone = {victim}
    seen: dict[int, int] = {}

    def cancelled(sample):  # withdrawn after its first step
        return sample in gone and seen.get(sample, 0) >= 1

    out, finished = {}, []
    events = speculative_generate(TableTarget(TARGET_LM), TableDrafter(DRAFT_LM, PROCESSING),
                                  make_rule("chain", PROCESSING), [p for _, p in requests[:2]], processing=PROCESSING,
                                  sample_ids=[s for s, _ in requests[:2]], queue=iter(requests[2:]),
                                  cancelled=cancelled, **OPTIONS)
    for event in events:
        seen[event.sample] = seen.get(event.sample, 0) + 1
        out.setdefault(event.sample, []).extend(event.tokens)
        if event.finished:
            finished.append(event.sample)
    assert len(solo[victim]) > len(out[victim])  # alone it runs on: the withdrawal cut it short
    assert victim not in finished and seen[victim] == 1  # no step after the withdrawal, no finished event
    assert sorted(finished) == sorted(set(solo) - gone)
    for sample_id in solo:
        if sample_id == victim:
            assert solo[victim][:len(out[victim])] == out[victim]  # a prefix of its own run
        else:
            assert out[sample_id] == solo[sample_id]


def test_placeholder_rows_cancelled_from_the_start_are_free_rows():
    requests = _requests(4)
    out, finished = _run([torch.tensor([0])] * 3, [PLACEHOLDER] * 3, queue=iter(requests),
                         cancelled=lambda sample: sample == PLACEHOLDER)
    assert PLACEHOLDER not in out and sorted(finished) == [s for s, _ in requests]
    for sample_id, prompt in requests:
        assert out[sample_id] == _alone(sample_id, prompt)


def test_a_queue_that_is_empty_now_hands_out_requests_later():
    requests = _requests(4)
    queue = LaterQueue(requests[1:])
    out, finished = {}, []
    events = speculative_generate(TableTarget(TARGET_LM), TableDrafter(DRAFT_LM, PROCESSING),
                                  make_rule("chain", PROCESSING), [requests[0][1], torch.tensor([0])],
                                  processing=PROCESSING, sample_ids=[requests[0][0], PLACEHOLDER], queue=queue,
                                  cancelled=lambda sample: sample == PLACEHOLDER, **OPTIONS)
    for event in events:
        if event.step == 1:  # arrivals while the first request decodes
            queue.release()
        out.setdefault(event.sample, []).extend(event.tokens)
        finished += [event.sample] if event.finished else []
    assert sorted(finished) == [s for s, _ in requests]
    for sample_id, prompt in requests:
        assert out[sample_id] == _alone(sample_id, prompt)


def test_without_hooks_the_loop_is_unchanged():
    requests = _requests(3)
    out, finished = _run([p for _, p in requests], [s for s, _ in requests])
    assert sorted(finished) == [s for s, _ in requests]
    for sample_id, prompt in requests:
        assert out[sample_id] == _alone(sample_id, prompt)


def test_a_queued_request_with_its_own_length_limit_equals_its_solo_run_with_that_limit():
    requests = _requests(5)
    limits = {sample_id: 2 + i for i, (sample_id, _) in enumerate(requests)}
    queued = [(sample_id, prompt, limits[sample_id]) for sample_id, prompt in requests]
    out, finished = _run([torch.tensor([0])] * 2, [PLACEHOLDER] * 2, queue=iter(queued),
                         cancelled=lambda sample: sample == PLACEHOLDER)
    assert sorted(finished) == [s for s, _ in requests]
    for sample_id, prompt in requests:
        alone = speculative_generate(TableTarget(TARGET_LM), TableDrafter(DRAFT_LM, PROCESSING),
                                     make_rule("chain", PROCESSING), [prompt], processing=PROCESSING,
                                     sample_ids=[sample_id], **{**OPTIONS, "max_new_tokens": limits[sample_id]})
        assert out[sample_id] == [t for event in alone for t in event.tokens]
