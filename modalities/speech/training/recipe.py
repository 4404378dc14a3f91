"""Fit the acoustic codebook (role codec), encode the corpus with it (role tokens) and train the speech token models
(roles target, draft), resumably: the speech models' shipped recipe, role by role.

    python -m specgen.modalities.speech.training.recipe --role codec --corpus runs/speech-corpus \
        --out assets/speech/codec
    python -m specgen.modalities.speech.training.recipe --role tokens --corpus runs/speech-corpus \
        --out assets/speech/corpus
    python -m specgen.modalities.speech.training.alignment --tokens assets/speech/corpus     # character durations
    python -m specgen.modalities.speech.training.recipe --role target --tokens assets/speech/corpus \
        --run-dir runs/speech-target --out assets/speech/target --bf16

`codebook.py` makes the codebook and the token file, `token_models.py` trains on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specgen.settings import use_threads
from specgen.modalities.training import add_run_options
from specgen.modalities.speech.training.codebook import CORPUS_MODULE, encode_corpus, fit_codec
from specgen.modalities.speech.training.token_models import (ALIGNMENT, DEFAULTS, NOISE_SOURCES, TrainConfig,
                                                             train)

MODULE = "specgen.modalities.speech.training.recipe"
ROLES = ("codec", "tokens", "target", "draft")


def recipe(role: str, *, tokens: str | Path | None = None, layout: str = "auto", steps: int | None = None,
           batch_size: int | None = None, lr: float | None = None, **settings) -> TrainConfig:
    """The shipped recipe of a token model (`role` target or draft): the settings left out (or None) take the
    role's defaults; the run folder is runs/speech-ROLE, the tokens are the shipped corpus', and layout "auto"
    is interleaved when the corpus has character durations."""
    from specgen.errors import InvalidRequest
    from specgen.modalities.speech.models import default_paths
    from specgen.modalities.speech.training.alignment import load_durations

    if role not in DEFAULTS:
        raise InvalidRequest(f"role must be target or draft, not {role!r}")
    default_steps, default_batch, default_lr = DEFAULTS[role]
    tokens = tokens or default_paths()["target"].parent / "corpus"
    if layout == "auto":
        layout = "interleaved" if load_durations(Path(tokens)) is not None else "prefix"
    return TrainConfig(role=role, steps=default_steps if steps is None else steps,
                       batch_size=batch_size or default_batch, lr=lr or default_lr, tokens=str(tokens), layout=layout,
                       **{"run_dir": f"runs/speech-{role}", **settings})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--corpus", type=Path, nargs="+",
                   help=f"codec/tokens: the corpus folder (python -m {CORPUS_MODULE}); tokens takes several, "
                        "encoded in order")
    p.add_argument("--append-tokens", type=Path, default=None,
                   help="tokens: an encoded corpus (tokens.npz folder, same codebook) to put after --corpus")
    p.add_argument("--codec", type=Path, default=None,
                   help="tokens: the codebook folder (default: assets/speech/codec)")
    p.add_argument("--tokens", type=Path, default=None, help="target/draft: tokens.npz or its folder "
                                                             "(default: assets/speech/corpus)")
    p.add_argument("--codebook-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=None, help="default: 3000")
    p.add_argument("--batch-size", type=int, default=None, help="default: 16")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: target 1.5e-3, draft 2e-3)")
    add_run_options(p, "checkpoints and logs (default: runs/speech-ROLE)", "export folder")
    p.add_argument("--layout", choices=("auto", "prefix", "interleaved"), default="auto",
                   help="sequence layout; auto (default): interleaved when the corpus has durations.npz "
                        f"(python -m {ALIGNMENT}), else prefix")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the forward pass (faster on AMX CPUs)")
    p.add_argument("--teacher", type=Path, default=None,
                   help="draft distillation: a target model folder whose laws the model learns (forward KL)")
    p.add_argument("--input-noise", type=float, default=0.0,
                   help="share of the input's acoustic tokens replaced by random ones (labels unchanged; default 0)")
    p.add_argument("--noise-source", choices=NOISE_SOURCES, default="uniform",
                   help="replacements for --input-noise: any acoustic token (uniform, default) or the model's own "
                        "sample given the true frames before (model: an extra forward pass per step)")
    p.add_argument("--init", type=Path, default=None, help="start from this exported model instead of random weights")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--export-only", action="store_true", help="export the run's last checkpoint without training")
    a = p.parse_args(argv)
    from specgen.errors import SpecgenError
    from specgen.modalities.speech.models import default_paths

    use_threads(a.threads)
    try:
        if a.role in ("codec", "tokens"):
            if a.corpus is None or a.out is None:
                p.error(f"--role {a.role} needs --corpus and --out")
            if a.role == "codec":
                report = fit_codec(a.corpus[0], a.out, k=a.codebook_size, seed=a.seed)
            else:
                report = encode_corpus(a.corpus, a.codec or default_paths()["codec"], a.out, a.append_tokens)
            print(json.dumps({k: v for k, v in report.items() if k != "inertia"}))
            return 0
        cfg = recipe(a.role, tokens=a.tokens, layout=a.layout, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
                     seed=a.seed, threads=a.threads, **({"run_dir": str(a.run_dir)} if a.run_dir else {}),
                     out=str(a.out) if a.out else None, checkpoint_minutes=a.checkpoint_minutes,
                     eval_every=a.eval_every, bf16=a.bf16, teacher=str(a.teacher) if a.teacher else None,
                     input_noise=a.input_noise, noise_source=a.noise_source, init=str(a.init) if a.init else None)
        summary = train(cfg, resume=not a.no_resume, export_only=a.export_only)
    except SpecgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("role", "params", "steps", "final_train_loss", "eval", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
