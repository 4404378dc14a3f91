"""What every trainer shares: its common settings, the learning-rate schedule and step loop, the run folder
(checkpoint, metrics and records), atomic writes, fp16 export and file hashes.

A trainer's checkpoint holds at least `model`, `optimizer` and `state` (with `step` and `resumed_from`); its
`metrics.jsonl` has one JSON object per line with a `step`. Only the standard library is imported here: torch
and numpy load inside the helpers that use them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


# ---- settings ---------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class RunSettings:
    """The settings every trainer's config starts with: where it runs and exports, its seed and threads, and how
    often it checkpoints. A config redeclares a field to change its default."""

    run_dir: str = "runs"  # checkpoint, metrics and records
    out: str | None = None  # the export folder (None: no export)
    seed: int = 0
    threads: int = 1
    checkpoint_minutes: float = 10.0


@dataclass(kw_only=True)
class StepSettings(RunSettings):
    """The settings of a trainer whose loop is `run_steps`: its role, length, batch and schedule, and how often
    it logs and evaluates."""

    role: str
    steps: int
    batch_size: int
    lr: float  # the peak learning rate
    warmup: int = 50
    log_every: int = 10
    eval_every: int = 100

    def loop(self) -> LoopSettings:
        return LoopSettings(self.role, self.steps, self.lr, self.warmup, self.log_every, self.eval_every,
                            self.checkpoint_minutes)


def add_run_options(parser, run_dir_help: str, out_help: str) -> None:
    """The command-line options of `RunSettings`, and --eval-every."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--run-dir", type=Path, default=None, help=run_dir_help)
    parser.add_argument("--out", type=Path, default=None, help=out_help)
    parser.add_argument("--checkpoint-minutes", type=float, default=10.0)
    parser.add_argument("--eval-every", type=int, default=100)


def cosine_lr(step: int, steps: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then a cosine down to `floor * peak` at `steps`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def versions() -> dict:
    """The library versions a run record names."""
    import torch

    return {"torch": torch.__version__, "python": platform.python_version()}


# ---- files ------------------------------------------------------------------------------------------------------


def atomic_write(path: Path, write) -> None:
    """`write(tmp)` then rename over `path`: a kill mid-write leaves the previous file intact."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, record: dict) -> None:
    atomic_write(Path(path), lambda tmp: tmp.write_text(json.dumps(record, indent=1)))


def write_npy(path: Path, array) -> None:
    """One array, atomically (through a file object: np.save would append ".npy" to the temporary name)."""
    import numpy as np

    def write(tmp):
        with open(tmp, "wb") as f:
            np.save(f, array)

    atomic_write(Path(path), write)


def write_npz(path: Path, arrays: dict, compressed: bool = False) -> None:
    """Named arrays, atomically (through a file object: np.savez would append ".npz" to the temporary name)."""
    import numpy as np

    def write(tmp):
        with open(tmp, "wb") as f:
            (np.savez_compressed if compressed else np.savez)(f, **arrays)

    atomic_write(Path(path), write)


def export_fp16(model, folder: Path, add_files=None, **save_options) -> Path:
    """`model.save_pretrained` in fp16 into `folder`, replaced as a whole: written beside it (`add_files(tmp)` may
    add files), made readable by every user (safetensors writes 0600), then renamed over it."""
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    copy.deepcopy(model).half().save_pretrained(tmp, **save_options)
    if add_files is not None:
        add_files(tmp)
    for path in tmp.iterdir():
        path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, folder)
    return folder


# ---- the run folder ---------------------------------------------------------------------------------------------


def restore(checkpoint: dict, model, optimizer, metrics_path: Path) -> dict:
    """Load a checkpoint's weights and optimizer state, note the resume in its training state and drop the
    metrics logged after it (those steps are redone). Returns the training state."""
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    state = checkpoint["state"]
    state["resumed_from"].append(state["step"])
    if metrics_path.exists():
        kept = [line for line in metrics_path.read_text().splitlines() if json.loads(line)["step"] <= state["step"]]
        atomic_write(metrics_path, lambda tmp: tmp.write_text("".join(f"{line}\n" for line in kept)))
    return state


class RunFolder:
    """A trainer's run folder: `checkpoint.pt`, `metrics.jsonl`, `run.json` (settings and command) and
    `training.json` (the summary)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoint = self.path / "checkpoint.pt"
        self.metrics = self.path / "metrics.jsonl"

    def resume(self, model, optimizer, fresh: dict, *, check: Callable[[dict], None] | None = None,
               weights_only: bool = True, enabled: bool = True) -> tuple[dict, dict | None]:
        """(training state, checkpoint): the checkpoint's state restored into `model` and `optimizer` (and the
        torch RNG, when it was saved) after `check(checkpoint)` (which raises on settings that differ); without
        one (or `enabled` False), `fresh` and None, and the metrics of an earlier run are dropped."""
        import torch

        if enabled and self.checkpoint.exists():
            saved = torch.load(self.checkpoint, weights_only=weights_only)
            if check is not None:
                check(saved)
            state = restore(saved, model, optimizer, self.metrics)
            if "torch_rng" in saved:
                torch.set_rng_state(saved["torch_rng"])
            return state, saved
        if self.metrics.exists():
            self.metrics.unlink()
        return fresh, None

    def resume_with(self, model, optimizer, fresh: dict, settings: dict, fixed: tuple[str, ...]) -> dict:
        """`resume` of a checkpoint `save_with` wrote, refused (InvalidRequest) where it was made with other values
        of the `fixed` settings; returns the training state."""
        from specgen.errors import InvalidRequest

        def same_settings(saved: dict) -> None:
            differ = [k for k in fixed if saved["settings"].get(k) != settings.get(k)]
            if differ:
                raise InvalidRequest(f"{self.checkpoint} was made with other settings ({', '.join(differ)}); "
                                     "use another --out")

        return self.resume(model, optimizer, fresh, check=same_settings, weights_only=False)[0]

    def save_with(self, model, optimizer, state: dict, settings: dict) -> None:
        """The checkpoint `resume_with` reads: weights, optimizer, training state, settings and the torch RNG."""
        import torch

        self.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state,
                              "settings": settings, "torch_rng": torch.get_rng_state()})

    def save_checkpoint(self, blob: dict) -> None:
        import torch

        atomic_write(self.checkpoint, lambda tmp: torch.save(blob, tmp))

    def log(self, record: dict) -> None:
        with open(self.metrics, "a") as f:
            f.write(json.dumps(record) + "\n")

    def record(self, name: str, record: dict) -> None:
        """`run.json`, `training.json`: one JSON record, written atomically."""
        write_json(self.path / name, record)


# ---- the step loop ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopSettings:
    """How a trainer's step loop runs: its length and learning-rate schedule (linear warm-up, cosine to 10 %),
    and how often it logs, evaluates and checkpoints."""

    name: str  # names the run in the error for a non-finite loss
    steps: int
    peak_lr: float
    warmup: int
    log_every: int
    eval_every: int
    checkpoint_minutes: float


@dataclass(frozen=True)
class StepResult:
    loss: float
    lr: float
    grad_norm: float


def run_steps(loop: LoopSettings, state: dict, model, optimizer, loss_at: Callable[[int], object], *,
              log: Callable[[StepResult], None], evaluate: Callable[[StepResult], None],
              checkpoint: Callable[[], None], bar=None) -> None:
    """Optimizer steps state["step"] .. loop.steps - 1 on `loss_at(step)` (a pure function of the step, so a resumed
    run sees the batches an uninterrupted one would). `state` keeps the step, the last 50 losses
    (`recent_losses`) and the wall time across resumes; `log` and `evaluate` run after every log_every-th and
    eval_every-th step and after the last, `checkpoint` every checkpoint_minutes and after the last."""
    model.train()
    started = last_checkpoint = time.monotonic()
    elapsed0 = state["elapsed_s"]
    while state["step"] < loop.steps:
        step = state["step"]
        lr = cosine_lr(step, loop.steps, loop.peak_lr, loop.warmup)
        set_lr(optimizer, lr)
        loss = loss_at(step)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"{loop.name}: loss is {loss.item()} at step {step}")
        result = StepResult(loss.item(), lr, apply_gradients(loss, optimizer, model.parameters()))
        state["step"] = step + 1
        state["recent_losses"] = recent(state["recent_losses"], result.loss)
        now = time.monotonic()
        state["elapsed_s"] = elapsed0 + now - started
        if bar is not None:
            bar.update(1)
        if due(state["step"], loop.log_every, loop.steps):
            log(result)
        if due(state["step"], loop.eval_every, loop.steps):
            evaluate(result)
        if now - last_checkpoint >= loop.checkpoint_minutes * 60 or state["step"] == loop.steps:
            checkpoint()
            last_checkpoint = time.monotonic()


def apply_gradients(loss, optimizer, parameters, clip: float | None = 1.0) -> float | None:
    """Backpropagate `loss` and take one optimizer step, the gradient norm clipped to `clip` (None: unclipped).
    Returns the norm before clipping."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(parameters, clip).item() if clip is not None else None
    optimizer.step()
    return norm


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def recent(values: list, value, window: int = 50) -> list:
    """`values` with `value` appended, the last `window` kept: the losses behind a run's final train loss."""
    return (values + [value])[-window:]


def due(done: int, every: int, steps: int) -> bool:
    """Whether a periodic action (a metrics line, an evaluation) falls after step `done` of `steps`: every
    `every` steps and after the last."""
    return done % every == 0 or done == steps


def progress_bar(steps: int, done: int, desc: str):
    """A tqdm bar on stderr; redrawn every second on a terminal, every 30 s into a log file."""
    import sys

    from tqdm import tqdm

    return tqdm(total=steps, initial=done, desc=desc, file=sys.stderr, dynamic_ncols=True,
                mininterval=1 if sys.stderr.isatty() else 30)


# ---- model cards ------------------------------------------------------------------------------------------------


def write_readme(folder: Path, lines: list[str]) -> Path:
    """`folder`/README.md (a model card) from its lines, readable by every user."""
    path = Path(folder) / "README.md"
    path.write_text("\n".join(lines))
    path.chmod(0o644)
    return path


def flag_command(prefix: str, cfg, flags: dict[str, str]) -> str:
    """`prefix --out RUN_DIR` and the flag of every setting in `flags` whose value is not the config's default: the
    command that makes a trainer's run (recorded in its run folder and card)."""
    defaults = type(cfg)()
    parts = [prefix, f"--out {cfg.run_dir}"]
    parts += [f"{flag} {getattr(cfg, name)}" for name, flag in flags.items()
              if getattr(cfg, name) is not None and getattr(cfg, name) != getattr(defaults, name)]
    return " ".join(parts)


def card_command(write_card: Callable[[Path], Path], argv: list[str] | None, description: str) -> int:
    """`python -m <trainer> --card FOLDER`: rewrite a folder's model card with the trainer's `write_card`."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--card", type=Path, required=True)
    write_card(parser.parse_args(argv).card)
    return 0
