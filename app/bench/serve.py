"""`specgen bench serve`: the HTTP server under concurrent greedy clients, against one client at a time and
against plain decoding on the same server.

For each served model a `specgen serve` process starts (its default method, `--rows` rows, one thread); the same
requests (benchmarks/prompts/text.jsonl, cycled to `--requests`, `--max-tokens` each, temperature 0) go to it
four ways: {the server's method, plain decoding `ar` (the X-Specgen-Method header)} × {one client at a time,
`--clients` concurrent clients}. Reported per way: throughput (completion tokens per second of wall time),
latency per token (each request's latency over its tokens; p50 and p99 over requests) and whether every text
equals plain decoding one at a time. Written to serve-STAMP.{json,md} under $SPECGEN_HOME/runs and copied as
benchmarks/serve-latest.{json,md} (`--out-dir DIR`: both in DIR).
"""

from __future__ import annotations

import concurrent.futures as futures
import math
import signal
import socket
import subprocess
import sys
import tempfile
import time

from specgen.app.bench.prompts import load_prompts
from specgen.app.bench.records import benchmarks_dir, record_dirs, run_env, start_run
from specgen.app.bench.report import command_line, fmt, print_outcome, run_line, write_record
from specgen.errors import InvalidRequest

MODELS = ("code", "gemma")  # the shipped code pair; Gemma 3 270M (the default model) with its shipped draft


def model_flags(name: str) -> list[str]:
    """`specgen serve` flags that serve model `name` (none: the default model and its shipped draft)."""
    if name == "gemma":
        return []
    from specgen.modalities.text.generator import shipped_code_pair

    target, draft = shipped_code_pair()
    return ["--model", target, "--draft", draft]


def bench_serve(args) -> int:
    runs_dir, latest_dir = record_dirs(args.out_dir)  # checked before any work
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise InvalidRequest(f"unknown model(s) {', '.join(unknown)}; choose from: {', '.join(MODELS)}")
    prompts = [p.prompt for p in load_prompts(args.prompts or benchmarks_dir() / "prompts" / "text.jsonl")]
    prompts = [prompts[i % len(prompts)] for i in range(args.requests)]
    start = start_run()
    models = {name: _bench_model(name, prompts, args) for name in args.models}
    env = run_env(start, command=command_line(args), clients=args.clients, requests=args.requests,
                  max_tokens=args.max_tokens, rows=args.rows, threads=args.threads)
    result = {"models": models, "env": env}
    written = write_record(result, runs_dir, f"serve-{env['timestamp_utc']}", lambda names: render_markdown(result),
                           latest="serve-latest", latest_dir=latest_dir)
    print_outcome(result, written, args.json)
    return 0


def _bench_model(name: str, prompts: list[str], args) -> dict:
    flags = model_flags(name) + ["--rows", str(args.rows), "--threads", str(args.threads)]
    if args.method:
        flags += ["--method", args.method]
    with _Server(flags) as server:
        method = server.health()["replicas"][0]["method"]
        for way in (method, "ar"):  # warm-up: each method's first request builds its lane
            _request(server.url, prompts[0], way, args.max_tokens)
        ways = {}
        for way in (method, "ar"):  # sequential first, as a user would try it, then under load
            ways[f"{way} · 1 client"] = _load(server.url, prompts, way, args.max_tokens, 1)
            ways[f"{way} · {args.clients} clients"] = _load(server.url, prompts, way, args.max_tokens, args.clients)
    reference = ways["ar · 1 client"]["texts"]
    for row in ways.values():
        row["identical_to_ar"] = row.pop("texts") == reference
    base = ways["ar · 1 client"]["tokens_per_s"]
    for row in ways.values():
        row["throughput_vs_ar_1_client"] = row["tokens_per_s"] / base
    concurrent = ways[f"{method} · {args.clients} clients"]
    return {"method": method, "ways": ways,
            "concurrent_over_one_client": concurrent["tokens_per_s"] / ways[f"{method} · 1 client"]["tokens_per_s"]}


def _load(url: str, prompts: list[str], method: str, max_tokens: int, clients: int) -> dict:
    started = time.perf_counter()
    with futures.ThreadPoolExecutor(clients) as pool:
        replies = list(pool.map(lambda p: _request(url, p, method, max_tokens), prompts))
    wall_s = time.perf_counter() - started
    per_token = sorted(latency / max(tokens, 1) for _, tokens, latency in replies)
    tokens = sum(tokens for _, tokens, _ in replies)
    return {"clients": clients, "requests": len(prompts), "completion_tokens": tokens, "wall_s": wall_s,
            "tokens_per_s": tokens / wall_s, "latency_per_token_p50_s": _quantile(per_token, 0.5),
            "latency_per_token_p99_s": _quantile(per_token, 0.99), "texts": [text for text, _, _ in replies]}


def _request(url: str, prompt: str, method: str, max_tokens: int) -> tuple[str, int, float]:
    import httpx

    started = time.perf_counter()
    reply = httpx.post(url + "/v1/completions", headers={"X-Specgen-Method": method}, timeout=600,
                       json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    latency = time.perf_counter() - started
    if reply.status_code != 200:
        raise InvalidRequest(f"the server answered {reply.status_code}: {reply.text[:200]}")
    body = reply.json()
    return body["choices"][0]["text"], body["usage"]["completion_tokens"], latency


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted `values`."""
    return values[min(len(values), max(1, math.ceil(q * len(values)))) - 1]


class _Server:
    """`specgen serve FLAGS` on a free port, stopped (SIGTERM) on exit."""

    def __init__(self, flags: list[str]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile("w+")  # a file, not a pipe: nobody reads while it serves
        self.process = subprocess.Popen([sys.executable, "-m", "specgen", "serve", *flags, "--port", str(port)],
                                        stdout=subprocess.DEVNULL, stderr=self.log, text=True)

    def __enter__(self):
        import httpx

        deadline = time.monotonic() + 900  # Gemma's first start converts and packs it
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise InvalidRequest(f"specgen serve exited at start-up: {self.log.read()[-500:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(1)
        raise InvalidRequest("specgen serve did not start in 15 minutes")

    def health(self) -> dict:
        import httpx

        return httpx.get(self.url + "/health", timeout=30).json()

    def __exit__(self, *exc) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def render_markdown(result: dict) -> str:
    env = result["env"]
    lines = ["# `specgen serve` under concurrent clients", "", run_line(env), "",
             f"{env['requests']} greedy completions of {env['max_tokens']} tokens (benchmarks/prompts/text.jsonl, "
             f"cycled), sent by one client at a time and by {env['clients']} concurrent clients to one server "
             f"({env['rows']} rows per lane, {env['threads']} thread); the server's method and plain decoding (`ar`) "
             "on the same server. Latency per token: a request's latency over its tokens, p50/p99 over requests.",
             ""]
    for name, model in result["models"].items():
        lines += [f"## {name} (method `{model['method']}`)", "",
                  "| way | tokens/s | vs ar, 1 client | latency/token p50 | p99 | identical to ar |",
                  "|---|---|---|---|---|---|"]
        for way, row in model["ways"].items():
            lines.append(f"| {way} | {row['tokens_per_s']:.1f} | {row['throughput_vs_ar_1_client']:.2f}× | "
                         f"{fmt(row['latency_per_token_p50_s'] * 1e3, 1, ' ms')} | "
                         f"{fmt(row['latency_per_token_p99_s'] * 1e3, 1, ' ms')} | {row['identical_to_ar']} |")
        lines += ["", f"{env['clients']} clients over one client at a time ({model['method']}): "
                      f"**{model['concurrent_over_one_client']:.2f}×**", ""]
    lines += [f"Command: `{env['command']}`", ""]
    return "\n".join(lines)
