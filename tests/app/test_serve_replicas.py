"""`specgen serve --replicas 2` on a local Ray: requests spread over both replicas (each its own continuous
batch), and every result equals what one replica gives for the same request."""

import concurrent.futures as futures

import pytest

from test_serve_support import CODE_PAIR, MODEL, Server, client

pytest.importorskip("ray")


def _requests(api, seeds):
    def one(seed):
        reply = api.completions.create(model=MODEL, prompt="class Stack:\n", max_tokens=8, temperature=1.0,
                                       seed=seed, n=2)
        return [choice.text for choice in reply.choices]
    with futures.ThreadPoolExecutor(len(seeds)) as pool:
        return list(pool.map(one, seeds))


def test_two_replicas_spread_requests_and_equal_one_replica():
    seeds = list(range(8))
    single = Server(*CODE_PAIR, "--method", "draft", "--rows", "4")
    try:
        expected = _requests(client(single), seeds)
    finally:
        assert single.stop() == 0
    replicated = Server(*CODE_PAIR, "--method", "draft", "--rows", "4", "--replicas", "2", startup_s=600)
    try:
        got = _requests(client(replicated), seeds)
        replicas = replicated.health()["replicas"]
    finally:
        assert replicated.stop() == 0
    assert got == expected
    assert len(replicas) == 2 and all(r["lanes"] >= 1 for r in replicas)  # both served requests
