"""Train the EAGLE-style head (the drafter of LANTERN and LANTERN++) on the image target's own samples, resumably.

    specgen train image-head --out runs/image-head     # the shipped recipe; exports into runs/image-head/export

Loss per code position (EAGLE-1): SmoothL1 between predicted and target features + 0.1 × cross-entropy of the
draft's law (the target's lm_head over the predicted feature) against the target's law. Input features get
uniform noise (±noise) so the head tolerates its own errors when it feeds on them deeper in a tree. The last
chunk of samples is held out: the run reports the teacher-forced acceptance rate sum_x min(target, draft) there,
before and after. Batches are a pure function of (seed, step); a checkpoint is written every
--checkpoint-minutes, and rerunning the command resumes from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.settings import use_threads
from specgen.modalities.training import RunFolder, RunSettings, apply_gradients, cosine_lr, progress_bar, set_lr


@dataclass(kw_only=True)
class HeadConfig(RunSettings):
    run_dir: str = "runs/image-head"
    target: str | None = None
    chunks: int = 32  # of chunk_size target samples; the last is held out
    chunk_size: int = 64
    steps: int = 3000
    batch_size: int = 16  # sequences per step (their unconditioned twins come along)
    lr: float = 2e-3
    warmup: int = 50
    feature_weight: float = 1.0
    law_weight: float = 0.1
    noise: float = 0.1
    intermediate_size: int = 768  # 192 underfit the bold-glyph target (held-out acceptance 0.67 vs 0.73 at 768)
    checkpoint_minutes: float = 5.0
    eval_every: int = 200


class HeadTask:
    """Target, head and the sample chunks in memory (features fp16)."""

    def __init__(self, cfg: HeadConfig):
        from specgen.modalities.image.training.head_samples import make_chunks
        from specgen.modalities.image.eagle_head.head import EagleHead
        from specgen.modalities.image.models import default_guidance, default_paths, load_image_lm, load_image_vocab

        self.cfg = cfg
        path = Path(cfg.target or default_paths()["target"])
        self.target, self.vocab = load_image_lm(path), load_image_vocab(path)
        for p in self.target.parameters():
            p.requires_grad_(False)
        torch.manual_seed(cfg.seed)
        self.head = EagleHead.for_target(self.target, intermediate_size=cfg.intermediate_size)
        blobs = [torch.load(p) for p in make_chunks(self.target, self.vocab, Path(cfg.run_dir) / "samples",
                                                        cfg.chunks, cfg.seed, size=cfg.chunk_size,
                                                        guidance=default_guidance(path))]
        self.ids = torch.cat([b["ids"] for b in blobs[:-1]]).long()  # [N, T]
        self.features = torch.cat([b["features"] for b in blobs[:-1]])  # [N, T, d] fp16
        self.eval_ids, self.eval_features = blobs[-1]["ids"].long(), blobs[-1]["features"]
        self.first_code = self.vocab.prompt_length  # slot predicting the first code: the BOI token's

    def loss(self, ids, features, noise: float = 0.0, generator=None):
        """Mean losses over code-predicting slots. ids, features: [B, T(, d)]."""
        embed = self.target.model.embed_tokens(ids[:, 1:])  # token t, t = 1..T-1
        inputs = features[:, :-1].float()  # feature at t - 1
        if noise:
            inputs = inputs + (torch.rand(inputs.shape, generator=generator) * 2 - 1) * noise
        positions = torch.arange(1, ids.shape[1]).expand(ids.shape[0], -1)
        predicted = self.head(embed, inputs, positions)  # [B, T-1, d]: feature at t
        start = self.first_code - 1  # predicted feature at the BOI token's slot gives the first code's law
        predicted, wanted = predicted[:, start:-1], features[:, 1 + start:-1].float()
        feature_loss = F.smooth_l1_loss(predicted, wanted)
        codes = self.vocab.num_codes
        target_law = F.softmax(self.target.lm_head(wanted)[..., :codes], -1)
        draft_log = F.log_softmax(self.target.lm_head(predicted)[..., :codes], -1)
        law_loss = -(target_law * draft_log).sum(-1).mean()
        acceptance = torch.minimum(target_law, draft_log.exp()).sum(-1).mean()
        return feature_loss, law_loss, acceptance

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.head.eval()
        feature, law, acceptance = self.loss(self.eval_ids, self.eval_features)
        half = len(self.eval_ids) // 2
        _, _, cond_acceptance = self.loss(self.eval_ids[:half], self.eval_features[:half])
        self.head.train()
        return {"feature_loss": float(feature), "law_loss": float(law), "acceptance": float(acceptance),
                "acceptance_cond": float(cond_acceptance)}


def train_head(cfg: HeadConfig) -> dict:
    """Train (or resume) the head `cfg` describes, export it to cfg.out if set, and return the summary (also
    run_dir/training.json): the held-out acceptance before and after."""
    use_threads(cfg.threads)
    run = RunFolder(cfg.run_dir)
    task = HeadTask(cfg)
    optimizer = torch.optim.AdamW(task.head.parameters(), lr=cfg.lr, weight_decay=0.0)
    if run.checkpoint.exists():
        state, _ = run.resume(task.head, optimizer, {}, weights_only=False)
    else:
        state = {"step": 0, "resumed_from": [], "before": task.evaluate()}
    run.record("run.json", asdict(cfg))

    def checkpoint():
        run.save_checkpoint({"model": task.head.state_dict(), "optimizer": optimizer.state_dict(), "state": state})

    _train_steps(cfg, run, task, optimizer, state, checkpoint)
    checkpoint()
    summary = {"before": state["before"], "after": task.evaluate(), "steps": cfg.steps,
               "samples": len(task.ids) // 2, "resumed_from": state["resumed_from"], "config": asdict(cfg),
               "command": command_line(cfg)}
    run.record("training.json", summary)
    if cfg.out:
        from specgen.modalities.image.eagle_head.head import HEAD_FILE

        task.head.save(Path(cfg.out), add_files=lambda tmp: (tmp / HEAD_FILE).write_text(json.dumps(summary, indent=1)))
    return summary


def _train_steps(cfg: HeadConfig, run: RunFolder, task: HeadTask, optimizer, state: dict, checkpoint) -> None:
    """Steps from state["step"] to cfg.steps: a metrics line each (with the held-out figures every eval_every
    steps and after the last), a checkpoint every checkpoint_minutes. Rows and input noise are drawn from a
    generator seeded by (seed, step)."""
    last_save = time.monotonic()
    bar = progress_bar(cfg.steps, state["step"], "train image head")
    while state["step"] < cfg.steps:
        step = state["step"]
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rows = torch.randint(len(task.ids), (cfg.batch_size * 2,), generator=generator)
        set_lr(optimizer, cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup, floor=0.0))
        feature, law, acceptance = task.loss(task.ids[rows], task.features[rows], cfg.noise, generator)
        loss = cfg.feature_weight * feature + cfg.law_weight * law
        apply_gradients(loss, optimizer, task.head.parameters())
        state["step"] = step + 1
        record = {"step": step + 1, **{name: float(value.detach()) for name, value in
                                       (("loss", loss), ("feature_loss", feature), ("law_loss", law),
                                        ("acceptance", acceptance))}}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            record["eval"] = task.evaluate()
        run.log(record)
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}", acc=f"{float(acceptance):.3f}")
        if time.monotonic() - last_save > cfg.checkpoint_minutes * 60:
            checkpoint()
            last_save = time.monotonic()
    bar.close()


def command_line(cfg: HeadConfig) -> str:
    defaults = HeadConfig()
    parts = ["specgen train image-head"]
    for key, value in asdict(cfg).items():
        if value != getattr(defaults, key) or key in ("run_dir", "out"):
            if value is not None:
                parts.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = HeadConfig()
    for key, value in asdict(defaults).items():
        kind = type(value) if value is not None else str
        parser.add_argument(f"--{key.replace('_', '-')}", type=kind, default=value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specgen train image-head", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    summary = train_head(HeadConfig(**{k: v for k, v in vars(args).items()}))
    print(json.dumps({"before": summary["before"], "after": summary["after"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
