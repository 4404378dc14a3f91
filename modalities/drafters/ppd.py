"""PPD (Chen et al. 2024, arXiv 2405.18628; papers.md S15): parallel prompt decoding. A few trained prompt tokens
ride along in the target's own verification window and guess the tokens after the next one, so drafting costs no
forward of its own and no second model: only the prompt tokens' input vectors are trained (1,152 numbers for three
prompt tokens on the code target).

    window   pending  d1  ...  dk  │ p1 p2 p3 after pending │ p1 p2 p3 after d1 │ ... │ p1 p2 p3 after dk
    sees     causal                │ the prefix up to its slot, and its own group's earlier prompt tokens

Prompt token j (0-based) of the group after window slot i sits at position pos_i + 1 + j, where slot i's own output
decides the next token, and its law guesses the token at pos_i + 2 + j. Once the rule has accepted a drafts, the
new pending token is slot a's output, and the group after slot a has already guessed the m tokens after it: those
are the next step's drafts. Real slots never see a prompt token, so the verified logits are the bits plain scoring
gives them (the compiled step is window-invariant), and the output is the target's whatever the guesses are.

Our choices (docs/ppd.md): a group after *every* window slot, so the next step has guesses whatever is accepted (the
paper attaches prompt tokens to the likely-accepted nodes of a dynamic sparse tree sized by the hardware's verify
cost; on a chain the group after every slot is that tree's only shape); one prompt token per guessed position (the
paper's ensembles of prompt tokens average several); drafts are point masses on the guesses' argmax (exact at any
temperature, as prompt lookup's are). The first step after a prompt has no guesses yet and scores the pending token
with its group alone. Llama-architecture targets (the window takes input vectors: `TransformersTarget.score` of
floats); trained by `specgen train head --method ppd` (modalities/text/training/ppd.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.drafters.trained_files import described_for, load_described, load_once, save_described
from specgen.modalities.runtime import llama_runner
from specgen.samplers.types import DecodeContext, Draft, Verdict

PROMPTS_FILE = "prompt-tokens.safetensors"


@dataclass(frozen=True)
class PromptConfig:
    count: int  # m: prompt token j guesses the (j + 2)th token after its slot
    hidden_size: int
    target_sha256: str = ""  # the target folder's weights they were trained on (`model_sha256`)


class PromptTokens(torch.nn.Module):
    """m input vectors of the target's width (the prompt tokens' embeddings; they have no token id)."""

    def __init__(self, config: PromptConfig):
        super().__init__()
        self.config = config
        self.vectors = torch.nn.Parameter(torch.zeros(config.count, config.hidden_size))

    @classmethod
    def for_target(cls, model, count: int, target_sha256: str = "") -> "PromptTokens":
        """Started at the mean input embedding (an input of a token's scale that favours no token)."""
        if count < 1:
            raise InvalidRequest(f"PPD needs at least one prompt token, got {count}")
        embed = model.get_input_embeddings().weight.detach().float()
        prompts = cls(PromptConfig(count, embed.shape[1], target_sha256))
        with torch.no_grad():
            prompts.vectors.copy_(embed.mean(0).expand(count, -1))
        return prompts

    def window(self, embeds: torch.Tensor, groups: int, count: int) -> torch.Tensor:
        """[b, t + groups * count, d]: a window's input vectors, its tokens' `embeds` [b, t, d] followed by `groups`
        groups of the first `count` prompt tokens (`layout`'s slot order)."""
        vectors = self.vectors[:count]
        grouped = vectors.expand(embeds.shape[0], groups, count, -1).reshape(embeds.shape[0], groups * count, -1)
        return torch.cat([embeds, grouped.to(embeds.dtype)], 1)

    def save(self, path: Path, record: dict | None = None) -> Path:
        return save_described(path, self, self.config, record)

    @classmethod
    def load(cls, path: Path) -> "PromptTokens":
        return load_described(path, lambda config: cls(PromptConfig(**config)))


def prompt_folders(model_path: str) -> list[Path]:
    """`<model>/ppd/` and, for a pair folder such as assets/code/{target,draft}, the sibling `ppd/`."""
    model = Path(model_path)
    return [model / "ppd", model.parent / "ppd"]


def find_prompts(model_path: str) -> Path:
    """The prompt tokens trained on the weights at `model_path`; ModelNotFound naming how to train them."""
    path = described_for(model_path, prompt_folders(model_path), PROMPTS_FILE)
    if path is None:
        raise ModelNotFound(f"method 'ppd' needs prompt tokens trained for the target {model_path} (none in "
                            f"{' or '.join(str(f) for f in prompt_folders(model_path))}); train them with "
                            "`specgen train head --method ppd --model PATH`")
    return path


def load_prompts(path: Path) -> PromptTokens:
    """`PromptTokens.load`, kept while the file is unchanged (callers never modify it)."""
    return load_once(path, PromptTokens.load)


@functools.lru_cache(maxsize=64)  # serving's few window widths; training's anchors vary
def layout(slots: int, anchors: tuple[int, ...], count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`slots` real slots followed by a group of `count` prompt tokens after each slot of `anchors`:
    (position offsets from slot 0 [N], visibility [N, N] bool: query slot sees key slot). Real slots are causal;
    prompt token j of the group after slot a is at offset a + 1 + j and sees real slots 0..a and its group's
    prompt tokens 0..j. Serving attaches a group to every slot; training to chosen ones."""
    anchor = torch.tensor(anchors, dtype=torch.long).repeat_interleave(count)  # [G * count]
    index = torch.arange(count).repeat(len(anchors))
    group = torch.arange(len(anchors)).repeat_interleave(count)
    offsets = torch.cat([torch.arange(slots), anchor + 1 + index])
    last_real = torch.cat([torch.arange(slots), anchor])  # the last real slot each query sees
    prompt = torch.arange(len(offsets)) >= slots
    member = torch.cat([torch.full((slots,), -1), group])  # the group of a prompt slot (-1: real)
    order = torch.cat([torch.full((slots,), -1), index])
    sees_real = ~prompt[None, :] & (torch.arange(len(offsets))[None, :] <= last_real[:, None])
    sees_prompt = (prompt[:, None] & prompt[None, :] & (member[:, None] == member[None, :])
                   & (order[None, :] <= order[:, None]))
    return offsets, sees_real | sees_prompt


class PPDTarget:
    """The target as the loop scores it under `ppd`: a chain window scored with a group of prompt tokens after each
    slot, the groups' guesses handed to the drafter; the loop gets the real slots' logits. Everything else
    (prefill, commit, the cache) is the wrapped engine's."""

    def __init__(self, engine, drafter: "PPDDrafter"):
        if not isinstance(getattr(engine, "runner", None), llama_runner.LlamaRunner):
            raise InvalidRequest("method 'ppd' needs a Llama-architecture target (its window takes input vectors)")
        self.engine, self.drafter = engine, drafter
        self.prompt_slots = 0  # prompt-token slots scored so far

    def __getattr__(self, name):  # commit, cache, model, vocab_size, ...
        return getattr(self.engine, name)

    def prefill(self, prompts) -> None:
        self.drafter.guesses.clear()
        self.engine.prefill(prompts)

    def prefill_rows(self, prompts, rows: torch.Tensor) -> None:
        for row in rows.tolist():  # a row's new request starts without guesses
            self.drafter.guesses.pop(row, None)
        self.engine.prefill_rows(prompts, rows)

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
              tree_mask: torch.Tensor | None = None, valid: torch.Tensor | None = None,
              logits_to_keep: int = 0) -> torch.Tensor:
        if tree_mask is not None or logits_to_keep or tokens.is_floating_point():
            return self.engine.score(tokens, positions, rows, tree_mask, valid, logits_to_keep)
        runner, (batch, slots), count = self.engine.runner, tokens.shape, self.drafter.group
        offsets, visible = layout(slots, tuple(range(slots)), count)
        inputs = self.drafter.prompts.window(F.embedding(tokens, runner.embed), slots, count)  # [rows, N, d]
        hidden = self.engine.score(inputs, positions[:, :1] + offsets, rows, visible.expand(batch, -1, -1))
        logits = runner.output(hidden)  # [rows, N, vocab]
        guessed = logits[:, slots:].argmax(-1).view(batch, slots, count)  # [rows, slots, count]
        for i, row in enumerate(rows.tolist()):  # group a guesses from position pos_a + 2 on
            self.drafter.guesses[row] = (int(positions[i, 0]) + 2, guessed[i])
        self.prompt_slots += batch * slots * count
        return logits[:, :slots]

    def run_summary(self) -> dict:
        return {"prompt_slots": self.prompt_slots}


class PPDDrafter:
    """Drafts the guesses the prompt tokens made in the last verification, after the slot that became the pending
    token's predecessor: point masses (a row without guesses, e.g. right after its prompt, drafts nothing)."""

    def __init__(self, prompts: PromptTokens, group: int | None = None):
        self.prompts = prompts
        # prompt tokens scored after each window slot: the first `group` (each sees only those before it, so a
        # shorter group guesses the same tokens), as many as the step will draft
        self.group = min(group or prompts.config.count, prompts.config.count)
        # row -> (the position group 0 guesses first, [slots, count] guessed tokens), from the row's last scoring
        self.guesses: dict[int, tuple[int, torch.Tensor]] = {}
        self.guessed_steps = 0  # steps that drafted guesses in some row

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        width = min(budget, self.group)
        tokens = torch.zeros(len(ctx.rows), width, dtype=torch.long)
        counts = torch.zeros(len(ctx.rows), dtype=torch.long)
        for i, (row, first) in enumerate(zip(ctx.rows.tolist(), ctx.next_positions.tolist())):
            base, guessed = self.guesses.pop(row, (0, None))
            group = first - base  # the window slot the pending token's predecessor held
            if guessed is not None and 0 <= group < len(guessed):
                tokens[i], counts[i] = guessed[group, :width], width
        self.guessed_steps += int(bool(counts.any()))
        return Draft(tokens, None, num_drafted=counts)

    def observe(self, verdict: Verdict) -> None:
        pass  # the next scoring's guesses replace these

    def verifying_target(self, engine) -> PPDTarget:
        return PPDTarget(engine, self)

    def run_summary(self) -> dict:
        return {"prompt_tokens": self.group, "guessed_steps": self.guessed_steps}


def build_drafter(generator, knobs: dict) -> PPDDrafter:
    """The pipeline's `ppd` drafter for a text generator (its target folder's trained prompt tokens)."""
    return PPDDrafter(load_prompts(find_prompts(generator.model_path)), knobs.get("num_draft_tokens"))
