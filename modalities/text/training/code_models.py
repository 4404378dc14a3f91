"""Train the shipped code models (target and draft) from scratch on the standard library source, resumably.

    python -m specgen.modalities.text.training.code_models --role draft --run-dir runs/draft     # the shipped recipe
    python -m specgen.modalities.text.training.code_models --finalize-card   # rebuild assets/code/README.md, MANIFEST

A run folder holds the tokenizer it started with, the token cache, `checkpoint.pt` (model, optimizer, step,
RNG state, rolling losses) and `metrics.jsonl`. Batches are a pure function of (seed, step), so a run
killed at any point resumes from its last checkpoint onto exactly the batches it would have seen.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specgen.settings import use_threads
from specgen.errors import InvalidRequest, VocabularyMismatch
from specgen.modalities.text.models import ASSETS_CODE, VOCAB_SIZE
from specgen.modalities.training import (LoopSettings, RunFolder, StepResult, atomic_write, export_fp16, file_sha256,
                                         progress_bar, run_steps, write_npy)

# The shipped recipe. On one CPU core the budget is optimizer steps, not tokens: batches of 8 windows with a
# higher peak lr reached a lower loss per token than 16 windows at 6e-4 / 1e-3 (draft val 3.83 vs 4.48).
DEFAULT_LR = {"target": 1.5e-3, "draft": 2e-3}
DEFAULT_STEPS = {"target": 1600, "draft": 2400}
DEFAULT_BATCH = 8
# Settings that change what a step computes; a checkpoint only resumes under the same ones.
FIXED = ("role", "batch_size", "seq_len", "seed", "vocab_size", "max_files")
MODULE = "specgen.modalities.text.training.code_models"


@dataclass(frozen=True)
class CodeModelConfig:
    role: str  # "target" or "draft"
    run_dir: str | Path  # checkpoints, token cache and logs
    steps: int | None = None  # default: the role's (DEFAULT_STEPS)
    batch_size: int = DEFAULT_BATCH
    seq_len: int = 256
    lr: float | None = None  # peak learning rate; default: the role's (DEFAULT_LR)
    seed: int = 0
    threads: int = 1
    checkpoint_minutes: float = 5
    log_every: int = 10
    export_dir: str | Path | None = ASSETS_CODE  # weights into export_dir/role; None: no export
    eval_every: int | None = None  # default: a tenth of the steps, at most 200
    val_windows: int = 64
    warmup: int | None = None  # default: a twentieth of the steps, at most 100
    max_files: int | None = None  # the first corpus files only (quick checks)
    vocab_size: int = VOCAB_SIZE

    def resolved(self) -> CodeModelConfig:
        """This config with the defaults that depend on the role and the step count filled in."""
        if self.steps is None and self.role not in DEFAULT_STEPS:
            raise InvalidRequest(f"role must be one of {', '.join(DEFAULT_STEPS)}, not {self.role!r}")
        steps = DEFAULT_STEPS[self.role] if self.steps is None else self.steps
        return dataclasses.replace(
            self, steps=steps, lr=DEFAULT_LR.get(self.role, 1e-3) if self.lr is None else self.lr,
            warmup=min(100, max(1, steps // 20)) if self.warmup is None else self.warmup,
            eval_every=max(1, min(200, steps // 10)) if self.eval_every is None else self.eval_every)

    def record(self) -> dict:
        """The settings run.json and the checkpoint keep (of a resolved config)."""
        export_dir = Path(self.export_dir) if self.export_dir is not None else None
        return dict(role=self.role, steps=self.steps, batch_size=self.batch_size, seq_len=self.seq_len, lr=self.lr,
                    seed=self.seed, threads=self.threads, run_dir=str(Path(self.run_dir)), export_dir=str(export_dir),
                    max_files=self.max_files, warmup=self.warmup, vocab_size=self.vocab_size)

    def command(self) -> str:
        args = self.record()
        flags = ["role", "steps", "batch_size", "seq_len", "lr", "seed", "threads", "run_dir"]
        parts = [f"python -m {MODULE}"] + [f"--{k.replace('_', '-')} {args[k]}" for k in flags]
        if args.get("max_files"):
            parts.append(f"--max-files {args['max_files']}")
        if Path(args["export_dir"]).resolve() != ASSETS_CODE:
            parts.append(f"--export-dir {args['export_dir']}")
        return " ".join(parts)


def _prepare_tokenizer(run_dir: Path, export_dir: Path | None, corpus, vocab_size: int):
    """The run's own tokenizer if resuming, else the shared exported one, else a new one from the train split."""
    from specgen.modalities.text.models import load_tokenizer, train_tokenizer

    own = run_dir / "tokenizer"
    for source in (own, export_dir):
        if source is not None and (source / "tokenizer.json").exists():
            tok = load_tokenizer(source)
            break
    else:
        tok = train_tokenizer(corpus.texts("train"), vocab_size)
    if not (own / "tokenizer.json").exists():
        tok.save_pretrained(own)
    return tok


def _token_cache(run_dir: Path, corpus, tok) -> dict:
    """Train/val token arrays (uint16; each file is <bos> text <eos>), built once per corpus and tokenizer."""
    import numpy as np

    key = {"corpus_sha256": corpus.sha256, "tokenizer_sha256": file_sha256(run_dir / "tokenizer" / "tokenizer.json")}
    meta = run_dir / "tokens.json"
    if not (meta.exists() and json.loads(meta.read_text()) == key):
        for split in ("train", "val"):
            ids = [[tok.bos_token_id, *e.ids, tok.eos_token_id]
                   for e in tok.backend_tokenizer.encode_batch(corpus.texts(split), add_special_tokens=False)]
            array = np.fromiter((i for seq in ids for i in seq), dtype=np.uint16)
            write_npy(run_dir / f"tokens_{split}.npy", array)
        atomic_write(meta, lambda p: p.write_text(json.dumps(key)))
    return {split: np.load(run_dir / f"tokens_{split}.npy") for split in ("train", "val")}


def _batch(tokens, seed: int, step: int, batch_size: int, seq_len: int):
    """Random windows of seq_len + 1 tokens, chosen by (seed, step) alone: the data position is the step."""
    import numpy as np
    import torch

    starts = np.random.default_rng((seed, step)).integers(0, len(tokens) - seq_len, size=batch_size)
    return torch.from_numpy(np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64))


def _loss(model, batch):
    import torch.nn.functional as F

    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def _val_loss(model, tokens, seq_len: int, windows: int, batch_size: int) -> float:
    """Mean loss over fixed, evenly spaced, non-overlapping windows of the held-out files."""
    import numpy as np
    import torch

    count = min(windows, (len(tokens) - 1) // (seq_len + 1))
    if count == 0:
        return float("nan")
    stride = (len(tokens) - 1) // count
    data = torch.from_numpy(np.stack([tokens[i * stride:i * stride + seq_len + 1] for i in range(count)])
                            .astype(np.int64))
    model.eval()
    with torch.no_grad():
        total = sum(_loss(model, data[i:i + batch_size]).item() * len(data[i:i + batch_size])
                    for i in range(0, count, batch_size))
    model.train()
    return total / count


def _optimizer(model, lr: float):
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]  # no weight decay on norms
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def _refuse_other_settings(cfg: CodeModelConfig, checkpoint_path: Path):
    def check(saved: dict) -> None:
        if any(saved["args"][k] != cfg.record()[k] for k in FIXED):
            raise InvalidRequest(f"{checkpoint_path} was made with different settings ({', '.join(FIXED)} must "
                                 "match); pass resume=False (--no-resume) to start over")

    return check


def train_text_model(cfg: CodeModelConfig, resume: bool = True) -> dict:
    """Train `cfg.role` ("target" or "draft") for `cfg.steps` AdamW steps in run folder `cfg.run_dir`, then export
    fp16 safetensors to `cfg.export_dir/role` next to the shared tokenizer. Returns the training summary that is
    also written as `training.json`."""
    import torch

    from specgen.modalities.text.models import build_model
    from specgen.modalities.text.training.stdlib_corpus import load_corpus

    cfg = cfg.resolved()
    if cfg.steps < 1 or cfg.batch_size < 1 or cfg.seq_len < 1:
        raise InvalidRequest("steps, batch_size and seq_len must be positive")
    run = RunFolder(cfg.run_dir)
    export_dir = Path(cfg.export_dir) if cfg.export_dir is not None else None
    use_threads(cfg.threads)
    corpus = load_corpus(max_files=cfg.max_files)
    tok = _prepare_tokenizer(run.path, export_dir, corpus, cfg.vocab_size)
    tokens = _token_cache(run.path, corpus, tok)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.role, tok)
    opt = _optimizer(model, cfg.lr)
    fresh = {"step": 0, "elapsed_s": 0.0, "recent_losses": [], "val_loss": None, "resumed_from": []}
    state, _ = run.resume(model, opt, fresh, check=_refuse_other_settings(cfg, run.checkpoint), enabled=resume)
    run.record("run.json", {**cfg.record(), "command": cfg.command()})
    _train_steps(cfg, run, model, opt, tokens, state)
    summary = _summary(cfg, model, state, corpus, tokens, run.path)
    run.record("training.json", summary)
    if export_dir is not None:
        export(model, cfg.role, run.path, export_dir, summary)
    return summary


def _train_steps(cfg: CodeModelConfig, run: RunFolder, model, opt, tokens: dict, state: dict) -> None:
    """Steps from state["step"] to cfg.steps (state updated in place), with tokens/s in the metrics and the
    validation loss at every evaluation."""
    import torch

    tokens_per_step = cfg.batch_size * cfg.seq_len
    last = {"time": time.monotonic(), "step": state["step"]}  # the previous metrics line, for tokens/s
    bar = progress_bar(cfg.steps, state["step"], f"train {cfg.role}")

    def log(result: StepResult) -> None:
        now = time.monotonic()
        rate = (state["step"] - last["step"]) * tokens_per_step / max(now - last["time"], 1e-9)
        last.update(time=now, step=state["step"])
        bar.set_postfix(loss=f"{result.loss:.3f}", lr=f"{result.lr:.2e}", tok_s=f"{rate:.0f}", refresh=False)
        run.log({"step": state["step"], "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
                 "tokens_per_s": rate, "elapsed_s": state["elapsed_s"]})

    def evaluate(result: StepResult) -> None:
        state["val_loss"] = _val_loss(model, tokens["val"], cfg.seq_len, cfg.val_windows, cfg.batch_size)
        run.log({"step": state["step"], "val_loss": state["val_loss"]})
        bar.write(f"{cfg.role} step {state['step']}: train {result.loss:.4f}  val {state['val_loss']:.4f}",
                  file=sys.stderr)

    def checkpoint() -> None:
        run.save_checkpoint({"model": model.state_dict(), "optimizer": opt.state_dict(),
                             "torch_rng": torch.get_rng_state(), "args": cfg.record(),
                             "state": {**state, "data_step": state["step"]}})

    def loss_at(step: int):
        return _loss(model, _batch(tokens["train"], cfg.seed, step, cfg.batch_size, cfg.seq_len))

    loop = LoopSettings(cfg.role, cfg.steps, cfg.lr, cfg.warmup, cfg.log_every, cfg.eval_every,
                        cfg.checkpoint_minutes)
    run_steps(loop, state, model, opt, loss_at, log=log, evaluate=evaluate, checkpoint=checkpoint, bar=bar)
    bar.close()


def _summary(cfg: CodeModelConfig, model, state: dict, corpus, tokens: dict, run_dir: Path) -> dict:
    import platform

    import torch
    import transformers

    return {
        "role": cfg.role, "params": sum(p.numel() for p in model.parameters()), "command": cfg.command(),
        "seed": cfg.seed, "steps": cfg.steps, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "lr": cfg.lr,
        "warmup": cfg.warmup, "schedule": "linear warmup, cosine to 10 %",
        "optimizer": "AdamW b=(0.9, 0.95) wd=0.1 clip=1.0", "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "final_train_loss": sum(state["recent_losses"]) / len(state["recent_losses"]),
        "final_train_loss_steps": len(state["recent_losses"]), "final_val_loss": state["val_loss"],
        "wall_s": round(state["elapsed_s"], 1), "resumed_from_steps": state["resumed_from"], "threads": cfg.threads,
        "corpus": corpus.describe(), "train_tokens": int(len(tokens["train"])), "val_tokens": int(len(tokens["val"])),
        "tokenizer_sha256": file_sha256(run_dir / "tokenizer" / "tokenizer.json"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "cpu": platform.processor() or platform.machine(),
    }


def export(model, role: str, run_dir: Path, export_dir: Path, summary: dict) -> Path:
    """fp16 safetensors + config into export_dir/role; the run's tokenizer into export_dir (shared by both roles)."""
    export_dir.mkdir(parents=True, exist_ok=True)
    shared = export_dir / "tokenizer.json"
    if shared.exists() and file_sha256(shared) != summary["tokenizer_sha256"]:
        raise VocabularyMismatch(f"{shared} differs from the tokenizer this {role} was trained with "
                                 f"({run_dir / 'tokenizer'}); target and draft must share one tokenizer")
    if not shared.exists():
        from specgen.modalities.text.models import load_tokenizer

        load_tokenizer(run_dir / "tokenizer").save_pretrained(export_dir)
    return export_fp16(model, export_dir / role,
                       lambda tmp: (tmp / "training.json").write_text(json.dumps(summary, indent=1)))


def _build_tokenizer(export_dir: Path, max_files: int | None) -> None:
    from specgen.modalities.text.models import train_tokenizer
    from specgen.modalities.text.training.stdlib_corpus import load_corpus

    if (export_dir / "tokenizer.json").exists():
        raise SystemExit(f"{export_dir / 'tokenizer.json'} exists; remove it first to rebuild")
    train_tokenizer(load_corpus(max_files=max_files).texts("train")).save_pretrained(export_dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["target", "draft"])
    p.add_argument("--steps", type=int, default=None, help="default: target 1600, draft 2400")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: target 1.5e-3, draft 2e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--run-dir", type=Path, help="checkpoints, token cache and logs (default: runs/ROLE)")
    p.add_argument("--export-dir", type=Path, default=ASSETS_CODE)
    p.add_argument("--checkpoint-minutes", type=float, default=5)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--max-files", type=int, default=None, help="use only the first N corpus files (quick checks)")
    p.add_argument("--no-resume", action="store_true", help="start over even if the run folder has a checkpoint")
    p.add_argument("--tokenizer-only", action="store_true", help="build the shared tokenizer into --export-dir")
    p.add_argument("--finalize-card", action="store_true",
                   help="rebuild README.md in --export-dir and its entries in MANIFEST.json from the exported files")
    a = p.parse_args(argv)
    if a.finalize_card:
        from specgen.modalities.text.training.code_card import finalize_card

        print(finalize_card(a.export_dir))
        return 0
    if a.tokenizer_only:
        _build_tokenizer(a.export_dir, a.max_files)
        return 0
    if a.role is None:
        p.error("--role is required")
    cfg = CodeModelConfig(a.role, a.run_dir or Path("runs") / a.role, a.steps or None, a.batch_size, a.seq_len, a.lr,
                          a.seed, a.threads, a.checkpoint_minutes, a.log_every, export_dir=a.export_dir,
                          eval_every=a.eval_every, max_files=a.max_files)
    summary = train_text_model(cfg, resume=not a.no_resume)
    print(json.dumps({k: summary[k] for k in ("role", "params", "steps", "tokens_seen", "final_train_loss",
                                              "final_val_loss", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
