"""`specgen generate MODALITY`: the flags of one request, built from the request options
(`specgen.app.request_options`) and the method registry; the work is in text.py, image.py and speech.py."""

from __future__ import annotations

import argparse

from specgen.app.cli.options import (int_at_least, knob_flags, method_help, method_name, non_empty, output_path,
                                     request_flags)
from specgen.samplers import registry

OUT_SUFFIXES = {"image": (".png",), "video": (".gif", ".mp4"), "speech": (".wav",)}


def add_generate_parser(commands, command) -> None:
    """The `generate` subcommands; `command(sub, name, help, full_name, handler)` adds one with the shared options."""
    generate = commands.add_parser("generate", help="generate text, an image, a video or speech",
                                   description="Generate with a draft-verify method.")
    kinds = generate.add_subparsers(dest="modality", metavar="MODALITY", required=True)
    for modality in registry.MODALITIES:
        p = command(kinds, modality, f"generate {modality}", f"generate {modality}", handler=_generate)
        _source_flags(p, modality)
        p.add_argument("--method", type=method_name(modality), help=method_help(modality))
        _model_flags(p, modality)
        request_flags(p, modality)
        knob_flags(p, modality)
        _output_flags(p, modality)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _source_flags(p: argparse.ArgumentParser, modality: str) -> None:
    if modality == "speech":
        p.add_argument("--text", required=True, type=non_empty, help="the text to speak")
    elif modality == "text":
        p.add_argument("--prompt", type=non_empty,
                       help="the prompt to continue (default: the model's example prompt, printed to stderr)")
    else:
        source = p.add_mutually_exclusive_group(required=True)
        source.add_argument("--prompt", type=non_empty, help="text prompt")
        source.add_argument("--class", dest="class_label", type=non_empty, metavar="C",
                            help="class label, for class-conditional models")


def _model_flags(p: argparse.ArgumentParser, modality: str) -> None:
    if modality == "text":
        p.add_argument("--model", help="target: a Hugging Face causal LM path or id available offline")
        p.add_argument("--draft", help="draft model path or id (methods with a draft model)")
    elif modality == "speech":
        p.add_argument("--model", help="speech token model folder (default: the shipped assets/speech/target)")
        p.add_argument("--draft", help="draft model folder (default: the shipped assets/speech/draft)")
        p.add_argument("--codec", help="acoustic codebook folder (default: the shipped assets/speech/codec)")
    else:
        shipped = "assets/image/target" if modality == "image" else "assets/image/video"
        janus = "; or a Janus checkpoint folder with its processor" if modality == "image" else ""
        p.add_argument("--model", help=f"{modality} token model folder (default: the shipped {shipped}{janus})")
        p.add_argument("--vq", help="VQ tokenizer folder (default: the shipped assets/image/vq)")
        if modality == "image":
            p.add_argument("--head", metavar="DIR", help="eagle/lantern/lantern++: the draft head folder "
                                                         "(default: the shipped assets/image/head)")


def _output_flags(p: argparse.ArgumentParser, modality: str) -> None:
    if modality == "text":
        p.add_argument("--trace", type=output_path(), metavar="FILE", help="write the step events as JSON Lines")
        p.add_argument("--compare", action="store_true",
                       help="run the same request by plain decoding too and report the measured speedup and, "
                            "at temperature 0, whether the outputs are identical")
        return
    suffixes = OUT_SUFFIXES[modality]
    p.add_argument("--out", required=True, type=output_path(*suffixes), metavar=f"FILE{suffixes[0]}",
                   help="an .mp4 needs ffmpeg" if modality == "video" else None)
    if modality == "video":
        p.add_argument("--fps", type=int_at_least(1, 60), default=4, help="frames per second (default: 4)")


def _generate(args: argparse.Namespace) -> int:
    """The modality's command, imported only now: torch loads with it."""
    if args.modality == "text":
        from specgen.app.cli.text import generate_text as run
    elif args.modality == "speech":
        from specgen.app.cli.speech import generate_speech as run
    else:
        from specgen.app.cli.image import generate_image as run
    return run(args)
