"""`specgen train WHAT`: every trainer resumes from its checkpoints and exports into OUT/export."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specgen.app.cli.options import MAX_SEED, finite_float, int_at_least

TRAINABLE = ("text", "draft", "adapter", "head", "image", "image-head", "image-classifier", "speech")


def add_train_parser(commands, command) -> None:
    """The `train` subcommands; `command(sub, name, help, full_name, handler)` adds one with the shared options."""
    train = commands.add_parser("train", help="train a model (resumes from checkpoints)",
                                description="Train a target or draft model; every trainer resumes from its checkpoints.")
    kinds = train.add_subparsers(dest="what", metavar="WHAT", required=True)
    for what in TRAINABLE:
        p = command(kinds, what, f"train the {what} model", f"train {what}",
                    handler={"text": _train_text, "draft": _train_draft, "adapter": _train_adapter,
                             "head": _train_head, "image": _train_image,
                             "image-head": _train_image_head, "image-classifier": _train_image_classifier,
                             "speech": _train_speech}[what])
        p.add_argument("--out", type=Path, metavar="DIR", help="checkpoint folder (resumed when it holds one)")
        p.add_argument("--steps", type=int_at_least(1), metavar="N", help="optimiser steps (default: the recipe's)")
        p.add_argument("--seed", type=int_at_least(0, MAX_SEED), default=0, help="default: 0")
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
            p.add_argument("--max-files", type=int_at_least(1), metavar="N",
                           help="train on the first N corpus files only (quick checks)")
        if what == "draft":
            _distill_options(p)
        if what == "adapter":
            _adapter_options(p)
        if what == "head":
            _head_options(p)


def _distill_options(p: argparse.ArgumentParser) -> None:
    p.description = ("Distil a draft from its target (DistillSpec divergences, AdaSPEC, reduced vocabularies, "
                     "pruned self-drafts); exports fp16 weights and a model card into OUT/export.")
    p.add_argument("--target", metavar="DIR", help="the target model (default: the shipped code target)")
    p.add_argument("--init", metavar="DIR|scratch|prune:N",
                   help="start from a model folder, a fresh draft, or the target less its N-layer block of least "
                        "angular distance (default: the shipped draft)")
    p.add_argument("--loss", choices=("ce", "fkl", "rkl", "jsd", "tvd"), default="fkl",
                   help="cross-entropy on the text, forward/reverse KL, JSD or total variation (default: fkl)")
    p.add_argument("--beta", type=finite_float, default=0.5, help="JSD mixing weight (default: 0.5)")
    p.add_argument("--data", choices=("corpus", "target", "draft", "mix"), default="target",
                   help="continuations from the corpus, sampled by the target, on-policy by the draft, or a "
                        "target/draft mix (default: target)")
    p.add_argument("--mix-fraction", type=finite_float, default=0.5, help="on-policy share with --data mix")
    p.add_argument("--adaspec", type=finite_float, metavar="K",
                   help="AdaSPEC: train on the top fraction K of tokens by KL_draft - KL_reference (e.g. 0.4)")
    p.add_argument("--reference", metavar="DIR", help="AdaSPEC's reference draft (a forward-KL distilled draft)")
    p.add_argument("--vocab-size", type=int_at_least(4), metavar="N",
                   help="reduced draft vocabulary: the N most frequent tokens of target samples")
    p.add_argument("--vocab-from", choices=("samples", "corpus+samples"), default="samples",
                   help="count the reduced vocabulary's frequencies in the target samples' continuations, or in the "
                        "training corpus and them (default: samples)")
    p.add_argument("--batch-size", type=int_at_least(1), default=16, help="windows per step (default: 16)")
    p.add_argument("--windows", type=int_at_least(1), default=1024, help="fixed data set size (default: 1024)")
    p.add_argument("--prompt-len", type=int_at_least(1), default=32, help="default: 32")
    p.add_argument("--new-tokens", type=int_at_least(1), default=64, help="continuation tokens (default: 64)")
    p.add_argument("--lr", type=finite_float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument("--top-k", type=int_at_least(1), default=64, help="teacher log-probs kept per position")
    p.add_argument("--temperature", type=finite_float, default=1.0, help="decoding temperature (default: 1)")
    p.add_argument("--sample-temperature", type=finite_float, metavar="T",
                   help="draw the target's samples at T instead (0: greedy continuations, for a draft serving greedy "
                        "decoding); the teacher is then kept while sampling")
    p.add_argument("--samples-only", action="store_true",
                   help="only generate the target's samples (resumable) and print their size and throughput")
    p.add_argument("--data-seed", type=int_at_least(0, MAX_SEED), default=0, help="which windows (default: 0)")
    p.add_argument("--eval-windows", type=int_at_least(1), default=128, help="held-out windows (default: 128)")
    p.add_argument("--cache-dir", metavar="DIR", help="data and teacher caches (default: $SPECGEN_HOME/distill)")


def _adapter_options(p: argparse.ArgumentParser) -> None:
    p.description = ("Train what a method adds to the frozen target, resumably: a Kangaroo self-draft adapter on the "
                     "target's own greedy continuations (its first layers, a one-layer attention adapter, its "
                     "lm_head), or early-exit's exit heads and controllers on the corpus's code.")
    p.add_argument("--method", choices=("kangaroo", "early-exit"), required=True,
                   help="kangaroo (self-speculation) or early-exit (dynamic inference, lossy)")
    p.add_argument("--model", metavar="DIR|code", help="the target model folder (default: code, the shipped one)")
    p.add_argument("--exit-layer", type=int_at_least(1), metavar="L",
                   help="target layers the draft runs (default: 1)")
    p.add_argument("--mlp", action="store_true", help="a full decoder layer instead of the attention-only adapter")
    p.add_argument("--export", type=Path, metavar="DIR",
                   help="where the adapter and its card go (default: OUT/export; the shipped code target's are in "
                        "assets/code/kangaroo)")
    p.add_argument("--batch-size", type=int_at_least(1), metavar="N",
                   help="per step: windows (kangaroo, default 16) or positions (early-exit, default 1024)")
    p.add_argument("--windows", type=int_at_least(1), metavar="N",
                   help="greedy continuations (kangaroo, default 2048) or corpus windows (early-exit, default 768) "
                        "trained on")
    p.add_argument("--lr", type=finite_float, help="peak learning rate (default: 1e-3)")
    p.add_argument("--data-seed", type=int_at_least(0, MAX_SEED), metavar="SEED", help="which prompts (default: 0)")
    p.add_argument("--max-files", type=int_at_least(1), metavar="N",
                   help="the first N corpus files only (quick checks)")


def _head_options(p: argparse.ArgumentParser) -> None:
    from dataclasses import fields

    from specgen.modalities.text.training.eagle_config import EagleConfig, yes_no

    p.description = ("Train a draft head that reads the target's own features (EAGLE: one decoder layer over the "
                     "token embedding and the target's last hidden state), on the target's features over its own "
                     "greedy continuations and corpus text; resumable. docs/eagle.md")
    p.add_argument("--method", choices=("eagle", "poss", "mtp", "falcon", "ppd"), required=True,
                   help="the feature drafter: an EAGLE head, PosS position specialists over one (--base), "
                        "FastMTP's module (its own defaults: eagle_config.MTP_DEFAULTS), Falcon's semi-"
                        "autoregressive head (eagle_config.FALCON_DEFAULTS), or PPD's prompt tokens "
                        "(docs/ppd.md; it takes --model, --windows, --prompt-len, --eval-windows, --batch-size, --lr, "
                        "--warmup, --max-files and the two options below)")
    p.add_argument("--prompt-tokens", type=int_at_least(1), metavar="M", help="ppd: prompt tokens (default: 3)")
    p.add_argument("--anchors", type=int_at_least(1), metavar="N",
                   help="ppd: continuation slots per window given prompt tokens each step (default: 16)")
    p.add_argument("--export", type=Path, metavar="DIR",
                   help="where the head and its card go (default: OUT/export; the shipped ones are assets/code/eagle "
                        "and assets/gemma/eagle)")
    for field in fields(EagleConfig):
        if field.name not in ("run_dir", "out", "seed", "steps", "threads", "checkpoint_minutes", "method"):
            default = field.default
            p.add_argument(f"--{field.name.replace('_', '-')}", type=yes_no if isinstance(default, bool) else
                           type(default), metavar=field.name.upper(),
                           help=f"default: {default}" if default != "" else "default: the target's own")


# ---- handlers: each builds its trainer's config from the parsed options in one way (the run folder from --out,
# then the options given) and calls the trainer's one entry function -------------------------------------------

COMMON = ("steps", "seed", "threads")  # options every trainer takes; its recipe's default where not given
DISTILL = ("target", "init", "loss", "beta", "data", "mix_fraction", "adaspec", "reference", "vocab_size",
           "vocab_from", "batch_size", "windows", "prompt_len", "new_tokens", "lr", "top_k", "temperature",
           "sample_temperature", "data_seed", "eval_windows", "cache_dir", "max_files")


def _given(args: argparse.Namespace, *names: str) -> dict:
    """The options among `names` that have a value (argparse leaves the others None), paths as strings: the
    configs are written into the run records as JSON."""
    values = {name: getattr(args, name, None) for name in names}
    return {name: str(value) if isinstance(value, Path) else value
            for name, value in values.items() if value is not None}


def _folders(args: argparse.Namespace) -> dict:
    """--out DIR: the run in DIR and the export in DIR/export; without it, the trainer's own run folder."""
    return {} if args.out is None else {"run_dir": str(args.out), "out": str(args.out / "export")}


def _report(summary: dict, *keys: str) -> int:
    print(json.dumps({k: summary.get(k) for k in keys}))
    return 0


def _train_text(args: argparse.Namespace) -> int:
    """`train text` trains the code target from scratch (the draft's recipe: `python -m
    specgen.modalities.text.training.code_models --role draft`), exporting fp16 weights into OUT/export."""
    from specgen.modalities.text.training.code_models import CodeModelConfig, train_text_model

    out = args.out or Path("runs") / "target"
    cfg = CodeModelConfig(role="target", run_dir=out, export_dir=out / "export", **_given(args, *COMMON, "max_files"))
    return _report(train_text_model(cfg), "role", "params", "steps", "tokens_seen", "final_train_loss",
                   "final_val_loss", "wall_s")


def _train_draft(args: argparse.Namespace) -> int:
    from specgen.modalities.text.training.distill.distiller import DistillConfig, prepare_samples, train_draft

    cfg = DistillConfig(out=str(args.out or Path("runs") / "distill"), **_given(args, *COMMON, *DISTILL))
    if args.samples_only:  # the record of the target's samples, whole
        record = prepare_samples(cfg)
        return _report(record, *record)
    return _report(train_draft(cfg), "steps", "params", "final_loss", "heldout", "coverage", "wall_s")


def _train_adapter(args: argparse.Namespace) -> int:
    """`train adapter --method kangaroo|early-exit` (modalities/text/training/kangaroo.py, early_exit.py)."""
    from specgen.modalities.text.training.kangaroo import KangarooConfig, train_adapter

    if args.method == "early-exit":
        return _train_early_exit(args)
    options = _given(args, *COMMON, "exit_layer", "batch_size", "windows", "lr", "data_seed", "max_files")
    cfg = KangarooConfig(run_dir=str(args.out or Path("runs") / "kangaroo"), target=args.model, mlp=args.mlp,
                         out=None if args.export is None else str(args.export), **options)
    return _report(train_adapter(cfg), "exit_layer", "params", "steps", "final_loss", "heldout_before", "heldout",
                   "train_s")


def _train_early_exit(args: argparse.Namespace) -> int:
    from specgen.modalities.text.training.early_exit import EarlyExitConfig, train_early_exit

    if args.exit_layer is not None or args.mlp:
        from specgen.errors import InvalidRequest

        raise InvalidRequest("--exit-layer and --mlp are Kangaroo's; early-exit trains a head after every layer")
    options = _given(args, *COMMON, "batch_size", "windows", "lr", "data_seed", "max_files")
    cfg = EarlyExitConfig(run_dir=str(args.out or Path("runs") / "early-exit"), target=args.model,
                          out=None if args.export is None else str(args.export), **options)
    return _report(train_early_exit(cfg), "params", "steps", "final_loss", "calibration", "train_s")


def _train_head(args: argparse.Namespace) -> int:
    """`train head --method eagle|poss|mtp` (modalities/text/training/eagle.py)."""
    from dataclasses import fields

    from specgen.modalities.text.training.eagle import train_eagle
    from specgen.modalities.text.training.eagle_config import EagleConfig, config_for

    if args.method == "ppd":
        return _train_ppd(args)
    options = _given(args, *(f.name for f in fields(EagleConfig) if f.name not in ("run_dir", "out", "method")))
    out = args.out or Path("runs") / args.method
    cfg = config_for(args.method, run_dir=str(out), out=str(args.export or out / "export"), **options)
    return _report(train_eagle(cfg), "target", "params", "output_rows", "steps", "before", "after", "train_s",
                   "data_s")


def _train_ppd(args: argparse.Namespace) -> int:
    """`train head --method ppd` (modalities/text/training/ppd.py)."""
    from specgen.modalities.text.training.ppd import PPDConfig, train_prompts

    options = _given(args, *COMMON, "prompt_tokens", "anchors", "windows", "prompt_len", "eval_windows", "batch_size",
                     "lr", "warmup")
    if args.max_files:
        options["max_files"] = args.max_files
    out = args.out or Path("runs") / "ppd"
    cfg = PPDConfig(run_dir=str(out), out=str(args.export or out / "export"),
                    target=None if args.model in (None, "code") else args.model, **options)
    return _report(train_prompts(cfg), "target", "params", "steps", "final_loss", "heldout_before", "heldout",
                   "train_s", "data_s")


def _train_image(args: argparse.Namespace) -> int:
    from specgen.modalities.image.training.recipe import recipe, train

    cfg = recipe(args.role, **_folders(args), **_given(args, *COMMON))
    return _report(train(cfg), "role", "params", "steps", "final_train_loss", "eval", "wall_s")


def _train_image_head(args: argparse.Namespace) -> int:
    """The EAGLE-style head of lantern / lantern++."""
    from specgen.modalities.image.training.eagle_head import HeadConfig, train_head

    return _report(train_head(HeadConfig(**_folders(args), **_given(args, *COMMON))), "before", "after")


def _train_image_classifier(args: argparse.Namespace) -> int:
    """The classifier whose features measure image quality (Fréchet distance)."""
    from specgen.modalities.image.training.quality.classifier import ClassifierConfig, train_classifier

    summary = train_classifier(ClassifierConfig(**_folders(args), **_given(args, *COMMON)))
    return _report(summary, "val_accuracy_on_reconstructions")


def _train_speech(args: argparse.Namespace) -> int:
    from specgen.modalities.speech.training.recipe import recipe
    from specgen.modalities.speech.training.token_models import train

    cfg = recipe(args.role, layout=args.layout, bf16=args.bf16, **_folders(args),
                 **_given(args, *COMMON, "tokens", "teacher"))
    return _report(train(cfg), "role", "params", "steps", "final_train_loss", "eval", "wall_s")
