"""`specgen demo`: the Gradio web demo (`specgen.app.ui`)."""

from __future__ import annotations

import argparse

from specgen.app.cli.options import int_at_least, non_empty


def add_demo_parser(commands, command) -> None:
    demo = command(commands, "demo", "the Gradio web demo", "demo", handler=_demo)
    demo.add_argument("--host", default="127.0.0.1", type=non_empty, help="default: 127.0.0.1")
    demo.add_argument("--port", type=int_at_least(1, 65535), default=7860, help="default: 7860")
    demo.add_argument("--model", help="text target: a Hugging Face causal LM path or id available offline")
    demo.add_argument("--draft", help="text draft model path or id")
    demo.add_argument("--online-draft", type=int_at_least(1), metavar="I",
                      help="online speculative decoding: the text draft learns from its rejections every I requests")


def _demo(args: argparse.Namespace) -> int:
    from specgen.app.ui import launch_demo

    return launch_demo(args)
