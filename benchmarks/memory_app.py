"""The web demo's resident memory over many mixed requests: RSS after 200 must stay within 2% of after 20.

    python benchmarks/memory_app.py [--requests 200] [--max-new-tokens 32] [--out benchmarks/memory-app]

Starts `specgen demo` on a free local port with the default models (as a user would), then sends requests one
after another through `gradio_client`, cycling over the Text, Image, Video and Speech tabs with varied seeds,
prompts, methods and the "compare with plain decoding" option. After the warm-up mark (20 requests) and at
50, 100, 150 and 200 it reads the server's resident set size (the demo process and any children) from /proc.
Writes OUT.json and OUT.md and prints one line per mark.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from demo_latency import free_port, page_answers, wait_until

from specgen.modalities.memory import resident_mb

MARKS = (20, 50, 100, 150, 200)
TEXT_PROMPTS = ("def fibonacci(n):\n", "The history of the city begins", "import os\n\nfor name in",
                "Dear colleagues,\nthank you for")
IMAGE_PROMPTS = ("red K on blue", "digit 3", "green A on white", "photo of coffee")
VIDEO_PROMPTS = ("red K moving right", "green Q moving left")
SPEECH_TEXTS = ("hello there", "the quick brown fox", "speculative decoding is exact")


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MB."""
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        try:
            total += resident_mb(current)
            with open(f"/proc/{current}/task/{current}/children") as f:
                stack.extend(int(child) for child in f.read().split())
        except OSError:  # the process ended meanwhile
            continue
    return total


def request(index: int, max_new_tokens: int) -> tuple[str, dict]:
    """The index-th request of the mix: (api name, keyword arguments). The tab cycles with the index; prompts,
    methods, temperatures and the comparison vary with the round (index // 6) so that every combination recurs."""
    kind, round_ = ("text", "image", "text", "speech", "text", "video")[index % 6], index // 6
    seed, compare = 1000 + index, round_ % 4 == 0

    def pick(options):
        return options[round_ % len(options)]

    if kind == "text":
        return "/generate_text", dict(prompt=TEXT_PROMPTS[index % len(TEXT_PROMPTS)], method=pick(("ngram", "ngram", "ar")),
                                      max_new_tokens=max_new_tokens, temperature=pick((0.0, 1.0)), seed=seed,
                                      compare=compare)
    if kind == "image":
        return "/generate_image", dict(prompt=pick(IMAGE_PROMPTS), method=pick(("mc-sjd", "lantern++", "ar")),
                                       temperature=1.0, seed=seed, compare=compare)
    if kind == "video":
        return "/generate_video", dict(prompt=pick(VIDEO_PROMPTS), method="mc-sjd", temperature=1.0, seed=seed,
                                       compare=False)
    return "/generate_speech", dict(text=pick(SPEECH_TEXTS), method=pick(("sd", "pcg")), temperature=1.0, seed=seed,
                                    compare=compare)


def markdown(result: dict) -> str:
    rows = "\n".join(f"| {mark} | {rss:.1f} | {result['seconds'][mark]:.0f} |" for mark, rss in result["rss_mb"].items())
    growth = result["growth_after_20"]
    return (f"# The demo's resident memory over {result['requests']} mixed requests\n\n"
            f"Command: `{result['command']}`\n\n"
            f"Requests cycle over the tabs: {result['mix']}. Errors: {result['errors']}.\n\n"
            f"| requests done | server RSS (MB) | elapsed (s) |\n|---|---|---|\n{rows}\n\n"
            f"Growth from 20 to {result['requests']} requests: **{100 * growth:+.2f} %** "
            f"({'within' if result['within_2_percent'] else 'outside'} the 2 % bound).\n\n{result['machine']}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/memory-app")
    args = parser.parse_args()
    if args.requests < MARKS[0]:
        raise SystemExit(f"error: --requests must be at least {MARKS[0]}")
    from gradio_client import Client

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    demo = subprocess.Popen([sys.executable, "-m", "specgen", "demo", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marks, seconds, errors, mix = {}, {}, [], {}
    try:
        wait_until(lambda: page_answers(url), 180, "the demo page")
        client = Client(url, verbose=False)
        started = time.perf_counter()
        for index in range(1, args.requests + 1):
            api, kwargs = request(index, args.max_new_tokens)
            mix[api] = mix.get(api, 0) + 1
            try:
                client.predict(**kwargs, api_name=api)
            except Exception as error:  # a failed request is recorded; the point is memory over the run
                errors.append(f"{index} {api}: {str(error).splitlines()[0][:200]}")
            if index in MARKS or index == args.requests:
                time.sleep(1.0)  # let the server finish its post-request work before reading
                marks[index], seconds[index] = tree_rss_mb(demo.pid), time.perf_counter() - started
                print(f"after {index:4d} requests: RSS {marks[index]:.1f} MB ({seconds[index]:.0f} s)", flush=True)
    finally:
        demo.terminate()
        demo.wait(timeout=30)
    growth = marks[args.requests] / marks[MARKS[0]] - 1
    result = {"command": "python benchmarks/memory_app.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
              "requests": args.requests, "mix": ", ".join(f"{api} × {n}" for api, n in mix.items()),
              "rss_mb": marks, "seconds": seconds, "growth_after_20": growth, "within_2_percent": growth <= 0.02,
              "errors": errors or "none",
              "machine": f"{platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} cores"}
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(result))
    print(json.dumps({k: result[k] for k in ("rss_mb", "growth_after_20", "within_2_percent", "errors")}))


if __name__ == "__main__":
    main()
