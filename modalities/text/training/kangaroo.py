"""`specgen train adapter --method kangaroo`: the Kangaroo self-draft's adapter (modalities/drafters/kangaroo.py),
trained on the frozen target's own greedy continuations, resumably.

Data: prompts of `prompt_len` tokens from the code corpus the target was trained on (train split; validation split
for the held-out numbers), each continued greedily by the target for `new_tokens` tokens (the contexts greedy
decoding meets; generated once into the distillation cache, chunk by chunk, so a killed run resumes). One forward
of the frozen target over every window gives the two things training needs at each position: the hidden state after
the exit layer ℓ (the adapter's input) and the full target's next-token law (its final state through lm_head).

Loss: KL(target ‖ draft) over the full vocabulary at every position of a window, the draft's law being
lm_head(adapter(h_ℓ)); only the adapter learns (the paper's loss, a cross-entropy against the full model's soft
labels, has the same gradient). Each step's windows are a pure function of (seed, step), so a resumed run sees the
batches an uninterrupted one would. Held-out: at the continuation positions of the validation windows, the greedy
agreement (draft argmax = target argmax: the acceptance rate of greedy decoding on these contexts), α = Σ min(target,
draft) (the acceptance rate at temperature 1) and the KL, before and after training.

Run folder: `run.json`, `checkpoint.pt` (every `checkpoint_minutes` and at the end), `metrics.jsonl`,
`training.json`; the adapter is exported as `adapter-exit{ℓ}.safetensors` (fp16, config and summary in its
metadata) into `export` (default: the run's `export/`) with a README.md model card covering every adapter there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specgen.errors import InvalidRequest
from specgen.modalities.drafters.kangaroo import AdapterConfig, KangarooAdapter, adapter_path, read_record
from specgen.modalities.training import (LoopSettings, RunFolder, RunSettings, card_command, flag_command, progress_bar,
                                         run_steps, versions, write_readme)
from specgen.modalities.text.training.distill import windows as window_data
from specgen.settings import use_threads


@dataclass(kw_only=True)
class ContinuationSettings(RunSettings):
    """The settings of a trainer on the target's own greedy continuations (`greedy_data`; Kangaroo's, PPD's): the
    target, the windows and their held-out twins, and how often the loop logs and evaluates."""

    target: str | None = None  # a target model folder (None: the shipped code target)
    windows: int = 2048
    prompt_len: int = 32
    new_tokens: int = 64
    data_seed: int = 0
    eval_windows: int = 64
    max_files: int | None = None
    cache_dir: str | None = None
    log_every: int = 10
    eval_every: int = 100


@dataclass(kw_only=True)
class KangarooConfig(ContinuationSettings):
    run_dir: str = "runs/kangaroo"
    out: str | None = None  # where the adapter and its card go (None: <run_dir>/export; `--export DIR`)
    exit_layer: int = 1
    mlp: bool = False  # a full decoder layer instead of the paper's attention-only adapter
    steps: int = 800
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 20


# settings a resumed run must share with its checkpoint
FIXED = ("target", "exit_layer", "mlp", "steps", "batch_size", "windows", "prompt_len", "new_tokens", "lr", "warmup",
         "seed", "data_seed", "max_files")
FLAGS = {"target": "--model", "exit_layer": "--exit-layer", "steps": "--steps", "batch_size": "--batch-size",
         "windows": "--windows", "lr": "--lr", "seed": "--seed", "data_seed": "--data-seed", "max_files": "--max-files",
         "out": "--export"}


def command_line(cfg: KangarooConfig) -> str:
    """The `specgen train adapter` command that makes this run (non-default settings only)."""
    return flag_command("specgen train adapter --method kangaroo", cfg, FLAGS) + (" --mlp" if cfg.mlp else "")


def target_folder(cfg: ContinuationSettings) -> str:
    from specgen.modalities.text.generator import shipped_code_pair

    return cfg.target if cfg.target not in (None, "code") else shipped_code_pair()[0]


# ---- data: the target's greedy continuations and its states on them ------------------------------------------


def greedy_windows(target, tokenizer, cfg: ContinuationSettings, split: str, count: int, seed: int, cache: Path):
    """[count, prompt_len + new_tokens] corpus prompts of `split` continued greedily by the target (cached)."""
    stream = window_data.corpus_stream(tokenizer, split, cfg.max_files, cache)
    prompts = window_data.corpus_windows(stream, count, cfg.prompt_len, cfg.new_tokens, seed)
    key = hashlib.sha256(json.dumps([split, count, cfg.prompt_len, cfg.new_tokens, seed, cfg.max_files,
                                     int(stream.size)]).encode()).hexdigest()[:12]
    return window_data.target_windows(target, prompts, cfg.new_tokens, 0.0, seed, cache / f"kangaroo-greedy-{key}")


def greedy_data(target, tokenizer, cfg: ContinuationSettings, path: str, name: str, say) -> tuple:
    """(train, held-out) token windows [n, prompt_len + new_tokens]: `cfg.windows` train-split and
    `cfg.eval_windows` validation-split prompts continued greedily by the target (cached beside its weights)."""
    cache = window_data.cache_folder(path, cfg.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    say(f"{name}: greedy continuations of {cfg.windows} train and {cfg.eval_windows} held-out prompts")
    return (greedy_windows(target, tokenizer, cfg, "train", cfg.windows, cfg.data_seed, cache).tokens,
            greedy_windows(target, tokenizer, cfg, "val", cfg.eval_windows, cfg.data_seed + 1, cache).tokens)


@dataclass(frozen=True)
class Features:
    exit_hidden: torch.Tensor  # [n, t, d] the hidden state after the target's first ℓ layers (un-normed)
    final_hidden: torch.Tensor  # [n, t, d] the target's final-normed state: lm_head of it is the teacher


@torch.no_grad()
def target_features(target, tokens: np.ndarray, exit_layer: int, batch_size: int = 32) -> Features:
    """The frozen target's states over every window (one forward each batch)."""
    exits, finals = [], []
    for start in range(0, len(tokens), batch_size):
        out = target.model(input_ids=torch.from_numpy(tokens[start:start + batch_size]), output_hidden_states=True)
        exits.append(out.hidden_states[exit_layer].float())  # [0] is the embedding: [ℓ] follows layer ℓ - 1
        finals.append(out.last_hidden_state.float())
    return Features(torch.cat(exits), torch.cat(finals))


def rotary(target, hidden: torch.Tensor):
    """cos, sin [b, t, head_dim] of the target's rotary embedding at positions 0..t-1."""
    positions = torch.arange(hidden.shape[1]).expand(hidden.shape[0], -1)
    return target.model.rotary_emb(hidden, positions)


def draft_logits(target, adapter: KangarooAdapter, exit_hidden: torch.Tensor) -> torch.Tensor:
    """[b, t, vocab] the self-draft's logits: lm_head(adapter(h_ℓ))."""
    return target.lm_head(adapter(exit_hidden, *rotary(target, exit_hidden)))


def kl_to_target(target_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[...] KL(target ‖ draft) per position over the full vocabulary."""
    target_logp = target_logits.float().log_softmax(-1)
    return (target_logp.exp() * (target_logp - logits.float().log_softmax(-1))).sum(-1)


@torch.no_grad()
def heldout(target, adapter: KangarooAdapter, features: Features, prompt_len: int, batch_size: int = 16) -> dict:
    """Greedy agreement, α = Σ min(target, draft) and KL at the continuation positions of held-out windows."""
    adapter.eval()
    agree, alpha, kl, count = 0.0, 0.0, 0.0, 0
    for start in range(0, len(features.exit_hidden), batch_size):
        exit_hidden = features.exit_hidden[start:start + batch_size]
        # positions prompt_len - 1 .. t - 2 predict continuation tokens (the last one a token past the window)
        draft = draft_logits(target, adapter, exit_hidden)[:, prompt_len - 1:-1]
        full = target.lm_head(features.final_hidden[start:start + batch_size])[:, prompt_len - 1:-1]
        agree += float((draft.argmax(-1) == full.argmax(-1)).sum())
        alpha += float(torch.minimum(draft.softmax(-1), full.softmax(-1)).sum(-1).sum())
        kl += float(kl_to_target(full, draft).sum())
        count += draft.shape[0] * draft.shape[1]
    adapter.train()
    return {"positions": count, "greedy_agreement": round(agree / count, 4), "alpha": round(alpha / count, 4),
            "fkl": round(kl / count, 4)}


# ---- training ----------------------------------------------------------------------------------------------------


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def check(cfg: KangarooConfig) -> None:
    if min(cfg.steps, cfg.batch_size, cfg.windows, cfg.prompt_len, cfg.new_tokens, cfg.eval_windows) < 1:
        raise InvalidRequest("steps, batch size, windows, prompt and continuation lengths must be >= 1")


def train_adapter(cfg: KangarooConfig, *, say=_say) -> dict:
    """Train (or resume) one adapter and export it; returns the summary (also in `training.json`)."""
    from specgen.modalities.text.generator import load_causal_lm, load_tokenizer

    check(cfg)
    use_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    path = target_folder(cfg)
    target = load_causal_lm(path).requires_grad_(False)
    tokenizer = load_tokenizer(path)
    sha = window_data.model_sha256(path)
    config = AdapterConfig.for_target(target, cfg.exit_layer, mlp=cfg.mlp, target_sha256=sha)
    adapter = KangarooAdapter.from_target(target, config)
    run = RunFolder(cfg.run_dir)
    settings = dataclasses.asdict(cfg)
    run.record("run.json", {"command": command_line(cfg), "config": settings, "target": path, **versions()})
    began = time.perf_counter()
    train_tokens, eval_tokens = greedy_data(target, tokenizer, cfg, path, "kangaroo", say)
    train = target_features(target, train_tokens, cfg.exit_layer)
    evaluation = target_features(target, eval_tokens, cfg.exit_layer)
    data_s = time.perf_counter() - began
    optimizer = torch.optim.AdamW(adapter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    fresh = {"step": 0, "resumed_from": [], "recent_losses": [], "elapsed_s": 0.0,
             "heldout_before": heldout(target, adapter, evaluation, cfg.prompt_len)}

    state = run.resume_with(adapter, optimizer, fresh, settings, FIXED)

    def loss_at(step: int) -> torch.Tensor:
        rows = torch.from_numpy(np.random.default_rng([cfg.seed, step]).choice(cfg.windows, cfg.batch_size,
                                                                               replace=False))
        with torch.no_grad():
            full = target.lm_head(train.final_hidden[rows])  # [b, t, vocab]
        return kl_to_target(full, draft_logits(target, adapter, train.exit_hidden[rows])).mean()

    def checkpoint() -> None:
        run.save_with(adapter, optimizer, state, settings)

    def evaluate(result) -> None:
        state["heldout"] = heldout(target, adapter, evaluation, cfg.prompt_len)
        run.log({"step": state["step"], "eval": state["heldout"]})

    bar = progress_bar(cfg.steps, state["step"], f"kangaroo adapter (exit {cfg.exit_layer})")
    with bar:
        run_steps(_loop(cfg), state, adapter, optimizer, loss_at,
                  log=lambda r: run.log({"step": state["step"], "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm}),
                  evaluate=evaluate, checkpoint=checkpoint, bar=bar)
    if "heldout" not in state:  # resumed at the end
        state["heldout"] = heldout(target, adapter, evaluation, cfg.prompt_len)
    summary = {"command": command_line(cfg), "target": path, "target_sha256": sha,
               "exit_layer": cfg.exit_layer, "adapter": "decoder layer" if cfg.mlp else "attention-only",
               "params": sum(p.numel() for p in adapter.parameters()), "steps": state["step"],
               "windows": cfg.windows, "eval_windows": cfg.eval_windows, "prompt_len": cfg.prompt_len,
               "new_tokens": cfg.new_tokens,
               "batch_size": cfg.batch_size, "lr": cfg.lr, "seed": cfg.seed, "data_seed": cfg.data_seed,
               "final_loss": round(sum(state["recent_losses"]) / max(1, len(state["recent_losses"])), 4),
               "train_s": round(state["elapsed_s"], 1), "data_s": round(data_s, 1), "threads": cfg.threads,
               "heldout_before": state["heldout_before"], "heldout": state["heldout"],
               "resumed_from": state["resumed_from"], **versions()}
    run.record("training.json", summary)
    export = Path(cfg.out or Path(cfg.run_dir) / "export")
    adapter.save(adapter_path(export, cfg.exit_layer), summary)
    write_card(export)
    say(f"kangaroo: adapter for exit layer {cfg.exit_layer} in {adapter_path(export, cfg.exit_layer)}")
    return summary


def _loop(cfg: KangarooConfig) -> LoopSettings:
    return LoopSettings(f"kangaroo adapter (exit {cfg.exit_layer})", cfg.steps, cfg.lr, cfg.warmup, cfg.log_every,
                        cfg.eval_every, cfg.checkpoint_minutes)


# ---- the model card ----------------------------------------------------------------------------------------------


def write_card(folder: Path) -> Path:
    """README.md for every adapter in `folder`, from the summaries in their metadata."""
    folder = Path(folder)
    rows, commands = [], []
    for path in sorted(folder.glob("adapter-exit*.safetensors")):
        s = read_record(path)["record"]
        before, after = s["heldout_before"], s["heldout"]
        rows.append(f"| `{path.name}` | {s['exit_layer']} | {s['adapter']} | {s['params']:,} | {s['steps']} | "
                    f"{s['train_s']:.0f} s (+{s['data_s']:.0f} s data) | {s['final_loss']:.3f} | "
                    f"{before['greedy_agreement']:.3f} → **{after['greedy_agreement']:.3f}** | "
                    f"{before['alpha']:.3f} → **{after['alpha']:.3f}** | {after['fkl']:.3f} |")
        commands.append(f"- `{path.name}`: `{s['command']}` (torch {s['torch']}, {s['threads']} thread(s))")
    sample = read_record(sorted(folder.glob("adapter-exit*.safetensors"))[0])["record"] if rows else {}
    lines = ["# Kangaroo adapters for the code target", "",
             "The self-draft of method `kangaroo` (docs/self_speculation.md): the target's first ℓ layers, one of "
             "these adapters (an attention-only decoder layer and an RMSNorm, started from the target's layer ℓ and "
             "final norm) and the target's own lm_head. Each file is fp16 safetensors whose metadata holds the "
             "adapter's config (with the sha256 of the target weights it was trained on: another target refuses "
             "it) and the training summary below.", "",
             f"Data: {sample.get('windows', '?')} prompts of {sample.get('prompt_len', '?')} tokens from the code "
             f"corpus's train split (assets/code/README.md), each continued greedily by the target for "
             f"{sample.get('new_tokens', '?')} tokens; loss KL(target ‖ draft) over the full vocabulary at every "
             "position; AdamW, cosine schedule, batch of "
             f"{sample.get('batch_size', '?')} windows. Held out: the continuation positions of "
             f"{sample.get('eval_windows', '?')} greedy continuations of validation-split prompts; greedy "
             "agreement = P(draft argmax = target argmax) (the "
             "per-token acceptance of greedy decoding there), α = Σ min(target, draft) (the acceptance at "
             "temperature 1); before → after training.", "",
             "| file | exit layer ℓ | adapter | parameters | steps | time | final loss | held-out greedy agreement "
             "| held-out α | held-out KL |", "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
             "Commands (each wrote its file into its `--export` folder; a shipped file was copied from there):", "",
             *commands, ""]
    return write_readme(folder, lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m specgen.modalities.text.training.kangaroo --card FOLDER`: rewrite a folder's model card."""
    return card_command(write_card, argv, main.__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
