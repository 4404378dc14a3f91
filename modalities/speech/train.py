"""Fit the acoustic codebook (role codec) and train the speech token models (roles target, draft), resumably.

    python -m specgen.modalities.speech.train --role codec --corpus runs/speech-corpus --out assets/speech/codec
    python -m specgen.modalities.speech.train --role tokens --corpus runs/speech-corpus --out assets/speech/corpus
    python -m specgen.modalities.speech.align --tokens assets/speech/corpus     # character durations
    python -m specgen.modalities.speech.train --role target --tokens assets/speech/corpus --run-dir runs/speech-target \
        --out assets/speech/target --bf16

`tokens` encodes the corpus once with the codebook into `tokens.npz` (acoustic tokens, texts, voices; about
1 MB, so it ships and the models retrain without the audio). A token-model run folder holds `checkpoint.pt`
(model, optimizer, step, RNG), `metrics.jsonl` and `training.json`. Batches are a pure function of (seed, step),
so rerunning the same command resumes from the last checkpoint onto exactly the batches the run would have
seen. A checkpoint is written every --checkpoint-minutes and at the end; `--export-only` exports the last
checkpoint as it is (a run stopped early ships with its true step count).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from specgen.settings import use_threads
from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.checkpoints import atomic_write as _atomic_write
from specgen.modalities.checkpoints import restore
from specgen.modalities.speech.align import load_durations, load_inventory

ROLES = ("codec", "tokens", "target", "draft")
DEFAULTS = {"target": (3600, 16, 1.5e-3), "draft": (4000, 16, 2e-3)}  # role -> steps, batch size, peak lr
LOSS_WINDOW = 50
VAL_UTTERANCES = 96  # the last utterances of the token file are held out
NOISE_SOURCES = ("uniform", "model")


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------- codec and tokens


def fit_codec(corpus: Path, out: Path, *, k: int = 1024, max_frames: int = 200_000, iters: int = 25,
              seed: int = 0) -> dict:
    """k-means over log-mel frames of the corpus' training utterances (a seeded subsample of max_frames)."""
    import torch

    from specgen.modalities.speech import codec, data

    utts = data.read_manifest(corpus)[:-VAL_UTTERANCES]
    if not utts:
        raise InvalidRequest(f"no utterances in {corpus} (build it with python -m specgen.modalities.speech.data)")
    started = time.perf_counter()
    frames = torch.cat([codec.log_mel(codec.read_wav(corpus / u.file)) for u in utts])
    mel_s = time.perf_counter() - started
    g = torch.Generator().manual_seed(seed)
    sample = frames[torch.randperm(len(frames), generator=g)[:max_frames]]
    started = time.perf_counter()
    centroids, report = codec.fit_kmeans(sample, k, iters=iters, seed=seed)
    report |= {"kmeans_s": round(time.perf_counter() - started, 1), "log_mel_s": round(mel_s, 1),
               "corpus_frames": len(frames), "utterances": len(utts), "seed": seed}
    codec.AcousticCodec(centroids).save(out)
    (out / "fit.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def encode_corpus(corpus: Path | list[Path], codec_dir: Path, out: Path, append: Path | None = None) -> dict:
    """tokens.npz in out: every utterance's acoustic tokens (concatenated uint16 + offsets), text and voice, of
    one corpus folder or several in order; `append`: a tokens folder encoded with the same codebook (a corpus whose
    audio is gone) put after them, so its held-out last utterances stay last."""
    import numpy as np

    from specgen.modalities.speech import codec, data

    cd = codec.AcousticCodec.load(codec_dir)
    codebook_sha = _sha256(Path(codec_dir) / "codebook.safetensors")
    rows = []  # (tokens, text, voice, id)
    for folder in ([corpus] if isinstance(corpus, (str, Path)) else corpus):
        rows += [(cd.encode(codec.read_wav(Path(folder) / u.file)).numpy().astype(np.uint16), u.text, u.voice, u.id)
                 for u in data.read_manifest(Path(folder))]
    if append is not None:
        old = load_tokens(append)
        if json.loads((Path(append) / "tokens.json").read_text()).get("codebook_sha256") != codebook_sha:
            raise InvalidRequest(f"the tokens in {str(append)!r} were encoded with another codebook")
        bounds = old["offsets"]
        rows += [(old["tokens"][bounds[i]:bounds[i + 1]], str(t), str(v), str(k))
                 for i, (t, v, k) in enumerate(zip(old["texts"], old["voices"], old["ids"]))]
    tokens = [r[0] for r in rows]
    offsets = np.cumsum([0] + [len(t) for t in tokens]).astype(np.int64)
    out.mkdir(parents=True, exist_ok=True)
    blob = {"tokens": np.concatenate(tokens), "offsets": offsets, "texts": np.array([r[1] for r in rows]),
            "voices": np.array([r[2] for r in rows]), "ids": np.array([r[3] for r in rows])}

    def write(p):
        with open(p, "wb") as f:
            np.savez_compressed(f, **blob)

    _atomic_write(out / "tokens.npz", write)
    info = {"utterances": len(rows), "tokens": int(offsets[-1]), "num_tokens": cd.num_tokens,
            "codebook_sha256": codebook_sha, "val_utterances": VAL_UTTERANCES}
    (out / "tokens.json").write_text(json.dumps(info, indent=1) + "\n")
    for p in out.iterdir():
        p.chmod(0o644)
    return info


def load_tokens(path: Path) -> dict:
    import numpy as np

    path = Path(path)
    if path.is_dir():
        path = path / "tokens.npz"
    if not path.exists():
        raise ModelNotFound(f"no token file at {str(path)!r} (make it with --role tokens)")
    blob = np.load(path)
    return {k: blob[k] for k in blob.files}


# ------------------------------------------------------------------------------------------ target/draft roles


@dataclass
class TrainConfig:
    role: str
    steps: int
    batch_size: int
    lr: float
    tokens: str
    seed: int = 0
    threads: int = 1
    run_dir: str = "runs/speech"
    out: str | None = None
    checkpoint_minutes: float = 10.0
    eval_every: int = 100
    log_every: int = 10
    warmup: int = 100
    max_frames: int = 400  # prefix layout: longer utterances are cut (never in the shipped corpus)
    layout: str = "prefix"  # or "interleaved": characters spoken again where they start (models.py)
    bf16: bool = False  # bfloat16 autocast for the forward (about 1.7x faster steps on CPUs with AMX or AVX512-BF16)
    teacher: str | None = None  # a target model folder: train on forward KL(teacher || model) instead of the data
    # share of the input's acoustic tokens replaced by random ones (labels unchanged): the model learns to continue
    # from frames that are not the true ones, as it must when it runs on its own samples
    input_noise: float = 0.0
    # where the replacements come from: "uniform" (any acoustic token) or "model" (the model's own sample for that
    # slot given the true frames before it, drawn in an extra forward pass without gradients: the errors it makes)
    noise_source: str = "uniform"
    init: str | None = None  # an exported model folder to start from instead of random weights
    overrides: dict | None = None  # architecture overrides (tests)

    FIXED = ("role", "batch_size", "seed", "tokens_sha256", "layout", "teacher", "input_noise", "noise_source",
             "init")

    def command(self) -> str:
        parts = ["python -m specgen.modalities.speech.train", f"--role {self.role}", f"--tokens {self.tokens}",
                 f"--steps {self.steps}", f"--batch-size {self.batch_size}", f"--lr {self.lr:g}",
                 f"--seed {self.seed}", f"--threads {self.threads}", f"--run-dir {self.run_dir}"]
        parts += [f"--layout {self.layout}"] if self.layout != "prefix" else []
        parts += ["--bf16"] if self.bf16 else []
        parts += [f"--teacher {self.teacher}"] if self.teacher else []
        parts += [f"--input-noise {self.input_noise:g}"] if self.input_noise else []
        parts += [f"--noise-source {self.noise_source}"] if self.input_noise and self.noise_source != "uniform" else []
        parts += [f"--init {self.init}"] if self.init else []
        return " ".join(parts + ([f"--out {self.out}"] if self.out else []))


# the defaults of the fixed settings that have one (a checkpoint always records all of its own)
FIXED_DEFAULTS = {f.name: f.default for f in fields(TrainConfig) if f.name in TrainConfig.FIXED
                  and f.default is not MISSING}


def _lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class LMTask:
    def __init__(self, cfg: TrainConfig, num_tokens: int | None = None):
        import numpy as np

        from specgen.modalities.speech.models import build_speech_lm, default_vocab

        self.cfg = cfg
        blob = load_tokens(Path(cfg.tokens))
        inventory = load_inventory(Path(cfg.tokens)) if cfg.layout == "interleaved" else None
        self.vocab = default_vocab(num_tokens or int(blob.get("num_tokens", np.array(1024))), cfg.layout, inventory)
        offsets = blob["offsets"]
        codes = [blob["tokens"][offsets[i]:offsets[i + 1]].astype(np.int64) for i in range(len(offsets) - 1)]
        if int(max(c.max() for c in codes)) >= self.vocab.num_tokens:
            raise InvalidRequest("the token file has ids beyond the codebook size")
        durations = [None] * len(codes)
        if cfg.layout == "interleaved":
            durations = load_durations(Path(cfg.tokens))
            if durations is None or len(durations) != len(codes):
                raise ModelNotFound(f"the interleaved layout needs durations.npz beside the tokens in {cfg.tokens} "
                                    "(make it with python -m specgen.modalities.speech.align)")
        elif any(len(c) > cfg.max_frames for c in codes):
            codes = [c[:cfg.max_frames] for c in codes]
        if self.vocab.units == "phonemes":  # every word transcribed in one espeak-ng call, not one per sentence
            from specgen.modalities.speech.phonemes import corpus_units

            corpus_units([str(t) for t in blob["texts"]])
        built = [self.vocab.sequence(str(t), str(v), c, d)
                 for t, v, c, d in zip(blob["texts"], blob["voices"], codes, durations)]
        seqs = [s for s, _ in built]
        self.prompt_lengths = [p for _, p in built]
        n_val = min(VAL_UTTERANCES, max(1, len(seqs) // 10))
        self.train_idx, self.val_idx = list(range(len(seqs) - n_val)), list(range(len(seqs) - n_val, len(seqs)))
        self.seqs = seqs
        self._by_length = sorted(self.train_idx, key=lambda i: (len(seqs[i]), i))
        self.model = build_speech_lm(cfg.role, self.vocab, **(cfg.overrides or {}))
        if cfg.init:
            try:
                self.model.load_state_dict(self._load_same_vocab(cfg.init, "model").state_dict())
            except RuntimeError as exc:  # missing, unexpected or differently shaped weights
                raise InvalidRequest(f"the model in {cfg.init!r} is not a {cfg.role} of this shape") from exc
        self.teacher = None
        if cfg.teacher:  # distillation (DistillSpec's forward KL): the draft learns the target's laws
            self.teacher = self._load_same_vocab(cfg.teacher, "teacher").requires_grad_(False)

    def _load_same_vocab(self, path: str, what: str):
        """The exported model in `path`, refused unless it has this task's vocabulary and layout."""
        from specgen.modalities.speech.models import load_speech_lm, load_speech_vocab

        if load_speech_vocab(path) != self.vocab:
            raise InvalidRequest(f"the {what} in {path!r} has another vocabulary or layout")
        return load_speech_lm(path)

    def _batch(self, idx: list[int]):
        import torch

        width = max(len(self.seqs[i]) for i in idx)
        ids = torch.full((len(idx), width), self.vocab.pad, dtype=torch.long)
        labels = torch.full((len(idx), width), -100, dtype=torch.long)
        for row, i in enumerate(idx):
            s, p = self.seqs[i], self.prompt_lengths[i]
            ids[row, :len(s)] = torch.tensor(s)
            labels[row, p:len(s)] = torch.tensor(s[p:])  # everything after BOA
        return ids, labels

    def batch(self, step: int):
        """batch_size utterances of similar length (drawn from one of the length-sorted pools of 4 * batch_size),
        so little of a batch is padding."""
        import numpy as np

        rng = np.random.default_rng((self.cfg.seed, step))
        pool = 4 * self.cfg.batch_size
        by_length = self._by_length
        start = int(rng.integers(0, max(1, len(by_length) - pool + 1)))
        window = by_length[start:start + pool]
        ids, labels = self._batch([window[j] for j in rng.integers(0, len(window), self.cfg.batch_size)])
        return self.corrupt(ids, labels, rng), labels

    def corrupt(self, ids, labels, rng):
        """ids with a share `input_noise` of the generated acoustic tokens replaced (by `noise_source`; every draw
        comes from rng, so a batch stays a pure function of seed, step and weights); the labels keep the true
        tokens."""
        import torch

        if not self.cfg.input_noise:
            return ids
        acoustic = (labels != -100) & (ids < self.vocab.num_tokens)  # [batch, width]
        hit = torch.from_numpy(rng.random(ids.shape) < self.cfg.input_noise) & acoustic
        if self.cfg.noise_source == "model":
            noise = self._own_samples(ids, torch.Generator().manual_seed(int(rng.integers(2**62))))
        else:
            noise = torch.from_numpy(rng.integers(0, self.vocab.num_tokens, ids.shape))
        return torch.where(hit, noise, ids)

    def _own_samples(self, ids, generator):
        """[batch, width] per slot, an acoustic token sampled from the model's law for that slot given the true
        tokens before it (slot 0, never replaced, keeps its token)."""
        import torch

        with torch.no_grad():
            logits = self._logits(ids)[..., :self.vocab.num_tokens].float()  # [batch, width - 1, acoustic]
        drawn = torch.multinomial(logits.softmax(-1).reshape(-1, logits.shape[-1]), 1, generator=generator)
        return torch.cat([ids[:, :1], drawn.reshape(logits.shape[:2])], dim=1)

    def loss(self, batch, reduction: str = "mean"):
        ids, labels = batch
        logits = self._logits(ids)
        if self.teacher is not None and self.model.training:
            return self.kl(ids, labels, logits, reduction)
        return self._cross_entropy(logits, labels, reduction)

    def _logits(self, ids):
        import torch

        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cfg.bf16):
            return self.model(input_ids=ids[:, :-1]).logits

    @staticmethod
    def _cross_entropy(logits, labels, reduction: str):
        import torch.nn.functional as F

        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100, reduction=reduction)

    def kl(self, ids, labels, logits, reduction: str = "mean"):
        """Forward KL(teacher || model) per labelled slot, from the teacher's logits on the same batch."""
        import torch

        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cfg.bf16):
            teacher = self.teacher(input_ids=ids[:, :-1]).logits
        keep = labels[:, 1:] != -100  # [batch, slots]
        teacher_logp = teacher.float()[keep].log_softmax(-1)  # [labelled, vocab]
        model_logp = logits.float()[keep].log_softmax(-1)
        per_slot = (teacher_logp.exp() * (teacher_logp - model_logp)).sum(-1)
        return per_slot.sum() if reduction == "sum" else per_slot.mean()

    def evaluate(self) -> dict:
        import torch

        self.model.eval()
        total, count, kl = 0.0, 0, 0.0
        with torch.no_grad():
            for i in range(0, len(self.val_idx), self.cfg.batch_size):
                ids, labels = self._batch(self.val_idx[i:i + self.cfg.batch_size])
                logits = self._logits(ids)
                total += float(self._cross_entropy(logits, labels, "sum"))
                count += int((labels[:, 1:] != -100).sum())
                if self.teacher is not None:  # how far the model is from its teacher on held-out text
                    kl += float(self.kl(ids, labels, logits, reduction="sum"))
        self.model.train()
        return {"eval_loss": round(total / count, 4), **({"eval_kl": round(kl / count, 4)} if self.teacher else {})}

    def export(self, out: Path, summary: dict) -> None:
        import copy
        import shutil

        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        copy.deepcopy(self.model).half().save_pretrained(tmp)
        self.vocab.save(tmp / "vocab.json")
        (tmp / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
        for p in tmp.iterdir():
            p.chmod(0o644)
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)


def train(cfg: TrainConfig, resume: bool = True, export_only: bool = False) -> dict:
    """Run cfg to cfg.steps optimizer steps in cfg.run_dir (resuming its checkpoint), export to cfg.out if set, and
    return the summary (also run_dir/training.json). export_only: export the checkpoint without training."""
    import platform

    import torch

    if cfg.role not in ("target", "draft"):
        raise InvalidRequest(f"role must be target or draft, not {cfg.role!r}")
    if cfg.steps < 0 or cfg.batch_size < 1 or cfg.lr <= 0 or cfg.threads < 1:
        raise InvalidRequest("steps must be >= 0 and batch size, lr and threads positive")
    if not 0 <= cfg.input_noise < 1:
        raise InvalidRequest(f"input noise must be in [0, 1), not {cfg.input_noise}")
    if cfg.noise_source not in NOISE_SOURCES:
        raise InvalidRequest(f"noise source must be one of {', '.join(NOISE_SOURCES)}, not {cfg.noise_source!r}")
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    use_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    task = LMTask(cfg)
    model = task.model
    tokens_file = Path(cfg.tokens) / "tokens.npz" if Path(cfg.tokens).is_dir() else Path(cfg.tokens)
    fixed = {k: getattr(cfg, k) for k in TrainConfig.FIXED if k != "tokens_sha256"}
    fixed["tokens_sha256"] = _sha256(tokens_file)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.05)
    ckpt_path, metrics_path = run_dir / "checkpoint.pt", run_dir / "metrics.jsonl"
    state = {"step": 0, "elapsed_s": 0.0, "recent_losses": [], "eval": {}, "resumed_from": []}
    if resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        # checkpoints from before a setting existed lack its key: it had its default then
        if {**FIXED_DEFAULTS, **ckpt["fixed"]} != fixed:
            raise InvalidRequest(f"{ckpt_path} was made with different settings ({', '.join(TrainConfig.FIXED)} "
                                 "must match); use another --run-dir or --no-resume to start over")
        state = restore(ckpt, model, opt, metrics_path)
        torch.set_rng_state(ckpt["torch_rng"])
    elif metrics_path.exists():
        metrics_path.unlink()
    if export_only and state["step"] == 0:
        raise InvalidRequest(f"no checkpoint to export in {run_dir}")
    _atomic_write(run_dir / "run.json", lambda p: p.write_text(json.dumps({**asdict(cfg), "command": cfg.command()},
                                                                           indent=1)))

    def checkpoint():
        blob = {"model": model.state_dict(), "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(),
                "config": asdict(cfg), "fixed": fixed, "state": state}
        _atomic_write(ckpt_path, lambda p: torch.save(blob, p))

    def log(record):
        with open(metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    model.train()
    started = last_ckpt = time.monotonic()
    elapsed0 = state["elapsed_s"]
    while state["step"] < cfg.steps and not export_only:
        step = state["step"]
        lr = _lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = task.loss(task.batch(step))
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
        if state["step"] % cfg.log_every == 0 or state["step"] == cfg.steps:
            log({"step": state["step"], "loss": round(loss.item(), 4), "lr": lr, "grad_norm": round(grad_norm, 3),
                 "elapsed_s": round(state["elapsed_s"], 1)})
        if state["step"] % cfg.eval_every == 0 or state["step"] == cfg.steps:
            state["eval"] = task.evaluate()
            log({"step": state["step"], **state["eval"]})
            print(f"speech {cfg.role} step {state['step']}: train {loss.item():.4f}  "
                  f"eval {state['eval']['eval_loss']}  {state['elapsed_s']:.0f} s", file=sys.stderr, flush=True)
        if now - last_ckpt >= cfg.checkpoint_minutes * 60 or state["step"] == cfg.steps:
            checkpoint()
            last_ckpt = time.monotonic()
    if not state["eval"]:
        state["eval"] = task.evaluate()
    summary = {
        "role": cfg.role, "params": sum(p.numel() for p in model.parameters()), "command": cfg.command(),
        "seed": cfg.seed, "steps": state["step"], "planned_steps": cfg.steps, "batch_size": cfg.batch_size,
        "lr": cfg.lr, "warmup": cfg.warmup, "layout": cfg.layout, "bf16_autocast": cfg.bf16, "teacher": cfg.teacher,
        "input_noise": cfg.input_noise, "noise_source": cfg.noise_source, "init": cfg.init,
        "schedule": "linear warmup, cosine to 10 % of the planned steps",
        "final_train_loss": (round(sum(state["recent_losses"]) / len(state["recent_losses"]), 4)
                             if state["recent_losses"] else None),
        "eval": state["eval"], "wall_s": round(state["elapsed_s"], 1), "resumed_from_steps": state["resumed_from"],
        "train_utterances": len(task.train_idx), "val_utterances": len(task.val_idx),
        "threads": cfg.threads, "versions": {"torch": torch.__version__, "python": platform.python_version()},
    }
    _atomic_write(run_dir / "training.json", lambda p: p.write_text(json.dumps(summary, indent=1)))
    if cfg.out:
        task.export(Path(cfg.out), summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specgen.modalities.speech.train", description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--corpus", type=Path, nargs="+",
                   help="codec/tokens: the corpus folder (python -m specgen.modalities.speech.data); tokens takes "
                        "several, encoded in order")
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--run-dir", type=Path, default=None, help="checkpoints and logs (default: runs/speech-ROLE)")
    p.add_argument("--out", type=Path, default=None, help="export folder")
    p.add_argument("--checkpoint-minutes", type=float, default=10.0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--layout", choices=("auto", "prefix", "interleaved"), default="auto",
                   help="sequence layout; auto (default): interleaved when the corpus has durations.npz "
                        "(python -m specgen.modalities.speech.align), else prefix")
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
    import torch

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
        steps, batch, lr = DEFAULTS[a.role]
        tokens = a.tokens or default_paths()["target"].parent / "corpus"
        layout = a.layout
        if layout == "auto":
            layout = "interleaved" if load_durations(Path(tokens)) is not None else "prefix"
        cfg = TrainConfig(role=a.role, steps=steps if a.steps is None else a.steps, batch_size=a.batch_size or batch,
                          lr=a.lr or lr, tokens=str(tokens), seed=a.seed, threads=a.threads,
                          run_dir=str(a.run_dir or Path("runs") / f"speech-{a.role}"),
                          out=str(a.out) if a.out else None, checkpoint_minutes=a.checkpoint_minutes,
                          eval_every=a.eval_every, layout=layout, bf16=a.bf16,
                          teacher=str(a.teacher) if a.teacher else None, input_noise=a.input_noise,
                          noise_source=a.noise_source, init=str(a.init) if a.init else None)
        summary = train(cfg, resume=not a.no_resume, export_only=a.export_only)
    except SpecgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("role", "params", "steps", "final_train_loss", "eval", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
