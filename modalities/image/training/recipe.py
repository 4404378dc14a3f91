"""Train the image tokenizer (role vq) and the image and video token models (roles target, draft, video), resumably.

    python -m specgen.modalities.image.training.recipe --role vq --run-dir /work/runs/image-vq --out assets/image/vq
    python -m specgen.modalities.image.training.recipe --role target --run-dir /work/runs/image-target \
        --out assets/image/target
    python -m specgen.modalities.image.training.recipe --role video --run-dir /work/runs/image-video \
        --out assets/image/video

A run folder holds `checkpoint.pt` (model, optimizer, step, RNG and role state), `metrics.jsonl` and, for the
token models, the token cache (`tokens.npz`, the training images encoded once with the shipped VQ). Batches are
a pure function of (seed, step), so rerunning the same command resumes from the last checkpoint onto exactly the
batches the run would have seen. A checkpoint is written every --checkpoint-minutes and at the end; rerunning
with --steps equal to the checkpoint's step only exports it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specgen.settings import use_threads
from specgen.errors import InvalidRequest
from specgen.modalities.image.training.images import GLYPH_STYLES
from specgen.modalities.training import (RunFolder, StepResult, StepSettings, add_run_options, progress_bar,
                                         run_steps, versions)

MODULE = "specgen.modalities.image.training.recipe"
ROLES = ("vq", "target", "draft", "video")
DEFAULTS = {  # role -> (steps, batch size, peak lr); the shipped recipe
    "vq": (800, 32, 1e-3),
    "target": (1800, 8, 1.5e-3),
    "draft": (1500, 16, 2e-3),
    "video": (600, 4, 1e-3),
}
DEFAULT_ITEMS = {"video": 4000}  # training items for the token models (images; clips for video), else 20000


@dataclass(kw_only=True)
class TrainConfig(StepSettings):
    run_dir: str = "runs/image"
    # vq: codes unused over this many steps are moved onto encoder outputs of the current batch
    reset_every: int = 100
    # target/draft
    num_images: int = 20000
    eval_images: int = 256
    cond_dropout: float = 0.1
    class_prompt: float = 0.1  # fraction of rows conditioned on the class alone ("K", "digit 3")
    vq_path: str | None = None
    init_from: str | None = None  # a token model whose weights the new one starts from (video: the image target)
    extra: dict = field(default_factory=dict)

    # Settings that change what a step computes; a checkpoint only resumes under the same ones.
    FIXED = ("role", "batch_size", "seed", "num_images", "cond_dropout", "class_prompt", "init_from", "extra")

    def command(self) -> str:
        parts = [f"python -m {MODULE}", f"--role {self.role}", f"--steps {self.steps}",
                 f"--batch-size {self.batch_size}", f"--lr {self.lr:g}", f"--seed {self.seed}",
                 f"--threads {self.threads}", f"--run-dir {self.run_dir}"]
        if self.role != "vq" and self.num_images != DEFAULT_ITEMS.get(self.role, 20000):
            parts.append(f"--num-images {self.num_images}")
        if self.eval_images != 256:
            parts.append(f"--eval-images {self.eval_images}")
        if self.vq_path:
            parts.append(f"--vq {self.vq_path}")
        if self.init_from:
            parts.append(f"--init-from {self.init_from}")
        if self.extra.get("glyph_style"):
            parts.append(f"--glyph-style {self.extra['glyph_style']}")
        if self.extra.get("vq_overrides"):
            parts.append(f"--vq-config '{json.dumps(self.extra['vq_overrides'], separators=(',', ':'))}'")
        if self.out:
            parts.append(f"--out {self.out}")
        return " ".join(parts)


def recipe(role: str, *, steps: int | None = None, batch_size: int | None = None, lr: float | None = None,
           num_images: int | None = None, init_from: str | None = None, **settings) -> TrainConfig:
    """The shipped recipe of `role`: the settings left out (or None) take the role's defaults; the run folder is
    runs/image-ROLE, and the video model starts from the shipped image target when it is there."""
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    default_steps, default_batch, default_lr = DEFAULTS[role]
    return TrainConfig(role=role, steps=default_steps if steps is None else steps,
                       batch_size=batch_size or default_batch, lr=lr or default_lr,
                       num_images=num_images or DEFAULT_ITEMS.get(role, 20000),
                       init_from=init_from or _default_init(role), **{"run_dir": f"runs/image-{role}", **settings})


def _default_init(role: str) -> str | None:
    """The video model starts from the shipped image target (it learns motion, not drawing), when it is there."""
    from specgen.modalities.image.models import default_paths

    target = default_paths()["target"]
    return str(target) if role == "video" and (target / "model.safetensors").exists() else None


def _task(cfg: TrainConfig):
    from specgen.modalities.image.training.token_models import LMTask
    from specgen.modalities.image.training.tokenizer import VQTask

    return VQTask(cfg) if cfg.role == "vq" else LMTask(cfg)


def _optimizer(cfg: TrainConfig, model):
    import torch

    if cfg.role == "vq":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.05)


def _refuse_other_settings(cfg: TrainConfig, checkpoint_path: Path):
    def check(saved: dict) -> None:
        if any(saved["config"][k] != getattr(cfg, k) for k in TrainConfig.FIXED):
            raise InvalidRequest(f"{checkpoint_path} was made with different settings ({', '.join(TrainConfig.FIXED)} "
                                 "must match); use another --run-dir or --no-resume to start over")

    return check


def train(cfg: TrainConfig, resume: bool = True) -> dict:
    """Run `cfg` to cfg.steps optimizer steps in cfg.run_dir (resuming its checkpoint), export to cfg.out if set,
    and return the training summary (also written to run_dir/training.json)."""
    import torch

    if cfg.role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}, not {cfg.role!r}")
    if cfg.steps < 0 or cfg.batch_size < 1 or cfg.lr <= 0 or cfg.threads < 1:
        raise InvalidRequest("steps must be >= 0 and batch size, lr and threads positive")
    if cfg.extra.get("glyph_style") and cfg.role == "vq":
        raise InvalidRequest("--glyph-style applies to the token models' data, not to the VQ's")
    run = RunFolder(cfg.run_dir)
    use_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    task = _task(cfg)
    opt = _optimizer(cfg, task.model)
    fresh = {"step": 0, "elapsed_s": 0.0, "recent_losses": [], "eval": {}, "resumed_from": []}
    state, saved = run.resume(task.model, opt, fresh, check=_refuse_other_settings(cfg, run.checkpoint),
                              weights_only=False, enabled=resume)
    if saved is not None:
        task.load_state(saved["task"])
    run.record("run.json", {**asdict(cfg), "command": cfg.command()})
    _train_steps(cfg, run, task, opt, state)
    if not state["eval"]:  # an export-only rerun of a checkpoint saved between evaluations
        state["eval"] = task.evaluate()
    summary = _summary(cfg, task, state)
    run.record("training.json", summary)
    if cfg.out:
        out = Path(cfg.out)
        task.export(out)
        (out / "training.json").write_text(json.dumps(summary, indent=1))
        (out / "training.json").chmod(0o644)
    return summary


def _train_steps(cfg: TrainConfig, run: RunFolder, task, opt, state: dict) -> None:
    """Steps from state["step"] to cfg.steps (state updated in place); the VQ's dead-code resets go into the
    metrics."""
    import torch

    bar = progress_bar(cfg.steps, min(state["step"], cfg.steps), f"train image {cfg.role}")

    def log(result: StepResult) -> None:
        bar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{result.lr:.2e}", refresh=False)
        run.log({"step": state["step"], "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
                 "elapsed_s": round(state["elapsed_s"], 2), **getattr(task, "state_update", {})})

    def evaluate(result: StepResult) -> None:
        state["eval"] = task.evaluate()
        run.log({"step": state["step"], **state["eval"]})
        shown = "  ".join(f"{k} {v}" for k, v in state["eval"].items())
        bar.write(f"{cfg.role} step {state['step']}: train {result.loss:.4f}  {shown}", file=sys.stderr)

    def checkpoint() -> None:
        run.save_checkpoint({"model": task.model.state_dict(), "optimizer": opt.state_dict(),
                             "torch_rng": torch.get_rng_state(), "config": asdict(cfg), "state": state,
                             "task": task.state()})

    run_steps(cfg.loop(), state, task.model, opt, lambda step: task.loss(task.batch(step), step), log=log,
              evaluate=evaluate, checkpoint=checkpoint, bar=bar)
    bar.close()


def _summary(cfg: TrainConfig, task, state: dict) -> dict:
    model = task.model
    losses = state["recent_losses"]
    return {
        "role": cfg.role, "params": sum(p.numel() for p in model.parameters()), "command": cfg.command(),
        "seed": cfg.seed, "steps": state["step"], "batch_size": cfg.batch_size, "lr": cfg.lr, "warmup": cfg.warmup,
        "schedule": "linear warmup, cosine to 10 %",
        "final_train_loss": sum(losses) / len(losses) if losses else None,
        "final_train_loss_steps": len(losses), "eval": state["eval"],
        "wall_s": round(state["elapsed_s"], 1), "resumed_from_steps": state["resumed_from"],
        "threads": cfg.threads, "versions": versions(),
        **({} if cfg.role == "vq" else {"glyph_style": cfg.extra.get("glyph_style", "varied"),
                                        "vq_sha256": task.vq_sha256}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=ROLES)
    p.add_argument("--card", type=Path, default=None, metavar="FOLDER",
                   help="measure FOLDER/vq and write the model card figures into FOLDER (e.g. assets/image)")
    p.add_argument("--steps", type=int, default=None, help="default: vq 800, target 1800, draft 1500, video 600")
    p.add_argument("--batch-size", type=int, default=None, help="default: vq 32, target 8, draft 16, video 4")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: vq 1e-3, target 1.5e-3, "
                                                          "draft 2e-3)")
    add_run_options(p, "checkpoints and logs (default: runs/image-ROLE)", "export the finished model into this folder")
    p.add_argument("--num-images", type=int, default=None,
                   help="token models: training items (default: 20000 images; video 4000 clips)")
    p.add_argument("--eval-images", type=int, default=256, help="held-out images for the eval loss / PSNR")
    p.add_argument("--vq", type=Path, default=None, help="target/draft: the VQ folder (default: assets/image/vq)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from this token model's weights (video default: assets/image/target when present)")
    p.add_argument("--no-resume", action="store_true", help="start over even if the run folder has a checkpoint")
    p.add_argument("--vq-config", type=json.loads, default=None, metavar="JSON",
                   help="vq: architecture settings over the shipped ones (diffusers VQModel arguments), e.g. "
                        "'{\"num_vq_embeddings\": 1024, \"vq_embed_dim\": 16, \"latent_channels\": 16}' (pilots)")
    p.add_argument("--glyph-style", choices=tuple(GLYPH_STYLES), default="varied",
                   help="token models: the fonts and sizes of the glyph items (see images.GLYPH_STYLES)")
    a = p.parse_args(argv)
    if a.card:
        from specgen.modalities.image.training.card import card_figures

        use_threads(a.threads)
        print(json.dumps(card_figures(a.card, seed=a.seed)))
        return 0
    if a.role is None:
        p.error("--role is required")
    cfg = recipe(a.role, steps=a.steps, batch_size=a.batch_size, lr=a.lr, num_images=a.num_images,
                 init_from=str(a.init_from) if a.init_from else None, seed=a.seed, threads=a.threads,
                 **({"run_dir": str(a.run_dir)} if a.run_dir else {}), out=str(a.out) if a.out else None,
                 checkpoint_minutes=a.checkpoint_minutes, eval_every=a.eval_every, eval_images=a.eval_images,
                 vq_path=str(a.vq) if a.vq else None,
                 extra={**({"vq_overrides": a.vq_config} if a.vq_config else {}),
                        **({"glyph_style": a.glyph_style} if a.glyph_style != "varied" else {})})
    summary = train(cfg, resume=not a.no_resume)
    print(json.dumps({k: summary[k] for k in ("role", "params", "steps", "final_train_loss", "eval", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
