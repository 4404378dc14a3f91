"""`specgen serve`: an OpenAI-compatible HTTP server (`specgen.app.serve`, docs/serving.md)."""

from __future__ import annotations

import argparse

from specgen.app.cli.options import int_at_least, method_name, non_empty, option_type
from specgen.samplers import registry


def add_serve_parser(commands, command) -> None:
    serve = command(commands, "serve", "an OpenAI-compatible HTTP server with continuous batching", "serve",
                    handler=_serve)
    serve.add_argument("--model", help="text target: a Hugging Face causal LM path or id available offline "
                                       "(default: Gemma 3 270M with the gemma extra, else the shipped code model)")
    serve.add_argument("--draft", help="text draft model path or id")
    serve.add_argument("--method", type=method_name("text"),
                       help=f"the method of requests that name none: {', '.join(registry.method_names('text'))} "
                            "(default: the served model's default method)")
    serve.add_argument("--rows", type=int_at_least(1, 256), default=8, metavar="N",
                       help="batch rows per lane: requests decoding together (default: 8)")
    serve.add_argument("--memory-budget", type=option_type("text", "memory_budget_mb"), metavar="MB",
                       help="peak resident memory in MB: rows per lane are cut so full-context requests at the "
                            "default method fit beside the loaded model (default: no budget)")
    serve.add_argument("--host", default="127.0.0.1", type=non_empty, help="default: 127.0.0.1")
    serve.add_argument("--port", type=int_at_least(1, 65535), default=8000, help="default: 8000")
    serve.add_argument("--api-key", type=non_empty, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on the /v1 routes (default: none)")
    serve.add_argument("--replicas", type=int_at_least(1, 64), default=1, metavar="N",
                       help="N > 1: N Ray actors, each loading the model with its own batches (default: 1)")
    serve.add_argument("--grace", type=int_at_least(0, 3600), default=10, metavar="S",
                       help="on shutdown, seconds running requests may take to finish before they are cancelled "
                            "(default: 10)")


def _serve(args: argparse.Namespace) -> int:
    from specgen.app.serve.server import ServeOptions, run

    options = ServeOptions(model=args.model, draft=args.draft, method=args.method, rows=args.rows, host=args.host,
                           port=args.port, api_key=args.api_key,
                           replicas=args.replicas, threads=args.threads or 1, grace_s=float(args.grace),
                           memory_budget_mb=args.memory_budget)
    return run(options)
