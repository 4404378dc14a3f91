"""`specgen bench BENCH`: methods side by side on the same prompts.

One subcommand per modality (text, image, video, speech), and the studies recorded in benchmarks/: `tetris`
(TETRIS against fixed-length drafting in a batch), `lantern` (the image draft head's methods alone),
`calibrate` (Sequoia's acceptance vector, or the tree budget sweep with --sweep) and `speech-frontier` (the
speech bench at the frontier record's defaults). `python -m specgen.app.bench.tetris ARGS` and
`python -m specgen.app.bench.calibrate ARGS` are `specgen bench tetris|calibrate ARGS`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specgen.app.cli.options import (existing_file, finite_float, float_list, int_at_least, int_list, method_list,
                                     method_name, shape_list)
from specgen.samplers import registry
from specgen.settings import use_threads

HEAD_METHODS = "eagle, lantern, lantern++"  # the image methods that draft with the head (app/bench/lantern.py)


def add_bench_parser(commands, command) -> None:
    """The `bench` subcommands; `command(sub, name, help, full_name, handler)` adds one with the shared options."""
    bench = commands.add_parser("bench", help="benchmark methods side by side",
                                description="Benchmark methods side by side on the same prompts.")
    kinds = bench.add_subparsers(dest="modality", metavar="BENCH", required=True)
    for modality in registry.MODALITIES:
        p = command(kinds, modality, f"benchmark {modality} methods", f"bench {modality}",
                    handler={"text": _bench_text, "image": _bench_image, "video": _bench_image,
                             "speech": _bench_speech}[modality])
        _run_options(p, modality, f"benchmarks/prompts/{modality}.jsonl")
        p.add_argument("--max-new-tokens", type=int_at_least(1), metavar="N",
                       help="default: 128" if modality == "text" else "default: per modality")
        if modality == "text":
            p.add_argument("--model", help="target: a Hugging Face causal LM path or id available offline")
            p.add_argument("--draft", help="draft model path or id (draft and hf-assisted)")
        if modality in ("image", "video"):
            p.add_argument("--model", help=f"{modality} token model folder (default: the shipped one)")
            p.add_argument("--windows", type=int_list(2, 256), metavar="L,L,...",
                           help="Jacobi windows to sweep (default: " + ("2..64" if modality == "image" else "8..128")
                           + ")")
            p.add_argument("--quality", action="store_true",
                           help=f"also judge every generated {modality}: Tesseract OCR of the glyph and its palette "
                                "colours" + (", and the direction of motion" if modality == "video" else "")
                                + ", beside true renders (needs tesseract-ocr and the image-eval extra)")
        if modality == "image":
            _head_options(p)
        if modality == "speech":
            _speech_options(p)
            p.add_argument("--no-quality", action="store_true",
                           help="speed only: skip WER, the speaker-similarity proxy and the token-swap stress test")
    _add_studies(kinds, command)


def _add_studies(kinds, command) -> None:
    """The benchmarks behind the records in benchmarks/ that are not one modality's methods side by side."""
    p = command(kinds, "tetris", "TETRIS against fixed-length drafting for a batch of different requests, under the "
                "same verification budget (the code pair)", "bench tetris", _bench_tetris)
    _tetris_options(p)
    p = command(kinds, "lantern", f"the image draft head's methods ({HEAD_METHODS}) side by side, with their "
                "speed/quality frontier", "bench lantern", _bench_lantern)
    _run_options(p, "image", "benchmarks/prompts/image.jsonl", f"head methods among {HEAD_METHODS} (default: all)")
    p.add_argument("--model", help="image token model folder (default: the shipped one)")
    _head_options(p)
    p = command(kinds, "calibrate", "Sequoia's acceptance-by-rank vector for a text pair, or (--sweep) the tree "
                "methods over node budgets", "bench calibrate", _bench_calibrate)
    _calibrate_options(p)
    p = command(kinds, "speech-frontier", "the speed/quality frontier of relaxed speech verification: `bench speech` "
                "with quality scoring on the frontier prompts, two repeats", "bench speech-frontier",
                _bench_speech_frontier)
    _run_options(p, "speech", "benchmarks/prompts/speech-frontier.jsonl", repeats=2)
    p.add_argument("--max-new-tokens", type=int_at_least(1), metavar="N", help="default: from the text length")
    _speech_options(p)
    p = command(kinds, "serve", "`specgen serve` under concurrent greedy clients against one client at a time and "
                "against plain decoding (the code pair and Gemma 3 270M)", "bench serve", _bench_serve)
    _serve_options(p)


# ---- options ---------------------------------------------------------------------------------------------------

def _run_options(p: argparse.ArgumentParser, modality: str, prompts: str, methods_help: str | None = None,
                 repeats: int = 1) -> None:
    """What every side-by-side bench takes: methods, prompts, repeats, --json and where the records go."""
    p.add_argument("--methods", type=method_list(modality), metavar="A,B,C",
                   help=methods_help or "default: all" + (" (ar always runs: it is the baseline)"
                                                          if modality == "text" else ""))
    p.add_argument("--prompts", type=existing_file, metavar="FILE", help=f"JSON Lines (default: {prompts})")
    p.add_argument("--repeats", type=int_at_least(1), default=repeats, metavar="R", help=f"default: {repeats}")
    _record_options(p)


def _record_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--out-dir", type=Path, metavar="DIR",
                   help="one folder for the timestamped run and its *-latest copies (default: the run under "
                        "$SPECGEN_HOME/runs, the *-latest copies in benchmarks/)")


def _head_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", metavar="DIR", help="draft head of eagle/lantern/lantern++ (default: shipped)")
    p.add_argument("--shape", type=shape_list, metavar="NAME[,NAME...]",
                   help="their static tree (default: the methods'); several: every setting at each (a sweep)")
    p.add_argument("--lambdas", type=float_list(1.0, 1000.0), metavar="L,L,...",
                   help="lantern++ lambdas to sweep (default: 1.5,2,3,5,10)")
    p.add_argument("--deltas", type=float_list(0.0, 1.0), metavar="D,D,...",
                   help="lantern deltas to sweep (default: 0.1)")
    p.add_argument("--quality-samples", type=int_at_least(20), metavar="N",
                   help="also measure quality: N images per setting, Fréchet distance on the shipped "
                        "classifier's features and class accuracy (the recorded run uses 2000; hours "
                        "on one CPU core; resumable)")
    p.add_argument("--quality-methods", type=method_list("image"), metavar="A,B",
                   help="which of the head methods get the quality measurement (default: all run)")


def _speech_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--thetas", type=float_list(0.0, 1.0), metavar="T,T,...",
                   help="pcg group thresholds to sweep (default when pcg runs: 0.5,0.4,0.3,0.25; pcg's "
                        "default theta always runs)")
    p.add_argument("--betas", type=float_list(0.0, 1.0), metavar="B,B,...",
                   help="ssd tolerances to sweep (default: ssd's default beta only)")
    p.add_argument("--corpus", type=Path, metavar="DIR",
                   help="encoded corpus for voice profiles and the swap test (default: assets/speech/corpus)")
    p.add_argument("--swap-utterances", type=int_at_least(1), metavar="N",
                   help="held-out corpus utterances in the token-swap stress test (default: 48)")
    p.add_argument("--swap-rate", type=float_list(0.0, 1.0, single=True), metavar="R",
                   help="share of tokens the swap test replaces (default: 1)")


def _tetris_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=existing_file, metavar="FILE",
                   help="JSON Lines, cycled to fill the batch (default: benchmarks/prompts/text.jsonl)")
    p.add_argument("--batch-size", type=int_at_least(2), default=8, metavar="N", help="rows (default: 8)")
    p.add_argument("--capacity", type=int_at_least(1), default=16, metavar="N",
                   help="drafted tokens verified per step for the whole batch (default: 16)")
    p.add_argument("--max-draft", type=int_at_least(1), default=6, metavar="N",
                   help="TETRIS: most tokens drafted per row (default: 6)")
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=96, metavar="N",
                   help="static batch (--steps 0): tokens per row (default: 96)")
    p.add_argument("--steps", type=int_at_least(0), default=0, metavar="N",
                   help="run this many verification steps instead, rows never finishing (default: 0, off)")
    p.add_argument("--requests", type=int_at_least(0), default=0, metavar="N",
                   help="serve this many requests (the prompts cycled) by continuous batching in --batch-size rows, "
                        "each to --max-new-tokens (default: 0, one batch)")
    p.add_argument("--drafter", choices=("model", "ngram"), default="model",
                   help="model: the shipped code draft; ngram: prompt lookup in each row's own context")
    p.add_argument("--estimate", choices=("confidence", "history"), default=None,
                   help="TETRIS's acceptance estimate (default: confidence for model, history for ngram)")
    p.add_argument("--slot-cost", type=finite_float, default=None, metavar="X",
                   help="TETRIS: a verified slot's cost over a step's fixed cost; slots whose estimate does not pay "
                        "for theirs are not verified (default: measured on the batch for the history estimate, 0 "
                        "(always fill the budget) for the confidence one, which is not a calibrated probability)")
    p.add_argument("--temperature", type=finite_float, default=0.0, metavar="T", help="default: 0 (greedy)")
    p.add_argument("--repeats", type=int_at_least(1), default=3, metavar="R",
                   help="interleaved repeats, medians reported (default: 3)")
    _record_options(p)


def _serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", type=lambda text: [m.strip() for m in text.split(",") if m.strip()],
                   default=["code", "gemma"], metavar="A,B", help="code, gemma (default: both)")
    p.add_argument("--method", type=method_name("text"), help="the server's method (default: the model's default)")
    p.add_argument("--prompts", type=existing_file, metavar="FILE",
                   help="JSON Lines, cycled (default: benchmarks/prompts/text.jsonl)")
    p.add_argument("--requests", type=int_at_least(1), default=24, metavar="N", help="per way (default: 24)")
    p.add_argument("--clients", type=int_at_least(2), default=8, metavar="N", help="concurrent clients (default: 8)")
    p.add_argument("--rows", type=int_at_least(1), default=8, metavar="N", help="server rows per lane (default: 8)")
    p.add_argument("--max-tokens", type=int_at_least(1), default=64, metavar="N", help="per request (default: 64)")
    _record_options(p)


def _calibrate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="target (default: the shipped code target; tree drafts need a draft over the "
                                   "target's full vocabulary)")
    p.add_argument("--draft", help="draft (default: the shipped code draft)")
    p.add_argument("--width", type=int_at_least(1), default=8, metavar="N",
                   help="children of the one-level calibration tree (default: 8)")
    p.add_argument("--temperature", type=finite_float, default=0.0, metavar="T", help="default: 0")
    p.add_argument("--prompts", type=int_at_least(1), default=8, metavar="N",
                   help="held-out corpus files used as calibration prompts (default: 8)")
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=64, metavar="N", help="default: 64")
    p.add_argument("--sweep", action="store_true",
                   help="instead: every tree method at every budget on benchmarks/prompts/text.jsonl, against ar "
                        "and draft; writes trees-sweep-STAMP.{json,md,png} and trees-sweep-latest.*")
    p.add_argument("--budgets", type=int_list(1, 4096), metavar="B,B,...",
                   help="--sweep: tree budgets in nodes (default: 4,8,16,32)")
    p.add_argument("--methods", type=method_list("text"), metavar="A,B,C",
                   help="--sweep: tree methods (default: sequoia,dyspec,eagle2)")
    _record_options(p)


# ---- handlers ----------------------------------------------------------------------------------------------------

def _handler(module: str, function: str, set_threads: bool = True):
    """A handler that imports `specgen.app.bench.<module>` only when the command runs, so `--help` loads no torch;
    `set_threads`: apply --threads first (the text bench's generator applies them itself)."""
    def handle(args: argparse.Namespace) -> int:
        from importlib import import_module

        if set_threads:
            use_threads(args.threads)
        return getattr(import_module(f"specgen.app.bench.{module}"), function)(args)
    return handle


_bench_text = _handler("text", "bench_text", set_threads=False)
_bench_image = _handler("image", "bench_image")
_bench_speech = _handler("speech", "bench_speech")
_bench_speech_frontier = _handler("speech", "bench_speech_frontier")
_bench_tetris = _handler("tetris", "bench_tetris")
_bench_lantern = _handler("lantern", "lantern_command")
_bench_calibrate = _handler("calibrate", "bench_calibrate")
_bench_serve = _handler("serve", "bench_serve")
