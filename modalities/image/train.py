"""Train the image tokenizer (role vq) and the image and video token models (roles target, draft, video), resumably.

    python -m specgen.modalities.image.train --role vq --run-dir /work/runs/image-vq --out assets/image/vq
    python -m specgen.modalities.image.train --role target --run-dir /work/runs/image-target --out assets/image/target
    python -m specgen.modalities.image.train --role video --run-dir /work/runs/image-video --out assets/image/video

A run folder holds `checkpoint.pt` (model, optimizer, step, RNG and role state), `metrics.jsonl` and, for the
token models, the token cache (`tokens.npz`, the training images encoded once with the shipped VQ). Batches are
a pure function of (seed, step), so rerunning the same command resumes from the last checkpoint onto exactly the
batches the run would have seen. A checkpoint is written every --checkpoint-minutes and at the end; rerunning
with --steps equal to the checkpoint's step only exports it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specgen.settings import use_threads
from specgen.errors import InvalidRequest
from specgen.modalities.checkpoints import atomic_write as _atomic_write
from specgen.modalities.checkpoints import export_fp16, restore

ROLES = ("vq", "target", "draft", "video")
DEFAULTS = {  # role -> (steps, batch size, peak lr); the shipped recipe
    "vq": (800, 32, 1e-3),
    "target": (1800, 8, 1.5e-3),
    "draft": (1500, 16, 2e-3),
    "video": (600, 4, 1e-3),
}
DEFAULT_ITEMS = {"video": 4000}  # training items for the token models (images; clips for video), else 20000
LOSS_WINDOW = 50  # the reported final train loss is the mean over this many last steps


@dataclass
class TrainConfig:
    role: str
    steps: int
    batch_size: int
    lr: float
    seed: int = 0
    threads: int = 1
    run_dir: str = "runs/image"
    out: str | None = None
    checkpoint_minutes: float = 10.0
    eval_every: int = 100
    log_every: int = 10
    warmup: int = 50
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
    FIXED = ("role", "batch_size", "seed", "num_images", "cond_dropout", "class_prompt", "init_from")

    def command(self) -> str:
        parts = ["python -m specgen.modalities.image.train", f"--role {self.role}", f"--steps {self.steps}",
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
        if self.out:
            parts.append(f"--out {self.out}")
        return " ".join(parts)


def _lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))  # cosine down to 10 %


# ----------------------------------------------------------------------------------------------------- vq role


class VQTask:
    """Reconstruction (L1 + MSE in [-1, 1]) plus the VQ commitment/codebook loss, with dead-code resets."""

    def __init__(self, cfg: TrainConfig):
        from specgen.modalities.image import data
        from specgen.modalities.image.vq import build_vq

        self.cfg = cfg
        self.model = build_vq(**cfg.extra.get("vq_overrides", {}))
        self.num_codes = self.model.config.num_vq_embeddings
        self.usage = [0] * self.num_codes  # code counts since the last reset check
        self.eval_sets = {s: data.source_items(s, cfg.eval_images // 3 or 1, seed=cfg.seed) for s in data.SOURCES}

    def batch(self, step: int):
        from specgen.modalities.image import data
        from specgen.modalities.image.vq import to_tensor

        b = self.cfg.batch_size
        return to_tensor(data.make_dataset(b, seed=self.cfg.seed, start=step * b).images)

    def loss(self, x, step: int):
        import torch
        import torch.nn.functional as F

        vq = self.model
        h = vq.encode(x).latents
        if step == 0:  # start the codebook on encoder outputs: the default tiny init leaves most codes unused
            self._reset_dead_codes(h.detach(), step, codes=list(range(self.num_codes)))
        quant, commit, (_, _, idx) = vq.quantize(h)
        recon = vq.decode(quant, force_not_quantize=True).sample
        counts = torch.bincount(idx.reshape(-1), minlength=self.num_codes).tolist()
        self.usage = [u + c for u, c in zip(self.usage, counts)]
        if self.cfg.reset_every and (step + 1) % self.cfg.reset_every == 0:
            self._reset_dead_codes(h.detach(), step)
        return F.l1_loss(recon, x) + F.mse_loss(recon, x) + commit.mean()

    def _reset_dead_codes(self, h, step: int, codes: list[int] | None = None) -> None:
        """Codes unused since the last check restart on random encoder outputs, so the codebook stays in use."""
        import torch

        dead = [k for k, u in enumerate(self.usage) if u == 0] if codes is None else codes
        if codes is None:
            self.state_update = {"dead_codes_reset": len(dead)}
        if dead:
            flat = h.permute(0, 2, 3, 1).reshape(-1, h.shape[1])
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
            pick = torch.randint(0, len(flat), (len(dead),), generator=g)
            with torch.no_grad():
                self.model.quantize.embedding.weight[dead] = flat[pick]
        self.usage = [0] * self.num_codes

    def evaluate(self) -> dict:
        import numpy as np
        from specgen.modalities.image.vq import encode, psnr, reconstruct

        self.model.eval()
        out, used = {}, set()
        for source, items in self.eval_sets.items():
            out[f"psnr_{source}"] = round(psnr(reconstruct(self.model, items.images), items.images), 3)
            used |= set(np.unique(encode(self.model, items.images).numpy()).tolist())
        self.model.train()
        out["eval_codes_used"] = len(used)
        out["eval_psnr"] = round(float(np.mean([out[f"psnr_{s}"] for s in self.eval_sets])), 3)
        return out

    def state(self) -> dict:
        return {"usage": self.usage}

    def load_state(self, state: dict) -> None:
        self.usage = list(state["usage"])

    def export(self, out: Path) -> None:
        from specgen.modalities.image.vq import save_vq

        save_vq(self.model, out)

# ------------------------------------------------------------------------------------------ target/draft roles


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _items(kind: str, n: int, seed: int, split: str, start: int):
    """(frames uint8 [n * frames, 64, 64, 3], prompts, classes) of images or clips start .. start+n-1."""
    from specgen.modalities.image import data, video_data

    if kind == "video":
        clips = video_data.make_clips(n, seed=seed, split=split, start=start)
        return clips.clips.reshape(-1, *clips.clips.shape[2:]), clips.prompts, clips.classes
    items = data.make_dataset(n, seed=seed, split=split, start=start)
    return items.images, items.prompts, items.classes


def token_cache(run_dir: Path, vq_path: Path, num_images: int, eval_images: int, seed: int,
                kind: str = "image") -> dict:
    """Training and held-out images (or clips, kind "video") encoded once with the VQ at vq_path, cached in
    run_dir/tokens.npz (rebuilt when the VQ weights, the counts, the kind or the seed change)."""
    import numpy as np
    from specgen.modalities.image.vq import encode, load_vq
    from tqdm import tqdm

    weights = vq_path / "diffusion_pytorch_model.safetensors"
    vq = load_vq(vq_path)
    key = {"vq_sha256": _sha256(weights), "num_images": num_images, "eval_images": eval_images, "seed": seed}
    if kind != "image":
        key["kind"] = kind
    path, meta = run_dir / "tokens.npz", run_dir / "tokens.json"
    if path.exists() and meta.exists() and json.loads(meta.read_text()) == key:
        blob = np.load(path)
        return {k: blob[k] for k in blob.files} | {"vq": vq}
    out = {}
    chunk = 1000 if kind == "image" else 125
    for split, n in (("train", num_images), ("val", eval_images)):
        codes, prompts, classes = [], [], []
        for start in tqdm(range(0, n, chunk), desc=f"encode {split} {kind}", file=sys.stderr, leave=False):
            frames, chunk_prompts, chunk_classes = _items(kind, min(chunk, n - start), seed, split, start)
            codes.append(encode(vq, frames).reshape(len(chunk_prompts), -1).numpy().astype(np.uint16))
            prompts += chunk_prompts
            classes += chunk_classes
        out[f"{split}_codes"] = np.concatenate(codes)
        out[f"{split}_prompts"] = np.array(prompts)
        out[f"{split}_classes"] = np.array(classes)
    def write(p):
        with open(p, "wb") as f:  # a file object, because np.savez would append ".npz" to the tmp name
            np.savez(f, **out)

    _atomic_write(path, write)
    _atomic_write(meta, lambda p: p.write_text(json.dumps(key)))
    return out | {"vq": vq}


def start_from(model, path: Path) -> None:
    """Copy the weights of the token model at `path` into `model` (same layer shapes): the vocabulary of `model`
    may extend it (ids kept, new words appended), whose new embedding and head rows keep their fresh init."""
    import torch
    from specgen.modalities.image.models import load_image_lm

    source = load_image_lm(path).float().state_dict()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            old = source.get(name)
            if old is None or old.shape[1:] != tensor.shape[1:] or old.shape[0] > tensor.shape[0]:
                raise InvalidRequest(f"cannot start from {str(path)!r}: its {name} has shape "
                                     f"{tuple(old.shape) if old is not None else None}, this model's {tuple(tensor.shape)}")
            tensor[:old.shape[0]] = old


class LMTask:
    """Next-token loss on the 256 image codes of [BOS, condition, BOI, codes]; the condition is the full prompt,
    or (class_prompt of rows) the class alone, or (cond_dropout of rows) all NULL so guidance has an
    unconditional model to contrast with."""

    def __init__(self, cfg: TrainConfig):

        from specgen.modalities.image.conditions import default_vocab, video_vocab
        from specgen.modalities.image.models import build_image_lm, default_paths

        self.cfg = cfg
        vq_path = Path(cfg.vq_path) if cfg.vq_path else default_paths()["vq"]
        if not (vq_path / "config.json").exists():
            from specgen.errors import ModelNotFound

            raise ModelNotFound(f"the {cfg.role} trains on codes of the VQ in {str(vq_path)!r}, which is missing; "
                                "train it first (--role vq --out that folder) or pass --vq")
        kind = "video" if cfg.role == "video" else "image"
        self.tokens = token_cache(Path(cfg.run_dir), vq_path, cfg.num_images, cfg.eval_images, cfg.seed, kind)
        make_vocab = video_vocab if kind == "video" else default_vocab
        self.vocab = make_vocab(num_codes=self.tokens["vq"].config.num_vq_embeddings)
        self.model = build_image_lm(cfg.role, self.vocab)
        if cfg.init_from:
            start_from(self.model, Path(cfg.init_from))
        # Condition ids per distinct prompt and class string, computed once.
        self._cond = {s: self.vocab.prompt_ids(s).tolist() for s in set(self.tokens["train_prompts"].tolist())
                      | set(self.tokens["train_classes"].tolist()) | set(self.tokens["val_prompts"].tolist())}
        self.eval_batch = self._sequences(self.tokens["val_codes"], self.tokens["val_prompts"].tolist())

    def _sequences(self, codes, conditions: list):
        """int64 [B, prompt_length + 256]; a condition of None means the unconditional prefix."""
        import numpy as np
        import torch

        v = self.vocab
        prefix = [v.uncond_ids().tolist() if c is None else self._cond[c] for c in conditions]
        return torch.from_numpy(np.concatenate([np.array(prefix, np.int64), codes.astype(np.int64)], axis=1))

    def batch(self, step: int):
        import numpy as np

        cfg = self.cfg
        rng = np.random.default_rng((cfg.seed, step))
        idx = rng.integers(0, len(self.tokens["train_codes"]), size=cfg.batch_size)
        r = rng.random(cfg.batch_size)
        conds = [None if u < cfg.cond_dropout else
                 str(self.tokens["train_classes"][i]) if u < cfg.cond_dropout + cfg.class_prompt else
                 str(self.tokens["train_prompts"][i]) for i, u in zip(idx, r)]
        return self._sequences(self.tokens["train_codes"][idx], conds)

    def loss(self, ids, step: int = 0):
        import torch.nn.functional as F

        start = self.vocab.prompt_length  # first image code position
        logits = self.model(input_ids=ids[:, :-1]).logits[:, start - 1:]
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, start:].reshape(-1))

    def evaluate(self) -> dict:
        import torch

        self.model.eval()
        with torch.no_grad():
            b = self.cfg.batch_size
            total = sum(self.loss(self.eval_batch[i:i + b]).item() * len(self.eval_batch[i:i + b])
                        for i in range(0, len(self.eval_batch), b))
        self.model.train()
        return {"eval_loss": round(total / len(self.eval_batch), 4)}

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def export(self, out: Path) -> None:
        export_fp16(self.model, out, lambda tmp: self.vocab.save(tmp / "vocab.json"))


# ------------------------------------------------------------------------------------------- the training loop


def _make_task(cfg: TrainConfig):
    return VQTask(cfg) if cfg.role == "vq" else LMTask(cfg)


def train(cfg: TrainConfig, resume: bool = True) -> dict:
    """Run `cfg` to cfg.steps optimizer steps in cfg.run_dir (resuming its checkpoint), export to cfg.out if set,
    and return the training summary (also written to run_dir/training.json)."""
    import platform

    import torch
    from tqdm import tqdm

    if cfg.role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}, not {cfg.role!r}")
    if cfg.steps < 0 or cfg.batch_size < 1 or cfg.lr <= 0 or cfg.threads < 1:
        raise InvalidRequest("steps must be >= 0 and batch size, lr and threads positive")
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    use_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    task = _make_task(cfg)
    model = task.model
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr) if cfg.role == "vq" else torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.05)

    ckpt_path, metrics_path = run_dir / "checkpoint.pt", run_dir / "metrics.jsonl"
    state = {"step": 0, "elapsed_s": 0.0, "recent_losses": [], "eval": {}, "resumed_from": []}
    if resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        saved = ckpt["config"]
        if any(saved[k] != getattr(cfg, k) for k in TrainConfig.FIXED):
            raise InvalidRequest(f"{ckpt_path} was made with different settings ({', '.join(TrainConfig.FIXED)} "
                                 "must match); use another --run-dir or --no-resume to start over")
        state = restore(ckpt, model, opt, metrics_path)
        torch.set_rng_state(ckpt["torch_rng"])
        task.load_state(ckpt["task"])
    elif metrics_path.exists():
        metrics_path.unlink()
    _atomic_write(run_dir / "run.json", lambda p: p.write_text(json.dumps({**asdict(cfg), "command": cfg.command()},
                                                                           indent=1)))

    def checkpoint():
        blob = {"model": model.state_dict(), "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(),
                "config": asdict(cfg), "state": state, "task": task.state()}
        _atomic_write(ckpt_path, lambda p: torch.save(blob, p))

    def log(record):
        with open(metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    model.train()
    started = last_ckpt = time.monotonic()
    elapsed0 = state["elapsed_s"]
    bar = tqdm(total=cfg.steps, initial=min(state["step"], cfg.steps), desc=f"train image {cfg.role}",
               file=sys.stderr, dynamic_ncols=True, mininterval=1 if sys.stderr.isatty() else 30)
    while state["step"] < cfg.steps:
        step = state["step"]
        lr = _lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = task.loss(task.batch(step), step)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"{cfg.role}: loss is {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        state["step"] = step + 1
        state["recent_losses"] = (state["recent_losses"] + [loss.item()])[-LOSS_WINDOW:]
        now = time.monotonic()
        state["elapsed_s"] = elapsed0 + now - started
        bar.update(1)
        if state["step"] % cfg.log_every == 0 or state["step"] == cfg.steps:
            bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}", refresh=False)
            log({"step": state["step"], "loss": loss.item(), "lr": lr, "grad_norm": grad_norm,
                 "elapsed_s": round(state["elapsed_s"], 2), **getattr(task, "state_update", {})})
        if state["step"] % cfg.eval_every == 0 or state["step"] == cfg.steps:
            state["eval"] = task.evaluate()
            log({"step": state["step"], **state["eval"]})
            shown = "  ".join(f"{k} {v}" for k, v in state["eval"].items())
            bar.write(f"{cfg.role} step {state['step']}: train {loss.item():.4f}  {shown}", file=sys.stderr)
        if now - last_ckpt >= cfg.checkpoint_minutes * 60 or state["step"] == cfg.steps:
            checkpoint()
            last_ckpt = time.monotonic()
    bar.close()
    if not state["eval"]:  # an export-only rerun of a checkpoint saved between evaluations
        state["eval"] = task.evaluate()

    summary = {
        "role": cfg.role, "params": sum(p.numel() for p in model.parameters()), "command": cfg.command(),
        "seed": cfg.seed, "steps": state["step"], "batch_size": cfg.batch_size, "lr": cfg.lr, "warmup": cfg.warmup,
        "schedule": "linear warmup, cosine to 10 %",
        "final_train_loss": (sum(state["recent_losses"]) / len(state["recent_losses"])
                             if state["recent_losses"] else None),
        "final_train_loss_steps": len(state["recent_losses"]), "eval": state["eval"],
        "wall_s": round(state["elapsed_s"], 1), "resumed_from_steps": state["resumed_from"],
        "threads": cfg.threads, "versions": {"torch": torch.__version__, "python": platform.python_version()},
    }
    _atomic_write(run_dir / "training.json", lambda p: p.write_text(json.dumps(summary, indent=1)))
    if cfg.out:
        out = Path(cfg.out)
        task.export(out)
        (out / "training.json").write_text(json.dumps(summary, indent=1))
        (out / "training.json").chmod(0o644)
    return summary


# ------------------------------------------------------------------------------------------ model card figures


def _grid_png(rows: list, path: Path, scale: int = 2) -> None:
    """Rows of uint8 [N, 64, 64, 3] images as one PNG with 2 px gutters."""
    import numpy as np
    from PIL import Image

    gap = 2
    cols = max(len(r) for r in rows)
    h = len(rows) * (64 + gap) + gap
    w = cols * (64 + gap) + gap
    canvas = np.full((h, w, 3), 255, np.uint8)
    for i, row in enumerate(rows):
        for j, img in enumerate(row):
            y, x = gap + i * (64 + gap), gap + j * (64 + gap)
            canvas[y:y + 64, x:x + 64] = img
    Image.fromarray(canvas).resize((w * scale, h * scale), Image.NEAREST).save(path)
    path.chmod(0o644)


def card_figures(folder: Path, per_source: int = 64, sample_prompts: tuple[str, ...] | None = None,
                 seed: int = 0) -> dict:
    """Measure the VQ in folder/vq on held-out items (PSNR per source, codebook usage), write
    reconstructions.png, and, when folder/target exists, samples.png from plain guided ancestral sampling."""
    import numpy as np
    import torch
    from specgen.modalities.image import data
    from specgen.modalities.image.models import (
        load_image_lm,
        load_image_vocab,
        sample_codes,
    )
    from specgen.modalities.image.vq import decode, encode, load_vq, psnr

    folder = Path(folder)
    vq = load_vq(folder / "vq")
    report, used, rows = {}, set(), []
    for source in data.SOURCES:
        items = data.source_items(source, per_source, seed=seed, split="val")
        codes = encode(vq, items.images)
        recon = decode(vq, codes)
        used |= set(np.unique(codes.numpy()).tolist())
        report[f"psnr_{source}"] = round(psnr(recon, items.images), 2)
        rows += [items.images[:8], recon[:8]]
    report["codes_used"] = len(used)
    report["codes_used_of"] = vq.config.num_vq_embeddings
    report["held_out_items"] = per_source * len(data.SOURCES)
    _grid_png(rows, folder / "reconstructions.png")
    if (folder / "target" / "model.safetensors").exists():
        from specgen.modalities.image.conditions import EXAMPLE_PROMPTS

        prompts = list(sample_prompts or EXAMPLE_PROMPTS)
        model, vocab = load_image_lm(folder / "target"), load_image_vocab(folder / "target")
        g = torch.Generator().manual_seed(seed)
        images = [decode(vq, sample_codes(model, vocab, prompts, temperature=1.0, top_k=100, guidance=3.0,
                                          generator=g)) for _ in range(4)]
        _grid_png([np.stack([im[k] for im in images]) for k in range(len(prompts))], folder / "samples.png")
        report["sample_prompts"] = prompts
    return report


def _default_init(role: str) -> str | None:
    """The video model starts from the shipped image target (it learns motion, not drawing), when it is there."""
    from specgen.modalities.image.models import default_paths

    target = default_paths()["target"]
    return str(target) if role == "video" and (target / "model.safetensors").exists() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specgen.modalities.image.train", description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=ROLES)
    p.add_argument("--card", type=Path, default=None, metavar="FOLDER",
                   help="measure FOLDER/vq and write the model card figures into FOLDER (e.g. assets/image)")
    p.add_argument("--steps", type=int, default=None, help="default: vq 800, target 1800, draft 1500, video 600")
    p.add_argument("--batch-size", type=int, default=None, help="default: vq 32, target 8, draft 16, video 4")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: vq 1e-3, target 1.5e-3, "
                                                          "draft 2e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--run-dir", type=Path, default=None, help="checkpoints and logs (default: runs/image-ROLE)")
    p.add_argument("--out", type=Path, default=None, help="export the finished model into this folder")
    p.add_argument("--checkpoint-minutes", type=float, default=10.0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--num-images", type=int, default=None,
                   help="token models: training items (default: 20000 images; video 4000 clips)")
    p.add_argument("--eval-images", type=int, default=256, help="held-out images for the eval loss / PSNR")
    p.add_argument("--vq", type=Path, default=None, help="target/draft: the VQ folder (default: assets/image/vq)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from this token model's weights (video default: assets/image/target when present)")
    p.add_argument("--no-resume", action="store_true", help="start over even if the run folder has a checkpoint")
    a = p.parse_args(argv)
    if a.card:
        import torch

        use_threads(a.threads)
        print(json.dumps(card_figures(a.card, seed=a.seed)))
        return 0
    if a.role is None:
        p.error("--role is required")
    steps, batch, lr = DEFAULTS[a.role]
    cfg = TrainConfig(role=a.role, steps=steps if a.steps is None else a.steps, batch_size=a.batch_size or batch,
                      lr=a.lr or lr, seed=a.seed, threads=a.threads,
                      run_dir=str(a.run_dir or Path("runs") / f"image-{a.role}"),
                      out=str(a.out) if a.out else None, checkpoint_minutes=a.checkpoint_minutes,
                      eval_every=a.eval_every,
                      num_images=a.num_images or DEFAULT_ITEMS.get(a.role, 20000),
                      eval_images=a.eval_images, vq_path=str(a.vq) if a.vq else None,
                      init_from=str(a.init_from) if a.init_from else _default_init(a.role))
    summary = train(cfg, resume=not a.no_resume)
    print(json.dumps({k: summary[k] for k in ("role", "params", "steps", "final_train_loss", "eval", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
