"""`specgen serve` against the `openai` client: a real server process on the shipped code pair (small, real
models). Completions, chat, streaming, n > 1, stop strings, every error case, metrics parsed by prometheus_client,
a client that leaves mid-stream, 32 concurrent streams equal to the same requests alone, memory under load, and a
graceful shutdown."""

import concurrent.futures as futures
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_serve_support import CODE_PAIR, KEY, MODEL, Server, client

PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def server():
    srv = Server(*CODE_PAIR, "--method", "draft", "--rows", "8", "--api-key", KEY)
    yield srv
    assert srv.stop() == 0  # SIGTERM: a clean exit


@pytest.fixture(scope="module")
def api(server):
    return client(server)


def _complete(api, prompt=PROMPT, **options):
    return api.completions.create(model=MODEL, prompt=prompt, **options)


def _metrics(server) -> dict:
    """{sample name with labels: value} of /metrics, parsed by prometheus_client."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def _stream_text(api, **options) -> tuple[str, str, int]:
    text, reason, chunks = "", None, 0
    for chunk in _complete(api, stream=True, **options):
        chunks += 1
        for choice in chunk.choices:
            text += choice.text
            reason = choice.finish_reason or reason
    return text, reason, chunks


def test_models_and_health(server, api):
    assert [m.id for m in api.models.list().data] == [MODEL]
    health = server.health()
    assert health["status"] == "ok" and health["replicas"][0]["method"] == "draft"


def test_greedy_completion_equals_plain_decoding(api):
    spec = _complete(api, max_tokens=40, temperature=0)
    plain = _complete(api, max_tokens=40, temperature=0, extra_headers={"X-Specgen-Method": "ar"})
    assert spec.choices[0].text == plain.choices[0].text and spec.choices[0].text
    assert spec.choices[0].finish_reason in ("length", "stop")
    assert spec.usage.completion_tokens <= 40 and spec.usage.prompt_tokens > 0
    assert spec.model_extra["specgen"]["method"] == "draft"
    assert plain.model_extra["specgen"]["method"] == "ar"


def test_method_in_the_body_and_its_knobs(api):
    reply = _complete(api, max_tokens=12, temperature=0, extra_body={"method": "ngram",
                                                                   "method_params": {"num_draft_tokens": 3}})
    assert reply.model_extra["specgen"]["method"] == "ngram"
    assert reply.choices[0].text == _complete(api, max_tokens=12, temperature=0).choices[0].text


def test_chat_completion_and_its_stream(api):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    whole = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content
    pieces, roles = [], []
    for chunk in api.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                             stream=True):
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            roles.append(choice.delta.role)
    assert "".join(pieces) == whole.choices[0].message.content
    assert roles[0] == "assistant"


def test_streaming_equals_the_whole_completion(api):
    whole = _complete(api, max_tokens=30, temperature=0).choices[0]
    text, reason, chunks = _stream_text(api, max_tokens=30, temperature=0)
    assert text == whole.text and reason == whole.finish_reason and chunks > 1


def test_stream_usage_when_asked(api):
    chunks = list(_complete(api, max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].choices == []


def test_n_choices_are_seeded_per_request(api):
    first = _complete(api, max_tokens=16, temperature=1.0, n=3, seed=7)
    again = _complete(api, max_tokens=16, temperature=1.0, n=3, seed=7)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1  # independent samples
    other = _complete(api, max_tokens=16, temperature=1.0, n=1, seed=7)
    assert other.choices[0].text == first.choices[0].text  # choice i depends on (seed, i) only


def test_stop_strings_cut_the_text(api):
    full = _complete(api, max_tokens=40, temperature=0).choices[0].text
    stop = full[5:8]
    assert stop and stop in full
    cut = _complete(api, max_tokens=40, temperature=0, stop=[stop, "\u2603never"]).choices[0]
    assert cut.text == full[:full.index(stop)] and cut.finish_reason == "stop"
    text, reason, _ = _stream_text(api, max_tokens=40, temperature=0, stop=stop)
    assert text == cut.text and reason == "stop"


@pytest.mark.parametrize("options, param", [
    ({"temperature": 3.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"logprobs": 2}, "logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"extra_headers": {"X-Specgen-Method": "no-such-method"}}, "method"),
    ({"extra_body": {"method_params": {"no_such_knob": 1}}}, "method_params"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"prompt": "x" * 9000}, "prompt"),
    ({"model": "no-such-model"}, "model"),
])
def test_bad_requests_are_400_in_the_openai_shape(api, options, param):
    options = {"model": MODEL, "prompt": PROMPT, **options}
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(**options)
    error = caught.value.response.json()["error"]
    assert caught.value.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"] and "Traceback" not in caught.value.response.text


def test_wrong_key_is_401_and_raw_errors_hold_no_traceback(server):
    with pytest.raises(openai.AuthenticationError) as caught:
        client(server, default_headers={"Authorization": "Bearer wrong"}).models.list()
    assert caught.value.status_code == 401 and caught.value.response.json()["error"]["code"] == "invalid_api_key"
    headers = {"Authorization": f"Bearer {KEY}"}
    for body in (b"{not json", b"[]", json.dumps({"messages": "hi"}).encode()):
        reply = httpx.post(server.url + "/v1/chat/completions", content=body, headers=headers, timeout=30)
        assert reply.status_code == 400 and set(reply.json()) == {"error"} and "Traceback" not in reply.text
    assert httpx.get(server.url + "/v1/nothing", timeout=30).json()["error"]["message"]


def test_metrics_agree_with_the_usage_sent(server, api):
    before = _metrics(server)
    replies = [_complete(api, max_tokens=m, temperature=0) for m in (7, 13)]
    replies.append(_complete(api, max_tokens=9, temperature=1.0, n=2, seed=3))
    after = _metrics(server)

    def grew(name):
        return after.get(name, 0) - before.get(name, 0)
    assert grew("specgen:generation_tokens_total") == sum(r.usage.completion_tokens for r in replies)
    assert grew("specgen:prompt_tokens_total") == sum(r.usage.prompt_tokens for r in replies)
    assert grew("specgen:e2e_request_latency_seconds_count") == 4  # one per choice
    drafted = grew("specgen:spec_decode_num_draft_tokens_total{method=draft}")
    accepted = grew("specgen:spec_decode_num_accepted_tokens_total{method=draft}")
    per_position = sum(v - before.get(k, 0) for k, v in after.items()
                       if k.startswith("specgen:spec_decode_num_accepted_tokens_per_pos_total{method=draft,"))
    assert 0 < accepted <= drafted and per_position == accepted
    steps = sum(r.model_extra["specgen"]["choices"][i]["steps"] for r in replies for i in range(len(r.choices)))
    assert grew("specgen:spec_decode_num_drafts_total{method=draft}") <= steps
    assert 1.0 <= after["specgen:tau{method=draft}"] and 0.0 <= after["specgen:alpha_hat{method=draft}"] <= 1.0
    assert after["specgen:predicted_speedup_measured{method=draft}"] > 0


def test_a_client_that_leaves_mid_stream_frees_its_row(server):
    cancelled = _metrics(server).get("specgen:request_cancelled_total", 0)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    for _ in range(100):  # the row is freed at the next step
        replica = server.health()["replicas"][0]
        if replica["running"] == 0 and replica["waiting"] == 0:
            break
        httpx.get(server.url + "/health", timeout=10)
    assert replica["running"] == 0 and replica["waiting"] == 0
    assert _metrics(server)["specgen:request_cancelled_total"] == cancelled + 1


def _one_stream(api, seed: int) -> tuple[str, str]:
    text, reason, _ = _stream_text(api, max_tokens=6, temperature=1.0, seed=seed)
    return text, reason


def test_32_concurrent_streams_equal_the_same_requests_alone(api):
    seeds = list(range(100, 132))
    with futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda s: _one_stream(api, s), seeds))
    alone = [_one_stream(api, s) for s in seeds]
    assert all(reason in ("length", "stop") for _, reason in together)  # none lost
    assert together == alone
    assert len({text for text, _ in together}) > 16  # the seeds matter


def test_memory_is_flat_under_load(server, api):
    def burst(count: int) -> None:
        with futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda i: _complete(api, max_tokens=2, temperature=1.0, seed=i), range(count)))
        assert all(r.choices[0].finish_reason for r in replies)
    burst(50)
    after_50 = server.rss_kib()
    burst(450)
    after_500 = server.rss_kib()
    assert abs(after_500 - after_50) <= 0.02 * after_50, (after_50, after_500)


def test_graceful_shutdown_finishes_running_requests():
    srv = Server(*CODE_PAIR, "--method", "draft", "--rows", "2", "--grace", "30")
    api = client(srv)
    with futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(_stream_text, api, max_tokens=300, temperature=0, prompt="import os\n")
        while srv.health()["replicas"][0]["running"] == 0:
            pass
        code = srv.stop()
        text, reason, _ = running.result(timeout=60)
    assert code == 0 and reason in ("length", "stop") and text


def test_help_is_fast_imports_no_torch_and_bad_flags_exit_2():
    import subprocess
    import sys

    code = ("import sys\nfrom specgen.app.cli import main\ncode = main(sys.argv[1:])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)")
    for argv, expected in ((["serve", "--help"], 0), (["serve", "--rows", "0"], 2), (["serve", "--method", "x"], 2),
                           (["bench", "serve", "--help"], 0)):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == expected, done.stderr
        if expected == 2:
            assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")


def test_shutdown_past_the_grace_period_ends_running_streams_with_an_error_event():
    srv = Server(*CODE_PAIR, "--method", "draft", "--rows", "1", "--grace", "1")
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        code = srv.stop()  # the request cannot finish in one second
        rest = [line for line in lines if line.startswith("data:")]
    assert code == 0
    last = json.loads(rest[-1][len("data:"):])
    assert last["error"]["type"] == "server_error" and "shut down" in last["error"]["message"]
