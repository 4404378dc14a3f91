"""How fast the web demo is ready, and how fast its first text token appears, on the default models.

    python benchmarks/demo_latency.py [--prompt TEXT] [--method ngram] [--repeats 3]

Starts `specgen demo` on a free local port as a user would (default models: Gemma 3 270M with the gemma
extra, already converted, else the shipped code model), measures the seconds until the page answers and until
the text models report loaded, then sends text requests through `gradio_client` and measures the time from
submit to the first streamed output that holds text. Prints a Markdown table; results are recorded in
benchmarks/demo-latency.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float, what: str) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if check():
            return time.perf_counter() - started
        time.sleep(0.1)
    raise SystemExit(f"error: {what} not within {timeout:.0f} s")


def page_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default="def fibonacci(n):")
    parser.add_argument("--method", default="ngram")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from gradio_client import Client

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    demo = subprocess.Popen([sys.executable, "-m", "specgen", "demo", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ready_s = wait_until(lambda: page_answers(url), 120, "the demo page")
        client = Client(url, verbose=False)
        first_token, totals = [], []
        for _ in range(args.repeats):
            submitted = time.perf_counter()
            job = client.submit(prompt=args.prompt, method=args.method, max_new_tokens=args.max_new_tokens,
                                compare=False, api_name="/generate_text")
            first = None
            while not job.done() or first is None:
                outputs = job.outputs()
                # the highlighted text's first part is the prompt; a generated token adds a part
                if first is None and outputs and len(outputs[-1][0] or []) > 1:
                    first = time.perf_counter() - submitted
                if job.done():
                    break
                time.sleep(0.02)
            job.result()
            first_token.append(first if first is not None else float("nan"))
            totals.append(time.perf_counter() - submitted)
        loaded_s = time.perf_counter() - started
    finally:
        demo.terminate()
        demo.wait(timeout=30)
    print(f"| measure | value |\n|---|---|\n| demo page answers after start | {ready_s:.1f} s |")
    print(f"| first text token after submit (first request; median of all) | {first_token[0]:.2f} s; "
          f"{statistics.median(first_token):.2f} s |")
    print(f"| whole request ({args.max_new_tokens} tokens, {args.method}; median) | {statistics.median(totals):.2f} s |")
    print(f"| start to last answer | {loaded_s:.1f} s |")
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{args.repeats} requests, prompt {args.prompt!r}")


if __name__ == "__main__":
    main()
