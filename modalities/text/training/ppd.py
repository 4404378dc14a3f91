"""`specgen train head --method ppd`: PPD's prompt tokens (modalities/drafters/ppd.py) for a frozen Llama target,
trained on its own greedy continuations, resumably.

Data: the Kangaroo trainer's (`kangaroo.greedy_data`): prompts of `prompt_len` tokens from the code corpus the
target was trained on (train split; validation split for the held-out numbers), each continued greedily by the target
for `new_tokens` tokens, cached. Each step takes `batch_size` windows and `anchors` continuation slots, and puts a group
of prompt tokens after each of those slots (`ppd.layout`, the serving layout): one forward of the frozen target over
the window and the groups gives both the teacher and the student, since real slots never see a prompt token. Prompt
token j of the group after slot a is taught the target's law at slot a + 1 + j (the law of the token at a + 2 + j).

Loss: KL(target ‖ prompt token) over the full vocabulary, averaged over every prompt slot; only the prompt tokens'
input vectors learn (the paper distils from the model's own outputs too). Each step's windows and anchors are a pure
function of (seed, step), so a resumed run sees the batches an uninterrupted one would. Held-out: at every
continuation slot of the validation windows that has m guessed tokens ahead, the greedy agreement of each prompt
token with the target (its argmax is the greedy token there) and the share of slots whose first j guesses are all
right (the next step's accepted drafts at temperature 0), before and after training.

Run folder: `run.json`, `checkpoint.pt` (every `checkpoint_minutes` and at the end), `metrics.jsonl`,
`training.json`; the prompt tokens are exported as `prompt-tokens.safetensors` (fp16, config and summary in its
metadata) into `export` (default: the run's `export/`) with a README.md model card.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specgen.errors import InvalidRequest
from specgen.modalities.drafters.ppd import PROMPTS_FILE, PromptTokens, layout
from specgen.modalities.drafters.trained_files import read_record
from specgen.modalities.text.training.distill import windows as window_data
from specgen.modalities.text.training.kangaroo import ContinuationSettings, greedy_data, kl_to_target, target_folder
from specgen.modalities.training import (LoopSettings, RunFolder, card_command, flag_command, progress_bar, run_steps,
                                         versions, write_readme)
from specgen.settings import use_threads


@dataclass(kw_only=True)
class PPDConfig(ContinuationSettings):
    run_dir: str = "runs/ppd"
    out: str | None = None  # where the prompt tokens and their card go (None: <run_dir>/export; `--export DIR`)
    prompt_tokens: int = 3
    steps: int = 300
    batch_size: int = 8
    anchors: int = 16  # continuation slots per window given a group of prompt tokens each step
    windows: int = 1024
    lr: float = 1e-2
    warmup: int = 20


# settings a resumed run must share with its checkpoint
FIXED = ("target", "prompt_tokens", "steps", "batch_size", "anchors", "windows", "prompt_len", "new_tokens", "lr",
         "warmup", "seed", "data_seed", "max_files")
FLAGS = {"target": "--model", "prompt_tokens": "--prompt-tokens", "steps": "--steps", "batch_size": "--batch-size",
         "anchors": "--anchors", "windows": "--windows", "lr": "--lr", "seed": "--seed", "data_seed": "--data-seed",
         "max_files": "--max-files", "out": "--export"}


def command_line(cfg: PPDConfig) -> str:
    """The `specgen train head` command that makes this run (non-default settings only)."""
    return flag_command("specgen train head --method ppd", cfg, FLAGS)


def guess_logits(target, prompts: PromptTokens, tokens: torch.Tensor, anchors: tuple[int, ...]):
    """(real slots' logits [b, t, vocab], prompt tokens' [b, count, G, vocab]): one transformers forward of the target
    over windows `tokens` [b, t] with a group of prompt tokens after each slot of `anchors` (serving's layout; the
    reference the tests hold the served guesses to)."""
    b, t = tokens.shape
    count = prompts.config.count
    offsets, visible = layout(t, anchors, count)
    embeds = prompts.window(target.get_input_embeddings()(tokens), len(anchors), count)
    logits = target(inputs_embeds=embeds, position_ids=offsets.expand(b, -1),
                    attention_mask=visible[None, None].expand(b, 1, -1, -1)).logits.float()
    return logits[:, :t], logits[:, t:].view(b, len(anchors), count, -1).transpose(1, 2)


def prompt_logits(target, prompts: PromptTokens, tokens: torch.Tensor, anchors: tuple[int, ...]):
    """(teacher, student) [b, count, G, vocab]: the teacher of prompt token j after slot a is the target's law at
    slot a + 1 + j (detached; real slots never see a prompt token), the student the prompt token's own."""
    real, student = guess_logits(target, prompts, tokens, anchors)
    later = torch.tensor(anchors)[None, :] + 1 + torch.arange(prompts.config.count)[:, None]  # [count, G]
    return real[:, later].detach(), student


def sample_anchors(rng: np.random.Generator, cfg: PPDConfig, length: int) -> tuple[int, ...]:
    """`cfg.anchors` continuation slots with `prompt_tokens` target laws after them, sorted."""
    slots = np.arange(cfg.prompt_len - 1, length - 1 - cfg.prompt_tokens)
    return tuple(sorted(rng.choice(slots, min(cfg.anchors, len(slots)), replace=False).tolist()))


@torch.no_grad()
def heldout(target, prompts: PromptTokens, tokens: np.ndarray, cfg: PPDConfig, batch_size: int = 8) -> dict:
    """Per prompt token, greedy agreement with the target; and the share of slots whose first j guesses all agree."""
    prompts.eval()
    count = prompts.config.count
    anchors = tuple(range(cfg.prompt_len - 1, tokens.shape[1] - 1 - count))
    agree, chains, total = torch.zeros(count), torch.zeros(count), 0
    for start in range(0, len(tokens), batch_size):
        teacher, student = prompt_logits(target, prompts, torch.from_numpy(tokens[start:start + batch_size]), anchors)
        right = (teacher.argmax(-1) == student.argmax(-1)).float()  # [b, count, G]
        agree += right.sum((0, 2))
        chains += right.cumprod(1).sum((0, 2))
        total += right.shape[0] * right.shape[2]
    prompts.train()
    return {"positions": total, "greedy_agreement": [round(float(a) / total, 4) for a in agree],
            "chain_accepted": [round(float(c) / total, 4) for c in chains],
            "expected_drafts_accepted": round(float(chains.sum()) / total, 4)}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def check(cfg: PPDConfig) -> None:
    if min(cfg.steps, cfg.batch_size, cfg.anchors, cfg.windows, cfg.prompt_len, cfg.new_tokens, cfg.eval_windows,
           cfg.prompt_tokens) < 1:
        raise InvalidRequest("steps, batch size, anchors, windows, prompt tokens, prompt and continuation lengths "
                             "must be >= 1")
    if cfg.new_tokens <= cfg.prompt_tokens + 1:
        raise InvalidRequest(f"continuations of {cfg.new_tokens} tokens leave no slot with {cfg.prompt_tokens} "
                             "tokens ahead to learn from")


def train_prompts(cfg: PPDConfig, *, say=_say) -> dict:
    """Train (or resume) the prompt tokens and export them; returns the summary (also in `training.json`)."""
    from specgen.modalities.runtime import llama_runner
    from specgen.modalities.text.generator import load_causal_lm, load_tokenizer

    check(cfg)
    use_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    path = target_folder(cfg)
    target = load_causal_lm(path).requires_grad_(False)
    if not llama_runner.supports(target):
        raise InvalidRequest(f"method 'ppd' serves Llama-architecture targets; {path} is not one")
    tokenizer = load_tokenizer(path)
    sha = window_data.model_sha256(path)
    prompts = PromptTokens.for_target(target, cfg.prompt_tokens, sha)
    run = RunFolder(cfg.run_dir)
    settings = dataclasses.asdict(cfg)
    run.record("run.json", {"command": command_line(cfg), "config": settings, "target": path, **versions()})
    began = time.perf_counter()
    train, evaluation = greedy_data(target, tokenizer, cfg, path, "ppd", say)
    data_s = time.perf_counter() - began
    optimizer = torch.optim.AdamW(prompts.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    fresh = {"step": 0, "resumed_from": [], "recent_losses": [], "elapsed_s": 0.0,
             "heldout_before": heldout(target, prompts, evaluation, cfg)}

    state = run.resume_with(prompts, optimizer, fresh, settings, FIXED)

    def loss_at(step: int) -> torch.Tensor:
        rng = np.random.default_rng([cfg.seed, step])
        rows = rng.choice(len(train), min(cfg.batch_size, len(train)), replace=False)
        anchors = sample_anchors(rng, cfg, train.shape[1])
        teacher, student = prompt_logits(target, prompts, torch.from_numpy(train[rows]), anchors)
        return kl_to_target(teacher, student).mean()

    def checkpoint() -> None:
        run.save_with(prompts, optimizer, state, settings)

    def evaluate(result) -> None:
        state["heldout"] = heldout(target, prompts, evaluation, cfg)
        run.log({"step": state["step"], "eval": state["heldout"]})

    loop = LoopSettings("ppd prompt tokens", cfg.steps, cfg.lr, cfg.warmup, cfg.log_every, cfg.eval_every,
                        cfg.checkpoint_minutes)
    bar = progress_bar(cfg.steps, state["step"], "ppd prompt tokens")
    with bar:
        run_steps(loop, state, prompts, optimizer, loss_at,
                  log=lambda r: run.log({"step": state["step"], "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm}),
                  evaluate=evaluate, checkpoint=checkpoint, bar=bar)
    if "heldout" not in state:  # resumed at the end
        state["heldout"] = heldout(target, prompts, evaluation, cfg)
    summary = {"command": command_line(cfg), "target": path, "target_sha256": sha,
               "prompt_tokens": cfg.prompt_tokens, "params": sum(p.numel() for p in prompts.parameters()),
               "steps": state["step"], "batch_size": cfg.batch_size, "anchors": cfg.anchors, "windows": cfg.windows,
               "eval_windows": cfg.eval_windows, "prompt_len": cfg.prompt_len, "new_tokens": cfg.new_tokens,
               "lr": cfg.lr, "seed": cfg.seed, "data_seed": cfg.data_seed,
               "final_loss": round(sum(state["recent_losses"]) / max(1, len(state["recent_losses"])), 4),
               "train_s": round(state["elapsed_s"], 1), "data_s": round(data_s, 1), "threads": cfg.threads,
               "heldout_before": state["heldout_before"], "heldout": state["heldout"],
               "resumed_from": state["resumed_from"], **versions()}
    run.record("training.json", summary)
    export = Path(cfg.out or Path(cfg.run_dir) / "export")
    prompts.save(export / PROMPTS_FILE, summary)
    write_card(export)
    say(f"ppd: {cfg.prompt_tokens} prompt tokens in {export / PROMPTS_FILE}")
    return summary


def write_card(folder: Path) -> Path:
    """README.md for the prompt tokens in `folder`, from the summary in their metadata."""
    s = read_record(Path(folder) / PROMPTS_FILE)["record"]
    before, after = s["heldout_before"], s["heldout"]
    agreement = lambda h: ", ".join(f"{a:.3f}" for a in h["greedy_agreement"])  # noqa: E731
    lines = ["# PPD prompt tokens for the code target", "",
             f"`{PROMPTS_FILE}`: the prompt tokens of method `ppd` (docs/ppd.md), input vectors that ride in the "
             "target's verification window after every slot and guess the tokens after the next one. fp16 "
             "safetensors whose metadata holds "
             "their config (with the sha256 of the target weights they were trained on: another target refuses them) "
             "and the training summary below.", "",
             f"Data: {s['windows']} prompts of {s['prompt_len']} tokens from the code corpus's train split "
             f"(assets/code/README.md), each continued greedily by the target for {s['new_tokens']} tokens; each step "
             f"{s['batch_size']} windows with a group of prompt tokens after {s['anchors']} continuation slots; loss "
             "KL(target ‖ prompt token) over the full vocabulary; AdamW, cosine schedule. Held out: every "
             f"continuation slot of {s['eval_windows']} greedy continuations of validation-split prompts "
             f"({after['positions']:,} slots).", "",
             "| prompt tokens | parameters | steps | time | final loss | held-out greedy agreement per prompt token "
             "(before → after) | expected accepted drafts per step (before → after) |",
             "|---|---|---|---|---|---|---|",
             f"| {s['prompt_tokens']} | {s['params']:,} | {s['steps']} | {s['train_s']:.0f} s (+{s['data_s']:.0f} s "
             f"data) | {s['final_loss']:.3f} | {agreement(before)} → **{agreement(after)}** | "
             f"{before['expected_drafts_accepted']:.3f} → **{after['expected_drafts_accepted']:.3f}** |", "",
             "Command (it wrote the file into its `--export` folder; the shipped file was copied from there):", "",
             f"- `{s['command']}` (torch {s['torch']}, {s['threads']} thread(s))", ""]
    return write_readme(folder, lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m specgen.modalities.text.training.ppd --card FOLDER`: rewrite the folder's model card."""
    return card_command(write_card, argv, main.__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
