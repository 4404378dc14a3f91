"""The speech token models' training (roles target, draft): next-token loss on the acoustic tokens of the encoded
corpus after [BOS, voice, text, BOA], or the forward KL to a target's laws (a distilled draft), resumably.

    python -m specgen.modalities.speech.training.recipe --role target --tokens assets/speech/corpus \
        --run-dir runs/speech-target --out assets/speech/target --bf16

A run folder holds `checkpoint.pt` (model, optimizer, step, RNG), `metrics.jsonl` and `training.json`. Batches are
a pure function of (seed, step), so rerunning the same command resumes from the last checkpoint onto exactly the
batches the run would have seen. A checkpoint is written every --checkpoint-minutes and at the end; `--export-only`
exports the last checkpoint as it is (a run stopped early ships with its true step count).
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from specgen.settings import use_threads
from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.speech.training.alignment import load_durations, load_inventory
from specgen.modalities.speech.training.codebook import VAL_UTTERANCES, load_tokens
from specgen.modalities.training import (RunFolder, StepResult, StepSettings, export_fp16, file_sha256, run_steps,
                                         versions)

DEFAULTS = {"target": (3600, 16, 1.5e-3), "draft": (4000, 16, 2e-3)}  # role -> steps, batch size, peak lr
NOISE_SOURCES = ("uniform", "model")
RECIPE = "specgen.modalities.speech.training.recipe"
ALIGNMENT = "specgen.modalities.speech.training.alignment"


@dataclass(kw_only=True)
class TrainConfig(StepSettings):
    tokens: str
    run_dir: str = "runs/speech"
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
        parts = [f"python -m {RECIPE}", f"--role {self.role}", f"--tokens {self.tokens}",
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
                                    f"(make it with python -m {ALIGNMENT})")
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
        def add_files(tmp: Path) -> None:
            self.vocab.save(tmp / "vocab.json")
            (tmp / "training.json").write_text(json.dumps(summary, indent=1) + "\n")

        export_fp16(self.model, out, add_files)


def _check(cfg: TrainConfig) -> None:
    if cfg.role not in ("target", "draft"):
        raise InvalidRequest(f"role must be target or draft, not {cfg.role!r}")
    if cfg.steps < 0 or cfg.batch_size < 1 or cfg.lr <= 0 or cfg.threads < 1:
        raise InvalidRequest("steps must be >= 0 and batch size, lr and threads positive")
    if not 0 <= cfg.input_noise < 1:
        raise InvalidRequest(f"input noise must be in [0, 1), not {cfg.input_noise}")
    if cfg.noise_source not in NOISE_SOURCES:
        raise InvalidRequest(f"noise source must be one of {', '.join(NOISE_SOURCES)}, not {cfg.noise_source!r}")


def _fixed_settings(cfg: TrainConfig) -> dict:
    """The settings a checkpoint resumes only under, the token file named by its hash."""
    tokens_file = Path(cfg.tokens) / "tokens.npz" if Path(cfg.tokens).is_dir() else Path(cfg.tokens)
    fixed = {k: getattr(cfg, k) for k in TrainConfig.FIXED if k != "tokens_sha256"}
    fixed["tokens_sha256"] = file_sha256(tokens_file)
    return fixed


def _refuse_other_settings(fixed: dict, checkpoint_path: Path):
    def check(saved: dict) -> None:
        # checkpoints from before a setting existed lack its key: it had its default then
        if {**FIXED_DEFAULTS, **saved["fixed"]} != fixed:
            raise InvalidRequest(f"{checkpoint_path} was made with different settings ({', '.join(TrainConfig.FIXED)} "
                                 "must match); use another --run-dir or --no-resume to start over")

    return check


def train(cfg: TrainConfig, resume: bool = True, export_only: bool = False) -> dict:
    """Run cfg to cfg.steps optimizer steps in cfg.run_dir (resuming its checkpoint), export to cfg.out if set, and
    return the summary (also run_dir/training.json). export_only: export the checkpoint without training."""
    import torch

    _check(cfg)
    run = RunFolder(cfg.run_dir)
    use_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    task = LMTask(cfg)
    fixed = _fixed_settings(cfg)
    opt = torch.optim.AdamW(task.model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.05)
    fresh = {"step": 0, "elapsed_s": 0.0, "recent_losses": [], "eval": {}, "resumed_from": []}
    state, _ = run.resume(task.model, opt, fresh, check=_refuse_other_settings(fixed, run.checkpoint),
                          weights_only=False, enabled=resume)
    if export_only and state["step"] == 0:
        raise InvalidRequest(f"no checkpoint to export in {run.path}")
    run.record("run.json", {**asdict(cfg), "command": cfg.command()})
    if not export_only:
        _train_steps(cfg, run, task, opt, state, fixed)
    if not state["eval"]:
        state["eval"] = task.evaluate()
    summary = _summary(cfg, task, state)
    run.record("training.json", summary)
    if cfg.out:
        task.export(Path(cfg.out), summary)
    return summary


def _train_steps(cfg: TrainConfig, run: RunFolder, task: LMTask, opt, state: dict, fixed: dict) -> None:
    """Steps from state["step"] to cfg.steps (state updated in place), the evaluations reported on stderr."""
    import torch

    def log(result: StepResult) -> None:
        run.log({"step": state["step"], "loss": round(result.loss, 4), "lr": result.lr,
                 "grad_norm": round(result.grad_norm, 3), "elapsed_s": round(state["elapsed_s"], 1)})

    def evaluate(result: StepResult) -> None:
        state["eval"] = task.evaluate()
        run.log({"step": state["step"], **state["eval"]})
        print(f"speech {cfg.role} step {state['step']}: train {result.loss:.4f}  "
              f"eval {state['eval']['eval_loss']}  {state['elapsed_s']:.0f} s", file=sys.stderr, flush=True)

    def checkpoint() -> None:
        run.save_checkpoint({"model": task.model.state_dict(), "optimizer": opt.state_dict(),
                             "torch_rng": torch.get_rng_state(), "config": asdict(cfg), "fixed": fixed,
                             "state": state})

    run_steps(cfg.loop(), state, task.model, opt, lambda step: task.loss(task.batch(step)), log=log, evaluate=evaluate,
              checkpoint=checkpoint)


def _summary(cfg: TrainConfig, task: LMTask, state: dict) -> dict:
    losses = state["recent_losses"]
    return {
        "role": cfg.role, "params": sum(p.numel() for p in task.model.parameters()), "command": cfg.command(),
        "seed": cfg.seed, "steps": state["step"], "planned_steps": cfg.steps, "batch_size": cfg.batch_size,
        "lr": cfg.lr, "warmup": cfg.warmup, "layout": cfg.layout, "bf16_autocast": cfg.bf16, "teacher": cfg.teacher,
        "input_noise": cfg.input_noise, "noise_source": cfg.noise_source, "init": cfg.init,
        "schedule": "linear warmup, cosine to 10 % of the planned steps",
        "final_train_loss": round(sum(losses) / len(losses), 4) if losses else None,
        "eval": state["eval"], "wall_s": round(state["elapsed_s"], 1), "resumed_from_steps": state["resumed_from"],
        "train_utterances": len(task.train_idx), "val_utterances": len(task.val_idx),
        "threads": cfg.threads, "versions": versions(),
    }
