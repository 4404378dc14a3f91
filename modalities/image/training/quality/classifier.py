"""A small CNN classifier over the image data's 88 classes (62 glyph characters, 10 digits, 16 photos), trained
on VQ reconstructions of the training images: the domain generated images live in (VQ decodes), so a
generated image is judged by what it would take to look like a real one through the same tokenizer. Its
penultimate features (128-d) feed the Fréchet distance.

    specgen train image-classifier --out runs/image-classifier   # exports into runs/image-classifier/export

Resumable as the other trainers: a checkpoint every --checkpoint-minutes, batches a pure function of (seed, step).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specgen.settings import use_threads
from specgen.errors import ModelNotFound
from specgen.modalities.training import RunFolder, RunSettings, apply_gradients, atomic_write, progress_bar, set_lr

FEATURES = 128


def class_names() -> list[str]:
    from specgen.modalities.image.training.images import CHARACTERS, PHOTOS

    return list(CHARACTERS) + [f"digit {d}" for d in range(10)] + list(PHOTOS)


class ImageClassifier(nn.Module):
    def __init__(self, classes: int = 88, width: int = 16):
        super().__init__()
        block = lambda cin, cout: nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1),  # noqa: E731
                                                nn.GroupNorm(8, cout), nn.SiLU())
        self.body = nn.Sequential(block(3, width), block(width, width * 2), block(width * 2, width * 4),
                                  block(width * 4, FEATURES), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out = nn.Linear(FEATURES, classes)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 64, 64, 3] (numpy or torch) -> [B, 128]."""
        x = torch.as_tensor(np.asarray(images)).permute(0, 3, 1, 2).float().div(127.5).sub(1)
        return self.body(x.to(self.out.weight.dtype))

    def forward(self, images):
        return self.out(self.features(images))


@torch.no_grad()
def embed(model: ImageClassifier, images, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(features [N, 128] float64, class probabilities [N, classes]) of uint8 images."""
    model.eval()
    feats, probs = [], []
    for i in range(0, len(images), batch_size):
        f = model.features(images[i:i + batch_size]).float()
        feats.append(f.double().numpy())
        probs.append(torch.softmax(model.out(f.to(model.out.weight.dtype)).float(), -1).numpy())
    return np.concatenate(feats), np.concatenate(probs)


def save(model: ImageClassifier, folder: Path, info: dict) -> Path:
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half().contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    (tmp / "classifier.json").write_text(json.dumps({"classes": class_names(), **info}, indent=1))
    for path in tmp.iterdir():
        path.chmod(0o644)  # safetensors writes 0600
    import os
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def load(folder: str | Path) -> ImageClassifier:
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "model.safetensors").exists():
        raise ModelNotFound(f"no image classifier in {str(folder)!r}; train one with `specgen train image-classifier`")
    info = json.loads((folder / "classifier.json").read_text())
    model = ImageClassifier(len(info["classes"]), info["config"]["width"])
    model.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
    return model.eval()


@dataclass(kw_only=True)
class ClassifierConfig(RunSettings):
    """The shipped classifier's recipe: VQ reconstructions of `images` training items (`eval_images` held out),
    `steps` AdamW steps of `batch_size` images."""

    images: int = 16000
    eval_images: int = 1000
    steps: int = 1500
    batch_size: int = 64
    lr: float = 2e-3
    width: int = 16  # channels of the first block (doubling per block up to 128): 0.11 M parameters
    run_dir: str = "runs/image-classifier"
    checkpoint_minutes: float = 5.0


def _reconstructions(run_dir: Path, n: int, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """VQ reconstructions of the first n items of a split and their class ids, cached in the run folder."""
    from tqdm import tqdm

    from specgen.modalities.image import vq as vq_codec
    from specgen.modalities.image.training.images import make_dataset
    from specgen.modalities.image.models import default_paths

    path = run_dir / f"{split}-{n}-{seed}.npz"
    if path.exists():
        blob = np.load(path)
        return blob["images"], blob["labels"]
    vq = vq_codec.load_vq(default_paths()["vq"])
    index = {name: i for i, name in enumerate(class_names())}
    images, labels = [], []
    for start in tqdm(range(0, n, 1000), desc=f"reconstruct {split}", file=sys.stderr):
        data = make_dataset(min(1000, n - start), seed=seed, split=split, start=start)
        images.append(vq_codec.reconstruct(vq, data.images))
        labels.append(np.array([index[c] for c in data.classes]))
    images, labels = np.concatenate(images), np.concatenate(labels)
    atomic_write(path, lambda p: np.savez(p.open("wb"), images=images, labels=labels))
    return images, labels


def _lr(step: int, cfg: ClassifierConfig) -> float:
    """Linear warm-up over 50 steps times a cosine from the first step to the last (to 0)."""
    return cfg.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + np.cos(np.pi * step / cfg.steps))


def train_classifier(cfg: ClassifierConfig) -> dict:
    """Train (or resume) the classifier `cfg` describes, export it to cfg.out if set, and return the summary (also
    run_dir/training.json) with its accuracy on held-out reconstructions."""
    use_threads(cfg.threads)
    run = RunFolder(cfg.run_dir)
    images, labels = _reconstructions(run.path, cfg.images, cfg.seed, "train")
    eval_images, eval_labels = _reconstructions(run.path, cfg.eval_images, cfg.seed, "val")
    torch.manual_seed(cfg.seed)
    model = ImageClassifier(len(class_names()), cfg.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    state = {"step": 0, "resumed_from": []}
    if run.checkpoint.exists():
        state, _ = run.resume(model, optimizer, state, weights_only=False)

    def checkpoint():
        run.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state})

    last = time.monotonic()
    bar = progress_bar(cfg.steps, state["step"], "train image classifier")
    while state["step"] < cfg.steps:
        step = state["step"]
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        pick = torch.randint(len(images), (cfg.batch_size,), generator=generator).numpy()
        set_lr(optimizer, _lr(step, cfg))
        loss = nn.functional.cross_entropy(model(images[pick]), torch.as_tensor(labels[pick]))
        apply_gradients(loss, optimizer, model.parameters(), clip=None)
        state["step"] = step + 1
        run.log({"step": step + 1, "loss": float(loss.detach())})
        bar.update(1)
        if time.monotonic() - last > cfg.checkpoint_minutes * 60:
            checkpoint()
            last = time.monotonic()
    bar.close()
    checkpoint()
    _, probs = embed(model, eval_images)
    summary = {"val_accuracy_on_reconstructions": float((probs.argmax(-1) == eval_labels).mean()), "steps": cfg.steps,
               "images": cfg.images, "config": asdict(cfg), "resumed_from": state["resumed_from"]}
    run.record("training.json", summary)
    if cfg.out:
        save(model, Path(cfg.out), summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specgen train image-classifier", description=__doc__.split("\n\n")[0])
    for key, value in asdict(ClassifierConfig()).items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value) if value is not None else str, default=value)
    summary = train_classifier(ClassifierConfig(**vars(parser.parse_args(argv))))
    print(json.dumps({"val_accuracy_on_reconstructions": summary["val_accuracy_on_reconstructions"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
