"""`specgen train draft`: distil a draft from its target, resumably.

One step: take a batch of windows (fixed corpus, target samples or fresh on-policy draft samples, or a mix),
look up (or compute) the target's law at the continuation positions, and minimise the chosen divergence between
it and the draft's law there — or plain cross-entropy on the text, the baseline distillation must beat. AdaSPEC
keeps only the tokens where the draft trails a reference draft the most. Everything a step uses is a pure
function of (seed, step) and the weights, so a run killed at any point resumes onto exactly the batches and
samples it would have seen, and ends where an uninterrupted run ends.

Run folder: `run.json` (settings), `checkpoint.pt` (model, optimizer, RNG, step), `metrics.jsonl`, and at the
end `export/` (fp16 safetensors, `vocab_ids.json` for a reduced vocabulary, tokenizer, README.md model card).
Data and teacher caches are keyed by their inputs and shared between runs (`cache_dir`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specgen.settings import use_threads
from specgen.errors import InvalidRequest
from specgen.modalities.training import RunFolder, apply_gradients, cosine_lr, progress_bar, recent, set_lr
from specgen.modalities.text.training.distill import windows as window_data
from specgen.modalities.text.training.distill.export import export
from specgen.modalities.text.training.distill.divergences import (DIVERGENCES, TeacherTopK, adaspec_keep,
                                                                  draft_buckets, token_divergence)
from specgen.modalities.text.full_vocab import draft_index
from specgen.modalities.text.training.distill.teacher import (TeacherCache, frequent_vocab,
                                                              restrict_cache, score_windows, shrink_vocab,
                                                              target_top_k)

LOSSES = ("ce", *DIVERGENCES)
VOCAB_SOURCES = ("samples", "corpus+samples")


@dataclass(frozen=True)
class DistillConfig:
    out: str
    target: str | None = None  # default: the shipped code target
    # a model folder, "scratch" (the code draft's shape), "scratch:WxL" (a fresh draft W wide, L layers deep, its
    # embedding started from the target's), or "prune:N[@START]" (the target less an N-layer block)
    init: str | None = None
    loss: str = "fkl"  # ce | fkl | rkl | jsd | tvd
    beta: float = 0.5  # JSD's mixing weight
    data: str = "target"  # corpus | target | draft | mix
    mix_fraction: float = 0.5  # with data=mix: the share of each batch sampled on-policy (the rest: target samples)
    adaspec: float | None = None  # keep fraction k (AdaSPEC); needs `reference`
    reference: str | None = None  # the reference draft folder for AdaSPEC (a forward-KL distilled draft)
    vocab_size: int | None = None  # reduced draft vocabulary: the N most frequent tokens of target samples
    # what the frequencies are counted in: the samples' continuations, or the training corpus and them (greedy
    # continuations repeat few tokens; the text they continue names the rest, e.g. identifiers they copy)
    vocab_from: str = "samples"
    steps: int = 300
    batch_size: int = 16
    prompt_len: int = 32
    new_tokens: int = 64
    windows: int = 1024  # size of the fixed data set (corpus or target samples)
    lr: float = 1e-3
    warmup: int = 20
    top_k: int = 64  # teacher log-probabilities kept per position
    temperature: float = 1.0  # the decoding temperature the draft is distilled for
    # the temperature of the target's samples when it differs (0: greedy continuations, the contexts greedy
    # decoding meets); the teacher at `temperature` is then kept while sampling, with no second pass
    sample_temperature: float | None = None
    seed: int = 0
    data_seed: int = 0  # which windows form the data set (shared by runs that should see the same data)
    threads: int = 1
    max_files: int | None = None
    checkpoint_minutes: float = 5.0
    eval_windows: int = 128
    cache_dir: str | None = None

    def check(self) -> None:
        if self.loss not in LOSSES:
            raise InvalidRequest(f"loss must be one of {', '.join(LOSSES)}, not {self.loss!r}")
        if self.data not in window_data.SOURCES:
            raise InvalidRequest(f"data must be one of {', '.join(window_data.SOURCES)}, not {self.data!r}")
        if self.adaspec is not None and not (0 < self.adaspec <= 1 and self.reference):
            raise InvalidRequest("AdaSPEC needs a keep fraction in (0, 1] and a reference draft (--reference)")
        if self.adaspec is not None and self.loss == "ce":
            raise InvalidRequest("AdaSPEC selects tokens by divergence from the target; use a divergence loss")
        if self.vocab_from not in VOCAB_SOURCES:
            raise InvalidRequest(f"vocab_from must be one of {', '.join(VOCAB_SOURCES)}, not {self.vocab_from!r}")
        if self.vocab_size is not None and self.data in ("draft", "mix"):
            raise InvalidRequest("on-policy data is not supported with a reduced vocabulary")
        if min(self.steps, self.batch_size, self.prompt_len, self.new_tokens, self.windows, self.top_k) < 1:
            raise InvalidRequest("steps, batch size, prompt and continuation lengths, windows and top-k must be >= 1")
        if not self.temperature > 0:
            raise InvalidRequest("distillation needs a temperature > 0 (the draft's law at temperature 0 is a point)")
        if self.sample_temperature is not None:
            if not self.sample_temperature >= 0:
                raise InvalidRequest(f"the sample temperature must be >= 0, got {self.sample_temperature}")
            if self.data != "target":
                raise InvalidRequest("--sample-temperature sets how the target's samples are drawn: use --data target")


# settings a resumed run must share with its checkpoint
FIXED = ("target", "init", "loss", "beta", "data", "mix_fraction", "adaspec", "reference", "vocab_size", "vocab_from",
         "steps", "batch_size", "prompt_len", "new_tokens", "windows", "lr", "warmup", "top_k", "temperature",
         "sample_temperature", "seed", "data_seed", "max_files")


def command_line(cfg: DistillConfig) -> str:
    flags = {"target": "--target", "init": "--init", "loss": "--loss", "data": "--data", "adaspec": "--adaspec",
             "reference": "--reference", "vocab_size": "--vocab-size", "vocab_from": "--vocab-from",
             "steps": "--steps", "seed": "--seed", "data_seed": "--data-seed", "batch_size": "--batch-size",
             "lr": "--lr", "top_k": "--top-k", "temperature": "--temperature",
             "sample_temperature": "--sample-temperature", "windows": "--windows", "max_files": "--max-files",
             "prompt_len": "--prompt-len", "new_tokens": "--new-tokens"}
    parts = ["specgen train draft", f"--out {cfg.out}"]
    defaults = DistillConfig(out="")
    for name, flag in flags.items():
        value = getattr(cfg, name)
        if value is not None and value != getattr(defaults, name):
            parts.append(f"{flag} {value}")
    if cfg.loss == "jsd":
        parts.append(f"--beta {cfg.beta}")
    if cfg.data == "mix":
        parts.append(f"--mix-fraction {cfg.mix_fraction}")
    return " ".join(parts)


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step) % (2 ** 63)


def _load(path: str):
    from specgen.modalities.text.generator import load_causal_lm

    return load_causal_lm(path)


def _init_draft(cfg: DistillConfig, target, tokenizer, calibration: np.ndarray):
    """The model training starts from, and (for "prune:N") the pruning report."""
    from specgen.modalities.text.generator import default_models

    spec = cfg.init or default_models()[1]
    if spec is None:
        raise InvalidRequest("this target has no default draft to start from: pass --init scratch, prune:N or a "
                             "model folder")
    if spec == "scratch" or spec.startswith("scratch:"):
        from specgen.modalities.text.models import build_model, draft_shape

        shape = {}
        if spec != "scratch":
            width, _, layers = spec.split(":", 1)[1].partition("x")
            try:
                shape = draft_shape(int(width), int(layers), context=_draft_context(target))
            except ValueError as exc:
                raise InvalidRequest(f"--init scratch:WxL takes a width (a multiple of 64) and a layer count, "
                                     f"got {spec!r} ({exc})") from None
        torch.manual_seed(cfg.seed)
        return build_model("draft", tokenizer, **shape), None
    if spec.startswith("prune:"):  # "prune:N" drops the N-layer block of least angular distance, "prune:N@S" at S
        from specgen.modalities.text.training.distill.prune import drop_layers, prune_report

        count, _, start = spec.split(":", 1)[1].partition("@")
        try:
            count, start = int(count), (int(start) if start else None)
        except ValueError:
            raise InvalidRequest(f"--init takes prune:N or prune:N@START with integers, got {spec!r}") from None
        report = prune_report(target, torch.from_numpy(calibration), count)
        if start is not None:
            report = {**report, "start": start, "layers_removed": list(range(start, start + count)),
                      "distance": report["distances"][start] if 0 <= start < len(report["distances"]) else None,
                      "forced": True}
        return drop_layers(target, report["start"], count), report
    return _load(spec), None


def _draft_context(target) -> int:
    return min(4096, int(getattr(target.config, "max_position_embeddings", 1024)))


@torch.no_grad()
def embed_from_target(draft, target, vocab_ids: torch.Tensor | None) -> None:
    """Start the draft's (tied) embedding from the target's: the target's input embeddings of the draft's tokens,
    centred and projected onto their top principal directions, rescaled to the fresh embedding's spread. A small
    draft trained on little data then starts knowing which tokens are alike. In place."""
    ids = torch.arange(target.config.vocab_size) if vocab_ids is None else torch.as_tensor(vocab_ids)
    rows = target.get_input_embeddings()(ids[None])[0].float()  # [n, target_hidden]
    rows = rows - rows.mean(0)
    _, _, basis = torch.linalg.svd(rows, full_matrices=False)  # rows of `basis`: principal directions
    width = min(draft.config.hidden_size, len(basis))  # a draft wider than that keeps fresh extra columns
    projected = rows @ basis[:width].T  # [n, width]
    weight = draft.get_input_embeddings().weight
    projected *= weight.std() / projected.std()
    weight[:len(ids), :width] = projected.to(weight.dtype)
    if len(weight) > len(ids):  # a reduced draft's <unk> row: the centre
        weight[len(ids):] = 0


def _data_key(cfg: DistillConfig) -> str:
    sampled = "" if cfg.sample_temperature is None else f"x{cfg.sample_temperature:g}-"
    return f"{sampled}t{cfg.temperature:g}-n{cfg.windows}-p{cfg.prompt_len}-c{cfg.new_tokens}-s{cfg.data_seed}"


def _prompts(cfg: DistillConfig, tokenizer, cache: Path) -> window_data.Windows:
    stream = window_data.corpus_stream(tokenizer, "train", cfg.max_files, cache)
    return window_data.corpus_windows(stream, cfg.windows, cfg.prompt_len, cfg.new_tokens, cfg.data_seed)


def _samples_folder(cfg: DistillConfig, cache: Path) -> Path:
    return cache / f"samples-{_data_key(cfg)}"


def _target_samples(cfg: DistillConfig, target, prompts: window_data.Windows, cache: Path):
    """(the target's continuations of `prompts`, their teacher cache when it is kept while sampling, else None)."""
    folder = _samples_folder(cfg, cache)
    if cfg.sample_temperature is None:
        return window_data.target_windows(target, prompts, cfg.new_tokens, cfg.temperature, cfg.data_seed, folder), None
    return window_data.target_windows(target, prompts, cfg.new_tokens, cfg.sample_temperature, cfg.data_seed, folder,
                                   teacher_k=cfg.top_k, teacher_temperature=cfg.temperature)


def heldout_temperature(cfg: DistillConfig) -> float:
    """Held-out continuations are drawn like the training samples (greedy ones are scored at temperature 1)."""
    return cfg.temperature if cfg.sample_temperature is None else cfg.sample_temperature


class _Data:
    """Batches of (tokens [b, length], teacher) for a step, as a pure function of (seed, step) and the draft."""

    def __init__(self, cfg: DistillConfig, target, prompts: window_data.Windows, samples, cache: Path, vocab_ids, say):
        self.cfg, self.target, self.prompts = cfg, target, prompts
        self.fixed, self.teacher = None, None
        self.mask = window_data.continuation_mask(cfg.batch_size, cfg.prompt_len, cfg.new_tokens)
        if cfg.data in ("corpus", "target", "mix"):
            key = _data_key(cfg)
            if cfg.data == "corpus":
                self.fixed = prompts
            else:
                say(f"target samples for {cfg.windows} prompts (cached in {cache})")
                self.fixed, sampled_teacher = samples if samples is not None else _target_samples(cfg, target,
                                                                                                   prompts, cache)
                if sampled_teacher is not None:  # kept while sampling: no scoring pass
                    self.teacher = sampled_teacher if vocab_ids is None else restrict_cache(sampled_teacher, vocab_ids)
                    return
            vocab_key = "full" if vocab_ids is None else "v" + hashlib.sha256(vocab_ids.numpy().tobytes()).hexdigest()[:12]
            path = cache / f"teacher-{cfg.data if cfg.data == 'corpus' else 'target'}-{key}-k{cfg.top_k}-{vocab_key}.npz"
            if not path.exists():
                say(f"scoring {cfg.windows} windows with the target (top-{cfg.top_k} cache: {path.name})")
                score_windows(target, self.fixed.tokens, cfg.top_k, cfg.temperature, vocab_ids).save(path)
            self.teacher = TeacherCache.load(path)

    def _rows(self, step: int, count: int) -> np.ndarray:
        """Dataset rows for a step: consecutive slices of a per-epoch permutation keyed by (seed, epoch)."""
        n = len(self.fixed.tokens)
        epochs, offsets = np.divmod(np.arange(step * count, (step + 1) * count), n)
        orders = {int(e): np.random.default_rng((self.cfg.seed, int(e))).permutation(n) for e in np.unique(epochs)}
        return np.array([orders[int(e)][o] for e, o in zip(epochs, offsets)], dtype=np.int64)

    def batch(self, step: int, draft):
        cfg = self.cfg
        on_policy = {"draft": cfg.batch_size, "mix": round(cfg.batch_size * cfg.mix_fraction)}.get(cfg.data, 0)
        fixed_rows = self._rows(step, cfg.batch_size - on_policy) if cfg.batch_size > on_policy else np.array([], int)
        mask = self.mask
        parts, teachers = [], []
        if len(fixed_rows):
            parts.append(torch.from_numpy(self.fixed.tokens[fixed_rows]))
            teachers.append(self.teacher.select(fixed_rows, mask[:len(fixed_rows)]))
        if on_policy:
            starts = np.random.default_rng(_step_seed(cfg.seed, step)).integers(0, len(self.prompts.tokens), on_policy)
            heads = torch.from_numpy(self.prompts.tokens[starts, :cfg.prompt_len])
            sampled = window_data.sample_continuations(draft, heads, cfg.new_tokens, cfg.temperature,
                                                    seed=_step_seed(cfg.seed, step))
            teacher, _ = target_top_k(self.target, sampled[:, :-1], cfg.top_k, cfg.temperature)
            teachers.append(teacher.rows(torch.from_numpy(mask[:on_policy].reshape(-1))))
            parts.append(sampled)
        return torch.cat(parts), torch.from_numpy(mask), TeacherTopK.cat(teachers)


def _draft_logits(model, tokens: torch.Tensor, to_draft, vocab: int | None) -> torch.Tensor:
    inputs = tokens[:, :-1] if to_draft is None else to_draft[tokens[:, :-1]]
    logits = model(input_ids=inputs).logits.float()  # [b, length - 1, draft_vocab]
    return logits if vocab is None else logits[..., :vocab]  # the <unk> row is never proposed


def step_loss(cfg: DistillConfig, draft, reference, tokens, mask, teacher, to_draft=None, vocab_ids=None):
    """(loss, logged numbers) for one batch: tokens [b, length], mask [b, length - 1], teacher at the masked
    positions in order."""
    vocab = None if vocab_ids is None else len(vocab_ids)
    logits = _draft_logits(draft, tokens, to_draft, vocab)[mask]  # [positions, draft_vocab]
    if cfg.loss == "ce":
        labels = tokens[:, 1:][mask]
        if to_draft is not None:  # text tokens outside a reduced vocabulary cannot be learnt
            labels = torch.where(torch.isin(labels, vocab_ids), to_draft[labels], -100)
        return F.cross_entropy(logits, labels, ignore_index=-100), {}
    draft_logp = draft_buckets(logits, teacher, cfg.temperature)
    target_logp = teacher.buckets()
    per_token = token_divergence(cfg.loss, target_logp, draft_logp, cfg.beta)  # [positions]
    logged = {"tvd": float(token_divergence("tvd", target_logp, draft_logp.detach()).mean())}
    if reference is None:
        return per_token.mean(), logged
    with torch.no_grad():
        reference_logp = draft_buckets(_draft_logits(reference, tokens, to_draft, vocab)[mask], teacher,
                                       cfg.temperature)
    gap_draft = per_token if cfg.loss == "fkl" else token_divergence("fkl", target_logp, draft_logp)
    keep = adaspec_keep(gap_draft, token_divergence("fkl", target_logp, reference_logp), cfg.adaspec)
    logged["kept"] = float(keep.float().mean())
    return per_token[keep].mean(), logged


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def prepare_samples(cfg: DistillConfig, say=_say) -> dict:
    """Generate (or finish generating) the target's samples `cfg` trains on, and return their record: the
    corpus step of a distillation on its own (`specgen train draft --samples-only`), resumable chunk by chunk."""
    from specgen.modalities.text.generator import default_models, load_tokenizer, resolve_model_path

    cfg.check()
    if cfg.data != "target":
        raise InvalidRequest("--samples-only generates the target's samples: use --data target")
    use_threads(cfg.threads)
    target_path = resolve_model_path(cfg.target or default_models()[0])
    tokenizer = load_tokenizer(target_path)
    cache = window_data.cache_folder(target_path, cfg.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    windows, _ = _target_samples(cfg, _load(target_path), _prompts(cfg, tokenizer, cache), cache)
    folder = _samples_folder(cfg, cache)
    record = folder / "samples.json"
    summary = json.loads(record.read_text()) if record.exists() else {"windows": int(len(windows.tokens))}
    say(f"{summary['windows']} windows of target samples in {folder}")
    return {**summary, "folder": str(folder), "command": command_line(cfg) + " --samples-only"}


@dataclass
class _Distillation:
    """What a run trains with: the frozen target, its tokenizer and caches, the batches, the draft being trained
    (with its reduced vocabulary, if any) and AdaSPEC's reference."""

    target_path: str
    target: torch.nn.Module
    tokenizer: object
    cache: Path
    data: _Data
    draft: torch.nn.Module
    prune: dict | None  # the pruning report of a "prune:N" start
    reference: torch.nn.Module | None
    vocab_ids: torch.Tensor | None
    to_draft: torch.Tensor | None  # target id -> draft row, for a reduced vocabulary

    def heldout(self, cfg: DistillConfig):
        from specgen.modalities.text.training.distill.agreement import heldout_set

        return heldout_set(self.target, self.tokenizer, self.cache, count=cfg.eval_windows,
                           prompt_len=cfg.prompt_len, new_tokens=cfg.new_tokens, temperature=heldout_temperature(cfg),
                           max_files=cfg.max_files, vocab_ids=self.vocab_ids)

    def agreement(self, cfg: DistillConfig) -> dict:
        from specgen.modalities.text.training.distill.agreement import teacher_forced

        return teacher_forced(self.draft, self.heldout(cfg), self.vocab_ids, self.to_draft)


def _frozen(model):
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _reduced_vocab(cfg: DistillConfig, target, tokenizer, prompts, cache: Path):
    """(the target's samples, the reduced vocabulary's target ids): the most frequent tokens of the target's own
    samples (counted before any teacher cache exists), or (None, None) for a full vocabulary."""
    if cfg.vocab_size is None:
        return None, None
    samples = _target_samples(cfg, target, prompts, cache)
    specials = (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    counted = [samples[0].tokens[:, cfg.prompt_len:]]
    if cfg.vocab_from == "corpus+samples":
        counted.append(window_data.corpus_stream(tokenizer, "train", cfg.max_files, cache))
    ids = frequent_vocab(counted, cfg.vocab_size, always=tuple(dict.fromkeys(i for i in specials if i is not None)))
    return samples, torch.from_numpy(ids)


def _starting_draft(cfg: DistillConfig, target, tokenizer, data: _Data, vocab_ids):
    """(draft in training mode, pruning report or None, target id -> draft row or None)."""
    draft, prune = _init_draft(cfg, target, tokenizer, data.prompts.tokens[:256, :cfg.prompt_len])
    to_draft = None
    if vocab_ids is not None and not _has_vocab(cfg.init, vocab_ids):  # else: a reduced draft trained further
        shrink_vocab(draft, vocab_ids)
    if (cfg.init or "").startswith("scratch:"):  # a resumed run then loads its checkpoint over this
        embed_from_target(draft, target, vocab_ids)
    if vocab_ids is not None:
        to_draft = draft_index(vocab_ids, target.config.vocab_size, len(vocab_ids))
    draft = draft.float().train()
    for p in draft.parameters():  # a pruned draft copies the frozen target's flags
        p.requires_grad_(True)
    return draft, prune, to_draft


def _reference(cfg: DistillConfig, vocab_ids):
    """AdaSPEC's frozen reference draft, or None."""
    if cfg.adaspec is None:
        return None
    reference = _load(cfg.reference)
    if vocab_ids is not None:
        ref_vocab = Path(cfg.reference) / "vocab_ids.json"
        if not ref_vocab.exists() or json.loads(ref_vocab.read_text()) != vocab_ids.tolist():
            raise InvalidRequest("the AdaSPEC reference must use the same reduced vocabulary as the draft")
    return _frozen(reference)


def _prepare(cfg: DistillConfig, say) -> _Distillation:
    from specgen.modalities.text.generator import default_models, load_tokenizer, resolve_model_path

    target_path = resolve_model_path(cfg.target or default_models()[0])  # `gemma`: its served folder
    target = _frozen(_load(target_path))
    tokenizer = load_tokenizer(target_path)
    cache = window_data.cache_folder(target_path, cfg.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    prompts = _prompts(cfg, tokenizer, cache)
    samples, vocab_ids = _reduced_vocab(cfg, target, tokenizer, prompts, cache)
    data = _Data(cfg, target, prompts, samples, cache, vocab_ids, say)
    draft, prune, to_draft = _starting_draft(cfg, target, tokenizer, data, vocab_ids)
    return _Distillation(target_path, target, tokenizer, cache, data, draft, prune, _reference(cfg, vocab_ids),
                         vocab_ids, to_draft)


def _refuse_other_settings(checkpoint_path: Path, settings: dict):
    def check(saved: dict) -> None:
        defaults = dataclasses.asdict(DistillConfig(out=""))  # settings added since the checkpoint: their defaults
        changed = [k for k in FIXED if saved["config"].get(k, defaults[k]) != settings[k]]
        if changed:
            raise InvalidRequest(f"{checkpoint_path} was made with different settings ({', '.join(changed)}); "
                                 "use a new --out folder to start over")

    return check


def train_draft(cfg: DistillConfig, *, stop_after: int | None = None, say=_say) -> dict:
    """Run (or resume) the distillation `cfg` describes; returns the summary also written to `training.json`.
    `stop_after` ends the process's work after that many steps (tests use it to simulate a kill)."""
    cfg.check()
    use_threads(cfg.threads)
    run = RunFolder(cfg.out)
    distil = _prepare(cfg, say)
    # no weight decay: distillation starts from a trained draft and should not pull it towards zero
    opt = torch.optim.AdamW(distil.draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    settings = dataclasses.asdict(cfg)
    fresh = {"step": 0, "elapsed_s": 0.0, "recent": [], "resumed_from": []}
    state, _ = run.resume(distil.draft, opt, fresh, check=_refuse_other_settings(run.checkpoint, settings))
    run.record("run.json", {**settings, "command": command_line(cfg)})
    if state["step"] == 0 and "heldout_before" not in state:  # the starting point, for the card
        state["heldout_before"] = distil.agreement(cfg)
    if not _train_steps(cfg, run, distil, opt, state, settings, stop_after):
        return {"stopped_at": state["step"]}
    say("evaluating on held-out target samples")
    summary = _summary(cfg, distil, state, settings)
    run.record("training.json", summary)
    export(distil.draft, run.path / "export", distil.target_path, distil.vocab_ids, summary)
    return summary


def _train_steps(cfg: DistillConfig, run: RunFolder, distil: _Distillation, opt, state: dict, settings: dict,
                 stop_after: int | None) -> bool:
    """Steps from state["step"] to cfg.steps (state updated in place), a metrics line each, a checkpoint every
    checkpoint_minutes and at the end. Returns False when `stop_after` steps ended the work early."""
    draft = distil.draft

    def checkpoint():
        run.save_checkpoint({"model": draft.state_dict(), "optimizer": opt.state_dict(), "config": settings,
                             "state": state})

    started = last_ckpt = time.monotonic()
    elapsed0, done_here = state["elapsed_s"], 0
    bar = progress_bar(cfg.steps, state["step"], f"distil draft ({cfg.loss}, {cfg.data})")
    while state["step"] < cfg.steps:
        if stop_after is not None and done_here >= stop_after:
            checkpoint()
            bar.close()
            return False
        step = state["step"]
        lr = cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup)
        set_lr(opt, lr)
        tokens, mask, teacher = distil.data.batch(step, draft)
        loss, logged = step_loss(cfg, draft, distil.reference, tokens, mask, teacher, distil.to_draft, distil.vocab_ids)
        apply_gradients(loss, opt, draft.parameters())
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"the {cfg.loss} loss is {loss.item()} at step {step}")
        state["step"], done_here = step + 1, done_here + 1
        state["recent"] = recent(state["recent"], loss.item())
        state["elapsed_s"] = elapsed0 + time.monotonic() - started
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        run.log({"step": state["step"], "loss": loss.item(), "lr": lr, **logged})
        if time.monotonic() - last_ckpt >= cfg.checkpoint_minutes * 60 or state["step"] == cfg.steps:
            checkpoint()
            last_ckpt = time.monotonic()
    bar.close()
    return True


def _summary(cfg: DistillConfig, distil: _Distillation, state: dict, settings: dict) -> dict:
    summary = {"command": command_line(cfg), "config": settings, "target": distil.target_path,
               "params": sum(p.numel() for p in distil.draft.parameters()), "steps": state["step"],
               "tokens_with_gradient": state["step"] * cfg.batch_size * cfg.new_tokens,
               "final_loss": sum(state["recent"]) / max(len(state["recent"]), 1),
               "wall_s": round(state["elapsed_s"], 1), "resumed_from_steps": state["resumed_from"],
               "heldout": distil.agreement(cfg), "heldout_before": state.get("heldout_before")}
    if distil.vocab_ids is not None:
        summary["coverage"] = {"train": float(distil.data.teacher.coverage[:, cfg.prompt_len - 1:].mean()),
                               "heldout": _coverage(distil.heldout(cfg), distil.vocab_ids),
                               "vocab_size": len(distil.vocab_ids)}
    if distil.prune is not None:
        summary["prune"] = distil.prune
    return summary


def _has_vocab(init: str | None, vocab_ids: torch.Tensor) -> bool:
    """Whether the starting draft is already reduced to exactly `vocab_ids` (then it trains on as it is)."""
    mapping = Path(init or "") / "vocab_ids.json"
    if not init or not mapping.exists():
        return False
    if json.loads(mapping.read_text()) != vocab_ids.tolist():
        raise InvalidRequest(f"{init} has another reduced vocabulary than this run's; start from a full-vocabulary "
                             "draft or keep the data and --vocab-size it was trained with")
    return True


def _coverage(heldout, vocab_ids) -> float:
    return float(heldout.vocab_logp(vocab_ids).exp().sum(-1).mean())
