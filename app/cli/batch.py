"""`specgen batch`: a JSON Lines file of requests, one result line each (the runner is `specgen.app.batch`)."""

from __future__ import annotations

import argparse

from specgen.app.cli.options import existing_file, int_at_least, option_type, output_path
from specgen.errors import InvalidRequest


def add_batch_parser(commands, command) -> None:
    batch = command(commands, "batch", "run a JSON Lines file of requests", "batch", handler=_batch)
    batch.add_argument("--input", required=True, type=existing_file, metavar="IN.jsonl",
                       help='one request per line: {"id", "modality", "prompt"|"class"|"text", ...}')
    batch.add_argument("--output", required=True, type=output_path(), metavar="OUT.jsonl",
                       help="results, one line per request; ids already there are skipped on a rerun")
    batch.add_argument("--engine", choices=("local", "ray"), default="local", help="default: local")
    batch.add_argument("--online-draft", type=int_at_least(1), metavar="I",
                       help="online speculative decoding: update the text draft from its rejections every I items; "
                            "text items without a method run `draft` (outputs stay exact; local engine)")
    batch.add_argument("--rows", type=int_at_least(1), default=1, metavar="N",
                       help="greedy text items with the same method and knobs decode N at a time by continuous "
                            "batching, with the same tokens (default: 1, one by one)")
    batch.add_argument("--memory-budget", type=option_type("text", "memory_budget_mb"), metavar="MB",
                       help="peak resident memory in MB for text items that name none: rows and windows are cut to "
                            "fit beside the loaded models (default: no budget)")
    batch.add_argument("--model", help="text target: a Hugging Face causal LM path or id available offline")
    batch.add_argument("--draft", help="text draft model path or id")
    batch.add_argument("--image-model", metavar="DIR", help="image token model folder (default: the shipped one)")
    batch.add_argument("--image-vq", metavar="DIR", help="image VQ tokenizer folder (default: the shipped one)")
    batch.add_argument("--video-model", metavar="DIR", help="video token model folder (default: the shipped one)")
    batch.add_argument("--speech-model", metavar="DIR", help="speech token model folder (default: the shipped one)")
    batch.add_argument("--speech-draft", metavar="DIR", help="speech draft model folder (default: the shipped one)")
    batch.add_argument("--speech-codec", metavar="DIR", help="acoustic codebook folder (default: the shipped one)")
    batch.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")


def _batch(args: argparse.Namespace) -> int:
    if args.output.resolve() == args.input.resolve():
        raise InvalidRequest("--output must differ from --input")
    from specgen.app.jsonl import read_objects

    for _ in read_objects(args.input):  # every line is a JSON object: a bad file fails naming its line, before torch
        pass
    from specgen.app.batch import batch_command

    return batch_command(args)
