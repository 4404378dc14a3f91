"""`specgen train adapter --method early-exit`: the exit heads and controllers of method `early-exit`
(modalities/text/early_exit.py), trained on the frozen target's states over the corpus's own code, resumably.

Data: windows of `window` tokens of the code corpus's train split (held-out numbers: the validation split, files
never trained on), read with teacher forcing: one forward of the frozen target per batch of windows gives, at
every position, the residual stream after each layer (what the heads and controllers read), the target's own next
token (argmax) and its law, and the corpus's real next token y.

Loss per step (a batch of positions): the exit heads learn KL(target ‖ head ℓ) over the full vocabulary (our
choice: the paper fits its heads to y; an exit should reproduce what full decoding would have written), and each
controller a cross-entropy over three labels at its layer (the paper's): **stop** where the target's argmax ≠ y
(a completion continued from a wrong token is rarely accepted), else **exit** where head ℓ's argmax = the target's
(at layer L: always), else **continue** — labels from the heads as they are at that step, so the controllers follow
them as they train. Each step's positions are a pure function of (seed, step), so a resumed run sees the batches
an uninterrupted one would.

Held out: a teacher-forced replay of the decision rule over the validation positions at a grid of thresholds:
layers used per token, agreement with the target's token, accuracy against y (target alone and with exits), the
stop rate and the stop precision (the share of stops where the target was indeed wrong) — `calibration` in the
exported record, from which the registry's defaults were read.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specgen.errors import InvalidRequest
from specgen.modalities.text.early_exit import CONTINUE, EXIT, MODULES_FILE, STOP, ExitModules
from specgen.modalities.text.training.distill import windows as window_data
from specgen.modalities.training import (LoopSettings, RunFolder, RunSettings, card_command, flag_command, progress_bar,
                                         run_steps, versions, write_readme)
from specgen.settings import use_threads

THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


@dataclass(kw_only=True)
class EarlyExitConfig(RunSettings):
    run_dir: str = "runs/early-exit"
    out: str | None = None  # where the modules and their card go (None: <run_dir>/export)
    target: str | None = None  # a target model folder (None: the shipped code target)
    steps: int = 600
    batch_size: int = 1024  # positions per step
    windows: int = 768
    window: int = 128
    eval_windows: int = 128
    controller_size: int = 64
    lr: float = 2e-3
    warmup: int = 20
    data_seed: int = 0
    max_files: int | None = None
    cache_dir: str | None = None
    log_every: int = 10
    eval_every: int = 200


FIXED = ("target", "steps", "batch_size", "windows", "window", "controller_size", "lr", "warmup", "seed", "data_seed",
         "max_files")
FLAGS = {"target": "--model", "steps": "--steps", "batch_size": "--batch-size", "windows": "--windows",
         "lr": "--lr", "seed": "--seed", "data_seed": "--data-seed", "max_files": "--max-files", "out": "--export"}


def command_line(cfg: EarlyExitConfig) -> str:
    return flag_command("specgen train adapter --method early-exit", cfg, FLAGS)


@dataclass(frozen=True)
class States:
    layers: torch.Tensor  # [n, L, d] fp16: the residual stream after layers 1..L-1, then the final-normed state
    target_token: torch.Tensor  # [n] the target's argmax
    true_token: torch.Tensor  # [n] the corpus's next token


@torch.no_grad()
def target_states(model, tokens: np.ndarray, batch_size: int = 16) -> States:
    """The frozen target over every window (teacher forcing); positions with a next token only."""
    layers, target, true = [], [], []
    for start in range(0, len(tokens), batch_size):
        ids = torch.from_numpy(tokens[start:start + batch_size])
        out = model.model(input_ids=ids, output_hidden_states=True)
        # hidden_states[ℓ] follows layer ℓ - 1 ... [L] is the final-normed state (as the served stack's last layer)
        stack = torch.stack([*out.hidden_states[1:-1], out.last_hidden_state], 2)[:, :-1]  # [b, t-1, L, d]
        layers.append(stack.reshape(-1, *stack.shape[2:]).half())
        target.append(model.lm_head(out.last_hidden_state[:, :-1]).argmax(-1).flatten())
        true.append(ids[:, 1:].flatten())
    return States(torch.cat(layers), torch.cat(target), torch.cat(true))


def labels(head_tokens: torch.Tensor, target_token: torch.Tensor, true_token: torch.Tensor) -> torch.Tensor:
    """[n, L] the controllers' labels; head_tokens [n, L-1] the exit heads' argmax."""
    agree = torch.cat([head_tokens == target_token[:, None], torch.ones_like(target_token[:, None], dtype=torch.bool)],
                      1)
    action = torch.where(agree, EXIT, CONTINUE)
    return torch.where((target_token != true_token)[:, None], STOP, action)


def step_losses(model, modules: ExitModules, states: States, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean KL of the exit heads to the target, mean controller cross-entropy) over positions `rows`."""
    hidden = states.layers[rows].float()  # [b, L, d]
    exits = hidden.shape[1] - 1
    with torch.no_grad():
        target_logp = model.lm_head(hidden[:, -1]).float().log_softmax(-1)  # [b, vocab]
    kl, heads = 0.0, []
    for layer in range(1, exits + 1):
        logp = model.lm_head(modules.exit_hidden(layer, hidden[:, layer - 1])).float().log_softmax(-1)
        kl = kl + (target_logp.exp() * (target_logp - logp)).sum(-1).mean()
        heads.append(logp.argmax(-1))
    wanted = labels(torch.stack(heads, 1), states.target_token[rows], states.true_token[rows])
    ce = sum(F.cross_entropy(modules.action_logits(layer, hidden[:, layer - 1]), wanted[:, layer - 1])
             for layer in range(1, exits + 2))
    return kl / exits, ce / (exits + 1)


@torch.no_grad()
def replay(model, modules: ExitModules, states: States, exit_threshold: float, stop_threshold: float,
           batch_size: int = 4096) -> dict:
    """The decision rule replayed with teacher forcing over `states` at these thresholds."""
    layers_used, agree, correct, stops, stop_right, emitted = 0, 0, 0, 0, 0, 0
    exits = [0] * (modules.config.layers + 1)  # emitted tokens by the layer they left after
    for start in range(0, len(states.true_token), batch_size):
        hidden = states.layers[start:start + batch_size].float()
        target_token = states.target_token[start:start + batch_size]
        true_token = states.true_token[start:start + batch_size]
        total = hidden.shape[1]
        token = target_token.clone()
        depth = torch.full_like(target_token, total)
        stopped = torch.zeros_like(target_token, dtype=torch.bool)
        decided = torch.zeros_like(stopped)
        for layer in range(1, total + 1):
            probs = modules.action_logits(layer, hidden[:, layer - 1]).softmax(-1)
            stop_now = ~decided & (probs[:, STOP] >= stop_threshold) if stop_threshold < 1 else torch.zeros_like(
                decided)
            exit_now = ~decided & ~stop_now & (probs[:, EXIT] >= exit_threshold) if (
                exit_threshold < 1 and layer < total) else torch.zeros_like(decided)
            if bool(exit_now.any()):
                state = modules.exit_hidden(layer, hidden[exit_now, layer - 1])
                token[exit_now] = model.lm_head(state).argmax(-1)
            depth[stop_now | exit_now] = layer
            stopped |= stop_now
            decided |= stop_now | exit_now
        kept = ~stopped
        for layer, count in zip(*depth[kept].unique(return_counts=True)):
            exits[int(layer)] += int(count)
        layers_used += int(depth[kept].sum())
        emitted += int(kept.sum())
        agree += int((token == target_token)[kept].sum())
        correct += int((token == true_token)[kept].sum())
        stops += int(stopped.sum())
        stop_right += int((target_token != true_token)[stopped].sum())
    positions = len(states.true_token)
    return {"exit_threshold": exit_threshold, "stop_threshold": stop_threshold, "positions": positions,
            "mean_layers": round(layers_used / max(emitted, 1), 3),
            "agreement": round(agree / max(emitted, 1), 4), "accuracy": round(correct / max(emitted, 1), 4),
            "stop_rate": round(stops / positions, 4),
            "stop_precision": round(stop_right / stops, 4) if stops else None,
            "exit_share": {str(layer): round(count / max(emitted, 1), 4) for layer, count in enumerate(exits)
                           if count}}


def calibration(model, modules: ExitModules, states: States) -> dict:
    """The held-out replay: exits alone over the threshold grid (stops off), stops alone, both at the method's
    defaults, and the target alone."""
    from specgen.samplers.registry import get_method

    defaults = get_method("text", "early-exit").resolve_knobs({})
    target_accuracy = float((states.target_token == states.true_token).float().mean())
    return {"target_accuracy": round(target_accuracy, 4),
            "defaults": replay(model, modules, states, defaults["exit_threshold"], defaults["stop_threshold"]),
            "exits": [replay(model, modules, states, t, 1.0) for t in THRESHOLDS],
            "stops": [replay(model, modules, states, 1.0, t) for t in THRESHOLDS]}


# ---- training ----------------------------------------------------------------------------------------------------


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def train_early_exit(cfg: EarlyExitConfig, *, say=_say) -> dict:
    """Train (or resume) the exit heads and controllers and export them; returns the summary."""
    from specgen.modalities.text.generator import load_causal_lm, load_tokenizer
    from specgen.modalities.text.training.kangaroo import target_folder

    if min(cfg.steps, cfg.batch_size, cfg.windows, cfg.eval_windows, cfg.controller_size) < 1 or cfg.window < 2:
        raise InvalidRequest("steps, batch size, windows and the controller size must be >= 1, the window >= 2")
    use_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    path = target_folder(cfg)
    model = load_causal_lm(path).requires_grad_(False)
    if model.config.num_hidden_layers < 2:
        raise InvalidRequest("early exit needs a target of at least two layers")
    tokenizer = load_tokenizer(path)
    sha = window_data.model_sha256(path)
    modules = ExitModules.from_target(model, controller_size=cfg.controller_size, target_sha256=sha)
    run = RunFolder(cfg.run_dir)
    settings = dataclasses.asdict(cfg)
    run.record("run.json", {"command": command_line(cfg), "config": settings, "target": path, **versions()})
    cache = window_data.cache_folder(path, cfg.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    say(f"early-exit: the target's states over {cfg.windows} train and {cfg.eval_windows} held-out windows")
    splits = {}
    for split, count, seed in (("train", cfg.windows, cfg.data_seed), ("val", cfg.eval_windows, cfg.data_seed + 1)):
        stream = window_data.corpus_stream(tokenizer, split, cfg.max_files, cache)
        splits[split] = target_states(model, window_data.corpus_windows(stream, count, cfg.window, 0, seed).tokens)
    train, evaluation = splits["train"], splits["val"]
    data_s = time.perf_counter() - began
    optimizer = torch.optim.AdamW(modules.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    fresh = {"step": 0, "resumed_from": [], "recent_losses": [], "elapsed_s": 0.0}

    state = run.resume_with(modules, optimizer, fresh, settings, FIXED)

    def loss_at(step: int) -> torch.Tensor:
        rows = torch.from_numpy(np.random.default_rng([cfg.seed, step]).choice(len(train.true_token), cfg.batch_size,
                                                                               replace=False))
        kl, ce = step_losses(model, modules, train, rows)
        state["last"] = {"kl": round(kl.item(), 4), "controller_ce": round(ce.item(), 4)}
        return kl + ce

    def checkpoint() -> None:
        run.save_with(modules, optimizer, state, settings)

    def evaluate(result) -> None:
        modules.eval()
        run.log({"step": state["step"], "eval": replay(model, modules, evaluation, 0.9, 1.0)})
        modules.train()

    loop = LoopSettings("early-exit modules", cfg.steps, cfg.lr, cfg.warmup, cfg.log_every, cfg.eval_every,
                        cfg.checkpoint_minutes)
    bar = progress_bar(cfg.steps, state["step"], "early-exit heads and controllers")
    with bar:
        run_steps(loop, state, modules, optimizer, loss_at,
                  log=lambda r: run.log({"step": state["step"], "loss": r.loss, **state.get("last", {}), "lr": r.lr}),
                  evaluate=evaluate, checkpoint=checkpoint, bar=bar)
    modules.eval()
    say("early-exit: replaying the decisions over the held-out positions")
    summary = {"command": command_line(cfg), "target": path, "target_sha256": sha,
               "params": sum(p.numel() for p in modules.parameters()), "steps": state["step"],
               "windows": cfg.windows, "window": cfg.window, "eval_windows": cfg.eval_windows,
               "batch_size": cfg.batch_size, "lr": cfg.lr, "seed": cfg.seed, "data_seed": cfg.data_seed,
               "final_loss": round(sum(state["recent_losses"]) / max(1, len(state["recent_losses"])), 4),
               "train_s": round(state["elapsed_s"], 1), "data_s": round(data_s, 1), "threads": cfg.threads,
               "calibration": calibration(model, modules, evaluation), "resumed_from": state["resumed_from"],
               **versions()}
    run.record("training.json", summary)
    export = Path(cfg.out or Path(cfg.run_dir) / "export")
    modules.save(export / MODULES_FILE, summary)
    write_card(export)
    say(f"early-exit: heads and controllers in {export / MODULES_FILE}")
    return summary


def write_card(folder: Path) -> Path:
    """README.md for the exit modules in `folder`, from the summary in their metadata."""
    from specgen.modalities.text.early_exit import read_record

    s = read_record(Path(folder) / MODULES_FILE)["record"]
    cal = s["calibration"]

    def shares(entry: dict) -> str:
        return ", ".join(f"{layer}: {100 * share:.1f} %" for layer, share in entry.get("exit_share", {}).items())

    def rows(entries, key) -> list[str]:
        return [f"| {key(e) if callable(key) else e[key]} | {e['mean_layers']:.2f} | {shares(e)} | "
                f"{e['agreement']:.3f} | {e['accuracy']:.3f} | "
                f"{e['stop_rate']:.3f} | {e['stop_precision'] if e['stop_precision'] is not None else '—'} |"
                for e in entries]

    header = ["| threshold | layers per token | tokens by the layer they left after | agreement with the target | "
              "accuracy vs the code | stop rate | stop precision |", "|---|---|---|---|---|---|---|"]
    lines = ["# Early-exit heads and controllers for the code target", "",
             "Method `early-exit` (docs/early_exit.md, lossy): an exit head after each of the target's layers 1..L-1 "
             "(an affine map of the residual stream and a norm before the target's own lm_head) and a controller "
             "after each layer 1..L (Linear-GELU-Linear over the normed state: continue, exit or stop). fp16 "
             "safetensors; the metadata holds the config (with the sha256 of the target weights they were trained "
             "on: another target refuses them) and this summary.", "",
             f"Data: {s['windows']} windows of {s['window']} tokens of the code corpus's train split, teacher-forced; "
             f"{s['steps']} steps of {s['batch_size']} positions, {s['train_s']:.0f} s (+{s['data_s']:.0f} s "
             f"reading the target's states), {s['params']:,} parameters, final loss {s['final_loss']:.3f}.", "",
             f"Held out ({s['eval_windows']} windows of the validation split, files never trained on; the decision "
             f"rule replayed with teacher forcing). The target alone: accuracy {cal['target_accuracy']:.3f}.", "",
             "At the method's defaults:", "", *header,
             *rows([cal["defaults"]], lambda e: f"exit {e['exit_threshold']}, stop {e['stop_threshold']}"), "",
             "Exits alone (stop_threshold = 1):", "", *header, *rows(cal["exits"], "exit_threshold"), "",
             "Stops alone (exit_threshold = 1):", "", *header, *rows(cal["stops"], "stop_threshold"), "",
             f"Command: `{s['command']}` (torch {s['torch']}, {s['threads']} thread(s)); the shipped file was copied "
             "from its `--export` folder.", ""]
    return write_readme(folder, lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m specgen.modalities.text.training.early_exit --card FOLDER`: rewrite a folder's model card."""
    return card_command(write_card, argv, main.__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
